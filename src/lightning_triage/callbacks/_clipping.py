"""What the run's gradient clipping keeps, for :class:`~lightning_triage.GradientMonitor`: the
user's ``gradient_clip_val``, the gradient scaler a backward is scaled by, total norms."""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from lightning_triage._compat import grad_scaler
from lightning_triage.functional.tensors import is_plain

#: Manual optimization: the first steps whose clipping is measured (two host reads per step).
CLIP_STEPS = 30


def total_norm(params: list[nn.Parameter]) -> float:
    """The total norm of the parameters' gradients, read on the host in float64."""
    grads = [p.grad for p in params if p.grad is not None and is_plain(p.grad)]
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


def user_clip(trainer: pl.Trainer) -> float | None:
    """The user's ``gradient_clip_val`` when it clips the total norm (``None``: no clipping, or
    clipping by value, which bounds entries, not the norm)."""
    val = getattr(trainer, "gradient_clip_val", None)
    algorithm = str(getattr(trainer, "gradient_clip_algorithm", None) or "norm").lower()
    if not isinstance(val, (int, float)) or val <= 0 or not algorithm.endswith("norm"):
        return None
    return float(val)


__all__ = ["CLIP_STEPS", "scaler_of", "total_norm", "user_clip"]
