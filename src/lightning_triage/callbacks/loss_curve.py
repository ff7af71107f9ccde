"""Stage 7 (curve): what does the loss curve's shape say about the learning rate?

Also the long-run loss watch: loss spikes and late divergence for the whole run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import lightning.pytorch as pl
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from typing_extensions import override

from lightning_triage._compat import StepCounter, is_overridden, step_counter
from lightning_triage.callbacks._args import (
    BundleArg,
    bundle_window_cap,
    check_batch_keys,
    check_bool,
    check_int,
    fail,
    passes,
)
from lightning_triage.callbacks._monitor import (
    WindowMixin,
    handled_by,
    log_finding,
    log_to_loggers,
    scalar,
    validate_window,
)
from lightning_triage.callbacks._shared import loss_from_outputs, validate_task
from lightning_triage.callbacks._step import RowBuffer, StepState
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.functional.batch import BatchKey, split_batch
from lightning_triage.functional.chance import (
    IGNORE_INDEX,
    ChanceLevel,
    Task,
    resolve_chance,
)
from lightning_triage.functional.curve import CurveThresholds, classify_curve
from lightning_triage.functional.curve_verdicts import ValidationSeen
from lightning_triage.functional.curve_watch import CurveWatch
from lightning_triage.functional.hooks import HeadCapture
from lightning_triage.functional.objective import StepObjective
from lightning_triage.functional.overfit import batch_size_of
from lightning_triage.functional.series import BoundedSeries
from lightning_triage.functional.spikes import SpikeEvent, SpikeWatch
from lightning_triage.functional.verdict import Verdict
from lightning_triage.probing import step_loss


class LossCurveMonitor(TriageCallback, WindowMixin):
    """Classify the loss curve of the first epochs, then watch the loss for the whole run.

    During the window (the first ``window_epochs`` epochs or ``window_steps`` optimizer steps,
    whichever is longer, at most ``max_window_steps``) the training loss of every optimizer step
    (read from the batch outputs, undoing the division by ``accumulate_grad_batches``) and the
    validation loss of every validation run are classified by
    :func:`~lightning_triage.functional.curve.classify_curve`. The chance level comes from the
    first batch (task inferred like :class:`~lightning_triage.InitialLossCheck`, or given).

    After the window, with ``watch=True``, a
    :class:`~lightning_triage.functional.spikes.SpikeWatch` keeps robust running statistics of
    the loss and reports ``curve.loss_spike`` (step, size, level before) and ``curve.diverging``
    (a sustained rise, or NaN/Inf) for the rest of the run, marked ``"after_window": true``.

    Losses stay on the device (in a preallocated buffer) and move to the host every
    ``flush_every_n_steps`` steps (default: the smallest multiple of ``log_every_n_steps`` >= 100): no
    host synchronization per step; on CPU, where a host read is free, they are read as they
    come. Inside :class:`~lightning_triage.Triage` the loss is read once per step for this
    monitor and the gradient watch together. The
    running level and the findings go to the trainer's loggers under ``triage/``.

    Findings: ``curve.not_learning``, ``curve.lr_too_low``, ``curve.lr_too_high``,
    ``curve.diverging``, ``curve.plateau_at_chance``, ``curve.loss_spike``,
    ``curve.overfitting``, ``curve.healthy`` (info). At the end of training, for a run that
    filled a window long enough to classify: ``curve.no_validation`` (info) when no validation
    ran in the fit, ``curve.sparse_validation`` (info) when too few validation runs fell inside
    the window for the overfitting rule and validation ran less often than once per epoch.
    ``curve.overfitting`` is not reported under ``Trainer(overfit_batches=...)``; its evidence
    names the user's ``EarlyStopping``/``ModelCheckpoint`` on the validation loss
    (``handled_by``), which make it info (see :mod:`lightning_triage.ranking`).

    Args:
        task: ``"auto"`` (infer from the first batch), ``"multiclass"``, ``"binary"``,
            ``"regression"`` or ``"sequence"``.
        num_classes: class count (vocabulary size for ``"sequence"``).
        ignore_index: target value excluded from class statistics.
        input_key: where the inputs are in a batch the defaults do not understand (a key, an
            index or a callable ``batch -> tensor``).
        target_key: where the targets are (for the chance level), likewise.
        window_epochs: epochs in the window (the window is the longer of the two).
        window_steps: optimizer steps in the window.
        max_window_steps: the window ends here whatever ``window_epochs`` says.
        watch: keep watching for loss spikes and divergence after the window.
        flush_every_n_steps: optimizer steps between host reads (default: the smallest multiple of
            ``log_every_n_steps`` that is at least 100).
        val_key: the logged metric holding the validation loss when ``validation_step`` returns
            none (default: a ``callback_metrics`` key with "val" and "loss" in its name).
        max_points: length bound of the ``train_loss``/``val_loss`` series in the report.
        strict: raise internal errors instead of disabling the check.

    Raises:
        TriageConfigError: for invalid arguments (the message names the argument).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[LossCurveMonitor(window_steps=300)])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.LossCurveMonitor
                  init_args: {window_epochs: 2, window_steps: 200}
    """

    stage: ClassVar[str] = "curve"
    codes: ClassVar[tuple[str, ...]] = ("curve.not_learning", "curve.lr_too_low", "curve.lr_too_high",
        "curve.diverging", "curve.plateau_at_chance", "curve.loss_spike", "curve.overfitting",
        "curve.healthy", "curve.no_validation", "curve.sparse_validation")
    # how `Triage` builds this check (TriageCallback.bundle_args)
    bundle_args: ClassVar[Mapping[str, BundleArg]] = {
        **passes("task", "num_classes", "input_key", "target_key", "window_epochs",
                 "window_steps", "watch"),
        "max_window_steps": bundle_window_cap}

    state_key_args = ("task", "num_classes", "window_epochs", "window_steps", "val_key")
    #: the per-epoch view of the trainer's step counter (see `TriageCallback.unpicklable`)
    unpicklable: ClassVar[tuple[str, ...]] = ("_steps",)

    def __init__(
        self,
        *,
        task: Task = "auto",
        num_classes: int | None = None,
        ignore_index: int = IGNORE_INDEX,
        input_key: BatchKey | None = None,
        target_key: BatchKey | None = None,
        window_epochs: int = 2,
        window_steps: int = 200,
        max_window_steps: int = 5000,
        watch: bool = True,
        flush_every_n_steps: int | None = None,
        val_key: str | None = None,
        max_points: int = 1000,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        validate_task(task, num_classes)
        validate_window(window_epochs, window_steps, max_window_steps, flush_every_n_steps, max_points)
        check_int("ignore_index", ignore_index)
        check_batch_keys(input_key=input_key, target_key=target_key)
        check_bool("watch", watch)
        if val_key is not None and not isinstance(val_key, str):
            raise fail("val_key", val_key, "a metric name or None")
        self.task = task
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.input_key = input_key
        self.target_key = target_key
        self.window_epochs = window_epochs
        self.window_steps = window_steps
        self.max_window_steps = max_window_steps
        self.watch = watch
        self.flush_every_n_steps = flush_every_n_steps
        self.val_key = val_key
        self.max_points = max_points
        self.thresholds = CurveThresholds()
        self.chance: ChanceLevel | None = None
        #: the per-step reads (shared with the other watches inside the ``Triage`` bundle)
        self.step_state = StepState()
        self._reset_state()

    def _reset_state(self) -> None:
        self.window_closed = False
        self.train: list[float] = []
        self.train_steps: list[int] = []
        self.val: list[tuple[int, float]] = []
        self.val_examples = 0  # examples in one validation run (the overfitting test's noise)
        self.watcher: SpikeWatch | None = None
        self.train_series = BoundedSeries(self.max_points)
        self.val_series = BoundedSeries(self.max_points)
        #: what of the curve's verdicts to report (the policy, in the functional core)
        self.curve_watch = CurveWatch()
        self._buf: RowBuffer | None = None  # this chunk's losses, on the device on accelerators
        self._scale_by = 1
        self._flush_n: int | None = None
        self._val_sum: Tensor | None = None
        self._val_n = 0
        self._capture = HeadCapture()
        self._objective = StepObjective()
        #: why a shape could not be judged against the objective (its chance level unknown)
        self.objective_note = ""
        #: the objective's loss is noisy by nature (a fresh draw per step, in-batch negatives)
        self.noisy = False
        #: the objective's per-batch loss is heavy-tailed by design (a robust loss)
        self.heavy_tailed = False
        self._chance_read = False  # the first step's chance level was read (or never will be)
        self._steps: StepCounter | None = None
        self._val_runs = 0
        self._window_n = 0

    # ------------------------------------------------------------------ chance level
    def _scale(self) -> float | None:
        return self.chance.value if self.chance is not None and self.chance.value > 0 else None

    def _make_watcher(self) -> SpikeWatch:
        th = self.thresholds
        scale = self._scale() or (abs(self.train[0]) if self.train and math.isfinite(
            self.train[0]) and self.train[0] != 0 else 1.0)
        return SpikeWatch(z=th.spike_z, ratio=th.spike_ratio, min_jump=th.spike_jump_frac * scale,
                          warmup=th.spike_warmup, window=128, patience=16)

    @override
    @guarded
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.chance is not None or self.train or batch_idx != 0 or trainer.global_step != 0:
            return
        targets = split_batch(batch, self.input_key, self.target_key).targets
        self._capture.start(pl_module, targets, hooks=self.task == "auto",
                            wrap=lambda hook: self.guard_hook(trainer, "forward hook", hook))
        if self.task == "auto":  # the chance level is that of the loss the step calls
            self._objective.start(pl_module)

    @override
    @guarded
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           loss: Tensor) -> None:
        self._objective.stop(loss)

    @override
    def needs_hook(self, hook: str) -> bool:
        if hook == "on_before_backward":  # only to stop the first step's watch
            return not self._chance_read and not self.idle
        return super().needs_hook(hook)

    def _resolve_chance(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                        outputs: STEP_OUTPUT) -> None:
        self._chance_read = True
        output, targets = self._capture.finish()
        loss = loss_from_outputs(outputs, pl_module, trainer) if self._objective.active else None
        objective = self._objective.finish(None if loss is None else float(loss))
        self.heavy_tailed = objective is not None and objective.heavy_tailed
        if objective is not None and objective.noisy:
            self.noisy = True
            self.objective_note = (f"`lr_too_low` and `not_learning` not judged for "
                                   f"{objective.describe()}: per-step noise and an unknown "
                                   "floor; rises are read against that noise")
        if objective is not None and objective.recognized:
            self.chance = objective.chance_level()
            if self.chance is None and not self.noisy:
                self.objective_note = (f"`plateau_at_chance` not judged: {objective.describe()} "
                                       "has no chance level known")
            return
        try:
            self.chance = resolve_chance(self.task, self.num_classes, output, targets,
                                         self.ignore_index)
        except ValueError:
            self.chance = None
        if objective is not None and not objective.hand_written_ce and self.chance is not None \
                and self.chance.task != "regression":
            self.chance = None  # a watched step with no loss the checks know: labels make no CE

    # ------------------------------------------------------------------ per step
    @override
    @guarded
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._steps = step_counter(trainer)

    @override
    @guarded
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: STEP_OUTPUT, batch: Any, batch_idx: int) -> None:
        if self._capture.active:
            self._resolve_chance(trainer, pl_module, outputs)
        if self.window_closed and not self.watch:
            return
        # one value per optimizer step: the last micro-batch of an accumulation cycle
        accumulate = trainer.accumulate_grad_batches if pl_module.automatic_optimization else 1
        if (batch_idx + 1) % accumulate and not trainer.is_last_batch:
            return
        loss, value = self.step_state.loss(outputs)
        if loss is None:
            return
        buf = self._buf
        if buf is not None and buf.host != (value is not None):  # resumed on another device
            self._flush(trainer)
            buf = None
        if buf is None:
            buf = self._buf = RowBuffer(1, self.flush_interval(trainer) + 8, loss.device,
                                        host=value is not None)
        # the accumulation factor is applied on the host at the flush (no op per step)
        self._scale_by = accumulate
        step = trainer.global_step if self._steps is None else self._steps.completed
        i = buf.next_row(max(step - 1, 0))
        if buf.data is None:
            buf.rows[i] = [value]  # type: ignore[list-item]
        else:
            buf.data[i, 0].fill_(loss.to(buf.device))
        if buf.n >= self.flush_interval(trainer):
            self._flush(trainer)

    def _flush(self, trainer: pl.Trainer, epoch_done: bool = False) -> None:
        if self._buf is not None and self._buf.n:
            steps, rows = self._buf.take()
            values = (rows[:, 0] * self._scale_by).tolist()
            self.mark_ran()
            self._consume(trainer, steps, values)
        if not self.window_closed and self.train and self.window_over(
                trainer, len(self.train), epoch_done):
            self._close_window(trainer)

    def _consume(self, trainer: pl.Trainer, steps: list[int], values: list[float]) -> None:
        self.train_series.extend(steps, values)
        if not self.window_closed:
            room = self.max_window_steps - len(self.train)
            self.train.extend(values[:room])
            self.train_steps.extend(steps[:room])
            self._report(trainer, self._classify(final=False), after_window=False)
        if self.watch:
            if self.watcher is None:
                self.watcher = self._make_watcher()
            events = self.watcher.update(values, start_step=steps[0])
            if self.window_closed:
                self._report_events(trainer, events, steps, values)
            if values:
                log_to_loggers(trainer, {"triage/loss_level": self.watcher.level}
                               if math.isfinite(self.watcher.level) else {}, steps[-1])

    def _classify(self, final: bool) -> list[Verdict]:
        prior = self.chance.prior if self.chance is not None and self.chance.task != "regression" \
            else None
        return classify_curve(self.train, steps=self.train_steps, val=self.val,
                              chance=self._scale(), prior=prior, final=final,
                              thresholds=self.thresholds, val_examples=self.val_examples or None,
                              noisy=self.noisy, heavy_tailed=self.heavy_tailed)

    def _close_window(self, trainer: pl.Trainer, complete: bool = True) -> None:
        verdicts = self._classify(final=True)
        self._report(trainer, verdicts, after_window=False)
        n = self._window_n = len(self.train)
        shape = next((v.code.split(".", 1)[1] for v in verdicts), None)
        if shape is None:
            shape = ("healthy" if n >= self.thresholds.min_steps else
                     f"too short to classify (fewer than {self.thresholds.min_steps} values)")
        self.detail = (f"window of {n} steps ({self.train_steps[0]}-{self.train_steps[-1]})"
                       f"{'' if complete else ' (run ended inside the window)'}: {shape}"
                       + (f"; {self.objective_note}" if self.objective_note else ""))
        self.window_closed = True
        self.train, self.train_steps = [], []  # the window's values are no longer needed

    # ------------------------------------------------------------------ findings
    @property
    def counts(self) -> dict[str, int]:
        """Loss spikes and divergences seen after the window."""
        return self.curve_watch.counts

    def _report(self, trainer: pl.Trainer, verdicts: list[Verdict], after_window: bool) -> None:
        for v in self.curve_watch.window(verdicts, held=[f.code for f in self.findings],
                                         memorizing=bool(getattr(trainer, "overfit_batches", 0))):
            extra: dict[str, Any] = {}
            if v.code == "curve.overfitting":
                extra["handled_by"] = handled_by(trainer, self.val_key)
            finding = self.add_verdict(trainer, v, after_window=after_window,
                                       chance=None if self.chance is None else self.chance.value,
                                       **extra)
            log_finding(trainer, finding, scalar(v.evidence, "ratio"))

    def _report_events(self, trainer: pl.Trainer, events: list[SpikeEvent], steps: list[int],
                       values: list[float]) -> None:
        for v in self.curve_watch.late(events, steps, values, self.thresholds):
            finding = self.add_verdict(trainer, v)
            log_finding(trainer, finding, scalar(finding.evidence, "ratio"))

    # ------------------------------------------------------------------ validation
    @override
    @guarded
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._val_sum, self._val_n = None, 0
        self._val_count = 0

    @override
    @guarded
    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                outputs: STEP_OUTPUT, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        if trainer.sanity_checking or dataloader_idx != 0:
            return
        self._val_count = getattr(self, "_val_count", 0) + (batch_size_of(batch) or 0)
        loss = step_loss(outputs)
        if loss is not None:
            loss = loss.detach().float()
            self._val_sum = loss if self._val_sum is None else self._val_sum + loss
            self._val_n += 1

    def _val_from_metrics(self, trainer: pl.Trainer) -> float | None:
        metrics = trainer.callback_metrics
        key = self.val_key
        if key is None:
            candidates = sorted(k for k in metrics if "val" in k.lower() and "loss" in k.lower()
                                and not k.startswith("triage/"))
            key = next((k for k in candidates if k in ("val_loss", "val/loss")),
                       candidates[0] if candidates else None)
        if key is None or key not in metrics:
            return None
        value = metrics[key]
        return float(value) if isinstance(value, (Tensor, float, int)) else None

    @override
    @guarded
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.global_step == 0:
            return
        if self._val_sum is not None and self._val_n:
            value: float | None = float(self._val_sum) / self._val_n
        else:
            value = self._val_from_metrics(trainer)
        self._val_sum, self._val_n = None, 0
        self._val_runs += 1
        self.val_examples = getattr(self, "_val_count", 0) or self.val_examples
        if value is None:
            return
        step = trainer.global_step - 1
        self.val_series.append(step, value)
        if self.window_closed:
            return
        self.val.append((step, value))
        self._flush(trainer)
        if not self.window_closed:
            self._report(trainer, self._classify(final=False), after_window=False)

    # ------------------------------------------------------------------ epoch / end
    @override
    @guarded
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._flush(trainer, epoch_done=True)

    @override
    @guarded
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._flush(trainer)
        if not self.window_closed and self.train:
            self._close_window(trainer, complete=False)
        self._report_validation(trainer, pl_module)
        if self.watch and self.watcher is not None:
            self.detail += (f"; watch: {self.counts['spikes_after_window']} spike(s), "
                            f"{self.counts['divergences_after_window']} divergence(s) after the "
                            "window")

    def _report_validation(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Info findings when the window could not show overfitting: no validation at all, or
        too few validation runs inside the window (judged once the window held enough steps to
        classify the curve)."""
        verdict = self.curve_watch.validation(ValidationSeen(
            runs=self._val_runs, losses=len(self.val_series), in_window=len(self.val),
            window_steps=self._window_n, epochs=trainer.current_epoch,
            module=type(pl_module).__name__,
            has_validation_step=is_overridden("validation_step", pl_module),
            limit_val_batches_zero=trainer.limit_val_batches == 0,
            has_val_loader=trainer.val_dataloaders is not None,
            check_val_every_n_epoch=trainer.check_val_every_n_epoch,
            val_check_interval=trainer.val_check_interval), held=[f.code for f in self.findings],
            thresholds=self.thresholds)
        if verdict is not None:
            log_finding(trainer, self.add_verdict(trainer, verdict))

    @override
    def series(self) -> dict[str, list[list[float]]]:
        out = {"train_loss": self.train_series.to_list()}
        if len(self.val_series):
            out["val_loss"] = self.val_series.to_list()
        return out

    @override
    def report_details(self) -> dict[str, Any]:
        if self.chance is None:
            return {}
        return {"chance": {"chance": self.chance.value, "task": self.chance.task,
                           "formula": self.chance.describe()}}

    # ------------------------------------------------------------------ hooks and state
    @override
    def remove_handles(self) -> None:
        super().remove_handles()
        self._capture.close()
        self._objective.close()

    @override
    def extra_state(self) -> dict[str, Any]:
        steps, rows = ([], None) if self._buf is None else self._buf.peek()
        pending = [] if rows is None else (rows[:, 0] * self._scale_by).tolist()
        return {
            "window_closed": self.window_closed, "train": list(self.train),
            "train_steps": list(self.train_steps), "val": [list(v) for v in self.val],
            "val_examples": self.val_examples,
            "chance": None if self.chance is None else vars(self.chance),
            "watcher": None if self.watcher is None else self.watcher.state_dict(),
            "train_series": self.train_series.state_dict(),
            "val_series": self.val_series.state_dict(), **self.curve_watch.state_dict(),
            "pending": pending, "pending_steps": steps,
            "val_runs": self._val_runs, "window_n": self._window_n,
            "objective_note": self.objective_note, "noisy": self.noisy,
            "heavy_tailed": self.heavy_tailed,
        }

    @override
    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self._reset_state()
        self.window_closed = bool(state.get("window_closed", False))
        self.train = [float(v) for v in state.get("train", [])]
        self.train_steps = [int(s) for s in state.get("train_steps", [])]
        self.val = [(int(s), float(v)) for s, v in state.get("val", [])]
        self.val_examples = int(state.get("val_examples", 0))
        chance = state.get("chance")
        self.chance = None if chance is None else ChanceLevel(**chance)
        if state.get("watcher") is not None:
            self.watcher = self._make_watcher()
            self.watcher.load_state_dict(state["watcher"])
        self.train_series.load_state_dict(state.get("train_series", {}))
        self.val_series.load_state_dict(state.get("val_series", {}))
        self.curve_watch.load_state_dict(state)
        pending = [float(v) for v in state.get("pending", [])]
        if pending:  # already scaled; read on the host
            self._buf = RowBuffer(1, len(pending) + 8)
            for s, v in zip(state.get("pending_steps", []), pending, strict=False):
                self._buf.rows[self._buf.next_row(int(s))] = [v]
        self._val_runs = int(state.get("val_runs", 0))
        self._window_n = int(state.get("window_n", 0))
        self.objective_note = str(state.get("objective_note", ""))
        self.noisy = bool(state.get("noisy", False))
        self.heavy_tailed = bool(state.get("heavy_tailed", False))
        self._chance_read = True  # a resumed run does not read it again


__all__ = ["LossCurveMonitor"]
