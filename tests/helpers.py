"""Helpers for tests: tiny Trainers and models over real data."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage.findings import Finding


def make_trainer(tmp_path: Path, callbacks: list[Any], **kwargs: Any) -> pl.Trainer:
    """A quiet CPU Trainer writing under ``tmp_path``."""
    defaults: dict[str, Any] = dict(
        default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, accelerator="cpu",
        max_epochs=1, limit_train_batches=4, limit_val_batches=2, num_sanity_val_steps=0,
    )
    defaults.update(kwargs)
    return pl.Trainer(callbacks=callbacks, **defaults)


def seeds(n: int = 3) -> list[Any]:
    """Seeds for a test on a free-running training trajectory: seed 0, and seeds 1..n-1 marked
    ``slow`` (run by default; ``-m 'not slow'`` leaves them out). Its asserts hold with margins
    measured on all of them, under ``ATEN_CPU_CAPABILITY=default``, ``avx2`` and the native
    kernels."""
    return [0, *(pytest.param(s, marks=pytest.mark.slow, id=str(s)) for s in range(1, n))]


def other_seeds(n: int = 3) -> list[Any]:
    """Seeds 1..n-1 of :func:`seeds`, marked ``slow``: for a test whose seed 0 is another test
    (the registry's own fit, say)."""
    return seeds(n)[1:]


def loader(*tensors: torch.Tensor, batch_size: int = 32, shuffle: bool = False) -> DataLoader:
    return DataLoader(TensorDataset(*tensors), batch_size=batch_size, shuffle=shuffle,
                      generator=torch.Generator().manual_seed(0) if shuffle else None)


def codes(findings: list[Finding] | Any) -> set[str]:
    """The codes of a list of findings (or of a report dict's findings)."""
    if isinstance(findings, dict):
        return {f["code"] for f in findings["findings"]}
    return {f.code for f in findings}


def stage_codes(findings: list[Finding], stage: str) -> set[str]:
    return {f.code for f in findings if f.stage == stage}


def fit_ddp_spawn(make: Callable[[], pl.Trainer], *fit_args: Any) -> pl.Trainer:
    """``make().fit(*fit_args)`` for a ``ddp_spawn`` trainer on a port of its own, retried once
    when a worker was killed by SIGABRT: gloo workers occasionally abort at interpreter exit
    ("terminate called without an active exception", about 1 run in 20 on a loaded 2-core
    machine, with or without lightning-triage), or when another process took the port between
    its choice and the workers' start (``EADDRINUSE``: tests run in parallel, ``pytest -n``).
    Any other failure, or a second one, fails the test."""
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

    def fit() -> pl.Trainer:
        # Lightning keeps the port of the process's first fit in `MASTER_PORT`: each fit picks
        # a free one instead (two test processes never hold one port for the whole session)
        os.environ.pop("MASTER_PORT", None)
        trainer = make()
        trainer.fit(*fit_args)
        return trainer

    try:
        return fit()
    except ProcessExitedException as exc:
        if exc.signal_name != "SIGABRT":
            raise
    except ProcessRaisedException as exc:
        if "EADDRINUSE" not in str(exc) and "address already in use" not in str(exc):
            raise
    return fit()


#: The checks that read every step (or the first batches) of a healthy run and, finding
#: nothing, report ``passed``: a silent test asserts they ran, not only that they said nothing.
WATCHES = ("BatchInspector", "LossCurveMonitor", "GradientMonitor", "NonFiniteTracer")
#: The fit-start checks a healthy classifier passes.
FIT_START = ("InitialLossCheck", "GradientWiringCheck", "OverfitBatchCheck")


def check_statuses(source: Any) -> dict[str, str]:
    """``{check: status}`` of a report dict, of ``Triage`` (or ``TriageReport``) after fit, or
    of one check callback (``passed``, ``failed``, ``skipped``, ``error``)."""
    if hasattr(source, "check_status"):
        entry = source.check_status()
        return {entry["check"]: entry["status"]}
    report = source if isinstance(source, dict) else source.report.report
    return {c["check"]: c["status"] for c in report["checks"]}


def assert_ran_and_passed(source: Any, *checks: str) -> None:
    """Each of ``checks`` (default: every check of ``source``) ran and found no problem: its
    status is ``passed``, not ``skipped`` (never ran) nor ``failed``. For a report, the curve and
    gradient watches must also have recorded their series (they read every step)."""
    statuses = check_statuses(source)
    wanted = checks or tuple(statuses)
    wrong = {c: statuses.get(c, "absent") for c in wanted if statuses.get(c) != "passed"}
    assert not wrong, f"did not run, or found a problem: {wrong}"
    if not hasattr(source, "check_status"):
        report = source if isinstance(source, dict) else source.report.report
        series = report.get("series", {})
        for check, name in (("LossCurveMonitor", "train_loss"), ("GradientMonitor", "grad_norm")):
            if check in wanted:
                assert series.get(name), f"{check} recorded no {name}"



def drawn_plot(plot: Callable[..., Any], report: Any) -> tuple[Any, tuple[int, int]] | None:
    """The matplotlib figure ``plot`` (a function of :mod:`lightning_triage.report.plots`) draws for
    ``report`` as :func:`lightning_triage.report.plots.draw` runs it (the HTML page's settings), and
    the (width, height) in pixels of the image it returns; ``None`` when it draws nothing."""
    import base64
    import io

    from matplotlib.figure import Figure
    from matplotlib.image import imread

    from lightning_triage.report import plots

    figures: list[Any] = []

    class Recording(Figure):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            figures.append(self)

    uri, failed = plots.draw(plot, Recording, report)
    assert not failed, plot
    if uri is None:
        return None
    image = imread(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])), format="png")
    return figures[-1], (image.shape[1], image.shape[0])


def plot_text_problems(fig: Any, size: tuple[int, int], dpi: int = 80) -> list[str]:
    """What is wrong with the text of a drawn figure whose image is ``size`` pixels: a tick label
    in view that holds math text (``$``, ``^{``, a backslash) or, on a numeric axis (linear or
    log), does not read as the number at its position; and text drawn outside the image (an
    axis title cut at the edge)."""
    import math

    from matplotlib.ticker import LogFormatter, ScalarFormatter

    problems: list[str] = []
    for ax in fig.axes:
        for axis, lim, index in ((ax.xaxis, ax.get_xlim(), 0), (ax.yaxis, ax.get_ylim(), 1)):
            lo, hi = sorted(lim)
            for minor in (False, True):
                formatter = axis.get_minor_formatter() if minor else axis.get_major_formatter()
                numeric = isinstance(formatter, (ScalarFormatter, LogFormatter)) and not (
                    isinstance(formatter, ScalarFormatter) and formatter.get_offset())
                for tick in axis.get_ticklabels(minor=minor):
                    text, where = tick.get_text(), tick.get_position()[index]
                    if not text or not lo <= where <= hi:
                        continue
                    if any(mark in text for mark in ("$", "^{", "\\")):
                        problems.append(f"math text in a tick label: {text!r}")
                        continue
                    try:
                        value = float(text.replace("\u2212", "-"))
                    except ValueError:
                        value = math.nan
                    if numeric and not math.isclose(value, where, rel_tol=2e-3, abs_tol=1e-6 * (hi - lo)):
                        problems.append(f"tick label {text!r} at {where:g}")
    drawn, page = fig.get_tightbbox(), fig.bbox_inches
    outside = drawn.x0 < 0 or drawn.y0 < 0 or drawn.x1 > page.x1 or drawn.y1 > page.y1
    # text outside the figure: the image must be the drawn area (with a margin), not the figure
    if outside and (size[0] < drawn.width * dpi - 1 or size[1] < drawn.height * dpi - 1
                    or size == (round(page.width * dpi), round(page.height * dpi))):
        problems.append(f"text outside the image: drawn {drawn.bounds}, image {size} px")
    return problems
