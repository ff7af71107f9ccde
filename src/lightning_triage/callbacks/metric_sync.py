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
    reads the monitored metrics and the metrics logged in that validation run (those of
    ``trainer.callback_metrics`` that the run added or replaced) and the ranks gather them
    (one ``all_gather_object`` of a few numbers). A metric logged without ``sync_dist=True``
    holds each rank's own shard mean: the callbacks that monitor it then decide from one
    rank's data (a warning); a validation metric nothing monitors only shows rank 0's shard
    (info). Does nothing in a single process.

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
        self._before: dict[str, Any] = {}  # `callback_metrics` when the validation run started

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

    def _due(self, trainer: pl.Trainer) -> bool:
        return not (self.disabled or trainer.world_size < 2 or trainer.sanity_checking
                    or self._checks >= self.max_checks)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # the tensors before the run (references, no host read): those it adds or replaces
        # are the metrics it logged
        self._before = dict(trainer.callback_metrics) if self._due(trainer) else {}

    def _logged(self, trainer: pl.Trainer) -> list[str]:
        """The scalar metrics this validation run logged (sorted: the same list on every
        rank when the ranks log the same names)."""
        return sorted(k for k, v in trainer.callback_metrics.items()
                      if self._before.get(k) is not v and getattr(v, "numel", lambda: 1)() == 1)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._due(trainer):
            return
        monitored = monitored_metrics(trainer)  # the same callbacks on every rank
        mine: dict[str, float] = {}
        logged: list[str] = []
        try:
            logged = self._logged(trainer)
            for name in [*monitored, *logged]:
                value = trainer.callback_metrics.get(name)
                if value is not None:
                    mine[name] = float(value)
        except Exception as exc:
            if self.strict:
                raise
            mine = {}
            self.detail = f"could not read a metric: {type(exc).__name__}: {exc}"
        self._before = {}
        # taken on every rank, even with nothing to compare here (another rank may have some)
        values: list[Any] = gather_objects(trainer, mine)
        self._checks += 1
        try:
            names = sorted(set().union(*(v.keys() for v in values if isinstance(v, dict))))
            self.mark_ran(f"{len(names)} validation metric(s) compared across {len(values)} "
                          f"ranks ({len(monitored)} monitored)")
            if trainer.is_global_zero:
                verdicts = unsynced_rule(values, monitored, trainer.global_step, logged=names)
                self.add_verdicts(trainer, [v for v in verdicts
                                            if not self._seen(v.evidence["metric"])])
        except Exception as exc:
            self.hook_failed(trainer, "on_validation_end", exc)

    def _seen(self, metric: str) -> bool:
        return any(f.evidence.get("metric") == metric for f in self.findings)


__all__ = ["MetricSyncCheck"]
