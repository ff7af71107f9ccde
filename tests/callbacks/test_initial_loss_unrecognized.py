"""The step-0 check on a loss written by hand (issue 41): integer labels in the batch do not
make a metric-learning loss a cross-entropy, while a cross-entropy written by hand
(``-log_softmax(z).gather(y)``) is still judged against ln C."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_triage import InitialLossCheck
from lightning_triage.demo.digits import digits_loaders
from tests.helpers import make_trainer


class HandLoss(pl.LightningModule):
    """A digits model whose loss is written by hand: ``"triplet"`` (batch-hard mining on a
    32-d embedding), ``"ce"`` (a hand-written cross-entropy over 10 classes) or ``"ce_scaled"``
    (the same with logits multiplied by 100, the bug)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(),
                                 nn.Linear(32, 32 if kind == "triplet" else 10))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        out = self.net(x)
        if self.kind == "triplet":
            emb = F.normalize(out, dim=1)
            dist = torch.cdist(emb, emb)
            same = y[:, None] == y[None]
            pos = (dist * same).max(1).values
            neg = dist.masked_fill(same, float("inf")).min(1).values
            return F.relu(pos - neg + 0.2).mean()
        scale = 100.0 if self.kind == "ce_scaled" else 1.0
        return -F.log_softmax(out * scale, dim=1).gather(1, y[:, None]).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(tmp_path: Path, kind: str) -> InitialLossCheck:
    pl.seed_everything(0)
    check = InitialLossCheck(strict=True)
    train, _ = digits_loaders()
    make_trainer(tmp_path, [check], limit_train_batches=2).fit(HandLoss(kind), train)
    return check


def test_a_hand_written_metric_loss_is_not_compared_with_ln_c(tmp_path: Path) -> None:
    check = _fit(tmp_path, "triplet")
    [finding] = check.findings
    assert (finding.code, finding.severity) == ("init.chance_unknown", "info")
    assert "ln(32)" in finding.message and "not compared" in finding.message
    assert check.chance is None


@pytest.mark.parametrize(("kind", "codes"), [("ce_scaled", ["init.loss_above_chance"]),
                                              ("ce", [])])
def test_a_hand_written_cross_entropy_is_still_judged(tmp_path: Path, kind: str,
                                                      codes: list[str]) -> None:
    check = _fit(tmp_path, kind)
    assert [f.code for f in check.findings] == codes
    assert check.chance is not None and check.chance.num_classes == 10
