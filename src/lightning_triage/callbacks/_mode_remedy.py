"""The mode stage's remedy trial, run by the check that found the problem, at its probe.

:class:`~lightning_triage.EvalModeCheck` (layers in training mode during validation) and
:class:`~lightning_triage.EvalContractCheck` (evaluation random in eval mode) see their problem at
the first batch of a validation run. Right there, with that batch and the model as it is at that
moment, :func:`eval_remedy_trial` runs the user's ``validation_step`` on fresh copies of the
model over a few of the batch's examples, from two random states, as it is and with the remedy:

- ``"eval_mode"``: every layer in eval mode, forced at each layer's forward (whatever
  ``.train()`` the user's hooks call); the as-is passes keep the modes the check saw;
- ``"gate_dropout"``: the dropout calls gated on the mode (``F.dropout*`` act as in eval mode,
  ``scaled_dot_product_attention`` gets ``dropout_p=0``), through a ``TorchFunctionMode``.

The decision is :func:`~lightning_triage.functional.remedy.decide_eval_remedy`'s. The result
travels in the finding's evidence (``remedy_trial``); the report moves the lead's into its
``remedy`` block. Nothing is recorded beforehand (no validation batches kept): a healthy run
runs nothing. No collective: ``self.log`` of the copies is captured, not sent; every rank tries
on its own batch, as the checks' other probes do.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.overrides import TorchFunctionMode

from lightning_triage._compat import forward_context, hook_takes, is_overridden
from lightning_triage.codes.remedies import REMEDIES
from lightning_triage.functional.batch import BatchKey
from lightning_triage.functional.draws import DROPOUTS, SDPA_DROPOUT_ARG
from lightning_triage.functional.eval_contracts import first_divergence
from lightning_triage.functional.remedy import EvalPasses, decide_eval_remedy
from lightning_triage.probing import (
    ProbeUnavailableError,
    UserCodeError,
    copy_first_examples,
    probe_module,
    step_loss,
    user_code,
)
from lightning_triage.probing.recording import CallTrace

#: The random states of the two passes (the determinism probe's).
SEEDS = (1, 2)


class _DropoutGate(TorchFunctionMode):
    """Dropout calls act as in eval mode inside the block (the input returned as it is; the
    attention's ``dropout_p`` set to 0); ``gated`` counts the calls that would have dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.gated = 0

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in DROPOUTS and args and isinstance(args[0], Tensor):
            self.gated += 1
            return args[0]
        if func is F.scaled_dot_product_attention:
            if len(args) > SDPA_DROPOUT_ARG:
                args = (*args[:SDPA_DROPOUT_ARG], 0.0, *args[SDPA_DROPOUT_ARG + 1:])
                self.gated += 1
            elif kwargs.get("dropout_p"):
                kwargs["dropout_p"] = 0.0
                self.gated += 1
        return func(*args, **kwargs)


def dropout_gate() -> TorchFunctionMode:
    """A mode in which the dropout calls act as in eval mode (see :class:`_DropoutGate`)."""
    return _DropoutGate()


@contextmanager
def _forced_eval(module: nn.Module) -> Iterator[None]:
    """Every submodule of ``module`` in eval mode at its forward, whatever the user's code set."""
    def pre(mod: nn.Module, args: Any) -> None:
        mod.training = False

    handles = [sub.register_forward_pre_hook(pre) for sub in module.modules()]
    try:
        module.eval()
        yield
    finally:
        for h in handles:
            h.remove()


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def _running_stats(module: nn.Module) -> dict[str, Tensor]:
    return {f"{name}.{b}" if name else b: buf.detach().clone()
            for name, sub in module.named_modules() if isinstance(sub, _BatchNorm)
            for b, buf in sub.named_buffers(recurse=False) if buf is not None}


class _LossLog:
    """Stands in for ``self.log``/``self.log_dict`` of a copy: keeps the first logged scalar
    whose name holds "loss"."""

    def __init__(self) -> None:
        self.value: float | None = None

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        if self.value is None and "loss" in str(name).lower():
            if isinstance(value, Tensor) and value.numel() == 1:
                self.value = float(value.detach().float())
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                self.value = float(value)

    def log_dict(self, values: Any, *args: Any, **kwargs: Any) -> None:
        for name, value in dict(values).items():
            self.log(name, value)


def _one_pass(trainer: pl.Trainer, pl_module: pl.LightningModule, small: Any, kind: str,
              remedy: bool, seed: int, gate: _DropoutGate) -> tuple[list[Any], float | None,
                                                                    list[str]]:
    """One pass of ``validation_step`` on a fresh copy: the module calls, the loss, the running
    statistics it changed."""
    trace = CallTrace()
    logged = _LossLog()
    with probe_module(trainer, pl_module, trainer.optimizers) as probe:
        if not probe.copied:
            raise ProbeUnavailableError(f"no copy of the model ({probe.how})")
        module = probe.module
        spec = REMEDIES[kind]
        if spec.passes_in_eval:
            module.eval()  # as the determinism probe ran it; "eval_mode" keeps the modes seen
        object.__setattr__(module, "log", logged.log)
        object.__setattr__(module, "log_dict", logged.log_dict)
        stats = _running_stats(module)
        with ExitStack() as stack:
            if remedy and spec.force_eval:
                stack.enter_context(_forced_eval(module))
            stack.enter_context(trace.attached(module))
            stack.enter_context(torch.no_grad())
            stack.enter_context(forward_context(trainer))
            stack.enter_context(user_code())
            if remedy and spec.gate_dropout:
                stack.enter_context(gate)
            _seed_all(seed)
            step = module.validation_step
            args: tuple[Any, ...] = (small,)
            if hook_takes(step, "batch_idx", min_args=2):
                args = (small, 0, 0) if hook_takes(step, "dataloader_idx", min_args=3) \
                    else (small, 0)
            out = step(*args)
        loss = step_loss(out)
        value = float(loss.detach().float()) if loss is not None else logged.value
        after = _running_stats(module)
        changed = [k for k, v in stats.items() if not torch.equal(v, after[k])]
    return trace.calls, value, changed


def _passes(trainer: pl.Trainer, pl_module: pl.LightningModule, small: Any, kind: str,
            remedy: bool, gate: _DropoutGate) -> EvalPasses:
    (a, la, ca), (b, lb, cb) = (_one_pass(trainer, pl_module, small, kind, remedy, s, gate)
                                for s in SEEDS)
    divergence = first_divergence(a, b)
    losses = tuple(v for v in (la, lb) if v is not None)
    changed = tuple(dict.fromkeys((*ca, *cb)))
    if divergence is None:
        return EvalPasses(0.0, None, losses, changed)
    return EvalPasses(divergence.difference, divergence.call.name, losses, changed)


def eval_remedy_trial(trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                      kind: str, *, max_examples: int = 8, input_key: BatchKey | None = None,
                      target_key: BatchKey | None = None) -> dict[str, Any]:
    """The ``remedy`` block of a mode-stage remedy (``kind``: ``"eval_mode"`` or
    ``"gate_dropout"``) tried on ``batch``'s first ``max_examples`` examples (see the module
    docstring). Never raises for the user's code: a failure is a ``"skipped"`` block."""
    spec = REMEDIES[kind]
    block: dict[str, Any] = {"kind": kind, "change": spec.change, "verdict": "skipped"}
    if not is_overridden("validation_step", pl_module):
        return {**block, "reason": "the model has no `validation_step` to run"}
    if trainer.world_size > 1 and any(isinstance(m, nn.SyncBatchNorm)
                                      for m in pl_module.modules()):
        return {**block, "reason": "`SyncBatchNorm` under DDP: a pass in training mode would "
                                   "call a collective"}
    started = time.perf_counter()
    gate = _DropoutGate()
    try:
        small = copy_first_examples(batch, max_examples, input_key, target_key)
        as_is = _passes(trainer, pl_module, small, kind, False, gate)
        remedied = _passes(trainer, pl_module, small, kind, True, gate)
    except UserCodeError as err:
        return {**block, "reason": f"`validation_step` raised {err.describe()} on a copy"}
    except ProbeUnavailableError as exc:
        return {**block, "reason": str(exc)}
    decision = decide_eval_remedy(kind, as_is, remedied)  # type: ignore[arg-type]
    change = spec.change
    if spec.gate_dropout:
        change += f": {gate.gated // len(SEEDS)} call(s) per pass gated"
    return {"kind": kind, "change": change, "before": as_is.summary(),
            "after": remedied.summary(), "verdict": decision.verdict,
            "reason": decision.reason, "tried": list(decision.tried),
            "seconds": round(time.perf_counter() - started, 3)}


__all__ = ["dropout_gate", "eval_remedy_trial"]
