"""A progress line for long work (the fit-start probes, the end-of-fit remedy trial), shown the
way Lightning's progress bar shows its lines, and not at all when that bar is off."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import lightning.pytorch as pl
from lightning.pytorch.callbacks import TQDMProgressBar

PREFIX = "lightning-triage:"


def shows_progress(trainer: pl.Trainer | None) -> bool:
    """Whether ``trainer`` shows a progress bar on this process (rank zero, bar enabled)."""
    bar = getattr(trainer, "progress_bar_callback", None)
    return bar is not None and bool(getattr(bar, "is_enabled", False)) \
        and bool(getattr(trainer, "is_global_zero", False))


def say(trainer: pl.Trainer | None, text: str) -> None:
    """Print ``lightning-triage: text`` through the trainer's progress bar (a tqdm bar's line is
    redrawn below it; a Rich bar prints on its console); nothing when the bar is off. Never
    raises: a line that cannot be shown is not a reason to break the run."""
    if not shows_progress(trainer):
        return
    line = f"{PREFIX} {text}"
    bar = trainer.progress_bar_callback  # type: ignore[union-attr]
    try:
        if isinstance(bar, TQDMProgressBar):
            from tqdm import tqdm

            tqdm.write(line, file=sys.stdout)  # where Lightning's tqdm bars draw
        else:
            bar.print(line)  # type: ignore[union-attr]
    except Exception:
        pass


@contextmanager
def progress(trainer: pl.Trainer | None, what: str, budget: float | None = None,
             detail: str = "") -> Iterator[None]:
    """Say that ``what`` runs (``detail``: what it tries; its time ``budget`` in seconds), then
    how long it took.

    Example:
        >>> with progress(None, "overfit probe on a copy", budget=5.0):  # no trainer: silent
        ...     pass
    """
    started = time.perf_counter()
    say(trainer, what + (f": {detail}" if detail else "")
        + (f" (budget {budget:.3g} s)" if budget else "") + "...")
    try:
        yield
    finally:
        say(trainer, f"{what}: done in {time.perf_counter() - started:.1f} s")


__all__ = ["progress", "say", "shows_progress"]
