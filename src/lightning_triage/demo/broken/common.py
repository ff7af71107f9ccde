"""What the broken runs share: digits loaders with a change put in, and builders of fits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage.demo.digits import DigitsMLP, digits_loaders, load_digits_tensors
from lightning_triage.demo.scenario import Builder

Loaders = tuple[DataLoader, DataLoader]


def loaders(x: Tensor, y: Tensor, xv: Tensor, yv: Tensor, shuffle: bool = True) -> Loaders:
    """Train (batches of 32, shuffled with a seeded generator) and validation loaders."""
    train = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=shuffle,
                       generator=torch.Generator().manual_seed(0))
    return train, DataLoader(TensorDataset(xv, yv), batch_size=256)


def digits(**changes: Callable[[Tensor], Tensor]) -> Loaders:
    """Digits loaders with some of ``x``, ``y``, ``xv``, ``yv`` transformed."""
    parts = dict(zip(("x", "y", "xv", "yv"), load_digits_tensors(), strict=True))
    for key, change in changes.items():
        parts[key] = change(parts[key])
    return loaders(parts["x"], parts["y"], parts["xv"], parts["yv"])


def raw_digits() -> Loaders:
    """Digits loaders with the raw 0-16 pixels (not standardized)."""
    return digits_loaders(standardize=False)


def fit(model: Callable[[], pl.LightningModule],
        data: Callable[[], Loaders] = digits_loaders) -> Builder:
    """A builder: the loaders of ``data``, then the model of ``model``."""
    def build() -> tuple[pl.LightningModule, Any, Any]:
        train, val = data()
        return model(), train, val
    return build


def mlp(lr: float = 0.1, **kwargs: Any) -> Callable[[], pl.LightningModule]:
    """A :class:`DigitsMLP` factory."""
    return lambda: DigitsMLP(lr=lr, **kwargs)


#: The healthy digits MLP (SGD, lr 0.1): the fixed twin of most digits runs.
HEALTHY = fit(mlp())
