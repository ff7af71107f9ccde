"""The models the overhead benchmarks train: a small CNN, a tiny MLP and a small transformer
language model, plain SGD."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F


class BenchModule(pl.LightningModule):
    """Cross-entropy classifier around ``net``, SGD with momentum."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        out = self.net(x)
        if out.dim() == 3:  # a language model: (batch, positions, vocabulary)
            return F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))
        return F.cross_entropy(out, y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def small_cnn() -> nn.Module:
    """2 conv + 2 linear layers for 1x28x28 inputs."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 10))


def tiny_mlp() -> nn.Module:
    """64-32-10."""
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


class TinyLM(nn.Module):
    """A small causal transformer language model: 2 layers, width 64, 2 heads."""

    def __init__(self, vocab: int = 64, width: int = 64, layers: int = 2, heads: int = 2,
                 positions: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(0.02 * torch.randn(positions, width))
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, x: Tensor) -> Tensor:
        t = x.size(1)
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        h = self.blocks(self.embed(x) + self.pos[:t], mask=mask, is_causal=True)
        return self.head(h)


def tiny_lm() -> nn.Module:
    """A 2-layer transformer LM over 64 tokens (next-token prediction on 32 positions)."""
    return TinyLM()
