"""Stage 4 (overfit): can the model memorize one small batch?"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn.modules.dropout import _DropoutNd
from torch.optim import Optimizer
from torchmetrics import Metric
from typing_extensions import override

from lightning_triage._compat import (
    metric_state,
    set_metric_state,
    train_step_context,
    training_step_args,
)
from lightning_triage.callbacks._args import BundleArg, check_batch_keys, check_int, check_number, passes
from lightning_triage.callbacks._progress import progress
from lightning_triage.callbacks._shared import sharded_strategy, validate_task
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.functional.batch import BatchKey, split_batch
from lightning_triage.functional.chance import IGNORE_INDEX, Task
from lightning_triage.functional.hooks import capture_last_output, grad_enabled_calls
from lightning_triage.functional.objective import ObjectiveWatch
from lightning_triage.functional.overfit import (
    OverfitVerdict,
    batch_size_of,
    plateaued,
    predictions_right,
    slice_batch,
)
from lightning_triage.functional.overfit_verdicts import (
    ProbeRun,
    conclude_probe,
    set_reference,
    skipped_verdict,
)
from lightning_triage.functional.wiring import group_by_module
from lightning_triage.probing import (
    Probe,
    ProbeUnavailableError,
    UserCodeError,
    copy_optimizer,
    count_step_call,
    probe_module,
    rng_state,
    set_rng_state,
    step_loss,
    user_code,
)

#: Probe steps between two plateau tests (a failing probe stops early).
PLATEAU_EVERY = 25


def _is_regularizer(module: nn.Module) -> bool:
    """Modules the probe switches to eval: dropout layers and attention with dropout."""
    if isinstance(module, _DropoutNd):
        return True
    return isinstance(module, nn.MultiheadAttention) and module.dropout > 0


def _copy_value(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, list):
        return [_copy_value(v) for v in value]
    return copy.copy(value)


@contextmanager
def preserved_attributes(module: nn.Module) -> Iterator[None]:
    """Restore what a ``training_step`` may change beyond parameters and buffers.

    Public attributes of the module holding lists, dicts, sets, numbers, strings or tensors
    (e.g. ``self.training_step_outputs.append(loss)``, a step counter) and the states of
    torchmetrics metrics updated in ``training_step``. Public attributes created inside the
    block are deleted.

    Example:
        >>> net = nn.Linear(2, 2)
        >>> net.outputs = []
        >>> with preserved_attributes(net):
        ...     net.outputs.append(1)
        >>> net.outputs
        []
    """
    saved: dict[str, tuple[Any, Any]] = {}
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        if isinstance(value, (list, dict, set)):
            saved[name] = (value, copy.copy(value))
        elif isinstance(value, (int, float, str, bool, Tensor)) or value is None:
            saved[name] = (value, _copy_value(value))
    metrics: list[tuple[nn.Module, dict[str, Any]]] = []
    for sub in module.modules():
        if isinstance(sub, Metric):
            metrics.append((sub, {k: _copy_value(v) for k, v in metric_state(sub).items()}))
    present = set(vars(module))
    try:
        yield
    finally:
        for name in set(vars(module)) - present:
            if not name.startswith("_"):  # attributes the probe's `training_step` created
                delattr(module, name)
        for name, (original, snapshot) in saved.items():
            current: Any = vars(module).get(name)
            value = original
            if isinstance(value, list) and current is value:
                value[:] = snapshot
            elif isinstance(value, (dict, set)) and current is value:
                value.clear()
                value.update(snapshot)
            elif isinstance(value, Tensor) and current is value:
                with torch.no_grad():
                    value.copy_(snapshot)
            else:
                setattr(module, name, original)
        for metric, state in metrics:
            set_metric_state(metric, state)


def _frozen_owners(module: nn.Module) -> set[str]:
    """The submodules (not the root) that hold frozen parameters of their own."""
    return {name for name, sub in module.named_modules() if name and any(
        not p.requires_grad for p in sub.parameters(recurse=False))}


def _note_params(run: ProbeRun, params: list[tuple[str, nn.Parameter]], held: set[int],
                 off_path: set[str]) -> dict[str, int]:
    """Record the frozen parameters that can hold the loss back (those of a submodule in
    ``off_path``, never called with gradients enabled, cannot: a teacher under ``no_grad``) and
    those in no param group; the trainable ones' sizes."""
    trainable = {n: p.numel() for n, p in params if p.requires_grad}
    frozen = {n: p.numel() for n, p in params if not p.requires_grad}
    on_path = [n for n in frozen if n.rpartition(".")[0] not in off_path]
    run.frozen = group_by_module(on_path, {**trainable, **frozen}) if on_path else []
    outside = [n for n, p in params if p.requires_grad and id(p) not in held]
    run.outside_optimizer = group_by_module(outside, trainable) if outside else []
    return trainable


def _bundle_min_steps(args: Mapping[str, Any]) -> int:
    """``min_steps`` in the ``Triage`` bundle: 30, or all of ``overfit_max_steps`` when fewer."""
    steps = args["overfit_max_steps"]
    return min(30, steps) if isinstance(steps, int) else 30


class OverfitBatchCheck(TriageCallback):
    """Train on a few examples of the first batch alone: a healthy setup memorizes them.

    At the first training batch (step 0), the first ``batch_size`` examples of that batch are
    taken (every tensor of the batch is sliced along dim 0; the user's dataloaders are never
    iterated) and the model is trained on them alone for up to ``max_steps`` steps, with the
    user's own ``training_step`` (so the real loss is tested), a fresh optimizer of the user's
    type and hyperparameters (weight decay 0; learning rate before any scheduler warmup), and
    dropout layers in eval mode. Every step starts from the same random state, so an objective
    that draws in its step (a noise, a mask, a timestep, a mix) sees the same draw each time. The
    probe stops early once the loss is near zero: ``tolerance`` times the chance level (the
    chance level of the loss the step calls, see :mod:`~lightning_triage.functional.objective`;
    else inferred from the output and targets, or from ``task``/``num_classes``), else times the
    starting loss, above the objective's memorization floor (soft targets: their own entropy).
    An objective with no floor the probe can reach (a fresh draw per step, in-batch negatives)
    is never ``overfit.failed`` for a plateau: ``overfit.inconclusive`` (info) names it.

    The probe trains a deep copy of the LightningModule (:func:`~lightning_triage.probing.
    probe_module`; the trainer, loggers and datamodule are shared), so nothing the module holds
    (weights, buffers, attributes, hidden states, metrics, lists, generators) changes in the
    real run; every global RNG is put back. Its optimizer is a copy of the user's with empty
    state (the constructor is not run again). When the copy, its gradients and that optimizer
    state (about 4x the parameters and buffers) would exceed half the free memory, the probe
    runs on the live module under a complete snapshot (1x, restored afterwards). The trainer's
    loggers receive nothing and ``self.log`` is swallowed; side effects outside the module
    (files, prints) happen on each of the probe's ``training_step`` calls, counted in the
    finding's ``evidence["training_step_calls"]``. An exception raised by the user's code
    stops the probe (``overfit.skipped`` names it); the real step then runs as usual. Its cost is
    bounded: one step is timed and the probe is skipped when ``min_steps`` steps would exceed
    ``time_budget``; it stops when the budget is spent. Manual optimization is skipped (the
    probe cannot replace the optimizer steps taken inside ``training_step``).

    Findings: ``overfit.passed`` (info), ``overfit.failed`` (with the curve's numbers and the
    likely cause: loss not connected, broken gradient path, frozen layers, parameters missing
    from the optimizer, a loss bounded away from zero such as cross-entropy on
    probabilities, a non-finite or rising loss), ``overfit.loss_on_probabilities`` (the loss
    applies log-softmax to outputs that are already probabilities), ``overfit.loss_floor``
    (every probed example predicted right, but the loss settles on a floor at least half the
    chance level: label smoothing, a penalty term; info in the report unless a larger learning
    rate, tried on a copy, did not cure a slow loss), ``overfit.inconclusive`` and
    ``overfit.skipped`` (info).

    Args:
        batch_size: examples to memorize (the first ones of the first batch).
        max_steps: most probe steps.
        time_budget: seconds the probe may take.
        tolerance: "near zero" is this fraction of the chance level (or of the start loss).
        min_steps: skip the probe when this many steps would not fit in ``time_budget``.
        task: as for :class:`InitialLossCheck` (``"auto"`` infers it).
        num_classes: class count (vocabulary size for ``"sequence"``).
        input_key: where the inputs are in a batch the defaults do not understand (a key, an
            index or a callable ``batch -> tensor``).
        target_key: where the targets are (for the chance level), likewise.
        strict: raise internal errors instead of disabling the check.

    Raises:
        TriageConfigError: for arguments out of range, naming the argument.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[OverfitBatchCheck(batch_size=8, max_steps=300)])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.OverfitBatchCheck
                  init_args: {batch_size: 8, max_steps: 300, time_budget: 5.0}
    """

    stage: ClassVar[str] = "overfit"
    codes: ClassVar[tuple[str, ...]] = ("overfit.failed", "overfit.loss_on_probabilities",
        "overfit.passed", "overfit.loss_floor", "overfit.inconclusive", "overfit.skipped")
    # how `Triage` builds this check (TriageCallback.bundle_args)
    bundle_args: ClassVar[Mapping[str, BundleArg]] = {
        "batch_size": "overfit_batch_size", "max_steps": "overfit_max_steps",
        "time_budget": "overfit_time_budget", "min_steps": _bundle_min_steps,
        **passes("task", "num_classes", "input_key", "target_key")}
    bundle_switch: ClassVar[str | None] = "overfit"

    state_key_args = ("batch_size", "task", "num_classes", "input_key", "target_key")

    def __init__(
        self,
        *,
        batch_size: int = 8,
        max_steps: int = 300,
        time_budget: float = 5.0,
        tolerance: float = 0.05,
        min_steps: int = 30,
        task: Task = "auto",
        num_classes: int | None = None,
        input_key: BatchKey | None = None,
        target_key: BatchKey | None = None,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        validate_task(task, num_classes)
        check_int("batch_size", batch_size, 1)
        check_int("max_steps", max_steps, 2)
        check_number("time_budget", time_budget, 0, unit="seconds")
        check_number("tolerance", tolerance, 0, 1)
        check_int("min_steps", min_steps, 1, max_steps)
        check_batch_keys(input_key=input_key, target_key=target_key)
        self.batch_size = batch_size
        self.max_steps = max_steps
        self.time_budget = float(time_budget)
        self.tolerance = float(tolerance)
        self.min_steps = min_steps
        self.task = task
        self.num_classes = num_classes
        self.input_key = input_key
        self.target_key = target_key
        self.verdict: OverfitVerdict | None = None
        self.curve: list[list[float]] = []
        self._attempted = False

    # ------------------------------------------------------------------ hooks
    @override
    @guarded
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self._attempted or trainer.global_step != 0:
            self.idle = True  # the probe runs at the first step of a fit or not at all
            return
        self._attempted = True
        if not pl_module.automatic_optimization:
            self._skipped(trainer, "manual optimization: the probe cannot replace the optimizer "
                                   "steps taken inside `training_step`")
            return
        sharded = sharded_strategy(trainer)
        if sharded is not None:
            self._skipped(trainer, f"parameters are sharded/flattened under `{sharded}`: the "
                                   "probe cannot run `training_step` outside the strategy")
            return
        small = slice_batch(batch, self.batch_size)
        examples = batch_size_of(small)
        if examples is None:
            self._skipped(trainer, "no tensor with a batch dimension found in the first batch")
            return
        run = ProbeRun(examples=examples)
        start = time.perf_counter()
        try:
            # the copy, its gradients and a fresh optimizer state of up to two moments
            with progress(trainer, "overfit probe on a copy", self.time_budget), \
                    probe_module(trainer, pl_module, trainer.optimizers, factor=4.0) as probe:
                run.isolation = probe.how
                self._probe(trainer, probe, small, run)
        except ProbeUnavailableError as exc:
            self._skipped(trainer, str(exc))
            return
        run.seconds = time.perf_counter() - start
        self._conclude(trainer, run)

    # ------------------------------------------------------------------ the probe
    def _optimizer(self, trainer: pl.Trainer, probe: Probe, run: ProbeRun) -> Optimizer:
        """A fresh optimizer of the user's type and hyperparameters, weight decay 0, over the
        probed module's parameters."""
        reason = ""
        pl_module = probe.module
        if len(probe.optimizers) == 1 and not isinstance(probe.optimizers[0], torch.optim.LBFGS):
            user = probe.optimizers[0]
            try:
                optimizer = copy_optimizer(user, {id(p): p for p in pl_module.parameters()})
                for group in optimizer.param_groups:
                    if "initial_lr" in group:  # a scheduler's warmup may start the lr near 0
                        group["lr"] = group["initial_lr"]
                    if "weight_decay" in group:
                        group["weight_decay"] = 0.0
                lrs = sorted({float(g["lr"]) for g in optimizer.param_groups if "lr" in g})
                lr = ", ".join(f"{v:.3g}" for v in lrs)
                run.optimizer = f"{type(user).__name__}(lr={lr}, weight_decay=0)"
                return optimizer
            except Exception as exc:  # an optimizer that cannot be copied
                reason = f"could not copy `{type(user).__name__}` ({type(exc).__name__}: {exc})"
        elif not trainer.optimizers:
            reason = "no optimizer configured"
        elif len(trainer.optimizers) > 1:
            reason = f"{len(trainer.optimizers)} optimizers configured"
        else:
            reason = "LBFGS needs a closure"
        run.fallback = f"{reason}; used Adam(lr=1e-3) instead"
        run.optimizer = "Adam(lr=0.001)"
        return torch.optim.Adam([p for p in pl_module.parameters() if p.requires_grad], lr=1e-3)

    def _probe(self, trainer: pl.Trainer, probe: Probe, batch: Any, run: ProbeRun) -> None:
        pl_module = probe.module
        for module in pl_module.modules():
            if _is_regularizer(module):
                module.eval()
        optimizer = self._optimizer(trainer, probe, run)
        held = {id(p) for g in optimizer.param_groups for p in g["params"]}
        params = list(pl_module.named_parameters())
        trainable: dict[str, int] = {}
        args = training_step_args(pl_module, batch, 0)
        started = time.perf_counter()
        step_times: list[float] = []
        owners = _frozen_owners(pl_module)
        watch = ObjectiveWatch()  # what the step optimizes, read at its first call
        fixed = rng_state()  # every step draws the same noise, mask, timestep or mix
        for step in range(self.max_steps):
            tic = time.perf_counter()
            for _, p in params:
                p.grad = None
            if step == 0:
                with grad_enabled_calls(pl_module, owners) as called, watch:
                    output, captured = self._user_step(trainer, pl_module, args, run, step)
                if not run.error:  # after the first forward: lazy modules have sizes
                    trainable = _note_params(run, params, held, owners - called)
            else:
                set_rng_state(fixed)
                output, captured = self._user_step(trainer, pl_module, args, run, step)
            loss = step_loss(output)
            if step == 0:
                run.objective = watch.objective(
                    None if loss is None else float(loss.detach().float()),
                    None if loss is None else loss.grad_fn)
            if self._stop_everywhere(trainer, run, self._judge_loss(run, step, loss, batch,
                                                                    captured)):
                return
            assert loss is not None
            try:
                with user_code():  # the user's autograd functions, hooks and optimizer
                    loss.backward()
                    if step == 0:
                        missing = [n for n, p in params if p.requires_grad and p.grad is None]
                        run.no_grad = group_by_module(missing, trainable) if missing else []
                    optimizer.step()
            except UserCodeError as err:
                run.error = err.describe()
                self._stop_everywhere(trainer, run, "error")
                return
            step_times.append(time.perf_counter() - tic)
            if self._stop_everywhere(trainer, run, self._pace(run, step, step_times, started)):
                return
        run.step_seconds = run.step_seconds or (min(step_times) if step_times else 0.0)

    @staticmethod
    def _user_step(trainer: pl.Trainer, pl_module: pl.LightningModule, args: tuple[Any, ...],
                   run: ProbeRun, step: int) -> tuple[Any, Any]:
        """One call of the user's ``training_step`` (its output, and the model's last output
        captured at the first step and at each plateau test)."""
        captured = None
        try:
            with ExitStack() as stack:
                captured = stack.enter_context(capture_last_output(pl_module)) if (
                    step == 0 or (step + 1) % PLATEAU_EVERY == 0) else None
                stack.enter_context(train_step_context(trainer))
                stack.enter_context(user_code())
                run.calls += 1
                count_step_call()
                output = pl_module.training_step(*args)
        except UserCodeError as err:
            run.error, output = err.describe(), None
        return output, captured

    def _judge_loss(self, run: ProbeRun, step: int, loss: Tensor | None, batch: Any,
                    captured: Any) -> str:
        """Record the step's loss; why the probe stops before its backward (``""``: it goes on)."""
        if run.error:
            return "error"
        if loss is None:
            return "no_loss"
        if not loss.requires_grad:
            run.detached = True
            run.losses.append(float(loss.detach().float()))
            return "detached"
        value = float(loss.detach().float())
        run.losses.append(value)
        if step == 0:
            set_reference(run, value, split_batch(batch, self.input_key, self.target_key).targets,
                          captured.output if captured else None, task=self.task,
                          num_classes=self.num_classes, tolerance=self.tolerance,
                          objective=run.objective)
        if captured is not None and captured.output is not None and \
                run.targets is not None:  # judged by its predictions at a plateau
            run.all_right = predictions_right(captured.output, run.targets, run.class_dim,
                                              IGNORE_INDEX)
        return "done" if not math.isfinite(value) or value <= run.target else ""

    def _pace(self, run: ProbeRun, step: int, step_times: list[float], started: float) -> str:
        """Why the probe stops after a step's update (``""``: it goes on): its time budget, or a
        curve that can no longer reach the target."""
        stop = ""
        # decide on the second step (the first may pay one-time costs), unless the first
        # step alone already exceeds the budget
        if step <= 1:
            run.step_seconds = min(step_times)
            if (step == 0 and run.step_seconds > self.time_budget) or (
                    step == 1 and run.step_seconds * self.min_steps > self.time_budget):
                stop = "budget"
        elif time.perf_counter() - started + run.step_seconds > self.time_budget:
            stop = "time"
        if not stop and (step + 1) % PLATEAU_EVERY == 0:
            if run.floor is not None and run.floor > run.target:
                stop = "floor"  # decided: this loss cannot reach the target
            elif plateaued(run.losses, run.target):
                stop = "plateau"
        return stop

    @staticmethod
    def _stop_everywhere(trainer: pl.Trainer, run: ProbeRun, reason: str) -> bool:
        """Whether the probe stops now; under DDP every rank stops at the same step (the user's
        `training_step` may hold collectives), for its own reason or because another rank
        stopped (then its own curve is judged as if time ran out)."""
        stop = bool(reason)
        if trainer.world_size > 1:
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if stop and not reason:
            run.stopped = "time"
        elif reason not in ("", "done", "detached"):
            run.stopped = reason
        return stop

    # ------------------------------------------------------------------ conclusions
    def _skipped(self, trainer: pl.Trainer, why: str) -> None:
        self.skip(f"skipped: {why}")
        self.add_verdicts(trainer, [skipped_verdict(why)])

    def _conclude(self, trainer: pl.Trainer, run: ProbeRun) -> None:
        out = conclude_probe(run, tolerance=self.tolerance, max_steps=self.max_steps,
                             min_steps=self.min_steps, time_budget=self.time_budget)
        self.curve = out.curve
        if out.outcome is not None:
            self.verdict = out.outcome
        if out.ran:
            self.mark_ran(out.detail)
        else:
            self.skip(out.detail)
        self.add_verdicts(trainer, out.verdicts)

    # ------------------------------------------------------------------ report & state
    @override
    def series(self) -> dict[str, list[list[float]]]:
        return {"overfit_loss": [list(p) for p in self.curve]} if self.curve else {}

    @override
    def extra_state(self) -> dict[str, Any]:
        return {"attempted": self._attempted, "curve": self.curve}

    @override
    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self._attempted = bool(state.get("attempted", self._attempted))
        self.curve = [list(p) for p in state.get("curve", self.curve)]


__all__ = ["OverfitBatchCheck", "preserved_attributes"]
