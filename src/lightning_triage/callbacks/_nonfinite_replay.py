"""The replay of a failing training step, for :class:`~lightning_triage.NonFiniteTracer`."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor

from lightning_triage._compat import forward_context, training_step_args
from lightning_triage.functional.collection import map_tensors
from lightning_triage.functional.nonfinite import Localization, float32_state, localize_nonfinite
from lightning_triage.probing import count_step_call, probe_module, step_loss


def to_float32(batch: Any) -> Any:
    """``batch`` with its float16/bfloat16 tensors cast to float32 (any nesting)."""

    def cast(t: Tensor) -> Tensor:
        return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t

    return map_tensors(cast, batch)


def replay_step(trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, *,
                rng: Tensor | None, cuda_rng: Tensor | None, float32: bool,
                on_call: Callable[[], None]) -> Localization:
    """Replay one training step through the user's ``training_step`` and localize its first NaN/Inf.

    On a copy of the module (its state stays out of the run; loggers quiet), or in place under a
    complete snapshot when a copy does not fit; every RNG is put back after.

    Args:
        trainer: the running trainer (its precision context and optimizers).
        pl_module: the module to replay.
        batch: the step's batch.
        batch_idx: its index (passed when ``training_step`` takes it).
        rng: the CPU RNG state at the step's start (``None``: left as is).
        cuda_rng: the CUDA RNG state at the step's start (``None``: left as is).
        float32: replay in float32 (float32 copies of the weights, autocast disabled) instead of
            under the run's precision context.
        on_call: called before each ``training_step`` call (counts them).
    """
    batch = to_float32(batch) if float32 else batch
    args = training_step_args(pl_module, batch, batch_idx)
    with probe_module(trainer, pl_module, trainer.optimizers, factor=2.0) as probe, \
            torch.enable_grad(), ExitStack() as stack:
        model = probe.module

        def step() -> Tensor | None:
            on_call()
            count_step_call()
            return step_loss(model.training_step(*args))

        if rng is not None:
            torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, pl_module.device)
        if float32:
            stack.enter_context(float32_state(model))
            stack.enter_context(torch.autocast(pl_module.device.type, enabled=False))
        else:
            stack.enter_context(forward_context(trainer))
        return localize_nonfinite(model, step)


__all__ = ["replay_step", "to_float32"]
