"""A score's bias under a pairwise margin loss (issue 41): the loss sees score differences only,
so the bias's gradient cancels exactly (``wiring.zero_grad_params`` at info), while a layer
whose weight and bias both get zero gradients stays a warning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_triage import GradientWiringCheck
from tests.helpers import loader, make_trainer


class PairwiseScore(pl.LightningModule):
    """Scores 16 examples; the first 8 should outrank the last 8 by a margin of 100 (every pair
    active at step 0: each score's gradient is exactly +-1/8, and the bias's sums to 0).
    ``gate``: the score multiplied by it (0 blocks the whole head, the bug)."""

    def __init__(self, gate: float = 1.0) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.score = nn.Linear(8, 1)
        self.extra = nn.Linear(8, 1)
        self.gate = gate

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        (x,) = batch
        h = self.body(x)
        s = (self.score(h) + self.gate * self.extra(h)).squeeze(-1)
        return F.margin_ranking_loss(s[:8], s[8:], torch.ones(8), margin=100.0)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


@pytest.mark.parametrize(("gate", "expected"), [
    (1.0, [("info", "score")]),  # both biases cancel: one finding, `score` then `extra`
    (0.0, [("warning", "extra"), ("info", "score")]),
])
def test_a_bias_that_cancels_by_symmetry_is_info(tmp_path: Path, gate: float,
                                                 expected: list[tuple[str, str]]) -> None:
    pl.seed_everything(0)
    check = GradientWiringCheck(strict=True)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    make_trainer(tmp_path, [check], limit_train_batches=1).fit(PairwiseScore(gate),
                                                               loader(x, batch_size=16))
    found = sorted((f.severity, f.layer or "") for f in check.findings
                   if f.code == "wiring.zero_grad_params")
    assert found == sorted(expected), [f.message for f in check.findings]
    if gate:
        [finding] = check.findings
        assert sorted(finding.evidence["params"]) == ["extra.bias", "score.bias"]
