"""A classifier whose training step draws its own augmentation (input noise, a random feature
drop) is judged like any classifier (issue 41): its objective scores the batch's hard labels,
the draws perturb the inputs only, so a learning rate far too low is still `curve.lr_too_low`
and its twin at a good learning rate stays silent. Objectives whose draws define what is scored
(diffusion, masked modelling, mixup) stay noisy: the corpus (`test_recipes.py`) keeps them
silent, and `tests/functional/test_objective.py` tells the two apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_triage import Triage
from lightning_triage.demo.digits import DigitsMLP, digits_loaders


class AugmentedMLP(DigitsMLP):
    """The digits MLP whose training step adds Gaussian noise to the inputs and drops 10% of
    the features at random, each step a fresh draw."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        keep = (torch.rand_like(x) > 0.1).to(x.dtype)
        loss = F.cross_entropy(self((x + 0.1 * torch.randn_like(x)) * keep), y)
        self.log("train_loss", loss)
        return loss


def _report(lr: float, root: Path) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    train, val = digits_loaders()
    triage = Triage(report_dir=root, verbose=False, overfit_time_budget=120.0,
                    verify_remedies=False)
    trainer = pl.Trainer(max_epochs=2, callbacks=[triage], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=root, accelerator="cpu")
    trainer.fit(AugmentedMLP(lr=lr), train, val)
    assert triage.report.report is not None
    return triage.report.report


@pytest.mark.parametrize(("lr", "expect"), [(1e-5, "curve.lr_too_low"), (0.1, None)])
def test_an_augmented_classifier_at_a_tiny_learning_rate_is_lr_too_low(
        tmp_path: Path, lr: float, expect: str | None) -> None:
    report = _report(lr, tmp_path)
    loud = [f["code"] for f in report["findings"] if f["severity"] != "info"]
    curve = next(c for c in report["checks"] if c["check"] == "LossCurveMonitor")
    assert "not judged" not in curve["detail"], curve["detail"]  # the draws are augmentation
    if expect is None:
        assert loud == [], loud
    else:
        assert expect in loud and report["start_here"] == expect, loud
