"""Helpers the callbacks share (private): each was a function of one check that others imported
from it; they live here so that no callback imports from a sibling callback.

The modules they came from (``initial_loss``, ``gradient_wiring``) import them from here, so the
old import paths keep working.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch.distributed as dist
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from torch.utils.data import DataLoader

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


#: A loader's place among the training iterables: the keys and indices leading to it.
Keys = tuple[Any, ...]


def train_loaders(iterables: Any, keys: Keys = ()) -> Iterator[tuple[Keys, DataLoader[Any]]]:
    """Every ``DataLoader`` among ``trainer.train_dataloader`` (one, or a dict/list of them, as
    ``CombinedLoader`` takes them), with its keys."""
    if isinstance(iterables, DataLoader):
        yield keys, iterables
    elif len(keys) < 3 and isinstance(iterables, dict):
        for key, value in iterables.items():
            yield from train_loaders(value, (*keys, key))
    elif len(keys) < 3 and isinstance(iterables, (list, tuple)):
        for i, value in enumerate(iterables):
            yield from train_loaders(value, (*keys, i))


def loader_name(keys: Keys) -> str:
    """How findings name the training loader at ``keys``."""
    return "train_dataloader" + "".join(f"[{k!r}]" for k in keys)


def gather_objects(trainer: pl.Trainer, obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order: one collective that every rank must take
    (``[obj]`` in a single process)."""
    if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, obj)
        return gathered
    return [obj]


__all__ = ["SHARDED_STRATEGIES", "Keys", "gather_objects", "loader_name", "loss_from_outputs",
           "sharded_strategy", "train_loaders", "validate_task"]
