"""Objectives that couple a batch's examples on purpose (in-batch negatives, batch statistics),
each with a twin that mixes examples by mistake."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

#: The recipes: CLIP's two towers with a symmetric InfoNCE over a (B, B) logit matrix, SimCLR's
#: NT-Xent over two augmented views, a batch-statistic loss (VICReg-style variance and
#: covariance of the batch's embeddings), Barlow Twins' cross-correlation, and VICReg's
#: variance and covariance terms alone on one view (``"varcov"``: the encoder is called once, so
#: the probe sees its batch-statistics bug).
RECIPES = ("clip", "simclr", "vicreg", "barlow", "varcov")


def tower(n_in: int, bug: str | None = None) -> nn.Module:
    """An MLP tower to a 12-d embedding (a projector with BatchNorm, as SimCLR's);
    ``bug="batch_stats"``: the BatchNorm keeps no running statistics, so eval mode normalizes
    with the batch's (examples mixed by mistake)."""
    norm = nn.BatchNorm1d(32, track_running_stats=bug != "batch_stats")
    return nn.Sequential(nn.Linear(n_in, 32), norm, nn.ReLU(), nn.Linear(32, 12))


class Coupled(pl.LightningModule):
    """``recipe`` in :data:`RECIPES`; ``bug`` as in :func:`tower`."""

    def __init__(self, recipe: str, bug: str | None = None) -> None:
        super().__init__()
        self.recipe, self.bug = recipe, bug
        self.image = tower(64, bug)
        self.text = tower(16, bug) if recipe == "clip" else None
        if recipe == "clip":  # CLIP's learned temperature
            self.logit_scale = nn.Parameter(torch.tensor(2.0))

    def encode(self, x: Tensor) -> Tensor:
        return self.image(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.encode(x)

    def _views(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x + 0.1 * torch.randn_like(x), x + 0.1 * torch.randn_like(x)

    def _loss(self, batch: Any) -> Tensor:
        if self.recipe == "clip":
            img, txt = batch
            a = F.normalize(self.encode(img), dim=1)
            b = F.normalize(self.text(txt), dim=1)
            logits = self.logit_scale.exp() * a @ b.T
            labels = torch.arange(img.shape[0], device=img.device)
            return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
        (x,) = batch
        if self.recipe == "varcov":  # one view: VICReg's variance and covariance terms
            z = self.encode(x)
            c = torch.cov(z.T)
            return F.relu(1 - z.std(0)).mean() + (c - torch.diag(torch.diag(c))).pow(2).mean()
        v1, v2 = self._views(x)
        z1, z2 = self.encode(v1), self.encode(v2)
        if self.recipe == "simclr":
            z = F.normalize(torch.cat([z1, z2]), dim=1)
            n = x.shape[0]
            sim = (z @ z.T / 0.5).masked_fill(torch.eye(2 * n, dtype=torch.bool,
                                                        device=x.device), -1e9)
            partner = torch.cat([torch.arange(n, 2 * n), torch.arange(n)]).to(x.device)
            return F.cross_entropy(sim, partner)
        if self.recipe == "vicreg":
            inv = F.mse_loss(z1, z2)
            std = torch.sqrt(z1.var(0) + 1e-4)
            var = F.relu(1 - std).mean()
            c = torch.cov(z1.T)
            cov = (c - torch.diag(torch.diag(c))).pow(2).sum() / z1.shape[1]
            return 25 * inv + 25 * var + cov
        n1 = (z1 - z1.mean(0)) / (z1.std(0) + 1e-5)
        n2 = (z2 - z2.mean(0)) / (z2.std(0) + 1e-5)
        c = n1.T @ n2 / x.shape[0]
        on = (torch.diagonal(c) - 1).pow(2).sum()
        off = (c - torch.diag(torch.diagonal(c))).pow(2).sum()
        return on + 5e-3 * off

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._loss(batch)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def coupled_loader(recipe: str, n: int = 64, batch_size: int = 16) -> DataLoader:
    """Digits-like random features (64) and, for CLIP, a paired 16-d "caption" per example."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 64, generator=g)
    if recipe == "clip":
        return DataLoader(TensorDataset(x, x[:, :16] + 0.1 * torch.randn(n, 16, generator=g)),
                          batch_size=batch_size)
    return DataLoader(TensorDataset(x), batch_size=batch_size)
