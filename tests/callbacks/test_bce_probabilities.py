"""`BCEWithLogitsLoss` fed probabilities (issue 42): an `nn.Sigmoid` left at the end of the
model (binary and multilabel) or a sigmoid in the loss code is `overfit.loss_on_probabilities`
once the probe stalls on that loss's floor; logits that merely start in [0, 1] are not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_triage import OverfitBatchCheck
from lightning_triage.demo.broken.overfit import SigmoidBCE, flag_loaders
from lightning_triage.functional.overfit_verdicts import bce_on_probabilities
from tests.helpers import make_trainer, seeds


def probe(tmp_path: Path, build: Any, labels: int = 1, seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = build()
    check = OverfitBatchCheck(strict=True, time_budget=3600.0)
    train, val = flag_loaders(labels)
    make_trainer(tmp_path, [check], limit_train_batches=1, limit_val_batches=1).fit(
        model, train, val)
    return {f.code: f for f in check.findings}


class SigmoidInLoss(SigmoidBCE):
    def _loss(self, batch: Any) -> Tensor:
        x, y = batch
        return F.binary_cross_entropy_with_logits(torch.sigmoid(self(x)), y)


class PositiveStart(SigmoidBCE):
    """Healthy logits that all start in [0, 1] (a bias of 0.5, tiny weights)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(sigmoid=False, **kwargs)
        with torch.no_grad():
            self.net[2].weight.mul_(0.01)
            self.net[2].bias.fill_(0.5)


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("labels", [1, 3])
def test_a_sigmoid_before_bce_with_logits_is_named(tmp_path: Path, labels: int,
                                                   seed: int) -> None:
    found = probe(tmp_path / "broken", lambda: SigmoidBCE(labels=labels), labels, seed)
    f = found["overfit.loss_on_probabilities"]
    assert f.evidence["sigmoid_in"] == "model" and 0.3 < f.evidence["floor"] < 0.7
    assert "overfit.failed" in found
    fixed = probe(tmp_path / "fixed", lambda: SigmoidBCE(sigmoid=False, labels=labels), labels,
                  seed)
    assert set(fixed) == {"overfit.passed"}


def test_a_sigmoid_in_the_loss_code_is_named(tmp_path: Path) -> None:
    f = probe(tmp_path, lambda: SigmoidInLoss(sigmoid=False))["overfit.loss_on_probabilities"]
    assert f.evidence["sigmoid_in"] == "loss"


def test_logits_that_start_in_the_unit_interval_are_not_probabilities(tmp_path: Path) -> None:
    assert set(probe(tmp_path, PositiveStart)) == {"overfit.passed"}


def test_the_floor_and_the_readings() -> None:
    y = torch.tensor([1.0, 0.0, 0.0, 1.0])
    z = torch.tensor([2.0, -1.0, 0.5, 3.0])
    assert bce_on_probabilities(z, y, float(F.binary_cross_entropy_with_logits(z, y))) is None
    p = torch.sigmoid(z)
    floor, where = bce_on_probabilities(p, y, float(F.binary_cross_entropy_with_logits(p, y)))
    assert where == "model" and floor == pytest.approx((0.6931 + 0.3133) / 2, abs=1e-3)
    _, where = bce_on_probabilities(z, y, float(F.binary_cross_entropy_with_logits(p, y)))
    assert where == "loss"
