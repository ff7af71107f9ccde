"""Stage 6 (mode): are dropout and batch-norm layers in eval mode during validation?"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import lightning.pytorch as pl
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from lightning_triage.callbacks._args import BundleArg, check_bool
from lightning_triage.callbacks._mode_remedy import eval_remedy_trial
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.functional.mode import mode_sensitive_in_training, train_mode_in_eval


class EvalModeCheck(TriageCallback):
    """Report dropout/batch-norm layers left in training mode during validation.

    Lightning puts the model in eval mode before validation; a ``self.train()`` in
    ``on_validation_epoch_start`` (or in ``validation_step``) undoes it, so validation scores
    are noisy (dropout) and BatchNorm statistics get updated with validation data. The check
    looks at the first batch of every validation run (sanity check included), before and after
    its ``validation_step``: a loop over the modules, no tensor work. Each problem is reported
    once; the evidence counts the validation runs where it was seen.

    When it finds the problem, it tries the remedy right there (``verify_remedy``): the user's
    ``validation_step`` on copies of the model over at most 8 examples of that batch, from two
    random states, with the modes as seen and with every layer in eval mode; the result
    (``confirmed`` when the outputs become identical and no running statistic moves, with the
    validation loss before and after) is the finding's ``remedy_trial`` evidence, which the
    report shows when the finding leads (docs/remedies.md). A healthy run runs nothing.

    Findings: ``mode.train_mode_in_eval`` (with the module names).

    Args:
        verify_remedy: try the remedy on copies when the problem is found.
        strict: raise internal errors instead of disabling the check.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[EvalModeCheck()])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.EvalModeCheck
    """

    stage: ClassVar[str] = "mode"
    codes: ClassVar[tuple[str, ...]] = ("mode.train_mode_in_eval",)
    # how `Triage` builds this check (TriageCallback.bundle_args)
    bundle_args: ClassVar[Mapping[str, BundleArg]] = {"verify_remedy": "verify_remedies"}

    def __init__(self, *, verify_remedy: bool = True, strict: bool = False) -> None:
        super().__init__(strict=strict)
        check_bool("verify_remedy", verify_remedy)
        self.verify_remedy = verify_remedy
        self.runs_checked = 0
        self.runs_in_train_mode = 0
        self._pending = False

    @override
    @guarded
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pending = True

    @override
    @guarded
    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                  batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if self._pending and self._inspect(trainer, pl_module, batch,
                                           "at the first validation batch"):
            self._close_run(found=True)

    @override
    @guarded
    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                outputs: STEP_OUTPUT, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        if self._pending:
            found = self._inspect(trainer, pl_module, batch, "after the first `validation_step`")
            self._close_run(found)

    def _close_run(self, found: bool) -> None:
        self._pending = False
        self.runs_checked += 1
        self.runs_in_train_mode += int(found)
        # the finding says how many runs showed it so far: a new one, built complete, each run
        self.findings = [replace(f, evidence={**f.evidence,
                                              "validation_runs": self.runs_in_train_mode})
                         if f.code == "mode.train_mode_in_eval" else f for f in self.findings]
        self.mark_ran(f"checked the first batch of {self.runs_checked} validation run(s): "
                      f"{self.runs_in_train_mode} with layers in training mode")

    def _inspect(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                 when: str) -> bool:
        if self.has_finding("mode.train_mode_in_eval"):
            return bool(mode_sensitive_in_training(pl_module))
        phase = "the sanity check" if trainer.sanity_checking else "validation"
        verdict = train_mode_in_eval(pl_module, trainer.global_step, phase=phase, when=when)
        if verdict is None:
            return False
        extra: dict[str, Any] = {}
        if self.verify_remedy:
            extra["remedy_trial"] = eval_remedy_trial(trainer, pl_module, batch, "eval_mode")
        self.add_verdict(trainer, verdict, validation_runs=self.runs_in_train_mode + 1,
                         sanity_check=bool(trainer.sanity_checking), **extra)
        return True

    @override
    def extra_state(self) -> dict[str, Any]:
        return {"runs_checked": self.runs_checked, "runs_in_train_mode": self.runs_in_train_mode}

    @override
    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.runs_checked = int(state.get("runs_checked", self.runs_checked))
        self.runs_in_train_mode = int(state.get("runs_in_train_mode", self.runs_in_train_mode))


__all__ = ["EvalModeCheck"]
