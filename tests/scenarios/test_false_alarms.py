"""Healthy runs that used to raise warnings stay silent; the real bug next to them is caught."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage import LossCurveMonitor, Triage
from tests.helpers import make_trainer


def wine_loaders(seed: int, n_val: int = 38) -> tuple[DataLoader, DataLoader]:
    from sklearn.datasets import load_wine

    data = load_wine()
    x = torch.tensor(data.data, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    xt, yt, xv, yv = x[n_val:], y[n_val:], x[:n_val], y[:n_val]
    mean, std = xt.mean(0), xt.std(0)
    xt, xv = (xt - mean) / std, (xv - mean) / std
    train = DataLoader(TensorDataset(xt, yt), batch_size=16, shuffle=True,
                       generator=torch.Generator().manual_seed(seed))
    return train, DataLoader(TensorDataset(xv, yv), batch_size=64)


class WineMLP(pl.LightningModule):
    def __init__(self, lr: float = 3e-3, hidden: int = 64) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(13, hidden), nn.ReLU(), nn.Linear(hidden, 3))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("val_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_small_validation_set_drift_is_not_overfitting(tmp_path: Path, seed: int) -> None:
    """Wine: 140 training and 38 validation examples, MLP, Adam 3e-3, 15 epochs. The late rise
    of the validation loss is inside the noise of a mean over 38 examples."""
    torch.manual_seed(seed)
    triage = Triage(report_dir=tmp_path, verbose=False, strict=True, window_epochs=15,
                    window_steps=200)
    trainer = make_trainer(tmp_path, [triage], max_epochs=15, limit_train_batches=None,
                           limit_val_batches=None)
    trainer.fit(WineMLP(), *wine_loaders(seed))
    report = triage.report.report
    assert report["start_here"] is None, [(f["code"], f["message"]) for f in report["findings"]]
    assert "curve.overfitting" not in {f["code"] for f in report["findings"]}


class Memorizer(WineMLP):
    """A wide MLP trained far too long at a high learning rate on 40 examples with noisy labels:
    real overfitting, the validation loss climbs by multiples."""


def test_real_overfitting_is_still_caught(tmp_path: Path) -> None:
    from sklearn.datasets import load_digits

    torch.manual_seed(0)
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16
    y = torch.tensor(data.target, dtype=torch.long)
    # 64 training examples, 25% of their labels wrong: memorizing them hurts validation
    yt = y[:64].clone()
    yt[::4] = (yt[::4] + 3) % 10
    train = DataLoader(TensorDataset(x[:64], yt), batch_size=16, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    val = DataLoader(TensorDataset(x[1000:1400], y[1000:1400]), batch_size=200)
    model = WineMLP(lr=1e-2, hidden=256)
    model.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    monitor = LossCurveMonitor(window_epochs=60, window_steps=400, strict=True)
    trainer = make_trainer(tmp_path, [monitor], max_epochs=60, limit_train_batches=None,
                           limit_val_batches=None)
    trainer.fit(model, train, val)
    over = [f for f in monitor.findings if f.code == "curve.overfitting"]
    assert over, [(f.code, f.message) for f in monitor.findings]
    assert over[0].evidence["val_examples"] == 400
    rise = over[0].evidence["val"] - over[0].evidence["best_val"]
    assert rise > 2 * over[0].evidence["standard_error"]
