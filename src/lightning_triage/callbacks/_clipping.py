"""What the run's gradient clipping keeps, for :class:`~lightning_triage.GradientMonitor`: the
user's ``gradient_clip_val``, the gradient scaler a backward is scaled by, total norms."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from lightning_triage._compat import grad_scaler
from lightning_triage.functional.tensors import is_plain

#: Manual optimization: the first steps whose clipping is measured (two host reads per step).
CLIP_STEPS = 30


def total_norm(params: list[nn.Parameter]) -> float:
    """The total norm of the parameters' gradients, read on the host in float64."""
    return total_norm_of([p.grad for p in params if p.grad is not None])


def total_norm_of(tensors: list[torch.Tensor]) -> float:
    """The total norm of ``tensors`` (gradients), read on the host in float64."""
    grads = [g for g in tensors if is_plain(g)]
    if not grads:
        return math.nan
    return float(torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm(g.detach().double()) for g in grads])))


def scaler_of(trainer: pl.Trainer, pl_module: pl.LightningModule) -> Any:
    """The gradient scaler that scales this run's backward: Lightning's (fp16 AMP), else one
    the module holds as an attribute (manual optimization with the user's own scaler)."""
    found = grad_scaler(trainer)
    if found is not None:
        return found
    return next((v for v in vars(pl_module).values() if isinstance(v, torch.amp.GradScaler)),
                None)


class ClipMeter:
    """What the user's own clipping keeps under manual optimization, read by torch hooks in
    one process: at every backward the norm it produced (divided by the gradient scaler's scale:
    the user's own scaler too) and at every optimizer step (a pre-hook on the raw optimizer, so
    ``scaler.step(opt.optimizer)`` counts) the norm reaching the optimizer. Appends the kept
    fraction per step to ``kept``, at most :data:`CLIP_STEPS`, while ``active()``.

    Attributes:
        scale: the scaler's scale at the last measured backward (``nan`` before any).
        optimizer: the class name of the optimizer stepped (``""`` before any step).
    """

    def __init__(self, kept: list[float], active: Callable[[], bool]) -> None:
        self.kept, self.active = kept, active
        self.scale = math.nan
        self.optimizer = ""
        self._pending: list[float] = []  # squared unscaled norms of this step's backwards

    def hooks(self, params: list[nn.Parameter], optimizers: Sequence[Any],
              scaler: Any) -> list[RemovableHandle]:
        """Register the hooks (nothing when no parameter requires a gradient); the caller
        removes the handles (never from inside a torch hook)."""
        leaves = [p for p in params if p.requires_grad]
        if not leaves:
            return []

        def produced(grads: Sequence[torch.Tensor | None]) -> None:
            if not self.active() or len(self.kept) >= CLIP_STEPS:
                return
            scale = float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() \
                else 1.0
            self.scale = scale
            norm = total_norm_of([g for g in grads if g is not None])
            self._pending.append((norm / scale) ** 2 if scale > 0 else math.nan)

        def at_step(opt: Any, *_: Any) -> None:
            self.optimizer = self.optimizer or type(opt).__name__
            if not self._pending:
                return
            after, before = total_norm(params), math.sqrt(sum(self._pending))
            self._pending.clear()
            if math.isfinite(after) and math.isfinite(before) and before > 0 \
                    and len(self.kept) < CLIP_STEPS:
                self.kept.append(after / before)

        return [torch.autograd.graph.register_multi_grad_hook(leaves, produced),
                *(opt.register_step_pre_hook(at_step) for opt in optimizers)]


def user_clip(trainer: pl.Trainer) -> float | None:
    """The user's ``gradient_clip_val`` when it clips the total norm (``None``: no clipping, or
    clipping by value, which bounds entries, not the norm)."""
    val = getattr(trainer, "gradient_clip_val", None)
    algorithm = str(getattr(trainer, "gradient_clip_algorithm", None) or "norm").lower()
    if not isinstance(val, (int, float)) or val <= 0 or not algorithm.endswith("norm"):
        return None
    return float(val)


__all__ = ["CLIP_STEPS", "ClipMeter", "scaler_of", "total_norm", "total_norm_of", "user_clip"]
