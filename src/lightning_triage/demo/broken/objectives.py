"""Broken runs of objectives beyond plain classification: a VAE whose KL term has the wrong sign
(the loss falls without bound) and a CLIP-style contrastive loss with its logit scale applied
twice (the step-0 loss far above ``ln B``, the chance level of in-batch negatives)."""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage.demo.broken.common import Loaders
from lightning_triage.demo.digits import load_digits_tensors
from lightning_triage.demo.scenario import Builder, Scenario


def unit_digits() -> Loaders:
    """Digits with pixels in ``[0, 1]`` (the raw 0-16 values / 16), for a Bernoulli decoder."""
    x, y, xv, yv = load_digits_tensors(standardize=False)
    train = DataLoader(TensorDataset(x / 16, y), batch_size=32, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    return train, DataLoader(TensorDataset(xv / 16, yv), batch_size=128)


class DigitsVAE(pl.LightningModule):
    """A VAE on 8x8 digits: reconstruction (BCE summed over pixels) plus the KL term, a latent
    sampled in training (the mean in evaluation).

    Args:
        kl_sign: ``+1`` (the ELBO) or ``-1`` (the bug: the KL term subtracted).
        lr: Adam's learning rate.
    """

    def __init__(self, kl_sign: float = 1.0, lr: float = 3e-3) -> None:
        super().__init__()
        self.kl_sign, self.lr = kl_sign, lr
        self.encoder = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16))
        self.decoder = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        mu, logvar = self.encoder(x).chunk(2, dim=1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp() if self.training else mu
        return torch.sigmoid(self.decoder(z)), mu, logvar

    def _loss(self, x: Tensor) -> Tensor:
        recon, mu, logvar = self(x)
        rec = F.binary_cross_entropy(recon, x, reduction="sum") / x.shape[0]
        kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum() / x.shape[0]
        return rec + self.kl_sign * kl

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._loss(batch[0])

    def validation_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._loss(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def paired_views(n: int = 512, dim: int = 16, seed: int = 0) -> Loaders:
    """Pairs ``(a, b)``: ``b`` a fixed linear map of ``a`` plus noise (two views of one thing)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, dim, generator=g)
    b = a @ torch.randn(dim, dim, generator=g) / math.sqrt(dim) + 0.1 * torch.randn(n, dim,
                                                                                 generator=g)
    cut = n * 3 // 4
    train = DataLoader(TensorDataset(a[:cut], b[:cut]), batch_size=32, shuffle=True,
                       generator=torch.Generator().manual_seed(0), drop_last=True)
    return train, DataLoader(TensorDataset(a[cut:], b[cut:]), batch_size=32, drop_last=True)


class TwoTower(pl.LightningModule):
    """CLIP-style contrastive learning of two views: normalized embeddings, a learned logit scale
    (starting at ``1 / 0.07``), the symmetric cross-entropy over in-batch negatives.

    Args:
        scale_twice: the bug: the logit scale multiplies the similarities twice.
        lr: Adam's learning rate.
    """

    def __init__(self, scale_twice: bool = False, lr: float = 1e-3, dim: int = 16) -> None:
        super().__init__()
        self.scale_twice, self.lr = scale_twice, lr
        self.tower_a = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, 32))
        self.tower_b = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, 32))
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        return F.normalize(self.tower_a(a), dim=-1), F.normalize(self.tower_b(b), dim=-1)

    def _loss(self, batch: Any) -> Tensor:
        ea, eb = self(*batch)
        scale = self.logit_scale.exp()
        logits = scale * ea @ eb.T
        if self.scale_twice:
            logits = scale * logits
        labels = torch.arange(logits.shape[0], device=logits.device)
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._loss(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._loss(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def vae(kl_sign: float) -> Builder:
    """A builder of :class:`DigitsVAE` on ``[0, 1]`` digits."""
    def build() -> tuple[pl.LightningModule, Any, Any]:
        train, val = unit_digits()
        return DigitsVAE(kl_sign), train, val
    return build


def two_tower(scale_twice: bool) -> Builder:
    """A builder of :class:`TwoTower` on paired views."""
    def build() -> tuple[pl.LightningModule, Any, Any]:
        train, val = paired_views()
        return TwoTower(scale_twice), train, val
    return build


OBJECTIVE_RUNS: list[Scenario] = [
    Scenario("vae-kl-sign", "a VAE whose KL term is subtracted (the loss falls without bound)",
             "curve.diverging", vae(-1.0), fixed=vae(1.0), max_epochs=3),
    Scenario("clip-scale-twice", "CLIP-style loss with its logit scale applied twice",
             "init.loss_above_chance", two_tower(True), fixed=two_tower(False)),
]
