"""Models for the evaluation-contract and autocast tests: a digits classifier with one switch per
bug (and its fixed twin)."""

from __future__ import annotations

import copy
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage.demo.digits import load_digits_tensors


class Attention(nn.Module):
    """Self-attention over tokens; ``bug=True`` passes its dropout rate in eval mode too."""

    def __init__(self, dim: int, p: float = 0.2, bug: bool = False) -> None:
        super().__init__()
        self.qkv, self.proj, self.p, self.bug = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), p, bug

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        p = self.p if self.bug or self.training else 0.0
        return self.proj(F.scaled_dot_product_attention(q, k, v, dropout_p=p))


class RunningNorm(nn.Module):
    """Standardizes its input with running statistics that only training-mode calls update (an
    observation normalizer); ``var_init`` 0 is the bug (eval mode divides by ``sqrt(eps)``)."""

    def __init__(self, dim: int, var_init: float, momentum: float = 0.1) -> None:
        super().__init__()
        self.momentum = momentum
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.full((dim,), var_init))

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            with torch.no_grad():
                self.mean.lerp_(x.mean(0), self.momentum)
                self.var.lerp_(x.var(0), self.momentum)
            return (x - x.mean(0)) / (x.var(0) + 1e-5).sqrt()
        return (x - self.mean) / (self.var + 1e-5).sqrt()


class DigitsNet(pl.LightningModule):
    """64 standardized pixels -> 10 classes. ``kind``:

    - ``"healthy"``; ``"dropout"``/``"dropout_fixed"``: ``F.dropout`` without/with
      ``training=self.training``; ``"sdpa"``/``"sdpa_fixed"``: attention dropout in eval or not;
    - ``"bn_frozen"``/``"bn"``: BatchNorm after a small-scale layer, ``momentum=0`` (its running
      statistics never move) or the default; ``"bn_lag"``: after a large, off-centre layer (the
      running statistics at their init are far off at first, then catch up);
    - ``"ema_stale"``: eval mode uses an averaged copy of the model that is never updated;
    - ``"autocast_off"``: the whole forward under ``torch.autocast(enabled=False)``;
      ``"autocast_head"``: only a small head outside autocast; ``"norms"``: LayerNorm + softmax;
    - ``"sn_old"``/``"sn"``: both layers under ``torch.nn.utils.spectral_norm`` (power-iteration
      vectors random until the first training forward; pytorch#51800) or under
      ``parametrizations.spectral_norm`` (iterated at construction);
    - ``"runnorm_zero"``/``"runnorm"``: a running input normalizer whose variance starts at zero
      or at one.
    """

    def __init__(self, kind: str = "healthy", lr: float = 3e-3, width: int = 64) -> None:
        super().__init__()
        self.kind, self.lr = kind, lr
        self.fc1 = nn.Linear(64, width)
        self.fc2 = nn.Linear(width, 10)
        if kind.startswith("bn"):
            # a scale that BN makes harmless in training: small, or large and off-centre
            nn.init.normal_(self.fc1.weight, std=1.0 if kind == "bn_lag" else 0.01)
            if kind == "bn_lag":
                nn.init.normal_(self.fc1.bias, std=3.0)
            self.bn = nn.BatchNorm1d(width, momentum=0.0 if kind == "bn_frozen" else 0.1)
        if kind == "ema_stale":  # an averaged copy for evaluation whose update was forgotten
            self.ema = copy.deepcopy(nn.ModuleList([self.fc1, self.fc2])).requires_grad_(False)
        if kind.startswith("sdpa"):
            self.attn = Attention(8, bug=kind == "sdpa")
            self.fc1 = nn.Linear(64, 64)
        if kind == "norms":
            self.norm = nn.LayerNorm(width)
        if kind.startswith("sn"):
            sn = nn.utils.spectral_norm if kind == "sn_old" else nn.utils.parametrizations.spectral_norm
            self.fc1, self.fc2 = sn(self.fc1), sn(self.fc2)
        if kind.startswith("runnorm"):
            self.inorm = RunningNorm(64, var_init=0.0 if kind == "runnorm_zero" else 1.0)

    def features(self, x: Tensor) -> Tensor:
        if self.kind.startswith("runnorm"):
            x = self.inorm(x)
        if self.kind.startswith("sdpa"):
            h = self.attn(self.fc1(x).view(-1, 8, 8)).reshape(-1, 64)
        else:
            h = self.fc1(x)
        if self.kind.startswith("bn"):
            h = self.bn(h)
        if self.kind == "norms":
            h = self.norm(h) * F.softmax(h, dim=-1)
        h = F.relu(h)
        if self.kind == "dropout":
            h = F.dropout(h, 0.5)
        elif self.kind == "dropout_fixed":
            h = F.dropout(h, 0.5, training=self.training)
        return h

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "autocast_off":
            with torch.autocast(x.device.type, enabled=False):
                return self.fc2(self.features(x.float()))
        if self.kind == "ema_stale" and not self.training:
            return self.ema[1](F.relu(self.ema[0](x)))
        h = self.features(x)
        if self.kind == "autocast_head":
            with torch.autocast(x.device.type, enabled=False):
                return self.fc2(h.float())
        return self.fc2(h)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x).float(), y)

    def validation_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x).float(), y)
        self.log("val_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam([p for p in self.parameters() if p.requires_grad], lr=self.lr)


def digits_loaders(seed: int, batch_size: int = 32, label_noise: float = 0.0
                   ) -> tuple[DataLoader, DataLoader]:
    """Standardized digits; ``label_noise``: that fraction of the validation labels redrawn at
    random (harder validation data)."""
    x, y, xv, yv = load_digits_tensors(standardize=True, seed=seed, val_fraction=0.2)
    if label_noise:
        g = torch.Generator().manual_seed(seed)
        flip = torch.rand(len(yv), generator=g) < label_noise
        yv = torch.where(flip, torch.randint(0, 10, (len(yv),), generator=g), yv)
    train = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(seed))
    return train, DataLoader(TensorDataset(xv, yv), batch_size=64)
