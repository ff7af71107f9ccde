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
        from sklearn.datasets import load_digits  # the `demo` extra: scikit-learn

        data = load_digits()
        x = torch.tensor(data.data, dtype=torch.float32)
        y = torch.tensor(data.target, dtype=torch.long)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(self.seed))
        n_val = int(len(x) * self.val_fraction)
        val, train = order[:n_val], order[n_val:]
        # Scale by the training std, but never up by more than one intensity level (pixels are
        # integers 0-16): a pixel that is (almost) always 0 in training is centred, not blown
        # up; with a tiny std floor, the few validation images that ink it would read ~1e6
        mean, std = x[train].mean(0), x[train].std(0).clamp_min(1.0)
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
