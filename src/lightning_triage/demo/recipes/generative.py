"""Healthy generative recipes on the digits pixels: DDPM noise prediction, rectified flow, a
masked autoencoder, a VAE with KL annealing and a denoising autoencoder. Each draws its noise,
timesteps, masks or latent in validation too, as the reference implementations do."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_triage.demo.recipes.common import Recipe, RecipeModule, loaders, pixels

Built = tuple[RecipeModule, Any, Any]


def digit_pixels(seed: int) -> tuple[Any, Any]:
    xt, yt, xv, yv = pixels(seed)
    return loaders((xt, yt), (xv, yv), seed)


def time_embedding(t: Tensor, dim: int = 32) -> Tensor:
    """Sinusoidal embedding of timesteps ``t`` (any scale), ``(N, dim)``."""
    freqs = torch.exp(-math.log(1000.0) * torch.arange(dim // 2, device=t.device) / (dim // 2))
    angles = t.float()[:, None] * freqs[None]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


class Denoiser(nn.Module):
    """An MLP over the noisy image and the embedded timestep (``use_time=False``: the
    timestep embedding is built but never added, the bug of the broken twin)."""

    def __init__(self, dim: int = 64, hidden: int = 128, use_time: bool = True) -> None:
        super().__init__()
        self.use_time = use_time
        self.time = nn.Sequential(nn.Linear(32, hidden), nn.SiLU())
        self.inp = nn.Linear(dim, hidden)
        self.out = nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, dim))

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        h = self.inp(x)
        if self.use_time:
            h = h + self.time(time_embedding(t))
        return self.out(h)


class DDPM(RecipeModule):
    """Noise prediction (epsilon MSE) at a random timestep of a 100-step linear schedule."""

    alpha_bar: Tensor

    def __init__(self, use_time: bool = True, steps: int = 100) -> None:
        super().__init__(lr=1e-3)
        self.model = Denoiser(use_time=use_time)
        betas = torch.linspace(1e-4, 0.02, steps)
        self.register_buffer("alpha_bar", torch.cumprod(1 - betas, 0))
        self.steps = steps

    def loss(self, batch: Any) -> Tensor:
        x0 = batch[0]
        t = torch.randint(0, self.steps, (x0.shape[0],), device=x0.device)
        noise = torch.randn_like(x0)
        a = self.alpha_bar[t][:, None]
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        return F.mse_loss(self.model(xt, t), noise)


def ddpm(seed: int) -> Built:
    return DDPM(), *digit_pixels(seed)


class RectifiedFlow(RecipeModule):
    """Flow matching: the velocity ``x1 - x0`` regressed at ``x_t = (1 - t) x0 + t x1``."""

    def __init__(self) -> None:
        super().__init__(lr=1e-3)
        self.model = Denoiser()

    def loss(self, batch: Any) -> Tensor:
        x1 = batch[0]
        x0 = torch.randn_like(x1)
        t = torch.rand(x1.shape[0], device=x1.device)
        xt = (1 - t[:, None]) * x0 + t[:, None] * x1
        return F.mse_loss(self.model(xt, t * 1000), x1 - x0)


def flow_matching(seed: int) -> Built:
    return RectifiedFlow(), *digit_pixels(seed)


class MaskedAutoencoder(RecipeModule):
    """MAE on 16 patches of 2x2 pixels: a fresh 75% mask per step, a one-layer encoder over the
    visible patches, a one-layer decoder, MSE on the masked patches."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__(lr=1e-3)
        self.embed = nn.Linear(4, dim)
        self.pos = nn.Parameter(torch.randn(16, dim) * 0.02)
        self.mask_token = nn.Parameter(torch.zeros(dim))
        self.encoder = nn.TransformerEncoderLayer(dim, 2, 32, dropout=0.0, batch_first=True)
        self.decoder = nn.TransformerEncoderLayer(dim, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(dim, 4)
        self.dim = dim

    def loss(self, batch: Any) -> Tensor:
        x = batch[0]
        n = x.shape[0]
        patches = x.view(n, 4, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(n, 16, 4)
        order = torch.rand(n, 16, device=x.device).argsort(1)
        keep, masked = order[:, :4], order[:, 4:]
        tokens = self.embed(patches) + self.pos
        visible = self.encoder(torch.gather(tokens, 1, keep[..., None].expand(-1, -1, self.dim)))
        full = (self.mask_token + self.pos).expand(n, -1, -1).clone()
        full = full.scatter(1, keep[..., None].expand(-1, -1, self.dim), visible)
        pred = self.head(self.decoder(full))
        idx = masked[..., None].expand(-1, -1, 4)
        return F.mse_loss(torch.gather(pred, 1, idx), torch.gather(patches, 1, idx))


def masked_autoencoder(seed: int) -> Built:
    return MaskedAutoencoder(), *digit_pixels(seed)


class VAE(RecipeModule):
    """Reconstruction (summed squared error per image) plus the KL of an 8-d Gaussian latent,
    its weight annealed from 0 to 1 over ``warmup`` steps; the latent is sampled in validation
    too, as the classic example does (``kl_sign=-1``: the broken twin's flipped KL term)."""

    def __init__(self, warmup: int = 20, kl_sign: float = 1.0) -> None:
        super().__init__(lr=1e-3)
        self.encoder = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16))
        self.decoder = nn.Sequential(nn.Linear(8, 128), nn.ReLU(), nn.Linear(128, 64))
        self.warmup, self.kl_sign = warmup, kl_sign

    def loss(self, batch: Any) -> Tensor:
        x = batch[0]
        mu, log_var = self.encoder(x).chunk(2, dim=1)
        z = mu + torch.randn_like(mu) * (0.5 * log_var).exp()
        recon = F.mse_loss(self.decoder(z), x, reduction="sum") / x.shape[0]
        kl = -0.5 * torch.sum(1 + log_var - mu.pow(2) - log_var.exp()) / x.shape[0]
        beta = min(1.0, (self.global_step + 1) / self.warmup)
        return recon + self.kl_sign * beta * kl


def vae(seed: int) -> Built:
    return VAE(), *digit_pixels(seed)


class DenoisingAutoencoder(RecipeModule):
    """Reconstruct the clean image from one with Gaussian noise (std 0.5) added each step."""

    def __init__(self) -> None:
        super().__init__(lr=1e-3)
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 64))

    def loss(self, batch: Any) -> Tensor:
        x = batch[0]
        return F.mse_loss(self.net(x + 0.5 * torch.randn_like(x)), x)


def denoising_autoencoder(seed: int) -> Built:
    return DenoisingAutoencoder(), *digit_pixels(seed)


GENERATIVE_RECIPES: list[Recipe] = [
    Recipe("ddpm", "generative", "DDPM noise prediction over random timesteps", ddpm),
    Recipe("flow-matching", "generative", "rectified flow, velocity regression", flow_matching),
    Recipe("masked-autoencoder", "generative", "MAE, a fresh 75% patch mask per step",
           masked_autoencoder),
    Recipe("vae", "generative", "VAE, KL annealing, latent sampled in validation", vae),
    Recipe("denoising-autoencoder", "generative", "denoising autoencoder, noise std 0.5",
           denoising_autoencoder),
]
