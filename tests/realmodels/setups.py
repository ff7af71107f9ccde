"""Lightning set-ups a new user brings: batches as dicts, dataclasses and namedtuples, an
IterableDataset, and a manual-optimization GAN (the resume, Tuner, SWA and EarlyStopping set-ups
are built in the tests from :class:`~tests.realmodels.models.DigitsClassifier`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, IterableDataset

from lightning_triage.demo.digits import load_digits_tensors
from tests.realmodels.models import DigitsClassifier


@dataclass
class DigitsBatch:
    pixels: Tensor
    target: Tensor


class DigitsPair(NamedTuple):
    image: Tensor
    label: Tensor


class _Digits(Dataset):
    def __init__(self, x: Tensor, y: Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.x[i], self.y[i]


def _collate(kind: str) -> Any:
    def collate(items: list[tuple[Tensor, Tensor]]) -> Any:
        x = torch.stack([i[0] for i in items])
        y = torch.stack([i[1] for i in items])
        if kind == "dict":
            return {"image": x, "label": y}
        if kind == "dataclass":
            return DigitsBatch(x, y)
        return DigitsPair(x, y)

    return collate


def structured_loaders(kind: str, seed: int = 0) -> tuple[DataLoader, DataLoader]:
    """Digits loaders whose batches are a dict, a dataclass or a namedtuple (``kind``)."""
    x, y, xv, yv = load_digits_tensors()
    train = DataLoader(_Digits(x[:512], y[:512]), batch_size=32, shuffle=True,
                       collate_fn=_collate(kind), generator=torch.Generator().manual_seed(seed))
    return train, DataLoader(_Digits(xv[:128], yv[:128]), batch_size=64, collate_fn=_collate(kind))


class StructuredClassifier(DigitsClassifier):
    """Reads its inputs and targets from a dict, a dataclass or a namedtuple batch."""

    def split(self, batch: Any) -> tuple[Tensor, Tensor]:
        if isinstance(batch, dict):
            return batch["image"], batch["label"]
        if isinstance(batch, DigitsBatch):
            return batch.pixels, batch.target
        return batch.image, batch.label


class StreamedDigits(IterableDataset):
    """Digits streamed in a seeded shuffled order (no ``__len__``)."""

    def __init__(self, x: Tensor, y: Tensor, seed: int) -> None:
        self.x, self.y, self.seed = x, y, seed
        self.epoch = 0

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        gen = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        self.epoch += 1
        for i in torch.randperm(len(self.x), generator=gen).tolist():
            yield self.x[i], self.y[i]


def streamed_loaders(seed: int = 0) -> tuple[DataLoader, DataLoader]:
    x, y, xv, yv = load_digits_tensors()
    train = DataLoader(StreamedDigits(x[:512], y[:512], seed), batch_size=32)
    return train, DataLoader(StreamedDigits(xv[:128], yv[:128], seed), batch_size=64)


# ---------------------------------------------------------------------------------------------
# a manual-optimization GAN on 2-D points
# ---------------------------------------------------------------------------------------------
def ring_points(seed: int = 0, n: int = 1024) -> DataLoader:
    """Points on a noisy ring of radius 2."""
    gen = torch.Generator().manual_seed(seed)
    angle = torch.rand(n, generator=gen) * 2 * torch.pi
    radius = 2 + 0.1 * torch.randn(n, generator=gen)
    points = torch.stack([radius * angle.cos(), radius * angle.sin()], dim=1)
    return DataLoader(points, batch_size=64, shuffle=True,
                      generator=torch.Generator().manual_seed(seed))


class RingGAN(pl.LightningModule):
    """Generator and discriminator MLPs trained alternately with manual optimization."""

    def __init__(self, noise: int = 8, hidden: int = 32) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.noise = noise
        self.generator = nn.Sequential(nn.Linear(noise, hidden), nn.ReLU(),
                                       nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, hidden), nn.LeakyReLU(0.2),
                                           nn.Linear(hidden, hidden), nn.LeakyReLU(0.2),
                                           nn.Linear(hidden, 1))

    def forward(self, z: Tensor) -> Tensor:
        return self.generator(z)

    def training_step(self, batch: Tensor, batch_idx: int) -> None:
        opt_g, opt_d = self.optimizers()  # type: ignore[misc]
        n = batch.shape[0]
        z = torch.randn(n, self.noise, device=batch.device)
        fake = self(z)
        real_logit, fake_logit = self.discriminator(batch), self.discriminator(fake.detach())
        d_loss = (F.binary_cross_entropy_with_logits(real_logit, torch.ones_like(real_logit))
                  + F.binary_cross_entropy_with_logits(fake_logit, torch.zeros_like(fake_logit)))
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        gen_logit = self.discriminator(fake)
        g_loss = F.binary_cross_entropy_with_logits(gen_logit, torch.ones_like(gen_logit))
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.log_dict({"d_loss": d_loss, "g_loss": g_loss})

    def configure_optimizers(self) -> Any:
        betas = (0.5, 0.999)
        return (torch.optim.Adam(self.generator.parameters(), lr=2e-3, betas=betas),
                torch.optim.Adam(self.discriminator.parameters(), lr=2e-3, betas=betas))


__all__ = [
    "DigitsBatch",
    "DigitsPair",
    "RingGAN",
    "StreamedDigits",
    "StructuredClassifier",
    "ring_points",
    "streamed_loaders",
    "structured_loaders",
]
