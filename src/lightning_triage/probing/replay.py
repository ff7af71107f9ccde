"""Replay the user's step for a probe: a fresh copy per pass with the same randomness, the
user's ``training_step`` in the run's precision context, a small copy of the batch."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Literal

import lightning.pytorch as pl
from torch import Tensor, nn

from lightning_triage._compat import train_step_context, training_step_args
from lightning_triage.functional.batch import BatchKey, split_batch
from lightning_triage.functional.collection import map_tensors
from lightning_triage.probing.isolation import Probe, probe_module
from lightning_triage.probing.state import RngState, set_rng_state, user_code

#: The user's ``training_step`` calls made on copies in this process, by who made them: the
#: probes, or the remedy trial (``TriageReport`` reports the difference over each fit).
STEP_CALLS: dict[str, int] = {"probes": 0, "trial": 0}
_CALLER: ContextVar[Literal["probes", "trial"]] = ContextVar("triage_step_caller",
                                                               default="probes")


def count_step_call() -> None:
    """Count one call of the user's ``training_step`` on a copy (see :data:`STEP_CALLS`)."""
    STEP_CALLS[_CALLER.get()] += 1


@contextmanager
def step_caller(caller: Literal["probes", "trial"]) -> Iterator[None]:
    """The ``training_step`` calls inside the block are counted as ``caller``'s."""
    token = _CALLER.set(caller)
    try:
        yield
    finally:
        _CALLER.reset(token)


@contextmanager
def eval_copy(trainer: pl.Trainer, module: nn.Module, rng: RngState | None, *,
              factor: float = 2.0) -> Iterator[Probe]:
    """:func:`probe_module` for one pass of a differential probe: a fresh copy (or the live
    module under a snapshot) in eval mode, with every global RNG set to ``rng`` (when given), so
    that paired passes start from the same state."""
    with probe_module(trainer, module, trainer.optimizers, factor=factor) as probe:
        probe.module.eval()
        if rng is not None:
            set_rng_state(rng)
        yield probe


def run_user_step(trainer: pl.Trainer, module: Any, batch: Any,
                  forward_fn: Callable[[Any, Any], Any] | None = None) -> Any:
    """The user's ``training_step`` (or ``forward_fn(module, batch)``) on ``batch``, in the run's
    precision context as the real step; its exceptions become :class:`UserCodeError`."""
    with train_step_context(trainer), user_code():
        if forward_fn is not None:
            return forward_fn(module, batch)
        count_step_call()
        return module.training_step(*training_step_args(module, batch, 0))


def step_loss(output: Any) -> Tensor | None:
    """The scalar loss in a ``training_step`` output (a tensor or a dict with ``"loss"``)."""
    loss = output.get("loss") if isinstance(output, Mapping) else output
    if isinstance(loss, Tensor) and loss.numel() == 1:
        return loss
    return None


def copy_first_examples(batch: Any, keep: int, input_key: BatchKey | None = None,
                        target_key: BatchKey | None = None) -> Any:
    """A copy of ``batch`` (tensors cloned, detached) with at most ``keep`` examples.

    The number of examples is the input tensor's first dimension (the input as
    :func:`~lightning_triage.functional.batch.split_batch` finds it); tensors and lists of that
    length are cut, everything else is kept whole.

    Example:
        >>> import torch
        >>> batch = {"x": torch.zeros(5, 2), "y": torch.arange(5), "ids": list("abcde")}
        >>> small = copy_first_examples(batch, 3, input_key="x")
        >>> small["x"].shape[0], small["y"].tolist(), small["ids"]
        (3, [0, 1, 2], ['a', 'b', 'c'])
    """
    inputs = split_batch(batch, input_key, target_key).inputs
    n = None if inputs is None or inputs.dim() == 0 else inputs.shape[0]
    cut_to = None if n is None or n <= keep else keep

    def cut(t: Tensor) -> Tensor:
        if cut_to is not None and t.dim() > 0 and t.shape[0] == n:
            t = t[:cut_to]
        return t.detach().clone()

    def cut_list(v: list[Any]) -> list[Any]:
        return v[:cut_to] if cut_to is not None and len(v) == n else list(v)

    return map_tensors(cut, batch, lists=cut_list)
