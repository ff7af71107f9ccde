"""Healthy recipes whose loss is not plain classification (issue 41's false alarms): tiny models on
synthetic data or digits, each a few dozen steps. Each builder returns ``(model, train, val)``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage.demo.digits import load_digits_tensors

Built = tuple[pl.LightningModule, DataLoader, DataLoader]


def _loaders(*tensors: Tensor, cut: float = 0.75, batch_size: int = 32) -> tuple[DataLoader,
                                                                                   DataLoader]:
    n = int(tensors[0].shape[0] * cut)
    train = DataLoader(TensorDataset(*(t[:n] for t in tensors)), batch_size=batch_size,
                       shuffle=True, generator=torch.Generator().manual_seed(0), drop_last=True)
    val = DataLoader(TensorDataset(*(t[n:] for t in tensors)), batch_size=batch_size * 4)
    return train, val


def _mlp(n_in: int, n_out: int, hidden: int = 64) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out))


class _Recipe(pl.LightningModule):
    """One loss for training and validation; Adam."""

    lr = 3e-3

    def loss(self, batch: Any) -> Tensor:
        raise NotImplementedError

    def val_loss(self, batch: Any) -> Tensor:
        return self.loss(batch)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self.loss(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = self.val_loss(batch)
        self.log("val_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


# ---------------------------------------------------------------------- classification variants
class Mixup(_Recipe):
    """Digits with mixup: a Beta(0.4, 0.4) mix of the batch with a permutation of itself, soft
    targets (timm's recipe)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp(64, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        lam = torch.distributions.Beta(0.4, 0.4).sample()
        perm = torch.randperm(x.shape[0])
        soft = F.one_hot(y, 10).float()
        return F.cross_entropy(self(lam * x + (1 - lam) * x[perm]),
                               lam * soft + (1 - lam) * soft[perm])

    def val_loss(self, batch: Any) -> Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


class Distillation(_Recipe):
    """Knowledge distillation from a fixed teacher (a ridge fit on the digits): KL at
    temperature 4 (times T^2) plus a small cross-entropy."""

    def __init__(self, x: Tensor, y: Tensor) -> None:
        super().__init__()
        self.net = _mlp(64, 10)
        ones = torch.cat([x, torch.ones(len(x), 1)], 1)
        w = torch.linalg.solve(ones.T @ ones + 1e-1 * torch.eye(65), ones.T @ F.one_hot(y, 10).float())
        self.register_buffer("teacher", 8 * w)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def loss(self, batch: Any) -> Tensor:
        x, y, t = batch[0], batch[1], 4.0
        teacher = torch.cat([x, torch.ones(len(x), 1)], 1) @ self.teacher
        student = self(x)
        kl = F.kl_div(F.log_softmax(student / t, 1), F.softmax(teacher / t, 1),
                      reduction="batchmean")
        return 0.9 * kl * t * t + 0.1 * F.cross_entropy(student, y)


class SymmetricCE(_Recipe):
    """Symmetric cross-entropy for noisy labels: 0.1 CE + 1.0 reverse CE (log 0 clamped to
    -4)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp(64, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def loss(self, batch: Any) -> Tensor:
        logits, y = self(batch[0]), batch[1]
        rce = -(F.softmax(logits, 1) * F.one_hot(y, 10).float().clamp(1e-4, 1).log()).sum(1)
        return 0.1 * F.cross_entropy(logits, y) + rce.mean()


class Triplet(_Recipe):
    """Metric learning: a normalized 32-d embedding, triplets mined in the batch (the first other
    example of the anchor's class, the first of another class), margin 0.2."""

    lr = 1e-3

    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp(64, 32)

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(self.net(x), dim=-1)

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        emb = self(x)
        same = (y[:, None] == y[None, :]) & ~torch.eye(len(y), dtype=torch.bool)
        keep = same.any(1)
        pos = same.float().argmax(1)
        neg = (y[:, None] != y[None, :]).float().argmax(1)
        return F.triplet_margin_loss(emb[keep], emb[pos][keep], emb[neg][keep], margin=0.2)


class MultilabelPosWeight(_Recipe):
    """A multilabel classifier of 8 rare labels with ``BCEWithLogitsLoss(pos_weight=...)`` and a
    torchmetrics F1 logged each step."""

    def __init__(self, pos_weight: Tensor) -> None:
        super().__init__()
        from torchmetrics.classification import MultilabelF1Score

        self.net = _mlp(20, 8)
        self.criterion = nn.BCEWithLogitsLoss(pos_weight=pos_weight)
        self.f1 = MultilabelF1Score(num_labels=8)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        logits = self(x)
        self.f1(logits, y.long())
        self.log("f1", self.f1)
        return self.criterion(logits, y)


# ---------------------------------------------------------------------- generative objectives
class Diffusion(_Recipe):
    """DDPM noise prediction on standardized digits: a timestep and a noise drawn per example
    and per step, the denoiser sees ``t``."""

    def __init__(self, steps: int = 100) -> None:
        super().__init__()
        self.net = _mlp(65, 64, hidden=128)
        betas = torch.linspace(1e-4, 0.05, steps)
        self.register_buffer("alpha_bar", torch.cumprod(1 - betas, 0))

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        return self.net(torch.cat([x, t[:, None].float() / len(self.alpha_bar)], 1))

    def loss(self, batch: Any) -> Tensor:
        x0 = batch[0]
        t = torch.randint(0, len(self.alpha_bar), (x0.shape[0],))
        noise = torch.randn_like(x0)
        ab = self.alpha_bar[t][:, None]
        return F.mse_loss(self(ab.sqrt() * x0 + (1 - ab).sqrt() * noise, t), noise)


class RectifiedFlow(_Recipe):
    """Rectified flow: ``x_t = (1 - t) noise + t x0`` with ``t ~ U(0, 1)``, the velocity
    ``x0 - noise`` regressed."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp(65, 64, hidden=128)

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        return self.net(torch.cat([x, t], 1))

    def loss(self, batch: Any) -> Tensor:
        x0 = batch[0]
        t = torch.rand(x0.shape[0], 1)
        noise = torch.randn_like(x0)
        return F.mse_loss(self((1 - t) * noise + t * x0, t), x0 - noise)


class MaskedAutoencoder(_Recipe):
    """A masked autoencoder of digit pixels: a fresh 75% mask per step, the masked pixels
    reconstructed."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp(128, 64, hidden=128)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        return self.net(torch.cat([x * ~mask, mask.float()], 1))

    def loss(self, batch: Any) -> Tensor:
        x = batch[0]
        mask = torch.rand(x.shape) < 0.75
        return F.mse_loss(self(x, mask)[mask], x[mask])


# ---------------------------------------------------------------------- builders
def digits_recipe(model: Callable[[], pl.LightningModule], n: int = 640,
                  batch_size: int = 32) -> Callable[[], Built]:
    def build() -> Built:
        x, y, xv, yv = load_digits_tensors()
        x, y = x[:n], y[:n]
        train = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True,
                           generator=torch.Generator().manual_seed(0), drop_last=True)
        return model(), train, DataLoader(TensorDataset(xv[:128], yv[:128]), batch_size=128)
    return build


def distillation() -> Built:
    x, y, _, _ = load_digits_tensors()
    model, train, val = digits_recipe(lambda: Distillation(x, y))()
    return model, train, val


def multilabel() -> Built:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 20, generator=g)
    scores = x @ torch.randn(20, 8, generator=g) / math.sqrt(20)
    y = (scores + 0.5 * torch.randn(1024, 8, generator=g) > 1.1).float()  # ~15% positives
    rate = y.mean(0).clamp_min(1e-3)
    train, val = _loaders(x, y)
    return MultilabelPosWeight((1 - rate) / rate), train, val


RECIPES: dict[str, Callable[[], Built]] = {
    "mixup": digits_recipe(Mixup),
    "multilabel-pos-weight": multilabel,
    "diffusion": digits_recipe(Diffusion),
    "rectified-flow": digits_recipe(RectifiedFlow),
    "masked-autoencoder": digits_recipe(MaskedAutoencoder),
    "distillation": distillation,
    "symmetric-ce": digits_recipe(SymmetricCE),
    "triplet": digits_recipe(Triplet, n=1280, batch_size=64),
}
