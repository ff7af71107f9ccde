"""What the healthy recipes share: the :class:`Recipe` entry, scikit-learn data split by seed,
loaders, and a base module whose training and validation steps call one ``loss``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

#: Builds one recipe's run for a seed: ``seed -> (model, train_loader, val_loader)``, called after
#: ``seed_everything(seed)``.
RecipeBuilder = Callable[[int], tuple[pl.LightningModule, Any, Any]]

#: The fit of every recipe unless it says otherwise: two short epochs on the CPU.
FIT: dict[str, Any] = {"max_epochs": 2, "limit_train_batches": 16, "limit_val_batches": 2}


@dataclass(frozen=True)
class Recipe:
    """One healthy recipe of modern training: a model, its data and its fit options.

    Args:
        name: a slug, unique in :data:`~lightning_triage.demo.recipes.HEALTHY_RECIPES`.
        family: the kind of objective (``"classification"``, ``"regression"``,
            ``"generative"``, ``"contrastive"``, ``"sequence"``, ``"technique"``).
        story: the recipe in a few words.
        build: ``seed -> (model, train_loader, val_loader)``.
        trainer_kwargs: ``Trainer`` arguments, over :data:`FIT`.
        triage_kwargs: ``Triage`` arguments a user of the recipe would pass.
    """

    name: str
    family: str
    story: str
    build: RecipeBuilder
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    triage_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def fit_kwargs(self) -> dict[str, Any]:
        """The ``Trainer`` arguments of the fit: :data:`FIT` updated by ``trainer_kwargs``."""
        return {**FIT, **self.trainer_kwargs}


@functools.cache
def _sklearn(name: str) -> tuple[Tensor, Tensor]:
    try:
        from sklearn import datasets
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError(
            "The recipes need scikit-learn: pip install 'lightning-triage[demo]'") from exc
    data = getattr(datasets, f"load_{name}")()
    return torch.tensor(data.data, dtype=torch.float32), torch.tensor(data.target)


def split(x: Tensor, y: Tensor, seed: int, val_fraction: float = 0.2
          ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(x, y, x_val, y_val)``: a seeded permutation split, inputs standardized with the train
    statistics (features that never vary stay 0)."""
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    n_val = int(len(x) * val_fraction)
    xt, yt, xv, yv = x[n_val:], y[n_val:], x[:n_val], y[:n_val]
    mean, std = xt.mean(0), xt.std(0)
    std = torch.where(std > 0, std, torch.ones_like(std))
    return (xt - mean) / std, yt, (xv - mean) / std, yv


def sklearn_split(name: str, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A scikit-learn data set (``digits``, ``wine``, ``breast_cancer``, ``diabetes``) split by
    :func:`split`; integer targets stay ``long``, real ones become standardized ``float32``."""
    x, y = _sklearn(name)
    xt, yt, xv, yv = split(x, y, seed)
    if y.is_floating_point():
        mean, std = yt.mean(), yt.std()
        yt, yv = ((yt - mean) / std).float(), ((yv - mean) / std).float()
    else:
        yt, yv = yt.long(), yv.long()
    return xt, yt, xv, yv


def pixels(seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Digits pixels scaled to ``[-1, 1]`` (what image generative models train on), not
    standardized per pixel, with their labels."""
    x, y = _sklearn("digits")
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm] / 8.0 - 1.0, y[perm].long()
    n_val = len(x) // 5
    return x[n_val:], y[n_val:], x[:n_val], y[:n_val]


def loaders(train: tuple[Tensor, ...], val: tuple[Tensor, ...], seed: int,
            batch_size: int = 32, collate_fn: Callable[[list[Any]], Any] | None = None
            ) -> tuple[DataLoader, DataLoader]:
    """A shuffled (seeded) train loader and a validation loader of 128."""
    train_loader = DataLoader(TensorDataset(*train), batch_size=batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(seed),
                              collate_fn=collate_fn)
    return train_loader, DataLoader(TensorDataset(*val), batch_size=128, collate_fn=collate_fn)


def mlp(inputs: int, outputs: int, hidden: int = 64) -> nn.Sequential:
    """A one-hidden-layer ReLU MLP."""
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, outputs))


class RecipeModule(pl.LightningModule):
    """A module whose training and validation steps log ``loss(batch)``; AdamW over the
    trainable parameters (a subclass overrides what its recipe does differently).

    Args:
        lr: AdamW's learning rate.
    """

    def __init__(self, lr: float = 3e-3) -> None:
        super().__init__()
        self.lr = lr

    def loss(self, batch: Any) -> Tensor:
        """The recipe's objective on one batch."""
        raise NotImplementedError

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.loss(batch))

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=self.lr)
