"""scikit-learn's digits data (8x8 images, 10 classes) and a small MLP: the demo's material.

``DigitsClassifier`` and ``DigitsDataModule`` stand for your own model and data in the quick
start and the docs' snippets (``from lightning_triage.demo.digits import DigitsClassifier,
DigitsDataModule``: shipped in the package, so the snippets run from an installed wheel).
Needs the ``demo`` extra (scikit-learn).
"""

from __future__ import annotations

from typing import Any, Literal

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


def load_digits_tensors(standardize: bool = True, val_fraction: float = 0.2,
                        seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(x_train, y_train, x_val, y_val)`` of digits; ``standardize`` with train statistics.

    Raw digits pixels are integers 0-16; standardized ones have mean 0 and std 1 per pixel
    (pixels that are always 0 stay 0).

    Raises:
        ModuleNotFoundError: without scikit-learn, saying what to install.
    """
    try:
        from sklearn.datasets import load_digits
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError(
            "The digits data needs scikit-learn: pip install scikit-learn (the `demo` extra)"
        ) from exc
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    n_val = int(len(x) * val_fraction)
    x_train, y_train, x_val, y_val = x[n_val:], y[n_val:], x[:n_val], y[:n_val]
    if standardize:
        mean, std = x_train.mean(0), x_train.std(0)
        std = torch.where(std > 0, std, torch.ones_like(std))
        x_train, x_val = (x_train - mean) / std, (x_val - mean) / std
    return x_train, y_train, x_val, y_val


def digits_loaders(batch_size: int = 32, standardize: bool = True,
                   seed: int = 0) -> tuple[DataLoader, DataLoader]:
    """Train and validation loaders of digits (train shuffled with a seeded generator)."""
    x_train, y_train, x_val, y_val = load_digits_tensors(standardize=standardize, seed=seed)
    train = DataLoader(TensorDataset(x_train, y_train), batch_size=batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(seed))
    val = DataLoader(TensorDataset(x_val, y_val), batch_size=256)
    return train, val


class DigitsMLP(pl.LightningModule):
    """A 64-32-10 MLP for digits.

    Args:
        lr: learning rate.
        optimizer: ``"sgd"`` or ``"adam"``.
        logit_scale: multiplies the logits (a bug when far from 1).
        hidden: hidden width.
    """

    def __init__(self, lr: float = 0.1, optimizer: Literal["sgd", "adam"] = "sgd",
                 logit_scale: float = 1.0, hidden: int = 32) -> None:
        super().__init__()
        self.lr = lr
        self.optimizer = optimizer
        self.logit_scale = logit_scale
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x) * self.logit_scale

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.lr)
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class DigitsDataModule(pl.LightningDataModule):
    """Digits, standardized with the training split's statistics, split into train and val.

    Each pixel is centred by its training mean and divided by its training std, with the std
    floored at 1 (one of the 0-16 intensity levels), so that pixels the training split (nearly)
    never inks stay small in validation images that do ink them.

    Args:
        batch_size: training batch size.
        val_fraction: the share of the examples held out for validation.
        seed: seeds the split and the shuffling.
    """

    def __init__(self, batch_size: int = 32, val_fraction: float = 0.2, seed: int = 0) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed

    def setup(self, stage: str) -> None:
        x_train, y_train, x_val, y_val = load_digits_tensors(
            standardize=False, val_fraction=self.val_fraction, seed=self.seed)
        # Scale by the training std, but never up by more than one intensity level (pixels are
        # integers 0-16): a pixel that is (almost) always 0 in training is centred, not blown
        # up; with a tiny std floor, the few validation images that ink it would read ~1e6
        mean, std = x_train.mean(0), x_train.std(0).clamp_min(1.0)
        self.train_set = TensorDataset((x_train - mean) / std, y_train)
        self.val_set = TensorDataset((x_val - mean) / std, y_val)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True,
                          generator=torch.Generator().manual_seed(self.seed))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)


class DigitsClassifier(pl.LightningModule):
    """A 64-32-10 MLP trained with SGD and cross-entropy: the quick start's model.

    Args:
        lr: learning rate.
        hidden: hidden width.
    """

    def __init__(self, lr: float = 0.1, hidden: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])
