"""What the structure-stage probes share: a small copy of the batch, the user's step on it,
and the forwarding of the functional core's verdicts to the report."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from torch import nn

from lightning_triage.callbacks.base import TriageCallback
from lightning_triage.functional.batch import BatchKey
from lightning_triage.probing import copy_first_examples, run_user_step

ForwardFn = Callable[[pl.LightningModule, Any], Any]


class ProbeCallback(TriageCallback):
    """A check that runs the user's step on a copy of the first batch (the subclass sets the
    attributes below in its ``__init__``)."""

    forward_fn: ForwardFn | None
    input_key: BatchKey | None
    target_key: BatchKey | None
    max_examples: int

    def _copy(self, batch: Any) -> Any:
        """A copy of ``batch`` with at most ``max_examples`` examples (tensors cloned)."""
        return copy_first_examples(batch, self.max_examples, self.input_key, self.target_key)

    def _count_user_call(self) -> None:
        """Count one call of the user's code in the probe's result (the subclass keeps it)."""
        raise NotImplementedError

    def _run(self, trainer: pl.Trainer, module: nn.Module, batch: Any) -> Any:
        """The user's code on a batch, in the run's precision context (as the real step)."""
        self._count_user_call()
        return run_user_step(trainer, module, batch, self.forward_fn)


__all__ = ["ForwardFn", "ProbeCallback"]
