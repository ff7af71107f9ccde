"""Shared plumbing of the per-step monitors (private): the first-epochs window, the flush
cadence (values stay on the device and move to the host in chunks), logging to the loggers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl

from lightning_triage.callbacks._args import check_int
from lightning_triage.findings import Finding


def validate_window(window_epochs: int, window_steps: int, max_window_steps: int,
                    flush_every_n_steps: int | None, max_points: int) -> None:
    """Validate the window arguments shared by the monitors.

    Raises:
        TriageConfigError: naming the argument, its value and what is allowed.
    """
    check_int("window_epochs", window_epochs, 0)
    check_int("window_steps", window_steps, 1)
    check_int("max_window_steps", max_window_steps, window_steps)
    check_int("max_points", max_points, 2)
    check_int("flush_every_n_steps", flush_every_n_steps, 1, optional=True)


class WindowMixin:
    """The window (first ``window_epochs`` epochs or ``window_steps`` steps, whichever is
    longer, at most ``max_window_steps``) and the flush cadence."""

    window_epochs: int
    window_steps: int
    max_window_steps: int
    flush_every_n_steps: int | None
    window_closed: bool
    _flush_n: int | None

    def flush_interval(self, trainer: pl.Trainer) -> int:
        """Steps between host reads: ``flush_every_n_steps``, else the smallest multiple of
        ``log_every_n_steps`` that is at least 100 (at most 256 unless ``log_every_n_steps`` is
        larger). Cached after the first call."""
        if self._flush_n is not None:
            return self._flush_n
        if self.flush_every_n_steps is not None:
            n = self.flush_every_n_steps
        else:
            every = max(1, int(getattr(trainer, "log_every_n_steps", 50) or 50))
            n = every * max(1, -(-100 // every))
            n = n if n <= 256 else max(every, 256 - 256 % every)
        self._flush_n = n
        return n

    def window_over(self, trainer: pl.Trainer, steps_seen: int, epoch_done: bool = False) -> bool:
        """Whether the window is over after ``steps_seen`` optimizer steps."""
        if steps_seen >= self.max_window_steps:
            return True
        epochs_done = trainer.current_epoch + (1 if epoch_done else 0)
        return steps_seen >= self.window_steps and epochs_done >= self.window_epochs


def log_to_loggers(trainer: pl.Trainer, metrics: Mapping[str, float], step: int) -> None:
    """Write ``metrics`` to every logger of the trainer (rank zero; nothing on the progress bar)."""
    if not trainer.loggers or not trainer.is_global_zero or not metrics:
        return
    for logger in trainer.loggers:
        logger.log_metrics(dict(metrics), step=step)


def log_finding(trainer: pl.Trainer, finding: Finding, value: float = 1.0) -> None:
    """Send a finding to the loggers as it happens: ``triage/<code>`` = ``value`` at its step."""
    log_to_loggers(trainer, {f"triage/{finding.code}": float(value)},
                   finding.global_step if finding.global_step is not None else trainer.global_step)


def scalar(evidence: Mapping[str, Any], key: str, default: float = 1.0) -> float:
    """A finite float from ``evidence[key]`` for logging, else ``default``."""
    value = evidence.get(key)
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default
    return out if out == out and abs(out) != float("inf") else default


def handled_by(trainer: pl.Trainer, key: str | None) -> list[str]:
    """The user's callbacks that act on a rise of the validation loss ``key`` (``None``: any
    metric named like ``val*loss*``): an ``EarlyStopping`` stops the run, a ``ModelCheckpoint``
    keeps the best weights; e.g. ``["EarlyStopping(monitor='val_loss')"]``."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    out = []
    for cb in trainer.callbacks:  # type: ignore[attr-defined]
        monitor = getattr(cb, "monitor", None)
        if not isinstance(cb, (EarlyStopping, ModelCheckpoint)) or not isinstance(monitor, str) \
                or getattr(cb, "mode", "min") != "min":
            continue
        lower = monitor.lower()
        if monitor == key if key else ("val" in lower and "loss" in lower):
            out.append(f"{type(cb).__name__}(monitor={monitor!r})")
    return out
