"""A remedy trial that cannot finish within its time budget does not start: its cost is
estimated from the fit's own step time (two replays of the recorded steps decide at least), and
the lead's block says so at once instead of spending the whole budget first."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from torch import Tensor

from lightning_triage import Triage
from lightning_triage.callbacks import _remedy
from lightning_triage.callbacks._remedy import RemedyRecorder, step_seconds
from lightning_triage.demo.digits import DigitsMLP, digits_loaders


class SlowStep(DigitsMLP):
    """The digits MLP at SGD lr 1e-5 (a lead with a replayed remedy) whose step takes 50 ms."""

    def __init__(self) -> None:
        super().__init__(lr=1e-5)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        time.sleep(0.05)
        return super().training_step(batch, batch_idx)


def test_a_trial_that_cannot_finish_does_not_start(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_remedy, "TIME_FLOOR_S", 0.5)  # the budget of a short fit: 0.25 x its time
    states = []
    bundle = Triage(report_dir=tmp_path, verbose=False, overfit=False)
    for triage in (bundle, None):
        pl.seed_everything(0, verbose=False)
        trainer = pl.Trainer(callbacks=[triage] if triage else [], max_epochs=2,
                             limit_train_batches=12, limit_val_batches=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=tmp_path,
                             num_sanity_val_steps=0)
        train, val = digits_loaders()
        model = SlowStep()
        trainer.fit(model, train, val)
        states.append(model.state_dict())
    assert all(v.equal(states[1][k]) for k, v in states[0].items())  # the run is the same
    report = bundle.report.report
    assert report is not None
    blocks = [f["remedy"] for f in report["findings"] if "remedy" in f]
    assert blocks and blocks[0]["verdict"] == "skipped", blocks
    assert "would need about" in blocks[0]["reason"] and "ms per step" in blocks[0]["reason"]
    assert bundle.report.remedies.trials == 0 and bundle.report.remedies.seconds == 0.0


def test_step_seconds_is_the_median_gap() -> None:
    recorder = RemedyRecorder()
    assert step_seconds(recorder) is None
    recorder.starts = [0.0, 0.1, 0.2, 5.0, 5.1]  # one validation run between two batches
    assert step_seconds(recorder) == pytest.approx(0.1)
