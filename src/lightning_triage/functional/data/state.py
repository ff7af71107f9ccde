"""What the data stage accumulates over a run: counters, class counts, feature moments,
fingerprint stores and the label probe's examples, in one place."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lightning_triage.functional.data.duplicates import FingerprintStore, example_fingerprints
from lightning_triage.functional.data.inputs import flat_features
from lightning_triage.functional.data.labels import class_counts
from lightning_triage.functional.data.shift import FeatureExtremes, FeatureMoments


@dataclass
class DataRunState:
    """The data stage's state over a run (see ``BatchInspector``).

    ``state_dict`` keeps what a checkpoint needs (the fingerprints and the probe's examples are
    not saved: they are rebuilt from the batches after a resume).

    Example:
        >>> s = DataRunState.fresh(max_fingerprints=16, probe_examples=64, classes=10,
        ...                        classes_source="`num_classes`")
        >>> s.train_inspected = 3
        >>> t = DataRunState.fresh(16, 64, None, None)
        >>> t.load_state_dict(s.state_dict())
        >>> t.train_inspected, t.classes
        (3, 10)
    """

    train_fps: FingerprintStore
    val_fps: FingerprintStore
    epoch_batches: FingerprintStore
    probe_seen: FingerprintStore
    classes: int | None = None
    classes_source: str | None = None
    sample: dict[str, Any] | None = None
    batch_stats: list[dict[str, Any]] = field(default_factory=list)
    train_inspected: int = 0
    train_fingerprinted: int = 0
    val_fingerprinted: int = 0
    class_totals: dict[int, int] = field(default_factory=dict)
    batch_classes: list[tuple[int, int]] = field(default_factory=list)
    val_inspected: set[tuple[int, int]] = field(default_factory=set)
    done: set[str] = field(default_factory=set)
    reported: set[str] = field(default_factory=set)
    train_moments: FeatureMoments = field(default_factory=FeatureMoments)
    val_moments: FeatureMoments = field(default_factory=FeatureMoments)
    val_extremes: FeatureExtremes = field(default_factory=FeatureExtremes)
    probe_x: list[Tensor] = field(default_factory=list)
    probe_y: list[Tensor] = field(default_factory=list)
    probe_count: int = 0
    probe_detail: str = ""
    no_class_count: bool = False

    @classmethod
    def fresh(cls, max_fingerprints: int, probe_examples: int, classes: int | None,
              classes_source: str | None) -> DataRunState:
        """An empty state: fingerprint stores of ``max_fingerprints`` entries, a probe store of
        ``probe_examples``."""
        return cls(FingerprintStore(max_fingerprints), FingerprintStore(max_fingerprints),
                   FingerprintStore(max_fingerprints), FingerprintStore(probe_examples),
                   classes=classes, classes_source=classes_source)

    def wants(self, split: str, key: tuple[int, int], num_batches: int,
              fingerprint_batches: int | None) -> bool:
        """Whether a batch (``key``: ``(dataloader_idx, batch_idx)``) is still to be inspected in
        full (the first ``num_batches``) or fingerprinted (the first ``fingerprint_batches``)."""
        limit = fingerprint_batches
        if split == "train":
            return (self.train_inspected < num_batches or limit is None
                    or self.train_fingerprinted < limit)
        return (key not in self.val_inspected and len(self.val_inspected) < num_batches) \
            or limit is None or self.val_fingerprinted < limit

    def count(self, split: str, key: tuple[int, int], num_batches: int,
              fingerprint_batches: int | None) -> tuple[bool, bool]:
        """Count a batch (see :meth:`wants`): ``(inspect it in full, fingerprint it)``."""
        limit = fingerprint_batches
        if split == "train":
            inspect = self.train_inspected < num_batches
            self.train_inspected += inspect
            fingerprint = limit is None or self.train_fingerprinted < limit
            self.train_fingerprinted += fingerprint
            return inspect, fingerprint
        inspect = key not in self.val_inspected and len(self.val_inspected) < num_batches
        if inspect:
            self.val_inspected.add(key)
        fingerprint = limit is None or self.val_fingerprinted < limit
        self.val_fingerprinted += fingerprint
        return inspect, fingerprint

    def count_classes(self, y: Tensor, ignore_index: int) -> None:
        """Add a training batch's class targets ``y`` (``(N,)``) to the class counts."""
        counts = class_counts(y, ignore_index)
        for k, c in counts.items():
            self.class_totals[k] = self.class_totals.get(k, 0) + c
        self.batch_classes.append((int(y.shape[0]), len(counts)))

    def collect_probe(self, x: Tensor, y: Tensor, probe_examples: int) -> None:
        """Keep the distinct labelled examples of a training batch for the label probe, up to
        ``probe_examples`` in all (inputs of another shape than the first batch's are skipped)."""
        if self.probe_count >= probe_examples or x.ndim == 0 or x.shape[0] != y.shape[0]:
            return
        width = flat_features(x[:1]).shape[1]
        if self.probe_x and self.probe_x[0].shape[1] != width:
            return
        fps = example_fingerprints(x)
        labelled = (y.detach() >= 0).reshape(-1).tolist()  # ignore_index and padding out
        keep = [i for i, fp in enumerate(fps) if labelled[i] and fp not in self.probe_seen]
        for i in keep:
            self.probe_seen.add(fps[i])
        keep = keep[: probe_examples - self.probe_count]
        if not keep:
            return
        index = torch.tensor(keep, device=x.device)
        self.probe_x.append(flat_features(x.index_select(0, index)).float().cpu())
        self.probe_y.append(y.detach().index_select(0, index).cpu())
        self.probe_count += len(keep)

    def state_dict(self) -> dict[str, Any]:
        """The checkpointed part, JSON/pickle-able."""
        return {
            "sample": self.sample,
            "batch_stats": self.batch_stats,
            "classes": self.classes,
            "classes_source": self.classes_source,
            "train_inspected": self.train_inspected,
            "train_fingerprinted": self.train_fingerprinted,
            "val_fingerprinted": self.val_fingerprinted,
            "class_totals": dict(self.class_totals),
            "batch_classes": [list(b) for b in self.batch_classes],
            "val_inspected": [list(k) for k in self.val_inspected],
            "done": sorted(self.done),
            "reported": sorted(self.reported),
            "train_moments": self.train_moments.state_dict(),
            "val_moments": self.val_moments.state_dict(),
            "val_extremes": self.val_extremes.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; a missing key keeps the current value."""
        self.sample = state.get("sample", self.sample)
        self.batch_stats = list(state.get("batch_stats", self.batch_stats))
        self.classes = state.get("classes", self.classes)
        self.classes_source = state.get("classes_source", self.classes_source)
        self.train_inspected = int(state.get("train_inspected", self.train_inspected))
        self.train_fingerprinted = int(state.get("train_fingerprinted", self.train_fingerprinted))
        self.val_fingerprinted = int(state.get("val_fingerprinted", self.val_fingerprinted))
        self.class_totals = {int(k): int(v) for k, v in state.get("class_totals", {}).items()}
        self.batch_classes = [(int(a), int(b)) for a, b in state.get("batch_classes", [])]
        self.val_inspected = {(int(a), int(b)) for a, b in state.get("val_inspected", [])}
        self.done = set(state.get("done", []))
        self.reported = set(state.get("reported", []))
        self.train_moments.load_state_dict(state.get("train_moments", {}))
        self.val_moments.load_state_dict(state.get("val_moments", {}))
        self.val_extremes.load_state_dict(state.get("val_extremes", {}))
