"""Set-ups of the 2026 training stack beside `torch.compile` and PEFT (their own files): gradient
checkpointing (reentrant and not), `weight_norm`/`spectral_norm` parametrizations and
channels_last convolutions. Each healthy run is silent and its weights are bit-identical with
and without `Triage()`; reentrant checkpointing over inputs that need no gradient (a real,
silent bug: the checkpointed block never gets a gradient) is caught."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn
from torch.nn.utils import parametrizations
from torch.utils.checkpoint import checkpoint

from lightning_triage import Triage
from tests.probe_models import digits
from tests.realmodels.models import DigitsCE, problems, quiet_trainer


class Net(DigitsCE):
    """A digits classifier built for one set-up of the stack."""

    def __init__(self, setup: str) -> None:
        super().__init__()
        self.setup_name = setup
        if setup == "channels_last":
            self.body: nn.Module = nn.Sequential(
                nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8),
                nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 32), nn.ReLU())
        else:
            self.body = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 10)
        if setup == "weight_norm":
            self.body[0] = parametrizations.weight_norm(self.body[0])
        elif setup == "spectral_norm":
            self.body[2] = parametrizations.spectral_norm(self.body[2])

    def forward(self, x: Tensor) -> Tensor:
        if self.setup_name == "channels_last":
            x = x.view(-1, 1, 8, 8).contiguous(memory_format=torch.channels_last).flatten(1)
        if self.setup_name.startswith("checkpoint"):
            reentrant = self.setup_name != "checkpoint"
            if self.setup_name == "checkpoint_reentrant":
                x = x.requires_grad_()  # the fix: an input that needs a gradient
            h = checkpoint(self.body, x, use_reentrant=reentrant)
        else:
            h = self.body(x)
        return self.head(h)



def fit(tmp_path: Path, setup: str, callbacks: list[Any]) -> Tensor:
    pl.seed_everything(0, verbose=False)
    model = Net(setup)
    if setup == "channels_last":
        model = model.to(memory_format=torch.channels_last)
    quiet_trainer(tmp_path, callbacks, max_epochs=2, limit_train_batches=6,
                  limit_val_batches=2).fit(model, *digits())
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("setup", ["checkpoint", "checkpoint_reentrant", "weight_norm",
                                   "spectral_norm", "channels_last"])
def test_healthy_stack_is_silent_and_unchanged(tmp_path: Path, setup: str) -> None:
    check = Triage(report_dir=tmp_path / "triage", strict=True, verbose=False,
                   overfit_time_budget=120.0)
    watched = fit(tmp_path / "triage", setup, [check])
    report = check.report.report
    assert report is not None
    assert problems(report) == []
    statuses = {c["check"]: c["status"] for c in report["checks"]}
    assert statuses["OverfitBatchCheck"] == "passed", report["checks"]
    assert "error" not in statuses.values(), report["checks"]
    assert torch.equal(fit(tmp_path / "bare", setup, []), watched)


def test_reentrant_checkpoint_without_an_input_gradient_is_caught(tmp_path: Path) -> None:
    check = Triage(report_dir=tmp_path, strict=True, verbose=False, overfit_time_budget=120.0)
    fit(tmp_path, "checkpoint_reentrant_broken", [check])
    report = check.report.report
    assert report is not None
    assert report["start_here"] == "wiring.no_grad_params"
    finding = next(f for f in report["findings"] if f["code"] == "wiring.no_grad_params")
    assert "`body`" in finding["message"]
