"""Stage 4 (overfit): can the model memorize one small batch?"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.modules.dropout import _DropoutNd
from torch.optim import Optimizer
from torchmetrics import Metric
from typing_extensions import override

from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.callbacks.gradient_wiring import sharded_strategy
from lightning_triage.callbacks.initial_loss import validate_task
from lightning_triage.functional.batch import split_batch
from lightning_triage.functional.chance import IGNORE_INDEX, Task, chance_level, infer_task
from lightning_triage.functional.hooks import capture_last_output
from lightning_triage.functional.overfit import (
    OverfitVerdict,
    batch_size_of,
    judge_curve,
    judge_memorization,
    near_zero_target,
    plateaued,
    predictions_right,
    probability_floor,
    slice_batch,
)
from lightning_triage.functional.wiring import ModuleGroup, describe_groups, group_by_module
from lightning_triage.probing import (
    Probe,
    ProbeUnavailableError,
    UserCodeError,
    copy_optimizer,
    probe_module,
    step_loss,
    user_code,
)

#: Probe steps between two plateau tests (a failing probe stops early).
PLATEAU_EVERY = 25
#: At most this many points of the probe's loss curve are kept (evidence and series).
MAX_CURVE_POINTS = 60


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
            state = {k: _copy_value(v) for k, v in sub.metric_state.items()}
            extra = {k: _copy_value(getattr(sub, k)) for k in
                     ("_update_count", "_computed", "_forward_cache") if hasattr(sub, k)}
            metrics.append((sub, {**state, **extra}))
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
            for key, item in state.items():
                object.__setattr__(metric, key, item)


@dataclass
class ProbeRun:
    """What one overfit probe saw (kept for the finding's evidence and the report series)."""

    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    step_seconds: float = 0.0
    optimizer: str = ""
    fallback: str = ""
    examples: int = 0
    target: float = math.nan
    chance: float | None = None
    chance_text: str = ""
    floor: float | None = None
    targets: Tensor | None = None
    class_dim: int = -1
    all_right: bool | None = None
    detached: bool = False
    stopped: str = ""
    #: `training_step` calls the probe made (on the copy, or in place)
    calls: int = 0
    #: "copy" or "in place: why"
    isolation: str = ""
    #: the user's exception that stopped the probe ("Type: message")
    error: str = ""
    no_grad: list[ModuleGroup] = field(default_factory=list)
    frozen: list[ModuleGroup] = field(default_factory=list)
    outside_optimizer: list[ModuleGroup] = field(default_factory=list)


class OverfitBatchCheck(TriageCallback):
    """Train on a few examples of the first batch alone: a healthy setup memorizes them.

    At the first training batch (step 0), the first ``batch_size`` examples of that batch are
    taken (every tensor of the batch is sliced along dim 0; the user's dataloaders are never
    iterated) and the model is trained on them alone for up to ``max_steps`` steps, with the
    user's own ``training_step`` (so the real loss is tested), a fresh optimizer of the user's
    type and hyperparameters (weight decay 0; learning rate before any scheduler warmup), and
    dropout layers in eval mode. The probe stops early once the loss is near zero:
    ``tolerance`` times the chance level (inferred from the output and targets, or from
    ``task``/``num_classes``), else times the starting loss.

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
    probabilities, a non-finite or rising loss), ``overfit.inconclusive`` and
    ``overfit.skipped`` (info).

    Args:
        batch_size: examples to memorize (the first ones of the first batch).
        max_steps: most probe steps.
        time_budget: seconds the probe may take.
        tolerance: "near zero" is this fraction of the chance level (or of the start loss).
        min_steps: skip the probe when this many steps would not fit in ``time_budget``.
        task: as for :class:`InitialLossCheck` (``"auto"`` infers it).
        num_classes: class count (vocabulary size for ``"sequence"``).
        strict: raise internal errors instead of disabling the check.

    Raises:
        ValueError: for arguments out of range, naming the argument.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[OverfitBatchCheck(batch_size=8, max_steps=300)])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.OverfitBatchCheck
                  init_args: {batch_size: 8, max_steps: 300, time_budget: 5.0}
    """

    def __init__(
        self,
        batch_size: int = 8,
        max_steps: int = 300,
        time_budget: float = 5.0,
        tolerance: float = 0.05,
        min_steps: int = 30,
        task: Task = "auto",
        num_classes: int | None = None,
        *,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        validate_task(task, num_classes)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"`batch_size` must be an integer >= 1, got {batch_size!r}.")
        if not isinstance(max_steps, int) or max_steps < 2:
            raise ValueError(f"`max_steps` must be an integer >= 2, got {max_steps!r}.")
        if not isinstance(time_budget, (int, float)) or not time_budget > 0:
            raise ValueError(f"`time_budget` must be a number of seconds > 0, got {time_budget!r}.")
        if not isinstance(tolerance, (int, float)) or not 0 < tolerance < 1:
            raise ValueError(f"`tolerance` must be in (0, 1), got {tolerance!r}.")
        if not isinstance(min_steps, int) or not 1 <= min_steps <= max_steps:
            raise ValueError(f"`min_steps` must be an integer in [1, max_steps={max_steps}], "
                             f"got {min_steps!r}.")
        self.batch_size = batch_size
        self.max_steps = max_steps
        self.time_budget = float(time_budget)
        self.tolerance = float(tolerance)
        self.min_steps = min_steps
        self.task = task
        self.num_classes = num_classes
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
            with probe_module(trainer, pl_module, trainer.optimizers, factor=4.0) as probe:
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

        def describe_params() -> None:  # after the first forward: lazy modules have sizes then
            trainable.update({n: p.numel() for n, p in params if p.requires_grad})
            frozen = {n: p.numel() for n, p in params if not p.requires_grad}
            run.frozen = group_by_module(frozen, {**trainable, **frozen}) if frozen else []
            outside = [n for n, p in params if p.requires_grad and id(p) not in held]
            run.outside_optimizer = group_by_module(outside, trainable) if outside else []

        pass_idx = is_param_in_hook_signature(pl_module.training_step, "batch_idx", min_args=2)
        args = (batch, 0) if pass_idx else (batch,)
        started = time.perf_counter()
        step_times: list[float] = []
        for step in range(self.max_steps):
            tic = time.perf_counter()
            for _, p in params:
                p.grad = None
            captured = None
            try:
                with ExitStack() as stack:
                    captured = stack.enter_context(capture_last_output(pl_module)) if (
                        step == 0 or (step + 1) % PLATEAU_EVERY == 0) else None
                    stack.enter_context(trainer.precision_plugin.train_step_context())
                    stack.enter_context(user_code())
                    run.calls += 1
                    output = pl_module.training_step(*args)
            except UserCodeError as err:
                run.error, output = err.describe(), None
            if step == 0 and not run.error:
                describe_params()
            loss = step_loss(output)
            stop = ""
            if run.error:
                stop = "error"
            elif loss is None:
                stop = "no_loss"
            elif not loss.requires_grad:
                run.detached = True
                run.losses.append(float(loss.detach().float()))
                stop = "detached"
            else:
                value = float(loss.detach().float())
                run.losses.append(value)
                if step == 0:
                    self._reference(run, value, batch, captured.output if captured else None)
                if captured is not None and captured.output is not None and \
                        run.targets is not None:  # judged by its predictions at a plateau
                    run.all_right = predictions_right(captured.output, run.targets, run.class_dim,
                                                      IGNORE_INDEX)
                if not math.isfinite(value) or value <= run.target:
                    stop = "done"
            if self._stop_everywhere(trainer, run, stop):
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
            if self._stop_everywhere(trainer, run, stop):
                return
        run.step_seconds = run.step_seconds or (min(step_times) if step_times else 0.0)

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

    def _reference(self, run: ProbeRun, start: float, batch: Any, output: Tensor | None) -> None:
        """Chance level, the near-zero target and a probability floor, from the first step."""
        targets = split_batch(batch).targets
        task: str = self.task
        num_classes = self.num_classes
        if task == "auto":
            inferred = infer_task(output, targets)
            task, num_classes = inferred if inferred is not None else ("", None)
            num_classes = self.num_classes or num_classes
        chance = None
        try:
            if task in ("multiclass", "sequence", "binary") or (task == "regression"
                                                                 and targets is not None):
                level = chance_level(task, num_classes=num_classes, targets=targets)
                chance, run.chance_text = level.value, level.describe()
        except ValueError:
            chance = None
        run.chance = chance
        # the regression loss is unknown (MSE scales with the variance, L1 with the spread):
        # measure "near zero" against the smaller of the start and the variance
        reference = min(chance, start) if task == "regression" and chance is not None \
            and start > 0 else chance
        run.target = near_zero_target(start, reference, self.tolerance)
        if output is not None and targets is not None and task in ("multiclass", "sequence"):
            class_dim = -1 if tuple(output.shape[:-1]) == tuple(targets.shape) else 1
            run.targets, run.class_dim = targets, class_dim
            floor = probability_floor(output, class_dim)
            if floor is not None and self._matches_cross_entropy(output, targets, class_dim,
                                                                 start):
                run.floor = floor

    @staticmethod
    def _matches_cross_entropy(output: Tensor, targets: Tensor, class_dim: int,
                               loss: float) -> bool:
        """Whether ``loss`` is ``F.cross_entropy`` of ``output`` taken as logits."""
        try:
            logits = output.detach().float()
            if class_dim != 1:
                logits = logits.movedim(class_dim, 1)
            ce = float(F.cross_entropy(logits, targets.long(), ignore_index=IGNORE_INDEX))
        except (RuntimeError, ValueError, IndexError):
            return False
        return abs(ce - loss) <= 1e-3 * max(1.0, abs(loss))

    # ------------------------------------------------------------------ conclusions
    def _skipped(self, trainer: pl.Trainer, why: str) -> None:
        self.skip(f"skipped: {why}")
        self.add_finding(trainer, "overfit.skipped", f"The overfit-one-batch probe was skipped: "
                                                     f"{why}.", global_step=0)

    def _conclude(self, trainer: pl.Trainer, run: ProbeRun) -> None:
        losses = run.losses
        self.curve = [[float(i), v] for i, v in enumerate(losses)][::max(1, len(losses) //
                                                                     MAX_CURVE_POINTS + 1)]
        cost = f"{len(losses)} steps, {run.seconds:.2f} s, {run.calls} `training_step` calls"
        if run.stopped == "error":
            self._skipped(trainer, f"the model's code raised {run.error} on the probe's "
                          f"{run.examples} examples ({run.calls} `training_step` call(s) on "
                          f"{'a copy of the model' if run.isolation == 'copy' else 'the model'})"
                          "; the real step runs on the full batch and raises it if it recurs")
            return
        if run.stopped == "no_loss":
            self._skipped(trainer, "`training_step` returned no scalar loss on the probe batch")
            return
        if run.stopped == "budget":
            self._skipped(
                trainer, f"one probe step takes {run.step_seconds:.3g} s, so {self.min_steps} "
                f"steps would exceed the {self.time_budget:g} s budget (raise `time_budget`/"
                f"`overfit_budget`, or lower `batch_size`)")
            self.detail += f" ({cost})"
            return
        evidence: dict[str, Any] = {
            "examples": run.examples, "steps": len(losses), "seconds": round(run.seconds, 4),
            "optimizer": run.optimizer, "target": run.target, "chance": run.chance,
            "curve": self.curve, "start": losses[0] if losses else None,
            "tolerance": self.tolerance, "training_step_calls": run.calls,
            "isolation": run.isolation,
        }
        if run.fallback:
            evidence["optimizer_fallback"] = run.fallback
        opt_text = run.optimizer + (f" ({run.fallback})" if run.fallback else "")
        if run.detached:
            self.verdict = OverfitVerdict("failed", "detached", losses[0], losses[0], losses[0], 1,
                                        run.target)
            causes = ["loss not connected: the loss returned by `training_step` has no "
                      "`grad_fn`, so nothing can be trained (see `wiring.loss_detached`)"]
            self._failed(trainer, run, causes, evidence, cost, opt_text)
            return
        verdict = judge_memorization(judge_curve(losses, run.target, self.max_steps,
                                                 floor=run.floor), run.all_right)
        self.verdict = verdict
        evidence.update(best=verdict.best, final=verdict.final, reason=verdict.reason,
                        floor=run.floor, all_predictions_right=run.all_right)
        target_text = (f"{run.target:.3g} ({self.tolerance:g}x chance {run.chance_text})"
                       if run.chance else f"{run.target:.3g} ({self.tolerance:g}x the start)")
        if run.floor is not None:
            self.add_finding(
                trainer, "overfit.loss_on_probabilities",
                f"The model's outputs on the probed batch are already probabilities (in [0, 1], "
                f"summing to 1 over the classes) and the step-0 loss equals `F.cross_entropy` "
                f"of them taken as logits: the loss applies its own log-softmax and cannot go "
                f"below {run.floor:.3f} (the probe's best: {verdict.best:.4g}); its gradients "
                "are squashed too.",
                evidence={"floor": run.floor, "best": verdict.best, "start": verdict.start},
                global_step=0)
        if verdict.verdict == "passed" and verdict.reason == "memorized_floor":
            self.mark_ran(f"passed: every probed example predicted right; loss {verdict.start:.4g}"
                          f" -> {verdict.best:.4g}, a floor ({cost}, {opt_text})")
            self.add_finding(
                trainer, "overfit.passed",
                f"Memorized {run.examples} examples of the first batch: every one is predicted "
                f"right after {len(losses)} steps ({run.seconds:.2f} s, {opt_text}), and the loss "
                f"settled on a plateau at {verdict.best:.4g} (from {verdict.start:.4g}), above the "
                f"target {target_text}: the loss has a floor (label smoothing, a regularization "
                "term), which is not a failure to learn.",
                evidence=evidence, global_step=0,
            )
            return
        if verdict.verdict == "passed":
            self.mark_ran(f"passed: loss {verdict.start:.4g} -> {verdict.best:.4g} on "
                          f"{run.examples} examples ({cost}, {opt_text})")
            self.add_finding(
                trainer, "overfit.passed",
                f"Memorized {run.examples} examples of the first batch in {len(losses)} steps "
                f"({run.seconds:.2f} s, {opt_text}): loss {verdict.start:.4g} -> "
                f"{verdict.best:.4g}, below the target {target_text}.",
                evidence=evidence, global_step=0,
            )
            return
        if verdict.verdict == "inconclusive":
            why = "the time budget ran out" if run.stopped == "time" else "the steps ran out"
            self.skip(f"inconclusive: loss {verdict.start:.4g} -> {verdict.best:.4g}, still "
                      f"falling when {why} ({cost}, {opt_text})")
            self.add_finding(
                trainer, "overfit.inconclusive",
                f"The loss on {run.examples} examples fell from {verdict.start:.4g} to "
                f"{verdict.best:.4g} in {len(losses)} steps ({run.seconds:.2f} s, {opt_text}) "
                f"and was still falling when {why}, above the target {target_text}.",
                evidence=evidence, global_step=0,
            )
            return
        self._failed(trainer, run, self._causes(run, verdict), evidence, cost, opt_text,
                     target_text)

    def _causes(self, run: ProbeRun, verdict: OverfitVerdict) -> list[str]:
        causes: list[str] = []
        if verdict.reason == "nonfinite":
            bad = next(i for i, v in enumerate(run.losses) if not math.isfinite(v))
            causes.append(f"the loss became {run.losses[bad]} at probe step {bad}: unstable "
                          "numerics or a learning rate too high (see `numerics.nonfinite_forward`"
                          ", `numerics.nonfinite_loss`, `curve.diverging`)")
        if run.floor is not None and verdict.reason in ("floor", "plateau", "max_steps"):
            causes.append(
                f"loss bounded away from zero: the model's outputs are probabilities (in [0, 1], "
                f"summing to 1) and the loss is cross-entropy over them, which applies its own "
                f"softmax and cannot go below {run.floor:.3f}; remove the softmax in the model "
                "and pass logits to `F.cross_entropy` (or use `F.nll_loss(torch.log(p), y)`; see "
                "`overfit.loss_on_probabilities`)")
        if run.no_grad:
            causes.append(f"broken gradient path: {describe_groups(run.no_grad)} got no "
                          "gradient (see `wiring.no_grad_params`)")
        if run.outside_optimizer:
            causes.append(f"parameters missing from the optimizer: "
                          f"{describe_groups(run.outside_optimizer)} are in no param group (see "
                          "`wiring.params_not_in_optimizer`)")
        if run.frozen:
            causes.append(f"frozen layers: {describe_groups(run.frozen)} have "
                          "`requires_grad=False` (see `wiring.frozen_params`)")
        if verdict.reason == "rising":
            causes.append(f"the loss rose ({verdict.start:.4g} -> {verdict.final:.4g}): the "
                          f"learning rate of {run.optimizer} is too high for this model (see "
                          "`curve.lr_too_high`, `curve.diverging`)")
        if verdict.reason == "flat":
            causes.append("the loss never moved: a learning rate of 0, or an output that does "
                          "not depend on the parameters (see `grad.update_ratio`, "
                          "`curve.not_learning`)")
        if verdict.reason == "max_steps" and not causes:
            causes.append(
                f"slow progress: the loss fell only from {verdict.start:.4g} to "
                f"{verdict.best:.4g} in {verdict.steps} steps with {run.optimizer} (a learning "
                "rate too low for the probe (see `curve.lr_too_low`), vanishing gradients (see "
                "`grad.vanishing`), a model too small or too constrained, or a loss with a "
                "floor); raise `max_steps`/`overfit_steps` to tell them apart")
        if not causes and verdict.reason in ("plateau", "floor"):
            causes.append(
                f"loss bounded away from zero: it stopped at {verdict.best:.4g} with gradients "
                "reaching every parameter (a softmax/sigmoid before a loss that applies its own, "
                "label smoothing or a regularization term in the loss, targets that contradict "
                "each other, or a model too small or too constrained; see `structure.batch_mixing`, "
                "`structure.shape_mismatch`, `grad.vanishing`)")
        return causes

    def _failed(self, trainer: pl.Trainer, run: ProbeRun, causes: list[str],
                evidence: dict[str, Any], cost: str, opt_text: str,
                target_text: str = "") -> None:
        losses = run.losses
        best, final = min(losses), losses[-1]
        evidence["causes"] = causes
        evidence["no_grad_modules"] = [g.module for g in run.no_grad]
        evidence["frozen_modules"] = [g.module for g in run.frozen]
        self.mark_ran(f"failed: loss {losses[0]:.4g} -> best {best:.4g} on {run.examples} "
                      f"examples ({cost}, {opt_text})")
        target = f", target {target_text}" if target_text else ""
        self.add_finding(
            trainer, "overfit.failed",
            f"Could not overfit {run.examples} examples of the first batch: loss "
            f"{losses[0]:.4g} -> best {best:.4g}, last {final:.4g} after {len(losses)} steps "
            f"({run.seconds:.2f} s, {opt_text}{target}). Likely cause: {causes[0]}."
            + (f" Also: {'; '.join(causes[1:])}." if len(causes) > 1 else ""),
            evidence=evidence, global_step=0,
        )

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
