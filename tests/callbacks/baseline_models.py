"""Digits classifiers for the baseline check: a small stack whose body is frozen by mistake (only
the head trains) and its healthy twin; a regression twin."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage.demo.digits import load_digits_tensors


class DigitsStack(pl.LightningModule):
    """8x8 digits -> a convolution and an MLP body -> a linear head. ``frozen=True``: the body
    is frozen by mistake (``requires_grad_(False)``), the head alone trains."""

    def __init__(self, frozen: bool = False, lr: float = 3e-3) -> None:
        super().__init__()
        self.lr = lr
        self.body = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Flatten(), nn.Linear(64, 16), nn.ReLU())
        self.head = nn.Linear(16, 10)
        if frozen:
            self.body.requires_grad_(False)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x.view(-1, 1, 8, 8)))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam([p for p in self.parameters() if p.requires_grad], lr=self.lr)


class DigitsRegressor(DigitsStack):
    """Regresses the digit's value (0-9, standardized) from its pixels."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(16, 1)

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x).squeeze(1)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.mse_loss(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y))


def digits(seed: int = 0, regression: bool = False, batch_size: int = 32
           ) -> tuple[DataLoader, DataLoader]:
    """Standardized digits (train shuffled with a seeded generator), validation in order."""
    x, y, xv, yv = load_digits_tensors(standardize=True, seed=seed)
    if regression:
        y, yv = (y.float() - 4.5) / 2.87, (yv.float() - 4.5) / 2.87
    return (DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(seed)),
            DataLoader(TensorDataset(xv, yv), batch_size=64))
