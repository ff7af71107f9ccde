"""Small objectives whose validation samples on purpose (diffusion, rectified flow, a masked
autoencoder, a VAE that samples its latent in eval), each with its dropout-left-on twins."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F

#: The objectives (what validation draws).
OBJECTIVES = ("diffusion", "flow", "mae", "vae")
#: The dropout bugs: ``F.dropout`` without ``training=self.training``, an attention dropout
#: passed in eval mode too, a Dropout layer forced into training mode by ``validation_step``.
BUGS = ("dropout", "sdpa", "train_layer")
STEPS = 20


class Denoiser(nn.Module):
    """64 pixels (+ a conditioning scalar) -> 64, through 8 tokens of 8 features with one
    attention; ``bug`` as in :data:`BUGS`."""

    def __init__(self, extra: int, bug: str | None) -> None:
        super().__init__()
        self.bug = bug
        self.inp = nn.Linear(64 + extra, 64)
        self.qkv = nn.Linear(8, 24)
        self.drop = nn.Dropout(0.3)
        self.out = nn.Linear(64, 64)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.inp(x))
        q, k, v = self.qkv(h.view(-1, 8, 8)).chunk(3, dim=-1)
        p = 0.3 if self.bug == "sdpa" or self.training else 0.0
        h = h + F.scaled_dot_product_attention(q, k, v, dropout_p=p).reshape(-1, 64)
        h = F.dropout(h, 0.3) if self.bug == "dropout" else self.drop(h)
        return self.out(h)


class SamplingNet(pl.LightningModule):
    """Digits pixels (64, standardized) under ``objective`` (:data:`OBJECTIVES`): the same
    ``_loss`` in training and validation, drawing noise, timesteps, masks or the latent."""

    def __init__(self, objective: str, bug: str | None = None) -> None:
        super().__init__()
        self.objective, self.bug = objective, bug
        extra = 1 if objective in ("diffusion", "flow") else 0
        self.net = Denoiser(extra, bug)
        if objective == "vae":
            self.enc = nn.Linear(64, 16)
            self.net = Denoiser(0, bug)
            self.dec = nn.Linear(8, 64)
        betas = torch.linspace(1e-4, 0.05, STEPS)
        self.register_buffer("alpha_bar", torch.cumprod(1 - betas, 0))

    def _loss(self, x: Tensor) -> Tensor:
        if self.objective == "diffusion":
            t = torch.randint(0, STEPS, (x.shape[0],), device=x.device)
            noise = torch.randn_like(x)
            ab = self.alpha_bar[t].unsqueeze(1)
            xt = ab.sqrt() * x + (1 - ab).sqrt() * noise
            return F.mse_loss(self.net(torch.cat([xt, t[:, None] / STEPS], 1)), noise)
        if self.objective == "flow":
            t = torch.rand(x.shape[0], 1, device=x.device)
            x0 = torch.randn_like(x)
            xt = (1 - t) * x0 + t * x
            return F.mse_loss(self.net(torch.cat([xt, t], 1)), x - x0)
        if self.objective == "mae":
            keep = torch.rand_like(x).argsort(dim=1)[:, :16]
            mask = torch.ones_like(x).scatter(1, keep, 0.0)
            pred = self.net(x * (1 - mask))
            return ((pred - x) ** 2 * mask).sum() / mask.sum()
        mu, logvar = self.enc(x).chunk(2, dim=1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()  # sampled in eval too
        recon = self.net(self.dec(z))
        kl = -0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum(1).mean()
        return F.mse_loss(recon, x) + 1e-3 * kl

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._loss(batch[0])

    def validation_step(self, batch: Any, batch_idx: int) -> Tensor:
        if self.bug == "train_layer":
            self.net.drop.train()  # the bug: a layer forced back into training mode
        loss = self._loss(batch[0])
        self.log("val_loss", loss)
        return loss

    def on_validation_epoch_end(self) -> None:
        if self.bug == "train_layer":
            self.net.drop.eval()

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def expected_draws(objective: str) -> set[str]:
    """The random functions each objective's step calls."""
    return {"diffusion": {"randint", "randn_like"}, "flow": {"rand", "randn_like"},
            "mae": {"rand_like"}, "vae": {"randn_like"}}[objective]

