"""The progress line of long work (issue 45): the fit-start probes and the end-of-fit remedy
trial say what runs and how long it took, through Lightning's progress bar, and nothing is
printed when that bar is off."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_triage import Triage
from lightning_triage.demo.broken import broken_run
from tests.helpers import make_trainer


def _fit(tmp_path: Path, bar: bool) -> None:
    model, train, val = broken_run("lr-50").build()
    triage = Triage(verbose=False, overfit_time_budget=60.0)
    make_trainer(tmp_path, [triage], enable_progress_bar=bar, limit_train_batches=16).fit(
        model, train, val)
    assert triage.report.report is not None
    assert triage.report.report["start_here"] == "curve.diverging"


def test_long_work_shows_a_progress_line_with_the_bar(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    _fit(tmp_path / "on", bar=True)
    out = capsys.readouterr().out
    for what in ("overfit probe on a copy (budget 60 s)...", "structure probes on copies",
                 "trying the lead's fix on a copy: every param group's learning rate / 10"):
        assert f"lightning-triage: {what}" in out, out[-2000:]
    assert "lightning-triage: overfit probe on a copy: done in " in out
    assert "lightning-triage: trying the lead's fix on a copy: done in " in out
    _fit(tmp_path / "off", bar=False)
    assert "lightning-triage" not in capsys.readouterr().out
