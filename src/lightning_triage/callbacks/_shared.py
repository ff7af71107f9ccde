"""Helpers the callbacks share (private): each was a function of one check that others imported
from it; they live here so that no callback imports from a sibling callback.

The modules they came from (``initial_loss``, ``gradient_wiring``) import them from here, so the
old import paths keep working.
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor

from lightning_triage.callbacks._args import arg, check_choice, check_int
from lightning_triage.errors import TriageConfigError
from lightning_triage.functional.chance import TASKS
from lightning_triage.probing import step_loss

#: Strategies that shard or flatten parameters: per-parameter gradients and probes that call
#: ``training_step`` outside the wrapped forward do not apply there.
SHARDED_STRATEGIES = ("FSDPStrategy", "DeepSpeedStrategy", "ModelParallelStrategy")


def validate_task(task: str, num_classes: int | None) -> None:
    """Check the ``task``/``num_classes`` arguments shared by the bundle and the checks.

    Raises:
        TriageConfigError: naming the argument, its value and what is allowed.
    """
    check_choice("task", task, TASKS)
    check_int("num_classes", num_classes, 2, optional=True)
    if task in ("multiclass", "sequence") and num_classes is None:
        shown = arg("num_classes")
        raise TriageConfigError(f"`{shown}` is required with task={task!r} (an integer >= 2), "
                                f"got None.", argument=shown, value=None)


def loss_from_outputs(outputs: STEP_OUTPUT, pl_module: pl.LightningModule,
                      trainer: pl.Trainer) -> Tensor | None:
    """The training-step loss from ``on_train_batch_end`` outputs, undoing Lightning's division
    by ``accumulate_grad_batches`` under automatic optimization."""
    loss = step_loss(outputs)
    if loss is None:
        return None
    if pl_module.automatic_optimization:
        loss = loss * trainer.accumulate_grad_batches
    return loss.detach()


def sharded_strategy(trainer: pl.Trainer) -> str | None:
    """The name of the trainer's strategy if it shards or flattens parameters, else ``None``."""
    names = {cls.__name__ for cls in type(trainer.strategy).__mro__}
    found = [name for name in SHARDED_STRATEGIES if name in names]
    return found[0] if found else None


__all__ = ["SHARDED_STRATEGIES", "loss_from_outputs", "sharded_strategy", "validate_task"]
