"""A small LightningModule and LightningDataModule: scikit-learn's digits (8x8 images of the
digits 0-9, shipped with scikit-learn, no download) and a 64-32-10 MLP.

Stands for your own model and data in the docs' snippets
(``from examples.digits import DigitsClassifier, DigitsDataModule``, from the repository root).
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


class DigitsDataModule(pl.LightningDataModule):
    """Digits, standardized with the training split's statistics, split into train and val.

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
        from sklearn.datasets import load_digits  # the `demo` extra: scikit-learn

        data = load_digits()
        x = torch.tensor(data.data, dtype=torch.float32)
        y = torch.tensor(data.target, dtype=torch.long)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(self.seed))
        n_val = int(len(x) * self.val_fraction)
        val, train = order[:n_val], order[n_val:]
        mean, std = x[train].mean(0), x[train].std(0)
        # pixels always 0 in training keep their scale (divided by 1, not by a clamped 1e-6:
        # a validation image with ink there would land a million training scales away)
        std = torch.where(std > 0, std, torch.ones_like(std))
        self.train_set = TensorDataset((x[train] - mean) / std, y[train])
        self.val_set = TensorDataset((x[val] - mean) / std, y[val])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True,
                          generator=torch.Generator().manual_seed(self.seed))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)


class DigitsClassifier(pl.LightningModule):
    """A 64-32-10 MLP trained with SGD and cross-entropy.

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
