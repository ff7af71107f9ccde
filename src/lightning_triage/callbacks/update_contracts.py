"""Stage 3 (wiring): the contracts of the update, checked on the first steps of the fit."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from lightning_triage.callbacks._args import check_int
from lightning_triage.callbacks._shared import sharded_strategy
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.functional.adapters import peft_base_params
from lightning_triage.functional.hooks import backward_start_hook
from lightning_triage.functional.late_freeze import LateFreezeWatch, running_norms
from lightning_triage.functional.update import (
    frozen_running_stats,
    frozen_running_stats_verdict,
    tensor_norms,
)
from lightning_triage.functional.update_ledger import Reading, ReadingKind, UpdateLedger

#: Training batches after which the running statistics of frozen parts are compared.
RUNNING_STATS_BATCHES = 3


@dataclass(eq=False)
class _Point:
    """A reading of every parameter's norm at one point of a batch (device tensors until the
    batch ends)."""

    kind: ReadingKind
    opt: int | None
    step: int
    norms: Tensor
    grads: Tensor | None = None
    lr: float = 0.0
    renewed: frozenset[int] = frozenset()
    tentative: bool = False  # taken by the optimizer's own step pre-hook


class _GradRefs(dict[int, "weakref.ref[Tensor] | None"]):
    """Each parameter's gradient tensor at its optimizer's last step (weak references: a
    gradient set to ``None`` and re-created since is another tensor). Pickles empty."""

    def __reduce__(self) -> tuple[type[_GradRefs], tuple[()]]:
        return (_GradRefs, ())


class UpdateContractCheck(TriageCallback):
    """Check on the first steps that the update keeps the training loop's contracts.

    For the first ``window`` training batches it reads the norm of every parameter (one fused
    ``foreach`` kernel) at the start of the batch, at the first backward, before and after each
    optimizer step and at the end of the batch, and the gradients' norms at each backward and
    before each step; one host sync per batch. Under manual optimization, a step that Lightning
    does not announce (``scaler.step(opt.optimizer)`` of the user's own ``GradScaler``) is read
    by a step pre-hook on the optimizer, and a backward that Lightning does not announce
    (``loss.backward()`` called directly) in a single-process run by a gradient hook on the
    parameters
    (:func:`~lightning_triage.functional.hooks.backward_start_hook`: once per backward, at
    its first gradient, before any is added to ``.grad``), so gradients zeroed in place
    (``zero_grad(set_to_none=False)``, ``p.grad.zero_()``) are seen zeroed. The readings feed
    a pure ledger of the functional core
    (:class:`~lightning_triage.functional.update_ledger.UpdateLedger`), which decides. At the end
    of the window it removes its hooks and goes idle.

    Findings:
        ``wiring.grads_not_zeroed`` (an optimizer steps on gradients that were not zeroed since
        its previous step; regular accumulation is silent), ``wiring.optimizer_not_stepping``
        (:data:`~lightning_triage.functional.update.STALLED_STEPS` steps in a row that move no
        parameter: no gradient, a zero learning rate, a no-op step, a step never reached),
        ``wiring.params_changed_outside_step`` (trainable parameters that change between
        steps: a re-initialization, ``load_state_dict``, an in-place edit in ``forward``; info
        for a projection applied at every step such as weight clipping),
        ``wiring.frozen_params_changed``, ``wiring.frozen_batchnorm_in_train`` (BatchNorm in
        training mode inside a frozen part, its running statistics moving) and
        ``wiring.frozen_late`` (parameters trainable for the first steps, frozen afterwards,
        having moved).

    Args:
        window: training batches watched from the start of fit.
        strict: raise internal errors instead of disabling the check.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[UpdateContractCheck()])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.UpdateContractCheck
                  init_args:
                    window: 40
    """

    stage: ClassVar[str] = "wiring"
    codes: ClassVar[tuple[str, ...]] = (
        "wiring.grads_not_zeroed", "wiring.optimizer_not_stepping",
        "wiring.params_changed_outside_step", "wiring.frozen_params_changed",
        "wiring.frozen_batchnorm_in_train", "wiring.frozen_late")

    def __init__(self, *, window: int = 40, strict: bool = False) -> None:
        super().__init__(strict=strict)
        check_int("window", window, 2)
        self.window = window
        self._done = False
        self._reset()
        self._reset_late()

    def _reset_late(self) -> None:
        # late freezing (watched past the window, at epoch starts and validation ends)
        self._late: LateFreezeWatch | None = None

    @override
    @guarded
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset_late()

    def _reset(self) -> None:
        self._armed = False
        self._batches = 0
        self._names: list[str] = []
        self._params: list[Tensor] = []
        self._sizes: dict[str, int] = {}
        self._init: list[float] = []
        self._ledger: UpdateLedger | None = None
        self._points: list[_Point] = []
        self._stepped: set[tuple[int, int]] = set()
        self._grad_refs = _GradRefs()
        self._step_at_start = 0
        self._announced = False  # inside a backward that Lightning announced (and we read)
        self._bn: list[tuple[str, str, Tensor]] = []
        self._bn_step = 0

    # ------------------------------------------------------------------ hooks
    @override
    @guarded
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self._done:
            self.idle = True
            return
        self._check_late(trainer)
        if not self._armed and not self._arm(trainer, pl_module):
            return
        self._step_at_start = trainer.global_step
        self._membership(trainer)
        self._point("start", None, trainer.global_step)

    @override
    @guarded
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           loss: Tensor) -> None:
        if not self._armed:
            return
        self._announced = True
        self._backward(trainer)

    @override
    @guarded
    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._announced = False

    def _backward(self, trainer: pl.Trainer) -> None:
        """Read the gradients before a backward adds to them (the parameters too at the
        batch's first backward)."""
        first = not any(p.kind == "backward" for p in self._points)
        norms, grads = self._norms_and_grads(first)
        self._points.append(_Point("backward", None, trainer.global_step, norms, grads))

    def _grad_hook(self, trainer: pl.Trainer) -> Any:
        def hook() -> None:
            # manual optimization: a backward Lightning does not announce (`loss.backward()`
            # called directly), read at its first gradient, before any reaches `.grad`
            if self._armed and not self._announced:
                self._backward(trainer)
        return self.guard_hook(trainer, "gradient hook", hook)

    @override
    @guarded
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: Optimizer) -> None:
        if not self._armed:
            return
        opt = self._opt_index(trainer, optimizer)
        if opt is None or (opt, trainer.global_step) in self._stepped:
            return  # LBFGS: its closure runs again inside the step
        self._stepped.add((opt, trainer.global_step))
        raw = self._open_step(opt)
        if raw is not None and raw.tentative:  # the step's own pre-hook read first: ours rules
            self._points.remove(raw)
        self._pre(trainer, opt, optimizer)

    def _pre(self, trainer: pl.Trainer, opt: int, optimizer: Optimizer,
             tentative: bool = False) -> None:
        self._membership(trainer, at_step=True)
        norms, grads = self._norms_and_grads(True)
        lr = max((float(g["lr"]) for g in optimizer.param_groups), default=0.0)
        self._points.append(_Point("pre", opt, trainer.global_step, norms, grads, lr,
                                   self._renewed(), tentative))

    def _open_step(self, opt: int) -> _Point | None:
        """The reading before the step of ``opt`` in flight (its last reading is a ``pre``)."""
        for p in reversed(self._points):
            if p.opt == opt:
                return p if p.kind == "pre" else None
        return None

    def _renewed(self) -> frozenset[int]:
        """The parameters whose gradient is another tensor than at their optimizer's last step:
        set to ``None`` (zeroed) in between, whatever ran the backward."""
        renewed = set()
        for i, p in enumerate(self._params):
            if i in self._grad_refs and p.grad is not None:
                ref = self._grad_refs[i]
                if ref is None or ref() is not p.grad:
                    renewed.add(i)
        return frozenset(renewed)

    @override
    @guarded
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: STEP_OUTPUT, batch: Any, batch_idx: int) -> None:
        if self._done:
            self.idle = True
            return
        if not self._armed:
            return
        # frozen during this batch (the model's own `on_train_batch_start` runs after ours):
        # frozen from the step the batch started at (toggles are undone by now)
        self._check_late(trainer, self._step_at_start)
        self._point("end", None, trainer.global_step)
        self._close_batch(trainer, pl_module)
        self._batches += 1
        if self._batches == RUNNING_STATS_BATCHES:
            self._decide_running_stats(trainer)
        if self._batches >= self.window:
            self._finish(trainer)

    @override
    @guarded
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._armed and self._ledger is not None and not trainer.sanity_checking:
            # Lightning zeroes the gradients before validation: the next step of each
            # optimizer is clean whatever the user's code does (no evidence either way)
            self._ledger.validation()

    @override
    @guarded
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._check_late(trainer)  # a `train()` override freezing stages runs at `eval()`

    @override
    @guarded
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check_late(trainer)

    @override
    @guarded
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._late is not None:
            self._late.epoch_end(trainer.global_step)

    @override
    @guarded
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._armed and not self._done:
            self._finish(trainer)

    # ------------------------------------------------------------------ late freezing
    def _check_late(self, trainer: pl.Trainer, step: int | None = None) -> None:
        """``wiring.frozen_late``: parameters trainable at the first batch that are frozen now
        (:class:`~lightning_triage.functional.late_freeze.LateFreezeWatch`)."""
        if self._late is not None:
            self.add_verdicts(trainer, self._late.check(
                trainer.global_step if step is None else step))

    # ------------------------------------------------------------------ readings
    def _membership(self, trainer: pl.Trainer, *, at_step: bool = False) -> None:
        """Which parameters each optimizer holds and which are frozen, read at the batch start
        and again at each optimizer step: a frozen parameter that an optimizer holds with
        ``requires_grad=True`` by then (unfrozen, or its param group added, in the model's own
        ``on_train_batch_start``) is no longer frozen. Parameters are frozen at the batch start
        only (``toggle_optimizer`` freezes the other optimizers' for a while)."""
        held = {id(p) for opt in trainer.optimizers for g in opt.param_groups
                for p in g["params"]}
        index = {id(p): i for i, p in enumerate(self._params)}
        assert self._ledger is not None
        self._ledger.membership(
            [[index[id(p)] for g in opt.param_groups for p in g["params"] if id(p) in index]
             for opt in trainer.optimizers],
            [p.requires_grad and id(p) in held for p in self._params], at_step=at_step)

    def _arm(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> bool:
        sharded = sharded_strategy(trainer)
        if sharded is not None:
            self._done = True
            self.skip(f"skipped: parameters are sharded/flattened under `{sharded}`")
            return False
        if any(isinstance(p, torch.nn.parameter.UninitializedParameter)
               for p in pl_module.parameters()):
            return False  # lazy modules: armed at the first batch after their first forward
        self._reset()  # a fit that ended inside the window (an exception) left its readings
        seen: set[int] = set()
        for name, p in pl_module.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                self._names.append(name)
                self._params.append(p)
                self._sizes[name] = p.numel()
        for i, opt in enumerate(trainer.optimizers):
            self.add_handle(opt.register_step_pre_hook(self._pre_hook(trainer, i)))
            self.add_handle(opt.register_step_post_hook(self._post_hook(trainer, i)))
        # `loss.backward()` called directly; one process only: under DDP a ddp_spawn run that
        # never zeroes aborted at exit in 6 of 72 runs with this hook (0 of 30 without it)
        if not pl_module.automatic_optimization and trainer.world_size == 1:
            self.add_handle(backward_start_hook(self._params, self._grad_hook(trainer)))
        self._init = self._norms().tolist()
        index = {id(p): i for i, p in enumerate(self._params)}
        self._ledger = UpdateLedger(
            self._names, self._sizes, self._init,
            [f"optimizer {i} ({type(opt).__name__})" for i, opt in enumerate(trainer.optimizers)],
            # `nn.Embedding(max_norm=...)` renormalizes the rows it looks up in place, in forward
            renormed={index[id(m.weight)] for m in pl_module.modules()
                      if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))
                      and m.max_norm is not None and id(m.weight) in index},
            pinned=peft_base_params(pl_module))  # a peft model's frozen base: never an EMA
        frozen_bn = set(frozen_running_stats(pl_module))
        self._bn = [(name, type(m).__name__, running_norms(m))
                    for name, m in pl_module.named_modules() if name in frozen_bn]
        self._bn_step = trainer.global_step
        if self._late is None:  # the parameters trainable (and held) at the first batch
            held = {id(p) for opt in trainer.optimizers for g in opt.param_groups
                    for p in g["params"]}
            keep = [i for i, p in enumerate(self._params) if p.requires_grad and id(p) in held]
            self._late = LateFreezeWatch(
                [self._names[i] for i in keep], [self._params[i] for i in keep],
                [self._init[i] for i in keep], self._sizes, trainer.global_step,
                module=pl_module)
        self._armed = True
        return True

    def _pre_hook(self, trainer: pl.Trainer, opt: int) -> Any:
        def hook(optimizer: Optimizer, args: Any, kwargs: Any) -> None:
            # manual optimization: a step Lightning does not announce (`scaler.step(opt.optimizer)`
            # of the user's own gradient scaler); read before it unless Lightning's reading
            # comes first (its `16-mixed` plugin), or comes later and replaces this one
            if self._armed and not trainer.lightning_module.automatic_optimization \
                    and self._open_step(opt) is None:
                self._pre(trainer, opt, optimizer, tentative=True)
        return self.guard_hook(trainer, "optimizer step pre-hook", hook)

    def _post_hook(self, trainer: pl.Trainer, opt: int) -> Any:
        def hook(optimizer: Optimizer, args: Any, kwargs: Any) -> None:
            if self._armed:
                self._points.append(_Point("post", opt, trainer.global_step, self._norms()))
                held = {id(p) for g in optimizer.param_groups for p in g["params"]}
                self._grad_refs.update({i: None if p.grad is None else weakref.ref(p.grad)
                                        for i, p in enumerate(self._params) if id(p) in held})
        return self.guard_hook(trainer, "optimizer step post-hook", hook)

    def _norms(self) -> Tensor:
        return tensor_norms(self._params)

    def _norms_and_grads(self, with_params: bool) -> tuple[Tensor, Tensor]:
        """The gradients' norms, and the parameters' (empty unless ``with_params``), read
        together."""
        grads = [p.grad for p in self._params]
        both = tensor_norms([*self._params, *grads] if with_params else grads)
        n = len(self._params) if with_params else 0
        return both[:n], both[n:]

    def _point(self, kind: ReadingKind, opt: int | None, step: int) -> None:
        self._points.append(_Point(kind, opt, step, self._norms()))

    def _opt_index(self, trainer: pl.Trainer, optimizer: Optimizer) -> int | None:
        for i, opt in enumerate(trainer.optimizers):
            if opt is optimizer or getattr(optimizer, "optimizer", None) is opt:
                return i
        return None

    # ------------------------------------------------------------------ one batch
    def _close_batch(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Read the batch's points to the host (its one sync) and hand them to the ledger."""
        points, self._points = self._points, []
        tensors = [t for p in points for t in (p.norms, p.grads) if t is not None]
        device = tensors[0].device
        flat = torch.cat([t.to(device) for t in tensors]).tolist()
        readings: list[Reading] = []
        at = 0
        for p in points:
            norms = flat[at:at + p.norms.numel()]
            at += p.norms.numel()
            grads = None
            if p.grads is not None:
                grads = flat[at:at + p.grads.numel()]
                at += p.grads.numel()
            readings.append(Reading(p.kind, p.opt, p.step, norms, grads, p.lr, p.renewed))
        counted = None
        if pl_module.automatic_optimization and trainer.optimizers \
                and trainer.global_step > self._step_at_start:
            counted = max((float(g["lr"]) for g in trainer.optimizers[0].param_groups),
                          default=0.0)
        assert self._ledger is not None
        self.add_verdicts(trainer, self._ledger.close_batch(
            readings, start_step=self._step_at_start, counted_lr=counted))

    # ------------------------------------------------------------------ decisions
    def _decide_running_stats(self, trainer: pl.Trainer) -> None:
        if not self._bn:
            return
        modules = dict(trainer.lightning_module.named_modules())
        moved: dict[str, float] = {}
        for name, _, start in self._bn:
            m = modules.get(name)
            if m is None:
                continue
            now = running_norms(m)
            change = (now - start).abs().max().item()
            if change > 0:
                moved[name] = change
        kinds = {name: kind for name, kind, _ in self._bn}
        self.add_verdicts(trainer, frozen_running_stats_verdict(
            moved, kinds, self._bn_step, RUNNING_STATS_BATCHES))
        self._bn = []

    def _finish(self, trainer: pl.Trainer) -> None:
        if self._batches < RUNNING_STATS_BATCHES:
            self._decide_running_stats(trainer)
        n_steps = 0
        if self._ledger is not None:
            self.add_verdicts(trainer, self._ledger.finish())
            n_steps = self._ledger.steps
        batches = self._batches
        self.remove_handles()
        self._reset()
        self._done = True
        self.idle = True
        self.mark_ran(f"watched the first {batches} training batch(es) ({n_steps} optimizer "
                      "step(s))")

    @override
    def remove_handles(self) -> None:
        """Remove the optimizer hooks and disarm (teardown, exception, end of the window): the
        next fit arms again from scratch."""
        super().remove_handles()
        self._armed = False
        self._points = []

    # ------------------------------------------------------------------ state
    @override
    def extra_state(self) -> dict[str, Any]:
        return {"done": self._done}

    @override
    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self._done = bool(state.get("done", self._done))


__all__ = ["UpdateContractCheck"]
