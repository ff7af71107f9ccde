"""Stage 1 (data): is the batch the model sees sane?"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from typing_extensions import override

from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.findings import Severity
from lightning_triage.functional.batch import BatchKey, BatchLayout, locate_batch
from lightning_triage.functional.chance import IGNORE_INDEX, infer_task
from lightning_triage.functional.data import (
    FeatureMoments,
    FingerprintStore,
    TensorSummary,
    batch_fingerprint,
    batch_picture,
    class_counts,
    class_imbalance,
    constant_across_batch,
    duplicate_stats,
    example_fingerprints,
    far_below_unit_scale,
    first_nonfinite_example,
    flat_features,
    input_shift,
    is_class_target,
    label_signal,
    scale_verdict,
    summarize_tensor,
    target_range,
)
from lightning_triage.functional.hooks import LastOutput, capture_last_output


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def _shape(t: Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')} {tuple(t.shape)}"


class BatchInspector(TriageCallback):
    """Inspect the batches exactly as the model receives them (after transforms and transfer).

    For the first ``num_batches`` training and validation batches (the sanity check counts):
    per-tensor statistics, NaN/Inf in inputs and targets, the input scale, inputs identical for
    every example, class targets outside ``[0, C)``, the class distribution and a label probe.
    For the first ``fingerprint_batches`` batches: a 64-bit fingerprint per example (a hash of
    256 evenly spaced values, kept in a store of at most ``max_fingerprints`` entries per split)
    to find repeated batches, duplicate examples and training examples reappearing in validation.

    Batches are only read: no extra iteration over the loaders, no global RNG draw, no change to
    the batch. The class count ``C`` is ``num_classes`` if given, else the width of the model's
    output on the first batch (read by temporary forward hooks); targets are checked when the
    batch starts, so a crash in the loss comes after the finding and the crash report holds it.

    Findings: ``data.nonfinite_input``, ``data.nonfinite_target``, ``data.unnormalized_input``,
    ``data.constant_input``, ``data.target_out_of_range``, ``data.class_imbalance``,
    ``data.repeated_batch``, ``data.duplicate_samples``, ``data.train_val_overlap``,
    ``data.train_val_shift``, ``data.label_misalignment`` and ``data.unknown_batch_structure``
    (info). See ``docs/data.md`` for thresholds.

    After fit, :attr:`sample` holds a small JSON-able picture of the first training batch and
    :attr:`batch_stats` the per-tensor statistics of the inspected batches.

    Args:
        num_batches: training batches (per fit) and validation batches inspected in full.
        fingerprint_batches: training and validation batches fingerprinted; ``None``: all.
        max_fingerprints: capacity of each fingerprint store (the oldest are forgotten).
        num_classes: class count (vocabulary size for token targets); default: the model's
            output width on the first batch.
        ignore_index: target value excluded from the class checks.
        input_key: the input entry when it cannot be found by its name or position: a key or
            attribute name, an index, or a callable ``batch -> tensor``.
        target_key: the target entry, the same way.
        max_rms: report inputs whose root mean square exceeds this (standardized data: ~1).
        duplicate_fraction: report a batch when this share of its examples repeats others.
        probe: run the label-misalignment probe.
        probe_examples: training examples the probe uses (the first distinct ones seen); it
            runs with at least ``min(512, probe_examples)`` (fewer cannot clear a weak but
            real task).
        strict: raise internal errors instead of disabling the check.

    Raises:
        ValueError: for an argument outside its range, naming it.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[BatchInspector(num_classes=10)])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.BatchInspector
                  init_args: {num_classes: 10, input_key: image, target_key: label}
    """

    def __init__(
        self,
        num_batches: int = 32,
        fingerprint_batches: int | None = 256,
        max_fingerprints: int = 65536,
        num_classes: int | None = None,
        ignore_index: int = IGNORE_INDEX,
        input_key: BatchKey | None = None,
        target_key: BatchKey | None = None,
        max_rms: float = 4.0,
        duplicate_fraction: float = 0.5,
        probe: bool = True,
        probe_examples: int = 1024,
        *,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        if not isinstance(num_batches, int) or num_batches < 1:
            raise ValueError(f"`num_batches` must be an integer >= 1, got {num_batches!r}.")
        if fingerprint_batches is not None and (
                not isinstance(fingerprint_batches, int) or fingerprint_batches < 0):
            raise ValueError("`fingerprint_batches` must be an integer >= 0 or None, got "
                             f"{fingerprint_batches!r}.")
        if not isinstance(max_fingerprints, int) or max_fingerprints < 1:
            raise ValueError(f"`max_fingerprints` must be an integer >= 1, got {max_fingerprints!r}.")
        if num_classes is not None and (not isinstance(num_classes, int) or num_classes < 2):
            raise ValueError(f"`num_classes` must be an integer >= 2 or None, got {num_classes!r}.")
        for name, key in (("input_key", input_key), ("target_key", target_key)):
            if key is not None and not isinstance(key, (str, int)) and not callable(key):
                raise ValueError(f"`{name}` must be a key name, an index, a callable or None, "
                                 f"got {key!r}.")
        if not max_rms > 1:
            raise ValueError(f"`max_rms` must be > 1, got {max_rms!r}.")
        if not 0 < duplicate_fraction <= 1:
            raise ValueError(f"`duplicate_fraction` must be in (0, 1], got {duplicate_fraction!r}.")
        if not isinstance(probe_examples, int) or probe_examples < 64:
            raise ValueError(f"`probe_examples` must be an integer >= 64, got {probe_examples!r}.")
        self.num_batches = num_batches
        self.fingerprint_batches = fingerprint_batches
        self.max_fingerprints = max_fingerprints
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.input_key = input_key
        self.target_key = target_key
        self.max_rms = max_rms
        self.duplicate_fraction = duplicate_fraction
        self.probe = probe
        self.probe_examples = probe_examples
        #: A small JSON-able picture of the first training batch (see ``batch_picture``).
        self.sample: dict[str, Any] | None = None
        #: Per-tensor statistics of every inspected batch (bounded by ``2 * num_batches``).
        self.batch_stats: list[dict[str, Any]] = []
        #: The class count used for the target checks, and where it came from.
        self.classes: int | None = num_classes
        self.classes_source: str | None = "`num_classes`" if num_classes else None
        self.train_inspected = 0
        self.train_fingerprinted = 0
        self.val_fingerprinted = 0
        self.class_totals: dict[int, int] = {}
        self._batch_classes: list[tuple[int, int]] = []
        self._val_inspected: set[tuple[int, int]] = set()
        self._done: set[str] = set()
        self._reported: set[str] = set()
        self._train_moments = FeatureMoments()
        self._val_moments = FeatureMoments()
        self._train_fps = FingerprintStore(max_fingerprints)
        self._val_fps = FingerprintStore(max_fingerprints)
        self._epoch_batches = FingerprintStore(max_fingerprints)
        self._probe_x: list[Tensor] = []
        self._probe_y: list[Tensor] = []
        self._probe_seen = FingerprintStore(probe_examples)
        self._probe_count = 0
        self._probe_detail = ""
        self._no_class_count = False
        self._capture: ExitStack | None = None
        self._captured: LastOutput | None = None
        self._pending: dict[str, Any] | None = None
        self._last: dict[str, Any] | None = None

    # ------------------------------------------------------------------ helpers
    def _once(self, key: str) -> bool:
        """True the first time ``key`` is seen (a finding is reported once per key)."""
        if key in self._reported:
            return False
        self._reported.add(key)
        return True

    def _describe(self) -> str:
        text = (f"inspected {self.train_inspected} training and {len(self._val_inspected)} "
                "validation batches")
        return f"{text}; {self._probe_detail}" if self._probe_detail else text

    def _where(self, split: str, batch_idx: int, dataloader_idx: int = 0) -> str:
        if split == "train":
            return f"training batch {batch_idx}"
        loader = f" of val loader {dataloader_idx}" if dataloader_idx else ""
        return f"validation batch {batch_idx}{loader}"

    def _layout(self, trainer: pl.Trainer, batch: Any) -> BatchLayout | None:
        layout = locate_batch(batch, self.input_key, self.target_key)
        if layout.inputs is not None and (layout.inputs.layout != torch.strided
                                          or layout.inputs.is_nested):
            layout = BatchLayout(None, None, None, None, layout.tensors,
                                 f"the input `{layout.input_name}` is a sparse or nested tensor")
        if layout.targets is not None and layout.targets.layout != torch.strided:
            layout = BatchLayout(layout.inputs, None, layout.input_name, None, layout.tensors,
                                 layout.note)
        if layout.inputs is None:
            if self._once("unknown_batch_structure"):
                self.add_finding(
                    trainer, "data.unknown_batch_structure",
                    f"The batch's inputs could not be found ({layout.note}; batch type "
                    f"`{type(batch).__name__}`), so the data checks did not run. Pass "
                    "`input_key=` and `target_key=` (a key, an index or a callable) to "
                    "`BatchInspector`.",
                    evidence={"batch_type": type(batch).__name__,
                              "tensors": [n for n, _ in layout.tensors][:16]},
                )
                self.skip(f"batch structure not understood: {layout.note}")
            return None
        return layout

    # ------------------------------------------------------------------ hooks
    @override
    @guarded
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_batches.clear()

    @override
    @guarded
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        self._begin(trainer, pl_module, batch, "train", batch_idx, 0)

    @override
    @guarded
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: STEP_OUTPUT, batch: Any, batch_idx: int) -> None:
        self._finish_capture(trainer)
        if self.train_inspected == self.num_batches and "window" not in self._done:
            self._done.add("window")
            self._evaluate(trainer, final=False)

    @override
    @guarded
    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                  batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if trainer.state.fn != "fit":
            return
        self._begin(trainer, pl_module, batch, "val", batch_idx, dataloader_idx)

    @override
    @guarded
    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                outputs: STEP_OUTPUT, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        self._finish_capture(trainer)

    @override
    @guarded
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self._evaluate(trainer, final=False, shift_only=True)

    @override
    @guarded
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._evaluate(trainer, final=False, epoch_end=True)

    @override
    @guarded
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._evaluate(trainer, final=True)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        try:
            if not self.disabled:
                self._finish_capture(trainer)
                last = self._last
                if last is not None and self.classes is not None:
                    if "targets" not in last:  # a batch after the inspected ones: read it now
                        layout = locate_batch(last["batch"], self.input_key, self.target_key)
                        strided = layout.targets is not None and \
                            layout.targets.layout == torch.strided
                        last.update(targets=layout.targets if strided else None,
                                    target_name=layout.target_name,
                                    global_step=trainer.global_step)
                    self._check_targets(trainer, last["targets"], last["target_name"],
                                        last["split"], last["batch_idx"], last["dataloader_idx"],
                                        last["global_step"])
                self._evaluate(trainer, final=True)
        except Exception as exc:
            if self.strict:
                raise
            self._disable_after_error(trainer, "on_exception", exc)
        finally:
            self._last = None
            super().on_exception(trainer, pl_module, exception)

    # ------------------------------------------------------------------ per batch
    def _begin(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, split: str,
               batch_idx: int, dataloader_idx: int) -> None:
        # kept by reference: if this batch crashes the run, `on_exception` checks its targets
        self._last = {"batch": batch, "split": split, "batch_idx": batch_idx,
                      "dataloader_idx": dataloader_idx}
        if not self._wants(split, batch_idx, dataloader_idx):
            return  # the steady state after the first batches: nothing to read
        layout = self._layout(trainer, batch)
        if layout is None:
            return
        assert layout.inputs is not None
        assert layout.input_name is not None
        step = trainer.global_step
        self._last.update(targets=layout.targets, target_name=layout.target_name, global_step=step)
        if split == "train":
            inspect = self.train_inspected < self.num_batches
            if inspect:
                self.train_inspected += 1
            limit = self.fingerprint_batches
            fingerprint = limit is None or self.train_fingerprinted < limit
            if fingerprint:
                self.train_fingerprinted += 1
        else:
            key = (dataloader_idx, batch_idx)
            inspect = key not in self._val_inspected and len(self._val_inspected) < self.num_batches
            if inspect:
                self._val_inspected.add(key)
            limit = self.fingerprint_batches
            fingerprint = limit is None or self.val_fingerprinted < limit
            if fingerprint:
                self.val_fingerprinted += 1
        if inspect:
            self.mark_ran(self._describe())
            self._inspect(trainer, layout, split, batch_idx, dataloader_idx, step)
        if fingerprint:
            self._fingerprint(trainer, layout, split, batch_idx, dataloader_idx, step)
        targets = layout.targets
        if (inspect and self.classes is None and not self._no_class_count and targets is not None
                and is_class_target(targets) and self._capture is None):
            self._arm(trainer, pl_module)

    def _wants(self, split: str, batch_idx: int, dataloader_idx: int) -> bool:
        """Whether this batch is still to be inspected or fingerprinted."""
        limit = self.fingerprint_batches
        if split == "train":
            return (self.train_inspected < self.num_batches or limit is None
                    or self.train_fingerprinted < limit)
        return ((dataloader_idx, batch_idx) not in self._val_inspected
                and len(self._val_inspected) < self.num_batches) or limit is None \
            or self.val_fingerprinted < limit

    def _inspect(self, trainer: pl.Trainer, layout: BatchLayout, split: str, batch_idx: int,
                 dataloader_idx: int, step: int) -> None:
        x, y = layout.inputs, layout.targets
        assert x is not None
        assert layout.input_name is not None
        where = self._where(split, batch_idx, dataloader_idx)
        summaries: list[TensorSummary] = []
        for name, t in layout.tensors[:16]:
            if name == layout.target_name or t.layout != torch.strided:
                continue
            summary = summarize_tensor(t, name)
            summaries.append(summary)
            # other tensors may hold -inf on purpose (additive attention masks): NaN only there
            if summary.nan or (summary.inf and name == layout.input_name):
                self._nonfinite(trainer, "data.nonfinite_input", split, where, batch_idx, t,
                                summary, step)
        target_summary = None
        if y is not None and layout.target_name is not None:
            target_summary = summarize_tensor(y, layout.target_name)
            if target_summary.nan or target_summary.inf:
                self._nonfinite(trainer, "data.nonfinite_target", split, where, batch_idx, y,
                                target_summary, step)
        if len(self.batch_stats) < 2 * self.num_batches:
            self.batch_stats.append({
                "split": split, "batch_idx": batch_idx, "dataloader_idx": dataloader_idx,
                "global_step": step,
                "tensors": [s.to_dict() for s in summaries]
                + ([target_summary.to_dict()] if target_summary is not None else []),
            })
        main = next((s for s in summaries if s.name == layout.input_name), None) or \
            summarize_tensor(x, layout.input_name)
        if split == "train":
            if self.sample is None:
                self.sample = {"split": split, "batch_idx": batch_idx, "global_step": step,
                               "tensor": layout.input_name, "target": layout.target_name,
                               **batch_picture(x, y)}
            self._scale(trainer, main, where, batch_idx, step)
        if (x.ndim >= 1 and x.shape[0] >= 2 and constant_across_batch(x)
                and self._once(f"constant:{split}")):
            self.add_finding(
                trainer, "data.constant_input",
                f"{where} (step {step}): `{layout.input_name}` ({_shape(x)}) is identical "
                f"for all {x.shape[0]} examples (min {_fmt(main.min)}, max {_fmt(main.max)})"
                ": the model cannot learn from it. Check the dataset indexing, the collate "
                "function and transforms that overwrite the input.",
                evidence={"split": split, "batch_idx": batch_idx, "tensor": layout.input_name,
                          "examples": int(x.shape[0]), "min": main.min, "max": main.max},
                global_step=step,
            )
        if y is not None and is_class_target(y):
            if self.classes is not None:
                self._check_targets(trainer, y, layout.target_name, split, batch_idx,
                                    dataloader_idx, step)
            if split == "train" and y.ndim == 1:
                counts = class_counts(y, self.ignore_index)
                for k, c in counts.items():
                    self.class_totals[k] = self.class_totals.get(k, 0) + c
                self._batch_classes.append((int(y.shape[0]), len(counts)))
                if self.probe and x.is_floating_point():
                    self._collect_probe(x, y)
        if x.is_floating_point() and x.ndim >= 1 and x.shape[0] > 0:
            (self._train_moments if split == "train" else self._val_moments).update(x)

    def _nonfinite(self, trainer: pl.Trainer, code: str, split: str, where: str, batch_idx: int,
                   t: Tensor, summary: TensorSummary, step: int) -> None:
        if not self._once(f"{code}:{split}:{summary.name}"):
            return
        example = first_nonfinite_example(t)
        what = "inputs" if code == "data.nonfinite_input" else "targets"
        self.add_finding(
            trainer, code,
            f"{where} (step {step}): `{summary.name}` ({_shape(t)}) holds {summary.nan} NaN and "
            f"{summary.inf} Inf values of {summary.numel} (first in example {example}). The "
            f"model's {what} must be finite: trace that example back through the dataset and its "
            "transforms.",
            evidence={"split": split, "tensor": summary.name, "nan": summary.nan,
                      "inf": summary.inf, "numel": summary.numel, "first_example": example,
                      "batch_idx": batch_idx},
            global_step=step,
        )

    def _scale(self, trainer: pl.Trainer, s: TensorSummary, where: str, batch_idx: int,
               step: int) -> None:
        verdict = scale_verdict(s, self.max_rms)
        if verdict is None and far_below_unit_scale(s) and self._once("tiny_input_scale"):
            self.add_finding(
                trainer, "data.tiny_input_scale",
                f"{where} (step {step}): float input `{s.name}` ({s.dtype} {tuple(s.shape)}) is "
                f"non-negative with values in [{_fmt(s.min)}, {_fmt(s.max)}] and root mean "
                f"square {_fmt(s.rms)}: every value is far below unit scale (images divided by "
                "their range twice?). Standardize with the training set's mean and std, or "
                "scale pixels to [0, 1] once.",
                evidence={"tensor": s.name, "batch_idx": batch_idx, "min": s.min, "max": s.max,
                          "mean": s.mean, "std": s.std, "rms": s.rms},
                global_step=step,
            )
        if verdict is None or not self._once("unnormalized"):
            return
        detail = (f"values in [{_fmt(s.min)}, {_fmt(s.max)}], mean {_fmt(s.mean)}, std "
                  f"{_fmt(s.std)}, root mean square {_fmt(s.rms)}")
        if verdict == "large":
            advice = (f"far from standardized (rms > {self.max_rms:g}; standardized inputs have "
                      "rms ~1). Standardize with the training set's mean and std, or scale "
                      "pixels to [0, 1] (`x / 255`, `x / 16` for digits).")
        else:
            advice = ("so small that early layers see almost nothing (divided by 255 twice?). "
                      "Standardize with the training set's mean and std.")
        self.add_finding(
            trainer, "data.unnormalized_input",
            f"{where} (step {step}): float input `{s.name}` ({s.dtype} {tuple(s.shape)}) has "
            f"{detail}: {advice}",
            evidence={"tensor": s.name, "batch_idx": batch_idx, "verdict": verdict,
                      "min": s.min, "max": s.max, "mean": s.mean, "std": s.std, "rms": s.rms,
                      "max_rms": self.max_rms},
            global_step=step,
        )

    def _check_targets(self, trainer: pl.Trainer, y: Tensor | None, name: str | None, split: str,
                       batch_idx: int, dataloader_idx: int, step: int) -> None:
        if y is None or self.classes is None or not is_class_target(y) or y.numel() == 0:
            return
        if "data.target_out_of_range" in self._reported:
            return
        result = target_range(y, self.classes, self.ignore_index)
        if not result.bad or not self._once("data.target_out_of_range"):
            return
        k = self.classes
        guess = ""
        if result.min >= 1 and result.max == k:
            guess = f" The targets run 1..{k}: labels counted from 1 instead of 0?"
        elif result.min < 0:
            guess = (f" Negative targets other than `ignore_index={self.ignore_index}`: a "
                     "padding value the loss does not ignore?")
        severity: Severity | None = None
        if self.num_classes is None and result.max >= 2 * k:
            # far beyond the inferred width: the output may not be class scores (embeddings?)
            severity = "warning"
            guess += (" If the model's output is not class scores, pass `num_classes=` to "
                      "`BatchInspector`/`Triage`.")
        where = self._where(split, batch_idx, dataloader_idx)
        self.add_finding(
            trainer, "data.target_out_of_range",
            f"{where} (step {step}): {result.bad} of {result.total} class targets in `{name}` are "
            f"outside [0, {k}) (targets range {result.min}..{result.max}; bad values "
            f"{result.values}, first in example {result.first_index}), with {k} classes from "
            f"{self.classes_source}. Cross-entropy fails or silently mis-trains on them.{guess}",
            evidence={"split": split, "batch_idx": batch_idx, "tensor": name, "bad": result.bad,
                      "total": result.total, "min": result.min, "max": result.max,
                      "values": result.values, "first_example": result.first_index,
                      "num_classes": k, "num_classes_from": self.classes_source,
                      "ignore_index": self.ignore_index},
            severity=severity, global_step=step,
        )

    def _collect_probe(self, x: Tensor, y: Tensor) -> None:
        if self._probe_count >= self.probe_examples or x.ndim == 0 or x.shape[0] != y.shape[0]:
            return
        width = flat_features(x[:1]).shape[1]
        if self._probe_x and self._probe_x[0].shape[1] != width:
            return  # inputs of another shape than the first batch's
        fps = example_fingerprints(x)
        labelled = (y.detach() >= 0).reshape(-1).tolist()  # ignore_index and padding out
        keep = [i for i, fp in enumerate(fps) if labelled[i] and fp not in self._probe_seen]
        for i in keep:
            self._probe_seen.add(fps[i])
        keep = keep[: self.probe_examples - self._probe_count]
        if not keep:
            return
        index = torch.tensor(keep, device=x.device)
        self._probe_x.append(flat_features(x.index_select(0, index)).float().cpu())
        self._probe_y.append(y.detach().index_select(0, index).cpu())
        self._probe_count += len(keep)

    # ------------------------------------------------------------------ fingerprints
    def _fingerprint(self, trainer: pl.Trainer, layout: BatchLayout, split: str, batch_idx: int,
                     dataloader_idx: int, step: int) -> None:
        x = layout.inputs
        assert x is not None
        if x.ndim == 0 or x.shape[0] == 0:
            return
        fps = example_fingerprints(x)
        n = len(fps)
        where = self._where(split, batch_idx, dataloader_idx)
        repeats, largest = duplicate_stats(fps)
        per_example = x[0].numel()
        if (n >= 8 and per_example >= 8 and largest < n and repeats >= self.duplicate_fraction * n
                and self._once(f"duplicates:{split}")):
            self.add_finding(
                trainer, "data.duplicate_samples",
                f"{where} (step {step}): {repeats} of the {n} examples of `{layout.input_name}` "
                f"repeat another example of the batch (only {n - repeats} distinct, the largest "
                "group of copies holds "
                f"{largest}). Check the dataset indexing and the collate function (an example "
                "repeated, a broadcast instead of a stack).",
                evidence={"split": split, "batch_idx": batch_idx, "tensor": layout.input_name,
                          "examples": n, "repeats": repeats, "distinct": n - repeats,
                          "largest_group": largest},
                global_step=step,
            )
        if split == "train":
            whole = batch_fingerprint(fps)
            previous = self._epoch_batches.get(whole)
            # a batch of one example repeated is `data.constant_input`, not a repeated batch
            if previous is not None and n >= 2 and largest < n and self._once("repeated_batch"):
                self.add_finding(
                    trainer, "data.repeated_batch",
                    f"{where} (step {step}) is identical to training batch {previous[0]} (step "
                    f"{previous[1]}) of the same epoch: all {n} examples of "
                    f"`{layout.input_name}`, in the same order. The loader yields the same batch "
                    "again: check the sampler and the dataset's `__getitem__` (a fixed index, a "
                    "cached batch).",
                    evidence={"batch_idx": batch_idx, "same_as_batch": previous[0],
                              "same_as_step": previous[1], "examples": n,
                              "tensor": layout.input_name, "epoch": trainer.current_epoch},
                    global_step=step,
                )
            elif previous is None:
                self._epoch_batches.add(whole, (batch_idx, step))
            for i, fp in enumerate(fps):
                self._train_fps.add(fp, (batch_idx, i))
        else:
            for i, fp in enumerate(fps):
                self._val_fps.add(fp, (batch_idx, i, dataloader_idx))

    # ------------------------------------------------------------------ across batches
    def _evaluate(self, trainer: pl.Trainer, *, final: bool, epoch_end: bool = False,
                  shift_only: bool = False) -> None:
        self._evaluate_shift(trainer)
        self._evaluate_overlap(trainer)
        if shift_only:
            return
        window_done = self.train_inspected >= self.num_batches
        if window_done or epoch_end or final:
            self._evaluate_imbalance(trainer)
        if (self.probe and "probe" not in self._done
                and (self._probe_count >= self.probe_examples
                     or ((window_done or epoch_end or final)
                         and self._probe_count >= min(512, self.probe_examples)))):
            self._done.add("probe")
            self._evaluate_probe(trainer)

    def _evaluate_imbalance(self, trainer: pl.Trainer) -> None:
        if "imbalance" in self._done or sum(self.class_totals.values()) < 64:
            return
        self._done.add("imbalance")
        result = class_imbalance(self.class_totals, self._batch_classes, self.classes)
        total = sum(self.class_totals.values())
        top = sorted(self.class_totals.items(), key=lambda kv: -kv[1])[:10]
        evidence = {"counts": {str(k): c for k, c in sorted(self.class_totals.items())[:100]},
                    "targets_seen": total, "dominant": result.dominant, "share": result.share,
                    "threshold": result.threshold, "one_class_batches": result.one_class_batches,
                    "batches": result.batches, "expected_one_class": result.expected_one_class}
        dist = ", ".join(f"{k}: {c}" for k, c in top)
        if result.sorted_batches:
            self.add_finding(
                trainer, "data.class_imbalance",
                f"{result.one_class_batches} of the first {result.batches} training batches hold "
                f"a single class, where a shuffled loader would give a share of "
                f"{result.expected_one_class:.2g} with this class mix (counts {dist}): the "
                "loader is not shuffled over data sorted by class. Pass "
                "`shuffle=True` (or a shuffling sampler) to the training `DataLoader`.",
                evidence=evidence,
            )
        elif result.dominated:
            self.add_finding(
                trainer, "data.class_imbalance",
                f"Class {result.dominant} is {result.share:.0%} of the {total} training targets "
                f"seen in the first {self.train_inspected} batches (counts {dist}). Judge the "
                "loss against the class prior, not uniform chance; if unexpected, check the "
                "sampler and the labels; else use class weights or a balanced sampler.",
                evidence=evidence,
            )

    def _evaluate_shift(self, trainer: pl.Trainer) -> None:
        if "shift" in self._done or self._train_moments.count < 64 or self._val_moments.count < 32:
            return
        result = input_shift(self._train_moments, self._val_moments)
        if result is None:
            return
        self._done.add("shift")
        if result.clearly_different():
            self.add_finding(
                trainer, "data.train_val_shift",
                f"Train and validation inputs differ: per feature, the means differ by "
                f"{result.mean_shift:.2f} pooled standard deviations and the stds by a factor "
                f"{result.std_ratio:.2f} (medians over {result.features} features; train mean "
                f"{result.train_mean:.3g} std {result.train_std:.3g}, validation mean "
                f"{result.val_mean:.3g} std {result.val_std:.3g}; {self._train_moments.count} "
                f"training and {self._val_moments.count} validation examples). Apply the same "
                "preprocessing (normalization, scaling, resizing) to both splits.",
                evidence={"mean_shift": result.mean_shift, "std_ratio": result.std_ratio,
                          "features": result.features, "train_mean": result.train_mean,
                          "val_mean": result.val_mean, "train_std": result.train_std,
                          "val_std": result.val_std, "train_examples": self._train_moments.count,
                          "val_examples": self._val_moments.count},
            )

    def _evaluate_overlap(self, trainer: pl.Trainer) -> None:
        if "overlap" in self._reported or not len(self._train_fps) or not len(self._val_fps):
            return
        hits = []
        for fp, where in self._val_fps.items():
            if fp in self._train_fps:
                hits.append((where, self._train_fps.get(fp)))
        checked = len(self._val_fps)
        if len(hits) >= 5 and len(hits) >= 0.01 * checked and self._once("overlap"):
            (vb, vi, vdl), (tb, ti) = min(hits, key=lambda h: (h[0][2], h[0][0], h[0][1]))
            self.add_finding(
                trainer, "data.train_val_overlap",
                f"{len(hits)} of the {checked} distinct validation examples seen "
                f"({len(hits) / checked:.0%}) also appear among the {len(self._train_fps)} "
                f"training examples seen (first: validation batch {vb} example {vi} = training "
                f"batch {tb} example {ti}). Validation built from a slice of the training set? "
                "Split before augmenting and keep the validation indices disjoint.",
                evidence={"overlap": len(hits), "val_examples": checked,
                          "train_examples": len(self._train_fps), "first_val_batch": vb,
                          "first_val_example": vi, "first_train_batch": tb,
                          "first_train_example": ti, "val_dataloader": vdl},
            )

    def _evaluate_probe(self, trainer: pl.Trainer) -> None:
        if not self._probe_x:
            return
        x, y = torch.cat(self._probe_x), torch.cat(self._probe_y)
        self._probe_x, self._probe_y = [], []
        result = label_signal(x, y)
        if result is None:
            return
        evidence = result.to_dict()
        self._probe_detail = (f"label probe on {result.examples} examples: 1-NN "
                              f"{result.knn:.2f} vs {result.knn_null:.2f} shuffled, centroid "
                              f"{result.centroid:.2f} vs {result.centroid_null:.2f}")
        self.detail = self._describe()
        if not result.related():
            self.add_finding(
                trainer, "data.label_misalignment",
                f"The training targets look unrelated to the inputs: on {result.examples} "
                f"distinct training examples ({result.classes} classes, majority share "
                f"{result.majority:.2f}), a 1-nearest-neighbour probe scores {result.knn:.3f} "
                f"(shuffled labels: {result.knn_null:.3f}, z = {result.z_knn:.1f}) and a "
                f"nearest-centroid probe {result.centroid:.3f} (shuffled: "
                f"{result.centroid_null:.3f}, z = {result.z_centroid:.1f}). Check that inputs "
                "and labels are indexed together (shuffled separately? sorted differently? an "
                "off-by-one join?). A genuinely near-unpredictable task looks the same: then "
                "ignore this.",
                evidence=evidence,
            )

    # ------------------------------------------------------------------ class count capture
    def _arm(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._capture = ExitStack()
        self._captured = self._capture.enter_context(capture_last_output(
            pl_module, wrap=lambda hook: self.guard_hook(trainer, "forward hook", hook)))

        def on_model_output(module: Any, args: Any, output: Any) -> None:
            self._learn_classes(trainer)

        hook = self.guard_hook(trainer, "forward hook", on_model_output)
        self._capture.callback(pl_module.register_forward_hook(hook).remove)

    def _learn_classes(self, trainer: pl.Trainer) -> None:
        """Take the class count from the model output captured so far, then check the batch."""
        captured, last = self._captured, self._last
        if self.classes is not None or captured is None or captured.output is None or last is None:
            return
        targets = last.get("targets")
        if targets is None:
            return
        inferred = infer_task(captured.output, targets, self.ignore_index)
        if (inferred is None or inferred[0] not in ("multiclass", "sequence")
                or inferred[1] is None or inferred[1] < 2):
            return
        self.classes = int(inferred[1])
        layer = captured.module_name or type(trainer.lightning_module).__name__
        self.classes_source = (f"the model's output width ({tuple(captured.output.shape)} from "
                               f"`{layer}`)")
        self._check_targets(trainer, targets, last["target_name"], last["split"],
                            last["batch_idx"], last["dataloader_idx"], last["global_step"])

    def _finish_capture(self, trainer: pl.Trainer) -> None:
        if self._capture is None:
            return
        try:
            self._learn_classes(trainer)
            captured = self._captured
            if self.classes is None and captured is not None and captured.output is not None:
                self._no_class_count = True  # e.g. a binary head: stop arming hooks
        finally:
            self._close_capture()

    def _close_capture(self) -> None:
        if self._capture is not None:
            self._capture.close()
            self._capture = None
            self._captured = None

    @override
    def remove_handles(self) -> None:
        super().remove_handles()
        self._close_capture()

    # ------------------------------------------------------------------ state
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(_capture=None, _captured=None, _last=None)
        return state

    @override
    def report_details(self) -> dict[str, Any]:
        return {"first_batch": dict(self.sample)} if self.sample else {}

    @override
    def extra_state(self) -> dict[str, Any]:
        return {
            "sample": self.sample,
            "batch_stats": self.batch_stats,
            "classes": self.classes,
            "classes_source": self.classes_source,
            "train_inspected": self.train_inspected,
            "train_fingerprinted": self.train_fingerprinted,
            "val_fingerprinted": self.val_fingerprinted,
            "class_totals": dict(self.class_totals),
            "batch_classes": [list(b) for b in self._batch_classes],
            "val_inspected": [list(k) for k in self._val_inspected],
            "done": sorted(self._done),
            "reported": sorted(self._reported),
            "train_moments": self._train_moments.state_dict(),
            "val_moments": self._val_moments.state_dict(),
        }

    @override
    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.sample = state.get("sample", self.sample)
        self.batch_stats = list(state.get("batch_stats", self.batch_stats))
        self.classes = state.get("classes", self.classes)
        self.classes_source = state.get("classes_source", self.classes_source)
        self.train_inspected = int(state.get("train_inspected", self.train_inspected))
        self.train_fingerprinted = int(state.get("train_fingerprinted", self.train_fingerprinted))
        self.val_fingerprinted = int(state.get("val_fingerprinted", self.val_fingerprinted))
        self.class_totals = {int(k): int(v) for k, v in state.get("class_totals", {}).items()}
        self._batch_classes = [(int(a), int(b)) for a, b in state.get("batch_classes", [])]
        self._val_inspected = {(int(a), int(b)) for a, b in state.get("val_inspected", [])}
        self._done = set(state.get("done", []))
        self._reported = set(state.get("reported", []))
        self._train_moments.load_state_dict(state.get("train_moments", {}))
        self._val_moments.load_state_dict(state.get("val_moments", {}))


__all__ = ["BatchInspector"]
