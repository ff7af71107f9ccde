"""Demo models on token sequences: a tiny transformer language model over pure random tokens.

On random tokens no honest model beats ``ln V`` (each next token is uniform), so a loss far
below it means the model sees what it must predict.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset


def random_token_loaders(n: int = 512, vocab: int = 16, length: int = 8, batch_size: int = 32,
                         seed: int = 0) -> tuple[DataLoader, DataLoader]:
    """Next-token data over uniform random tokens: inputs ``s[:, :-1]``, targets ``s[:, 1:]``.

    Example:
        >>> train, val = random_token_loaders(n=64)
        >>> x, y = next(iter(train))
        >>> bool((y[:, :-1] == x[:, 1:]).all()), tuple(x.shape)
        (True, (32, 8))
    """
    gen = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, vocab, (n + n // 4, length + 1), generator=gen)
    train, val = seq[:n], seq[n:]
    return (DataLoader(TensorDataset(train[:, :-1], train[:, 1:]), batch_size=batch_size),
            DataLoader(TensorDataset(val[:, :-1], val[:, 1:]), batch_size=batch_size))


class TinyLM(pl.LightningModule):
    """A one-layer transformer language model.

    Args:
        mask: ``"causal"`` hides later positions (correct); ``"future"`` hides earlier ones and
            shows later ones (the bug).
        vocab: vocabulary size.
        length: maximal sequence length.
        d_model: model width.
        lr: Adam learning rate.

    Example:
        >>> TinyLM()(torch.zeros(2, 8, dtype=torch.long)).shape
        torch.Size([2, 8, 16])
    """

    def __init__(self, mask: Literal["causal", "future"] = "causal", vocab: int = 16,
                 length: int = 8, d_model: int = 32, lr: float = 1e-2) -> None:
        super().__init__()
        self.mask, self.vocab, self.lr = mask, vocab, lr
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(length, d_model)
        layer = nn.TransformerEncoderLayer(d_model, 2, 2 * d_model, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[1]
        full = torch.full((t, t), float("-inf"), device=x.device)
        mask = torch.triu(full, 1) if self.mask == "causal" else torch.tril(full, -1)
        h = self.tok(x) + self.pos(torch.arange(t, device=x.device))
        return self.head(self.blocks(h, mask=mask))

    def _loss(self, batch: Any) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x).reshape(-1, self.vocab), y.reshape(-1))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)
