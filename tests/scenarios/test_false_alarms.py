"""Healthy runs that used to raise warnings stay silent; the real bug next to them is caught."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage import LossCurveMonitor, Triage
from tests.helpers import WATCHES, assert_ran_and_passed, make_trainer, seeds


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


@pytest.mark.parametrize("seed", seeds(2))
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
    assert_ran_and_passed(report, *WATCHES)
    # the overfitting rule had its validation losses to judge (not `curve.sparse_validation`)
    assert len(report["series"]["val_loss"]) >= 3
    assert "curve.sparse_validation" not in {f["code"] for f in report["findings"]}


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


def _fit_inputs(tmp_path: Path, x: Tensor, y: Tensor, classes: int, lr: float = 0.1,
                epochs: int = 1) -> dict[str, Any]:
    """Fit a small MLP on ``(x, y)`` with `Triage()` (default arguments) and return the report."""
    n_train = int(0.8 * len(x))
    train = DataLoader(TensorDataset(x[:n_train], y[:n_train]), batch_size=32, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    val = DataLoader(TensorDataset(x[n_train:], y[n_train:]), batch_size=128)
    features = x[0].numel()

    class Net(WineMLP):
        def __init__(self) -> None:
            super().__init__(lr=lr)
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(features, 32), nn.ReLU(),
                                     nn.Linear(32, classes))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=self.lr)

    triage = Triage(report_dir=tmp_path, verbose=False, strict=True, overfit=False)
    trainer = make_trainer(tmp_path, [triage], max_epochs=epochs, limit_train_batches=None,
                           limit_val_batches=None)
    trainer.fit(Net(), train, val)
    assert triage.report.report is not None
    return triage.report.report


def _digits_pixels() -> tuple[Tensor, Tensor]:
    from sklearn.datasets import load_digits

    data = load_digits()
    perm = torch.randperm(len(data.target), generator=torch.Generator().manual_seed(0))
    x = torch.tensor(data.data, dtype=torch.float32)[perm]
    return x, torch.tensor(data.target, dtype=torch.long)[perm]


@pytest.mark.parametrize("image", [False, True], ids=["flat", "image"])
def test_pixels_divided_by_their_range_twice_lead_the_report(tmp_path: Path, image: bool) -> None:
    x, y = _digits_pixels()
    x = x / 16 / 16  # scaled to [0, 1], then again: rms ~0.03
    if image:
        x = x.view(-1, 1, 8, 8)
    report = _fit_inputs(tmp_path, x, y, 10)
    assert report["start_here"] == "data.tiny_input_scale", report["findings"]
    lead = next(f for f in report["findings"] if f["code"] == "data.tiny_input_scale")
    assert 0.02 < lead["evidence"]["rms"] < 0.05
    assert lead["evidence"]["max"] == pytest.approx(1 / 16)
    assert "data.unnormalized_input" not in {f["code"] for f in report["findings"]}


def _waveforms(n: int = 480, length: int = 800) -> tuple[Tensor, Tensor]:
    """Three classes of short signed waveforms (a tone's pitch), quiet as raw audio is (rms
    ~0.03, peaks ~0.1-0.2)."""
    gen = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (n,), generator=gen)
    t = torch.arange(length) / 8000.0
    freq = torch.tensor([220.0, 440.0, 880.0])[y]
    phase = 2 * math.pi * torch.rand(n, 1, generator=gen)
    amp = 0.03 + 0.03 * torch.rand(n, 1, generator=gen)
    x = amp * torch.sin(2 * math.pi * freq[:, None] * t + phase)
    return x + 0.005 * torch.randn(n, length, generator=gen), y


@pytest.mark.parametrize("case", ["audio", "diabetes", "iris-metres", "pixels-0-1"])
def test_small_raw_scales_that_are_normal_are_not_flagged(tmp_path: Path, case: str) -> None:
    from sklearn.datasets import load_diabetes, load_iris

    if case == "audio":
        x, y = _waveforms()
        classes = 3
    elif case == "diabetes":  # scikit-learn's own scaling: centered, rms 0.048
        d = load_diabetes()
        x = torch.tensor(d.data, dtype=torch.float32)
        y = (torch.tensor(d.target) > float(torch.tensor(d.target).median())).long()
        classes = 2
    elif case == "iris-metres":  # non-negative, all below 0.08, but 4 tabular measurements
        d = load_iris()
        perm = torch.randperm(150, generator=torch.Generator().manual_seed(0))
        x = torch.tensor(d.data, dtype=torch.float32)[perm] / 100
        y = torch.tensor(d.target, dtype=torch.long)[perm]
        classes = 3
    else:
        x, y = _digits_pixels()
        x, classes = x / 16, 10
    rms = float(x.pow(2).mean().sqrt())
    assert rms < (1.0 if case == "pixels-0-1" else 0.06)
    report = _fit_inputs(tmp_path, x, y, classes)
    data_codes = {f["code"] for f in report["findings"] if f["code"].startswith("data.")}
    assert "data.tiny_input_scale" not in data_codes
    assert "data.unnormalized_input" not in data_codes
    assert_ran_and_passed(report, "BatchInspector")  # it read the inputs, and found them fine
