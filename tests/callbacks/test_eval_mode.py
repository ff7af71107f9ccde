"""EvalModeCheck on real Trainer.fit runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_triage import EvalModeCheck
from tests.helpers import make_trainer, stage_codes
from tests.probe_models import (
    Classifier,
    ManualClassifier,
    TinyLM,
    TrainInValidation,
    cnn,
    digits,
    lm_loaders,
    mlp,
)


def fit_mode(tmp_path: Path, model: Any, loaders: Any = None, **kwargs: Any) -> EvalModeCheck:
    torch.manual_seed(0)
    check = EvalModeCheck(strict=True)
    train, val = loaders or digits()
    trainer = make_trainer(tmp_path, [check], **kwargs)
    trainer.fit(model, train, val)
    return check


def test_train_called_in_validation_hook_is_reported_once(tmp_path: Path) -> None:
    check = fit_mode(tmp_path, TrainInValidation(), max_epochs=2, num_sanity_val_steps=1)
    found = [f for f in check.findings if f.code == "mode.train_mode_in_eval"]
    assert len(found) == 1
    f = found[0]
    assert f.evidence["modules"] == ["net.2", "net.4"]
    assert f.evidence["module_types"] == ["BatchNorm2d", "Dropout"]
    assert f.evidence["sanity_check"] is True
    assert f.evidence["validation_runs"] == 3  # sanity check + 2 epochs
    assert "`net.2`, `net.4`" in f.message
    assert f.layer == "net.2"
    assert check.runs_checked == 3
    assert check.check_status()["status"] == "failed"


def test_train_called_inside_validation_step(tmp_path: Path) -> None:
    class TrainInStep(Classifier):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.net.train()
            super().validation_step(batch, batch_idx)

    check = fit_mode(tmp_path, TrainInStep(cnn()))
    f = next(f for f in check.findings if f.code == "mode.train_mode_in_eval")
    assert "after the first `validation_step`" in f.message


@pytest.mark.parametrize("build", [
    pytest.param(lambda: (Classifier(mlp(dropout=0.2)), None), id="mlp-dropout"),
    pytest.param(lambda: (Classifier(cnn()), None), id="cnn-bn-dropout"),
    pytest.param(lambda: (ManualClassifier(net=cnn()), None), id="manual"),
    pytest.param(lambda: (TinyLM(), lm_loaders()), id="transformer-lm"),
])
def test_healthy_models_are_silent(tmp_path: Path, build: Any) -> None:
    model, loaders = build()
    check = fit_mode(tmp_path, model, loaders, max_epochs=2, num_sanity_val_steps=1)
    assert stage_codes(check.findings, "mode") == set()
    assert check.runs_checked == 3
    assert check.check_status()["status"] == "passed"
    assert all(m.training for m in model.modules())  # Lightning put train mode back


def test_state_round_trip(tmp_path: Path) -> None:
    check = fit_mode(tmp_path, TrainInValidation())
    clone = EvalModeCheck()
    clone.load_state_dict(check.state_dict())
    assert clone.runs_checked == check.runs_checked
    assert clone.runs_in_train_mode == check.runs_in_train_mode == 1
