"""Healthy regression recipes: squared error, Huber with outliers, heteroscedastic Gaussian NLL
(its loss goes negative) and Poisson NLL on counts."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_triage.demo.recipes.common import (
    Recipe,
    RecipeModule,
    loaders,
    mlp,
    sklearn_split,
)

Built = tuple[RecipeModule, Any, Any]


class Regressor(RecipeModule):
    """One output against standardized targets with ``criterion``."""

    def __init__(self, features: int, criterion: nn.Module) -> None:
        super().__init__()
        self.net = mlp(features, 1, hidden=32)
        self.criterion = criterion

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        return self.criterion(self.net(x).squeeze(-1), y)


def mse(seed: int) -> Built:
    xt, yt, xv, yv = sklearn_split("diabetes", seed)
    return Regressor(10, nn.MSELoss()), *loaders((xt, yt), (xv, yv), seed)


def huber(seed: int) -> Built:
    """Diabetes with 5% of the training targets made outliers (x6)."""
    xt, yt, xv, yv = sklearn_split("diabetes", seed)
    out = torch.rand(len(yt), generator=torch.Generator().manual_seed(seed + 1)) < 0.05
    yt = torch.where(out, yt * 6, yt)
    return Regressor(10, nn.HuberLoss(delta=1.0)), *loaders((xt, yt), (xv, yv), seed)


def _synthetic(seed: int, n: int = 800) -> tuple[Tensor, torch.Generator]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return x, g


class Heteroscedastic(RecipeModule):
    """A mean and a log-variance head, ``GaussianNLLLoss`` (negative once the fit is good)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 64), nn.ReLU())
        self.mean, self.log_var = nn.Linear(64, 1), nn.Linear(64, 1)
        self.criterion = nn.GaussianNLLLoss()

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        h = self.body(x)
        return self.criterion(self.mean(h).squeeze(-1), y, self.log_var(h).exp().squeeze(-1))


def gaussian_nll(seed: int) -> Built:
    x, g = _synthetic(seed)
    noise = 0.05 + 0.2 * x[:, 2].abs()
    y = torch.sin(x[:, 0]) + 0.5 * x[:, 1] + noise * torch.randn(len(x), generator=g)
    return Heteroscedastic(), *loaders((x[160:], y[160:]), (x[:160], y[:160]), seed)


class Counts(RecipeModule):
    """The log-rate of a Poisson, ``F.poisson_nll_loss(log_input=True)`` against counts."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp(4, 1, hidden=32)

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        return F.poisson_nll_loss(self.net(x).squeeze(-1), y, log_input=True)


def poisson_nll(seed: int) -> Built:
    x, g = _synthetic(seed)
    rate = torch.exp(0.8 * x[:, 0] - 0.5 * x[:, 1] + 0.5)
    y = torch.poisson(rate, generator=g)
    return Counts(), *loaders((x[160:], y[160:]), (x[:160], y[:160]), seed)


REGRESS_RECIPES: list[Recipe] = [
    Recipe("regression-mse", "regression", "diabetes MLP, MSE", mse),
    Recipe("huber", "regression", "Huber loss, 5% outlier targets", huber),
    Recipe("gaussian-nll", "regression",
           "heteroscedastic `GaussianNLLLoss` (negative losses)", gaussian_nll),
    Recipe("poisson-nll", "regression", "Poisson NLL on counts (log rate)", poisson_nll),
]
