"""Stage 6 (mode), data-parallel runs: are the monitored validation metrics synced?"""

from __future__ import annotations

from typing import Any, ClassVar

import lightning.pytorch as pl
from typing_extensions import override

from lightning_triage.callbacks._args import check_int
from lightning_triage.callbacks._shared import gather_objects
from lightning_triage.callbacks.base import TriageCallback
from lightning_triage.functional.metric_sync import unsynced_rule


def monitored_metrics(trainer: pl.Trainer) -> dict[str, list[str]]:
    """The metrics a checkpoint or early-stopping callback monitors -> their class names."""
    found: dict[str, list[str]] = {}
    for cb in [*trainer.checkpoint_callbacks, *trainer.early_stopping_callbacks]:
        monitor = getattr(cb, "monitor", None)
        if isinstance(monitor, str) and monitor:
            found.setdefault(monitor, []).append(type(cb).__name__)
    return found


class MetricSyncCheck(TriageCallback):
    """Check that the metrics a ``ModelCheckpoint`` or ``EarlyStopping`` monitors hold the same
    value on every rank.

    At the end of the first ``max_checks`` validation runs (not the sanity check), each rank
    reads the monitored metrics from ``trainer.callback_metrics`` and the ranks gather them
    (one ``all_gather_object`` of a few numbers). A metric logged without ``sync_dist=True``
    holds each rank's own shard mean: the callbacks that monitor it then decide from one
    rank's data. Metrics nothing monitors are not compared. Does nothing in a single process.

    Findings: ``mode.unsynced_metric``. See ``docs/distributed.md``.

    Args:
        max_checks: validation runs compared (per fit).
        strict: raise internal errors instead of disabling the check.

    Raises:
        TriageConfigError: for ``max_checks`` below 1.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[MetricSyncCheck()])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.MetricSyncCheck
                  init_args: {max_checks: 1}
    """

    stage: ClassVar[str] = "mode"
    codes: ClassVar[tuple[str, ...]] = ("mode.unsynced_metric",)

    def __init__(self, *, max_checks: int = 1, strict: bool = False) -> None:
        super().__init__(strict=strict)
        check_int("max_checks", max_checks, 1)
        self.max_checks = max_checks
        self._checks = 0

    @override
    def needs_hook(self, hook: str) -> bool:
        return False  # no per-step work

    # not `guarded`: an error on one rank must never make it skip the collective the others take
    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._checks = 0
        if trainer.world_size < 2:
            self.mark_ran("a single process: no ranks to compare")  # as autocast under 32-true
        else:
            self.mark_ran("no validation run compared")
        self.idle = True

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if (self.disabled or trainer.world_size < 2 or trainer.sanity_checking
                or self._checks >= self.max_checks):
            return
        monitored = monitored_metrics(trainer)  # the same callbacks on every rank
        if not monitored:
            self.mark_ran("no metric monitored by a checkpoint or early-stopping callback")
            return
        mine: dict[str, float] = {}
        try:
            for name in monitored:
                value = trainer.callback_metrics.get(name)
                if value is not None:
                    mine[name] = float(value)
        except Exception as exc:
            if self.strict:
                raise
            mine = {}
            self.detail = f"could not read a metric: {type(exc).__name__}: {exc}"
        values: list[Any] = gather_objects(trainer, mine)
        self._checks += 1
        try:
            self.mark_ran(f"{len(monitored)} monitored metric(s) compared across {len(values)} ranks")
            if trainer.is_global_zero:
                self.add_verdicts(trainer, [v for v in unsynced_rule(values, monitored,
                                                                    trainer.global_step)
                                            if not self.has_finding(v.code)])
        except Exception as exc:
            self.hook_failed(trainer, "on_validation_end", exc)


__all__ = ["MetricSyncCheck"]
