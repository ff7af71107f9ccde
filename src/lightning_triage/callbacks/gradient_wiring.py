"""Stage 3 (wiring): does every trainable parameter receive a gradient, and is it optimized?"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from typing_extensions import override

from lightning_triage.callbacks._args import check_bool
from lightning_triage.callbacks._shared import sharded_strategy
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.functional.adapters import zero_partners
from lightning_triage.functional.init_stats import frozen_at_init_verdict, frozen_layers_at_init
from lightning_triage.functional.tensors import any_nonzero
from lightning_triage.functional.unregistered import (
    graph_leaves,
    locate_tensors,
    unregistered_verdict,
)
from lightning_triage.functional.wiring import WiringResult, analyze_wiring, group_by_module
from lightning_triage.functional.wiring_verdicts import (
    detached_loss_verdict,
    shift_invariant_verdict,
    wiring_verdicts,
    zero_partner_verdict,
)

#: Optimizer steps after the first backward by which a zero gradient that a zero-initialized
#: partner explained (LoRA's ``lora_A`` while ``lora_B`` is zero) must have turned non-zero.
CONFIRM_STEPS = 3


class GradientWiringCheck(TriageCallback):
    """Check after the first real backward that gradients reach every trainable parameter.

    The check arms at the first ``on_before_backward`` of the run (Lightning's own backward:
    probes that call ``loss.backward()`` themselves do not count) and registers a
    post-accumulate-grad hook on every trainable parameter. It collects every backward of that
    first training batch (several under manual optimization, e.g. a GAN's two losses; one
    micro-batch under gradient accumulation) and decides at the end of the batch, then removes
    its hooks: nothing runs on later steps.

    Findings:
        ``wiring.loss_detached`` (the loss has no ``grad_fn``: reported in
        ``on_before_backward``, before the backward raises; or no trainable parameter got a
        gradient), ``wiring.no_grad_params`` (trainable parameters whose gradient stayed
        ``None``: unused modules, ``.detach()``), ``wiring.zero_grad_params`` (gradient exactly
        zero everywhere; when an all-zero partner beside the parameter got a non-zero gradient,
        e.g. peft LoRA's ``lora_A`` while ``lora_B`` starts at zero, the verdict waits
        :data:`CONFIRM_STEPS` optimizer steps and reports only the parameters whose gradient
        stayed zero once the partner could move), ``wiring.params_not_in_optimizer``
        (gradients but in no optimizer param group), ``wiring.frozen_params`` (info:
        ``requires_grad=False``, counted per module), ``wiring.unregistered_params`` (leaf
        tensors of the first batch's loss graph, read from its ``AccumulateGrad`` nodes, that
        are neither parameters nor buffers of the module: a layer kept in a plain
        ``list``/``dict``/``tuple``, named by its attribute path, or an ``nn.Parameter`` kept
        outside the module; an error when no optimizer holds them, a warning when one does),
        ``wiring.frozen_at_init`` (frozen ``Linear``/``Conv*``/``Embedding``/recurrent layers
        whose weights are statistically still the draw of their ``reset_parameters``, read at
        the first backward, before any optimizer step; a frozen layer with a trainable copy of
        the same values, an EMA teacher or a target network, is left out).
        Parameters are named by module: a module whose parameters are all affected is named
        once.

    Args:
        check_optimizer: report ``wiring.params_not_in_optimizer``.
        report_frozen: report frozen parameters (info).
        check_unregistered: report tensors that get gradients from the loss but are not the
            module's parameters (``wiring.unregistered_params``).
        check_frozen_init: report frozen layers still at their random initialization
            (``wiring.frozen_at_init``; turn it off for frozen random features on purpose).
        strict: raise internal errors instead of disabling the check.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[GradientWiringCheck()])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.GradientWiringCheck
    """

    stage: ClassVar[str] = "wiring"
    codes: ClassVar[tuple[str, ...]] = ("wiring.no_grad_params", "wiring.zero_grad_params",
        "wiring.frozen_params", "wiring.loss_detached", "wiring.params_not_in_optimizer",
        "wiring.unregistered_params", "wiring.frozen_at_init")

    def __init__(self, *, check_optimizer: bool = True, report_frozen: bool = True,
                 check_unregistered: bool = True, check_frozen_init: bool = True,
                 strict: bool = False) -> None:
        super().__init__(strict=strict)
        check_bool("check_optimizer", check_optimizer)
        check_bool("report_frozen", report_frozen)
        check_bool("check_unregistered", check_unregistered)
        check_bool("check_frozen_init", check_frozen_init)
        self.check_frozen_init = check_frozen_init
        #: frozen layers still at their initialization, read at the first backward
        self._at_init: list[tuple[str, str, int]] = []
        self.check_optimizer = check_optimizer
        self.report_frozen = report_frozen
        self.check_unregistered = check_unregistered
        #: leaf tensors of the first batch's loss graphs that the module does not own, by id
        self._stray: dict[int, Tensor] = {}
        self.result: WiringResult | None = None
        self._done = False
        self._armed = False
        self._backwards = 0
        self._step: int | None = None
        self._trainable: dict[str, int] = {}
        self._frozen: dict[str, int] = {}
        self._received: set[str] = set()
        self._hooked: set[str] = set()
        self._nonzero: dict[str, Tensor] = {}
        #: zero-gradient parameters whose verdict waits for their zero-valued partner to move
        self._deferred: dict[str, list[str]] = {}
        #: per trainable parameter, whether it has a non-zero value at the first backward
        self._valued: dict[str, Tensor] = {}

    # ------------------------------------------------------------------ hooks
    @override
    @guarded
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           loss: Tensor) -> None:
        if self._done:
            self.idle = not self._deferred
            return
        if not self._armed:
            sharded = sharded_strategy(trainer)
            if sharded is not None:
                self._done = True
                self.skip(f"skipped: parameters are sharded/flattened under `{sharded}`")
                return
            self._arm(trainer, pl_module)
        self._hook_new(trainer, pl_module)
        self._backwards += 1
        if isinstance(loss, Tensor) and not loss.requires_grad:
            self._report_detached(trainer, loss)
        elif isinstance(loss, Tensor) and self.check_unregistered:
            owned = {id(t) for t in (*pl_module.parameters(), *pl_module.buffers())}
            for leaf in graph_leaves(loss):
                if id(leaf) not in owned:
                    self._stray.setdefault(id(leaf), leaf)

    @override
    @guarded
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: STEP_OUTPUT, batch: Any, batch_idx: int) -> None:
        if self._deferred:
            if trainer.global_step >= (self._step or 0) + CONFIRM_STEPS:
                self._confirm(trainer, pl_module)
        elif self._done:
            self.idle = True
        elif self._armed:
            self._evaluate(trainer, pl_module)

    @override
    @guarded
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._deferred:
            self._confirm(trainer, pl_module)

    # ------------------------------------------------------------------ internals
    def _arm(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._armed = True
        self._step = trainer.global_step
        self._trainable, self._frozen, self._hooked = {}, {}, set()
        # Under manual optimization `toggle_optimizer` freezes the other optimizers'
        # parameters during a backward: count those as trainable.
        held: set[int] = set()
        if not pl_module.automatic_optimization:
            held = {id(p) for opt in trainer.optimizers for g in opt.param_groups
                    for p in g["params"]}
        self._valued = {}
        for name, p in pl_module.named_parameters():
            if p.requires_grad or id(p) in held:
                self._trainable[name] = p.numel()
                # read now, before the optimizer step moves a zero-initialized partner
                flag = any_nonzero(p.detach()) if p.numel() and not p.is_meta else None
                if flag is not None:
                    self._valued[name] = flag
            else:
                self._frozen[name] = p.numel()
        if self._frozen and self.check_frozen_init:
            trainable_ids = {id(p) for p in pl_module.parameters() if p.requires_grad
                             or id(p) in held}
            self._at_init = frozen_layers_at_init(pl_module, trainable_ids)

    def _hook_new(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Hook the trainable parameters not hooked yet that require grad now (a parameter
        toggled off by `toggle_optimizer` is hooked at the backward that toggles it on)."""
        for name, p in pl_module.named_parameters():
            if name in self._trainable and name not in self._hooked and p.requires_grad:
                self._hooked.add(name)
                self.add_handle(p.register_post_accumulate_grad_hook(
                    self._make_hook(trainer, name)))

    def _make_hook(self, trainer: pl.Trainer, name: str) -> Any:
        def hook(param: Tensor) -> None:
            self._received.add(name)
            grad = param.grad
            if grad is None:
                return
            # stays on the device: no host sync per hook; any layout (sparse embedding
            # gradients ...); an empty parameter has no value to be zero; no data (meta): unknown
            flag = any_nonzero(grad) if grad.numel() else None
            if flag is None:
                flag = torch.ones((), dtype=torch.bool,
                                  device="cpu" if grad.is_meta else grad.device)
            prev = self._nonzero.get(name)
            self._nonzero[name] = flag if prev is None else prev | flag

        return self.guard_hook(trainer, "gradient hook", hook)

    def _report_detached(self, trainer: pl.Trainer, loss: Tensor) -> None:
        if self.has_finding("wiring.loss_detached"):
            return
        where = "`training_step`" if trainer.lightning_module.automatic_optimization else \
            "the tensor passed to `manual_backward`"
        self.add_verdict(trainer, detached_loss_verdict(
            where, self._step, float(loss.detach().float().mean()), len(self._trainable),
            len(self._frozen)))
        self._finish("the loss has no `grad_fn`")

    def _evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        nonzero_flags = list(self._nonzero.items())
        values = torch.stack([f.to(nonzero_flags[0][1].device) for _, f in nonzero_flags]
                             ).tolist() if nonzero_flags else []  # one host sync
        nonzero = {name for (name, _), v in zip(nonzero_flags, values, strict=True) if v}
        held: set[str] | None = None
        if self.check_optimizer and trainer.optimizers:
            ids = {id(p) for opt in trainer.optimizers for g in opt.param_groups
                   for p in g["params"]}
            held = {name for name, p in pl_module.named_parameters() if id(p) in ids}
            if not held:  # e.g. a strategy that flattens parameters: names cannot be matched
                held = None
        result = analyze_wiring(self._trainable, self._frozen, self._received, nonzero, held)
        self._report_unregistered(trainer, pl_module)
        if self._at_init:
            self.add_verdict(trainer, frozen_at_init_verdict(
                self._step, self._at_init, sum(self._frozen.values()),
                sum(self._frozen.values()) + sum(self._trainable.values())))
            self._at_init = []
        deferred, partner_outside = self._partners(pl_module, result, nonzero, held)
        if deferred or partner_outside:
            keep = {n for g in result.zero_grad for n in g.params} - set(deferred) \
                - partner_outside
            result = dataclasses.replace(
                result, zero_grad=group_by_module(keep, self._trainable) if keep else [])
        # a bias with a zero gradient beside its layer's non-zero weight gradient: the loss is
        # invariant to a shift of that layer's outputs (score differences, a batch norm after)
        shifted = sorted(n for g in result.zero_grad for n in g.params
                         if n.rsplit(".", 1)[-1] == "bias" and n[:-4] + "weight" in nonzero)
        if shifted:
            keep = {n for g in result.zero_grad for n in g.params} - set(shifted)
            result = dataclasses.replace(
                result, zero_grad=group_by_module(keep, self._trainable) if keep else [])
            self.add_verdict(trainer, shift_invariant_verdict(shifted, self._step,
                                                              self._trainable))
        self.result = result
        step = self._step
        self.add_verdicts(trainer, wiring_verdicts(
            result, step, backwards=self._backwards, optimizers=len(trainer.optimizers),
            report_frozen=self.report_frozen,
            loss_detached=not self.has_finding("wiring.loss_detached")))
        got = len(set(self._received) & set(self._trainable))
        detail = (f"first backward at step {step}: {got}/{len(self._trainable)} trainable "
                  f"parameter tensors got a gradient ({self._backwards} backward pass(es))")
        if partner_outside:
            detail += (f"; {len(partner_outside)} zero gradient(s) explained by a zero-valued "
                       "partner in no optimizer (see `wiring.params_not_in_optimizer`)")
        self._finish(detail)
        if deferred:
            self._defer(trainer, pl_module, deferred)

    def _report_unregistered(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """``wiring.unregistered_params``: leaves of the loss's graph the module does not own,
        kept in its attributes (a layer in a plain list) or ``nn.Parameter`` objects."""
        stray, self._stray = self._stray, {}
        if not stray:
            return
        paths = locate_tensors(pl_module, set(stray))
        unlocated = [t for i, t in stray.items()
                     if i not in paths and isinstance(t, torch.nn.Parameter)]
        if not paths and not unlocated:  # inputs that require grad (a gradient penalty ...)
            return
        held = {id(p) for opt in trainer.optimizers for g in opt.param_groups
                for p in g["params"]}
        chosen = [*(stray[i] for i in paths), *unlocated]
        self.add_verdict(trainer, unregistered_verdict(
            self._step, sorted(paths.values()), len(unlocated),
            sum(t.numel() for t in chosen), all(id(t) in held for t in chosen)))

    # ------------------------------------------------------------------ zero-initialized partners
    def _partners(self, pl_module: pl.LightningModule, result: WiringResult, nonzero: set[str],
                  held: set[str] | None) -> tuple[dict[str, list[str]], set[str]]:
        """The zero-gradient parameters a zero-valued partner explains (deferred), and those
        whose partners are in no optimizer (explained by `wiring.params_not_in_optimizer`)."""
        zero = [n for g in result.zero_grad for n in g.params]
        if not zero:
            return {}, set()
        flags = list(self._valued.items())
        values = torch.stack([f.to(flags[0][1].device) for _, f in flags]).tolist() \
            if flags else []
        zero_valued = {n for (n, _), v in zip(flags, values, strict=True) if not v}
        self._valued = {}
        partners = zero_partners(pl_module, zero, nonzero, zero_valued)
        if held is None:
            return partners, set()
        deferred = {n: ps for n, ps in partners.items() if any(p in held for p in ps)}
        return deferred, set(partners) - set(deferred)

    def _defer(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
               deferred: dict[str, list[str]]) -> None:
        """Watch the deferred parameters' gradients on the next optimizer steps."""
        self._deferred = deferred
        self._done = True
        self.idle = False
        for name, p in pl_module.named_parameters():
            if name in deferred and p.requires_grad:
                self.add_handle(p.register_post_accumulate_grad_hook(
                    self._make_hook(trainer, name)))
        self.detail += (f"; {len(deferred)} parameter tensor(s) with an exactly zero gradient "
                        "beside a zero-valued partner that got one (LoRA's `lora_A` while "
                        "`lora_B` is zero): confirmed after the partner moved")

    def _confirm(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Report the deferred parameters whose gradient is still exactly zero."""
        deferred, self._deferred = self._deferred, {}
        flags = {n: f for n, f in self._nonzero.items() if n in deferred}
        values = torch.stack([f.to(next(iter(flags.values())).device) for f in flags.values()]
                             ).tolist() if flags else []
        moved = {n for n, v in zip(flags, values, strict=True) if v}
        self.remove_handles()
        self._nonzero.clear()
        self.idle = True
        steps = trainer.global_step - (self._step or 0)
        if steps < 1:  # no optimizer step after the first: the partner could not move yet
            self.detail = self.detail.replace(
                "confirmed after the partner moved",
                "not confirmed (the fit ended before an optimizer step moved the partner)")
            return
        still = [n for n in deferred if n not in moved]
        self.detail = self.detail.replace(
            "confirmed after the partner moved",
            f"{len(deferred) - len(still)} turned non-zero within {steps} optimizer step(s)")
        if not still:
            return
        params = dict(pl_module.named_parameters())
        partners = sorted({q for n in still for q in deferred[n]})
        unmoved = [q for q in partners if q in params and params[q].numel()
                   and not bool(any_nonzero(params[q].detach()))]
        self.add_verdict(trainer, zero_partner_verdict(still, partners, unmoved, self._step,
                                                       steps, self._trainable))

    def _finish(self, detail: str) -> None:
        self._done = True
        self._armed = False
        self.remove_handles()
        self._nonzero.clear()
        self._stray = {}
        self._at_init = []
        self.mark_ran(detail)

    @override
    def remove_handles(self) -> None:
        super().remove_handles()
        self._armed = False

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        self._deferred = {}  # a fit that ended before the confirmation (an exception)

    # ------------------------------------------------------------------ state
    @override
    def extra_state(self) -> dict[str, Any]:
        return {"done": self._done}

    @override
    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self._done = bool(state.get("done", self._done))


__all__ = ["CONFIRM_STEPS", "GradientWiringCheck", "sharded_strategy"]
