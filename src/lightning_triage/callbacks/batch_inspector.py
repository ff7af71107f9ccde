"""Stage 1 (data): is the batch the model sees sane?"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from typing_extensions import override

from lightning_triage.callbacks._args import (
    BundleArg,
    check_batch_keys,
    check_bool,
    check_int,
    check_number,
    passes,
)
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.functional.batch import BatchKey, BatchLayout, locate_batch
from lightning_triage.functional.chance import IGNORE_INDEX, infer_task
from lightning_triage.functional.data import (
    FingerprintStore,
    TensorSummary,
    batch_fingerprint,
    batch_picture,
    duplicate_stats,
    example_fingerprints,
    input_shift,
    is_class_target,
    label_signal,
    summarize_tensor,
    val_outlier,
    verdicts,
)
from lightning_triage.functional.data.state import DataRunState
from lightning_triage.functional.hooks import HeadCapture
from lightning_triage.functional.verdict import Verdict


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
    ``data.train_val_shift``, ``data.val_outlier``, ``data.label_misalignment``,
    ``data.tiny_input_scale`` and ``data.unknown_batch_structure`` (info). See ``docs/data.md``
    for thresholds.

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
        TriageConfigError: for an argument outside its range, naming it.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[BatchInspector(num_classes=10)])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.BatchInspector
                  init_args: {num_classes: 10, input_key: image, target_key: label}
    """

    stage: ClassVar[str] = "data"
    codes: ClassVar[tuple[str, ...]] = ("data.nonfinite_input", "data.nonfinite_target",
        "data.unnormalized_input", "data.tiny_input_scale", "data.constant_input",
        "data.target_out_of_range", "data.class_imbalance", "data.repeated_batch",
        "data.duplicate_samples", "data.train_val_overlap", "data.train_val_shift",
        "data.label_misalignment", "data.unknown_batch_structure", "data.val_outlier")
    # how `Triage` builds this check (TriageCallback.bundle_args)
    bundle_args: ClassVar[Mapping[str, BundleArg]] = passes(
        "num_classes", "input_key", "target_key")

    state_key_args = ("input_key", "target_key")

    def __init__(
        self,
        *,
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
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        check_int("num_batches", num_batches, 1)
        check_int("fingerprint_batches", fingerprint_batches, 0, optional=True)
        check_int("max_fingerprints", max_fingerprints, 1)
        check_int("num_classes", num_classes, 2, optional=True)
        check_int("ignore_index", ignore_index)
        check_batch_keys(input_key=input_key, target_key=target_key)
        check_number("max_rms", max_rms, 1)
        check_number("duplicate_fraction", duplicate_fraction, 0, 1, high_open=False)
        check_bool("probe", probe)
        check_int("probe_examples", probe_examples, 64)
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
        self._capture: HeadCapture | None = None  # the class-count capture while armed
        self._last: dict[str, Any] | None = None  # the current batch, for `on_exception`
        self.reset_state()

    def reset_state(self) -> None:
        """Forget everything seen: the run's state (:class:`DataRunState`) starts empty."""
        self.state = DataRunState.fresh(
            self.max_fingerprints, self.probe_examples, self.num_classes,
            "`num_classes`" if self.num_classes else None)

    # ------------------------------------------------------------------ the run's state
    @property
    def sample(self) -> dict[str, Any] | None:
        """A small JSON-able picture of the first training batch (see ``batch_picture``)."""
        return self.state.sample

    @property
    def batch_stats(self) -> list[dict[str, Any]]:
        """Per-tensor statistics of every inspected batch (bounded by ``2 * num_batches``)."""
        return self.state.batch_stats

    @property
    def classes(self) -> int | None:
        """The class count used for the target checks (see :attr:`classes_source`)."""
        return self.state.classes

    @property
    def classes_source(self) -> str | None:
        """Where :attr:`classes` came from."""
        return self.state.classes_source

    @property
    def train_inspected(self) -> int:
        """Training batches inspected in full."""
        return self.state.train_inspected

    @property
    def train_fingerprinted(self) -> int:
        """Training batches fingerprinted."""
        return self.state.train_fingerprinted

    @property
    def val_fingerprinted(self) -> int:
        """Validation batches fingerprinted."""
        return self.state.val_fingerprinted

    @property
    def class_totals(self) -> dict[int, int]:
        """Training targets seen per class."""
        return self.state.class_totals

    @property
    def _train_fps(self) -> FingerprintStore:
        return self.state.train_fps

    @property
    def _val_fps(self) -> FingerprintStore:
        return self.state.val_fps

    @property
    def _epoch_batches(self) -> FingerprintStore:
        return self.state.epoch_batches

    # ------------------------------------------------------------------ helpers
    def _once(self, key: str) -> bool:
        """True the first time ``key`` is seen (a finding is reported once per key)."""
        if key in self.state.reported:
            return False
        self.state.reported.add(key)
        return True

    def _forward(self, trainer: pl.Trainer, verdict: Verdict | None, once: str | None = None) -> None:
        """Report ``verdict`` as a finding (once per key ``once`` when given)."""
        if verdict is None or (once is not None and not self._once(once)):
            return
        self.add_verdict(trainer, verdict)

    def _describe(self) -> str:
        text = (f"inspected {self.state.train_inspected} training and "
                f"{len(self.state.val_inspected)} validation batches")
        return f"{text}; {self.state.probe_detail}" if self.state.probe_detail else text

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
            if "unknown_batch_structure" not in self.state.reported:
                self._forward(trainer, verdicts.unknown_structure_rule(batch, layout.note, layout.tensors),
                              "unknown_batch_structure")
                self.skip(f"batch structure not understood: {layout.note}")
            return None
        return layout

    # ------------------------------------------------------------------ hooks
    @override
    @guarded
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.state.epoch_batches.clear()

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
        if self.state.train_inspected == self.num_batches and "window" not in self.state.done:
            self.state.done.add("window")
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
        if not self.state.wants(split, (dataloader_idx, batch_idx), self.num_batches,
                                self.fingerprint_batches):
            return  # the steady state after the first batches: nothing to read
        layout = self._layout(trainer, batch)
        if layout is None:
            return
        assert layout.inputs is not None
        assert layout.input_name is not None
        step = trainer.global_step
        self._last.update(targets=layout.targets, target_name=layout.target_name, global_step=step)
        inspect, fingerprint = self.state.count(split, (dataloader_idx, batch_idx), self.num_batches,
                                                self.fingerprint_batches)
        if inspect:
            self.mark_ran(self._describe())
            self._inspect(trainer, layout, split, batch_idx, dataloader_idx, step)
        if fingerprint:
            self._fingerprint(trainer, layout, split, batch_idx, dataloader_idx, step)
        targets = layout.targets
        if (inspect and self.state.classes is None and not self.state.no_class_count
                and targets is not None and is_class_target(targets) and self._capture is None):
            self._arm(trainer, pl_module)

    def _inspect(self, trainer: pl.Trainer, layout: BatchLayout, split: str, batch_idx: int,
                 dataloader_idx: int, step: int) -> None:
        x, y, st = layout.inputs, layout.targets, self.state
        assert x is not None
        assert layout.input_name is not None
        where = verdicts.batch_place(split, batch_idx, dataloader_idx)
        summaries = self._summaries(trainer, layout, split, batch_idx, dataloader_idx, step)
        main = next((s for s in summaries if s.name == layout.input_name), None) or \
            summarize_tensor(x, layout.input_name)
        if split == "train":
            if st.sample is None:
                st.sample = {"split": split, "batch_idx": batch_idx, "global_step": step,
                             "tensor": layout.input_name, "target": layout.target_name,
                             **batch_picture(x, y)}
            self._forward(trainer, verdicts.tiny_scale_rule(main, max_rms=self.max_rms, where=where,
                                                         batch_idx=batch_idx, step=step),
                          "tiny_input_scale")
            self._forward(trainer, verdicts.unnormalized_rule(main, max_rms=self.max_rms, where=where,
                                                           batch_idx=batch_idx, step=step),
                          "unnormalized")
        self._forward(trainer, verdicts.constant_rule(x, main, split=split, where=where,
                                                   batch_idx=batch_idx, step=step),
                      f"constant:{split}")
        if y is not None and is_class_target(y):
            if st.classes is not None:
                self._check_targets(trainer, y, layout.target_name, split, batch_idx,
                                    dataloader_idx, step)
            if split == "train" and y.ndim == 1:
                st.count_classes(y, self.ignore_index)
                if self.probe and x.is_floating_point():
                    st.collect_probe(x, y, self.probe_examples)
        if x.is_floating_point() and x.ndim >= 1 and x.shape[0] > 0:
            (st.train_moments if split == "train" else st.val_moments).update(x)
            if split != "train":
                st.val_extremes.update(x, (dataloader_idx, batch_idx))

    def _summaries(self, trainer: pl.Trainer, layout: BatchLayout, split: str, batch_idx: int,
                   dataloader_idx: int, step: int) -> list[TensorSummary]:
        """Summarize the batch's tensors (kept in :attr:`batch_stats`) and report NaN/Inf."""
        where = verdicts.batch_place(split, batch_idx, dataloader_idx)
        summaries: list[TensorSummary] = []
        checks: list[tuple[Tensor, TensorSummary, bool]] = []
        for name, t in layout.tensors[:16]:
            if name == layout.target_name or t.layout != torch.strided:
                continue
            summary = summarize_tensor(t, name)
            summaries.append(summary)
            # other tensors may hold -inf on purpose (additive attention masks): NaN only there
            if summary.nan or (summary.inf and name == layout.input_name):
                checks.append((t, summary, False))
        target_summary = None
        if layout.targets is not None and layout.target_name is not None:
            target_summary = summarize_tensor(layout.targets, layout.target_name)
            if target_summary.nan or target_summary.inf:
                checks.append((layout.targets, target_summary, True))
        for t, summary, target in checks:
            code = "data.nonfinite_target" if target else "data.nonfinite_input"
            if f"{code}:{split}:{summary.name}" not in self.state.reported:
                self._forward(trainer, verdicts.nonfinite_rule(t, summary, target=target, split=split,
                                                            where=where, batch_idx=batch_idx,
                                                            step=step),
                              f"{code}:{split}:{summary.name}")
        if len(self.state.batch_stats) < 2 * self.num_batches:
            self.state.batch_stats.append({
                "split": split, "batch_idx": batch_idx, "dataloader_idx": dataloader_idx,
                "global_step": step,
                "tensors": [s.to_dict() for s in summaries]
                + ([target_summary.to_dict()] if target_summary is not None else []),
            })
        return summaries

    def _check_targets(self, trainer: pl.Trainer, y: Tensor | None, name: str | None, split: str,
                       batch_idx: int, dataloader_idx: int, step: int) -> None:
        classes = self.state.classes
        if y is None or classes is None or not is_class_target(y) or y.numel() == 0:
            return
        if "data.target_out_of_range" in self.state.reported:
            return
        self._forward(trainer, verdicts.target_range_rule(
            y, classes, source=self.state.classes_source, inferred=self.num_classes is None,
            ignore_index=self.ignore_index, name=name, split=split,
            where=verdicts.batch_place(split, batch_idx, dataloader_idx), batch_idx=batch_idx,
            step=step), "data.target_out_of_range")

    # ------------------------------------------------------------------ fingerprints
    def _fingerprint(self, trainer: pl.Trainer, layout: BatchLayout, split: str, batch_idx: int,
                     dataloader_idx: int, step: int) -> None:
        x, name, st = layout.inputs, layout.input_name, self.state
        assert x is not None
        assert name is not None
        if x.ndim == 0 or x.shape[0] == 0:
            return
        fps = example_fingerprints(x)
        n = len(fps)
        where = verdicts.batch_place(split, batch_idx, dataloader_idx)
        repeats, largest = duplicate_stats(fps)
        self._forward(trainer, verdicts.duplicates_rule(
            n, repeats, largest, per_example=x[0].numel(), fraction=self.duplicate_fraction,
            name=name, split=split, where=where, batch_idx=batch_idx, step=step),
            f"duplicates:{split}")
        if split != "train":
            for i, fp in enumerate(fps):
                st.val_fps.add(fp, (batch_idx, i, dataloader_idx))
            return
        whole = batch_fingerprint(fps)
        previous = st.epoch_batches.get(whole)
        self._forward(trainer, verdicts.repeated_batch_rule(
            previous, n, largest, name=name, where=where, batch_idx=batch_idx, step=step,
            epoch=trainer.current_epoch), "repeated_batch")
        if previous is None:
            st.epoch_batches.add(whole, (batch_idx, step))
        for i, fp in enumerate(fps):
            st.train_fps.add(fp, (batch_idx, i))

    # ------------------------------------------------------------------ across batches
    def _evaluate(self, trainer: pl.Trainer, *, final: bool, epoch_end: bool = False,
                  shift_only: bool = False) -> None:
        st = self.state
        if "shift" not in st.done and st.train_moments.count >= 64 and st.val_moments.count >= 32:
            shift = input_shift(st.train_moments, st.val_moments)
            if shift is not None:
                st.done.add("shift")
                self._forward(trainer, verdicts.shift_rule(shift, st.train_moments.count,
                                                        st.val_moments.count))
        if "outlier" not in st.reported and st.train_moments.count >= 64 \
                and st.val_moments.count >= 32:
            # a validation value far outside the training data: judged again as more validation
            # batches are inspected, reported once
            self._forward(trainer, verdicts.val_outlier_rule(
                val_outlier(st.train_moments, st.val_extremes), st.train_moments.count),
                "outlier")
        # `Trainer(overfit_batches=...)`: validating on the batches it trains on is what the
        # user asked for (issue 35)
        overfitting = bool(getattr(trainer, "overfit_batches", 0) or 0)
        if "overlap" not in st.reported and len(st.train_fps) and len(st.val_fps) \
                and not overfitting:
            self._forward(trainer, verdicts.overlap_rule(st.train_fps, st.val_fps), "overlap")
        if shift_only:
            return
        window_done = st.train_inspected >= self.num_batches or epoch_end or final
        if (window_done and "imbalance" not in st.done
                and sum(st.class_totals.values()) >= 64):
            st.done.add("imbalance")
            self._forward(trainer, verdicts.imbalance_rule(st.class_totals, st.batch_classes,
                                                        st.classes, st.train_inspected))
        if (self.probe and "probe" not in st.done
                and (st.probe_count >= self.probe_examples
                     or (window_done and st.probe_count >= min(512, self.probe_examples)))):
            st.done.add("probe")
            self._evaluate_probe(trainer)

    def _evaluate_probe(self, trainer: pl.Trainer) -> None:
        st = self.state
        if not st.probe_x:
            return
        x, y = torch.cat(st.probe_x), torch.cat(st.probe_y)
        st.probe_x, st.probe_y = [], []
        result = label_signal(x, y)
        if result is None:
            return
        st.probe_detail = verdicts.probe_detail(result)
        self.detail = self._describe()
        self._forward(trainer, verdicts.misalignment_rule(result))

    # ------------------------------------------------------------------ class count capture
    def _arm(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._capture = HeadCapture()
        self._capture.start(pl_module, None,
                            wrap=lambda hook: self.guard_hook(trainer, "forward hook", hook),
                            on_forward=lambda: self._learn_classes(trainer))

    def _learn_classes(self, trainer: pl.Trainer) -> None:
        """Take the class count from the model output captured so far, then check the batch."""
        captured = None if self._capture is None else self._capture.captured
        last, st = self._last, self.state
        if st.classes is not None or captured is None or captured.output is None or last is None:
            return
        targets = last.get("targets")
        if targets is None:
            return
        inferred = infer_task(captured.output, targets, self.ignore_index)
        if (inferred is None or inferred[0] not in ("multiclass", "sequence")
                or inferred[1] is None or inferred[1] < 2):
            return
        st.classes = int(inferred[1])
        layer = captured.module_name or type(trainer.lightning_module).__name__
        st.classes_source = (f"the model's output width ({tuple(captured.output.shape)} from "
                             f"`{layer}`)")
        self._check_targets(trainer, targets, last["target_name"], last["split"],
                            last["batch_idx"], last["dataloader_idx"], last["global_step"])

    def _finish_capture(self, trainer: pl.Trainer) -> None:
        if self._capture is None:
            return
        try:
            self._learn_classes(trainer)
            captured = self._capture.captured
            if self.state.classes is None and captured is not None and captured.output is not None:
                self.state.no_class_count = True  # e.g. a binary head: stop arming hooks
        finally:
            self._close_capture()

    def _close_capture(self) -> None:
        if self._capture is not None:
            self._capture.close()
            self._capture = None

    @override
    def remove_handles(self) -> None:
        super().remove_handles()
        self._close_capture()

    # ------------------------------------------------------------------ state
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(_capture=None, _last=None)
        return state

    @override
    def report_details(self) -> dict[str, Any]:
        return {"first_batch": dict(self.state.sample)} if self.state.sample else {}

    @override
    def extra_state(self) -> dict[str, Any]:
        return self.state.state_dict()

    @override
    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.state.load_state_dict(state)


__all__ = ["BatchInspector"]
