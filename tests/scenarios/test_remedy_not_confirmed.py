"""Leads whose remedy is not confirmed, in real fits (seeds 0-2): the curve reads "learning rate
too low", the trial multiplies the learning rate on a copy and the loss still does not fall, the
lead is challenged and the report names (and starts at) the cause another check saw. The runs
are the registry's (`lightning_triage.demo.broken.overfit`); their fixed twins (silent, no
trial) are checked with the registry's others, in `test_broken_runs.py`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest

from lightning_triage import Triage
from lightning_triage.callbacks import _remedy
from lightning_triage.demo.broken import REFUTED_LEAD_RUNS, broken_run
from tests.helpers import seeds

SLOW = ("curve.lr_too_low", "curve.not_learning")


@pytest.fixture(autouse=True)
def _roomy_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    # the machine running the suite is shared: the trial's 5 s floor is not what is tested here
    monkeypatch.setattr(_remedy, "TIME_FLOOR_S", 120.0)


def fit(build: Any, tmp_path: Path, seed: int) -> tuple[Triage, dict[str, Any]]:
    pl.seed_everything(seed, verbose=False)
    model, train, val = build()
    triage = Triage(report_dir=tmp_path, verbose=False, overfit_time_budget=120.0)
    trainer = pl.Trainer(max_epochs=2, callbacks=[triage], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(model, train, val)
    report = triage.report.report
    assert report is not None
    return triage, report


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("name", REFUTED_LEAD_RUNS)
def test_a_larger_learning_rate_does_not_cure_it_and_the_cause_is_named(
        tmp_path: Path, name: str, seed: int) -> None:
    run = broken_run(name)
    cause = run.expect
    triage, report = fit(run.build, tmp_path, seed)
    tried = [f for f in report["findings"] if "remedy" in f]
    assert len(tried) == 1 and triage.report.remedies.trials == 1
    challenged = tried[0]
    remedy = challenged["remedy"]
    assert challenged["code"] in SLOW
    assert (remedy["kind"], remedy["verdict"]) == ("lr_up", "not confirmed"), remedy
    assert remedy["tried"] == ["x10", "x100", "x1000"]
    assert remedy["before"]["finite"]
    assert "made no real progress" in remedy["reason"]
    # the cause another check saw is named, and the report starts there
    assert remedy["next_candidate"] == cause
    assert report["start_here"] == cause
    lead = next(f for f in report["findings"] if f["code"] == cause)
    assert lead["severity"] in ("warning", "error") and lead["explained_by"] == []
    # the challenged lead explains nothing any more (the floor explains it, where it is the cause)
    assert all(challenged["code"] not in f["explained_by"] for f in report["findings"])
    if cause == "overfit.loss_floor":
        assert challenged["explained_by"] == [cause]
        assert lead["evidence"]["share"] > 0.5
    text = (tmp_path / "triage_report.md").read_text()
    assert f"## Start here: `{cause}`" in text
    assert f"Remedy: on `{challenged['code']}`: not confirmed on a copy" in text
    assert f"next candidate: `{cause}`" in text
