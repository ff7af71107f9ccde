"""Stage 2 (init): is the loss at step 0 near chance level?"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import lightning.pytorch as pl
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from typing_extensions import override

from lightning_triage._compat import fp16_amp
from lightning_triage.callbacks._args import (
    BundleArg,
    check_batch_keys,
    check_int,
    check_number,
    passes,
)
from lightning_triage.callbacks._shared import loss_from_outputs, validate_task
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.functional.adapters import uses_adapters
from lightning_triage.functional.batch import BatchKey, split_batch
from lightning_triage.functional.chance import (
    IGNORE_INDEX,
    ChanceLevel,
    Task,
    compare_to_chance,
    resolve_chance,
)
from lightning_triage.functional.hooks import HeadCapture
from lightning_triage.functional.init_verdicts import (
    chance_unknown_verdict,
    initial_loss_verdict,
    objective_unknown_verdict,
    unrecognized_loss_verdict,
)
from lightning_triage.functional.objective import Objective, StepObjective


class InitialLossCheck(TriageCallback):
    """Compare the loss of the first training batch with the task's chance level.

    The loss is read from the first training step's output (no extra forward pass); under an
    optimizer that evaluates its closure several times per step (LBFGS) it is the first
    evaluation's loss, taken before the first backward. With
    ``task="auto"`` the task and class count are inferred from the targets and the shape of the
    model's output on that batch (captured by temporary forward hooks removed right after),
    unless the step calls a loss function the check knows: the first step is watched (a torch
    function mode that only observes; not for a module that runs compiled code) and the chance
    level is that loss's (:mod:`~lightning_triage.functional.objective`: soft targets, label
    smoothing, multilabel BCE with ``pos_weight``, in-batch negatives ``ln B``, KL to soft
    targets, masked positions only). A loss that is not one recognized term (weighted terms
    summed, a metric-learning loss) is not compared: ``init.chance_unknown`` (info) names it.

    Findings: ``init.loss_above_chance``, ``init.loss_below_chance`` (info for a peft
    fine-tune: adapters over a pretrained base start below chance), ``init.chance_unknown``.

    Args:
        task: ``"auto"``, ``"multiclass"``, ``"binary"``, ``"regression"`` or ``"sequence"``.
        num_classes: class count (vocabulary size for ``"sequence"``); required for
            ``"multiclass"`` and ``"sequence"``.
        ignore_index: target value excluded from class statistics.
        above_ratio: report when the loss exceeds this multiple of chance.
        below_ratio: report when the loss is below this multiple of chance (or of the prior).
        input_key: where the inputs are in a batch the defaults do not understand (a key, an
            index or a callable ``batch -> tensor``); see :func:`~lightning_triage.functional.split_batch`.
        target_key: where the targets are, likewise.
        strict: raise internal errors instead of disabling the check.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[InitialLossCheck(task="multiclass", num_classes=10)])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.InitialLossCheck
                  init_args: {task: multiclass, num_classes: 10}
    """

    stage: ClassVar[str] = "init"
    codes: ClassVar[tuple[str, ...]] = ("init.loss_above_chance", "init.loss_below_chance",
        "init.chance_unknown")
    # how `Triage` builds this check (TriageCallback.bundle_args)
    bundle_args: ClassVar[Mapping[str, BundleArg]] = passes(
        "task", "num_classes", "input_key", "target_key")

    state_key_args = ("task", "num_classes", "input_key", "target_key")

    def __init__(
        self,
        *,
        task: Task = "auto",
        num_classes: int | None = None,
        ignore_index: int = IGNORE_INDEX,
        above_ratio: float = 2.0,
        below_ratio: float = 0.5,
        input_key: BatchKey | None = None,
        target_key: BatchKey | None = None,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        validate_task(task, num_classes)
        check_int("ignore_index", ignore_index)
        check_number("above_ratio", above_ratio, 1)
        check_number("below_ratio", below_ratio, 0, 1)
        check_batch_keys(input_key=input_key, target_key=target_key)
        self.task = task
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.above_ratio = above_ratio
        self.below_ratio = below_ratio
        self.input_key = input_key
        self.target_key = target_key
        self.chance: ChanceLevel | None = None
        self.initial_loss: float | None = None
        self._capture = HeadCapture()
        self._objective = StepObjective()
        #: what the step-0 loss is (the loss functions the step called), when watched
        self.objective: Objective | None = None
        self._closure_losses: list[Tensor] = []  # the first backward losses of step 0

    @override
    @guarded
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.ran or trainer.global_step != 0 or batch_idx != 0:
            return
        targets = split_batch(batch, self.input_key, self.target_key).targets
        self._closure_losses = []
        self._capture.start(pl_module, targets, hooks=self.task == "auto",
                            wrap=lambda hook: self.guard_hook(trainer, "forward hook", hook))
        if self.task == "auto":  # which loss the step calls decides the chance level
            self._objective.start(pl_module)

    @override
    @guarded
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           loss: Tensor) -> None:
        self._objective.stop(loss)  # the loss is computed: the backward is not watched
        if self._capture.active and len(self._closure_losses) < 2:
            self._closure_losses.append(loss.detach().clone())

    @override
    @guarded
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: STEP_OUTPUT, batch: Any, batch_idx: int) -> None:
        if not self._capture.active:
            self._objective.close()
            self.idle = self.ran or trainer.global_step > 0
            return
        output, targets = self._capture.finish()
        self._objective.stop()
        loss = loss_from_outputs(outputs, pl_module, trainer)
        if len(self._closure_losses) > 1 and pl_module.automatic_optimization \
                and not fp16_amp(trainer):
            # an optimizer that evaluates its closure several times per step (LBFGS): the
            # step-0 loss is the first evaluation, the outputs hold the last
            loss = self._closure_losses[0] * trainer.accumulate_grad_batches
        if loss is None:
            self._objective.close()
            self.skip("the first training step returned no scalar loss")
            return
        self.initial_loss = float(loss)
        self.objective = self._objective.finish(self.initial_loss)
        self.mark_ran(f"step-0 loss {self.initial_loss:.4g}")
        if not math.isfinite(self.initial_loss):
            self.detail = f"step-0 loss is {self.initial_loss}; see the numerics findings"
            return
        if self.objective is not None and self.objective.recognized:
            # the loss functions the step called decide, not the batch's labels
            level = self.objective.chance_level()
            if level is None:
                self.detail = f"not judged: {self.objective.describe()}"
                self.add_verdict(trainer, objective_unknown_verdict(self.initial_loss,
                                                                    self.objective))
                return
            self.chance = level
            self._compare(trainer, self.initial_loss, level)
            return
        level = resolve_chance(self.task, self.num_classes, output, targets, self.ignore_index)
        if level is None:
            self._chance_unknown(trainer, output, targets)
            return
        if self.objective is not None and level.task != "regression" \
                and not self.objective.hand_written_ce:
            # the step was watched: integer labels in the batch do not make its loss a CE
            self.detail = f"not judged: {self.objective.describe()}"
            self.add_verdict(trainer, unrecognized_loss_verdict(self.initial_loss,
                                                                self.objective, level))
            return
        self.chance = level
        self._compare(trainer, self.initial_loss, level)

    def _chance_unknown(self, trainer: pl.Trainer, output: Tensor | None,
                        targets: Tensor | None) -> None:
        self.detail = "chance level unknown"
        self.add_verdict(trainer, chance_unknown_verdict(output, targets,
                                                         compiled=self._capture.traced))

    def _compare(self, trainer: pl.Trainer, loss: float, level: ChanceLevel) -> None:
        verdict = initial_loss_verdict(loss, level, above_ratio=self.above_ratio,
                                       below_ratio=self.below_ratio,
                                       peft=uses_adapters(trainer.lightning_module),
                                       inferred=self.task == "auto")
        ratio = compare_to_chance(loss, level, above_ratio=self.above_ratio,
                                  below_ratio=self.below_ratio).ratio
        self.detail = f"step-0 loss {loss:.4g} vs chance {level.describe()} ({ratio:.2f}x)"
        self.add_verdicts(trainer, verdict)

    @override
    def remove_handles(self) -> None:
        super().remove_handles()
        self._capture.close()
        self._objective.close()

    @override
    def report_details(self) -> dict[str, Any]:
        if self.initial_loss is None:
            return {}
        info: dict[str, Any] = {"loss": self.initial_loss if math.isfinite(self.initial_loss)
                                else str(self.initial_loss)}
        if self.chance is not None:
            info.update(chance=self.chance.value, chance_formula=self.chance.describe())
        if self.objective is not None and self.objective.recognized:
            info.update(objective=self.objective.describe())
        return {"initial_loss": info}

    @override
    def extra_state(self) -> dict[str, Any]:
        return {"initial_loss": self.initial_loss,
                "chance": None if self.chance is None else vars(self.chance)}

    @override
    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.initial_loss = state.get("initial_loss")
        chance = state.get("chance")
        self.chance = None if chance is None else ChanceLevel(**chance)


__all__ = ["InitialLossCheck", "loss_from_outputs", "validate_task"]
