"""Padded token data and small transformers that use (or forget) their padding mask."""

from __future__ import annotations

from typing import Any, Literal

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

PAD = 0
VOCAB = 12
LENGTH = 10


def padded_tokens(n: int, *, side: Literal["right", "left"] = "right", length: int = LENGTH,
                  min_len: int = 3, seed: int = 0, extra: int = 0) -> tuple[Tensor, Tensor]:
    """``(ids, real)``: ``(n, length + extra)`` token ids 1..VOCAB-1 of random lengths
    ``min_len..length``, padded with ``PAD`` on ``side``; ``real`` marks the tokens."""
    gen = torch.Generator().manual_seed(seed)
    total = length + extra
    ids = torch.full((n, total), PAD, dtype=torch.long)
    lengths = torch.randint(min_len, length + 1, (n,), generator=gen)
    for i, k in enumerate(lengths.tolist()):
        tokens = torch.randint(1, VOCAB, (k,), generator=gen)
        if side == "right":
            ids[i, :k] = tokens
        else:
            ids[i, total - k:] = tokens
    return ids, ids != PAD


class DictTokens(Dataset):
    """Examples ``{"input_ids", "attention_mask", "labels"}`` (right-padded, a class label)."""

    def __init__(self, n: int = 128, seed: int = 0, mask_name: str = "attention_mask") -> None:
        self.ids, real = padded_tokens(n, seed=seed)
        self.mask = ~real if "pad" in mask_name else real.long()
        self.mask_name = mask_name
        # label: is token 1 among the real tokens (learnable, depends on real tokens only)
        self.labels = (self.ids == 1).any(dim=1).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {"input_ids": self.ids[i], self.mask_name: self.mask[i], "labels": self.labels[i]}


def dict_loader(n: int = 128, seed: int = 0, batch_size: int = 16,
                mask_name: str = "attention_mask") -> DataLoader:
    return DataLoader(DictTokens(n, seed, mask_name), batch_size=batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(seed))


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))

    def forward(self, h: Tensor, pad: Tensor | None = None, attn_mask: Tensor | None = None) -> Tensor:
        a, _ = self.attn(h, h, h, key_padding_mask=pad, attn_mask=attn_mask, need_weights=False)
        h = self.norm(h + a)
        return h + self.ff(h)


class PaddedClassifier(pl.LightningModule):
    """Token embedding + positions, one attention block, mean pooling, a linear head.

    ``use_mask=True``: ``key_padding_mask`` and a masked mean; ``False``: both ignore the mask.
    """

    def __init__(self, use_mask: bool, d: int = 16, mask_name: str = "attention_mask") -> None:
        super().__init__()
        self.use_mask = use_mask
        self.mask_name = mask_name
        self.embed = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(64, d)
        self.block = Block(d)
        self.head = nn.Linear(d, 3)

    def forward(self, ids: Tensor, pad: Tensor) -> Tensor:
        h = self.embed(ids) + self.pos.weight[: ids.shape[1]]
        if self.use_mask:
            h = self.block(h, pad=pad)
            keep = (~pad).unsqueeze(-1).to(h.dtype)
            pooled = (h * keep).sum(1) / keep.sum(1).clamp_min(1.0)
        else:
            pooled = self.block(h).mean(1)
        return self.head(pooled)

    def _pad(self, batch: dict[str, Tensor]) -> Tensor:
        mask = batch[self.mask_name]
        return mask.bool() if "pad" in self.mask_name else mask == 0

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = F.cross_entropy(self(batch["input_ids"], self._pad(batch)), batch["labels"])
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def lm_loader(side: Literal["right", "left"], n: int = 128, seed: int = 0,
              batch_size: int = 16) -> DataLoader:
    """Next-token pairs ``(x, y)`` padded on ``side`` after the shift; ``y`` holds -100 at the
    padded positions."""
    seq, real = padded_tokens(n, side=side, length=LENGTH + 1, min_len=4, seed=seed)
    if side == "right":
        x, y, real_y = seq[:, :-1], seq[:, 1:].clone(), real[:, 1:]
    else:  # shift inside the real part: pads stay aligned on the left
        x, y, real_y = seq[:, :-1].clone(), seq[:, 1:].clone(), real[:, 1:]
        x[~real_y] = PAD
    y[~real_y] = -100
    ds = torch.utils.data.TensorDataset(x, y)
    return DataLoader(ds, batch_size=batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(seed))


class CausalLM(pl.LightningModule):
    """A causal decoder of one block. ``use_mask=False`` ignores the padding (positions from 0,
    pads seen as keys); ``True`` masks pad keys (each pad query sees itself only) and counts
    positions from the first real token."""

    def __init__(self, use_mask: bool, d: int = 16) -> None:
        super().__init__()
        self.use_mask = use_mask
        self.embed = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(64, d)
        self.block = Block(d)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, x: Tensor) -> Tensor:
        n, t = x.shape
        future = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        if self.use_mask:
            pad = x == PAD
            positions = ((~pad).long().cumsum(1) - 1).clamp_min(0)
            h = self.embed(x) + self.pos(positions)
            eye = torch.eye(t, dtype=torch.bool, device=x.device)
            blocked = future.unsqueeze(0) | (pad.unsqueeze(1) & ~eye.unsqueeze(0))
            mask = torch.zeros(n, t, t, device=x.device).masked_fill(blocked, float("-inf"))
            mask = mask.repeat_interleave(self.block.attn.num_heads, dim=0)
        else:
            h = self.embed(x) + self.pos.weight[:t]
            mask = torch.zeros(t, t, device=x.device).masked_fill(future, float("-inf"))
        return self.head(self.block(h, attn_mask=mask))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1), ignore_index=-100)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class EncoderClassifier(PaddedClassifier):
    """``nn.TransformerEncoder`` (its nested-tensor fast path in eval) with or without
    ``src_key_padding_mask``; masked or plain mean pooling; or per-token outputs."""

    def __init__(self, use_mask: bool, token_level: bool = False) -> None:
        super().__init__(use_mask)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2)
        self.token_level = token_level

    def forward(self, ids: Tensor, pad: Tensor) -> Tensor:
        h = self.embed(ids) + self.pos.weight[: ids.shape[1]]
        h = self.enc(h, src_key_padding_mask=pad if self.use_mask else None)
        if self.token_level:
            return self.head(h)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        pooled = (h * keep).sum(1) / keep.sum(1) if self.use_mask else h.mean(1)
        return self.head(pooled)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        out = self(batch["input_ids"], self._pad(batch))
        if self.token_level:  # tag every real token with the sequence's label
            keep = ~self._pad(batch)
            labels = batch["labels"][:, None].expand_as(keep)
            return F.cross_entropy(out[keep], labels[keep])
        return F.cross_entropy(out, batch["labels"])


class LSTMClassifier(PaddedClassifier):
    """A bidirectional LSTM over packed sequences (``use_mask``) or over the padded batch."""

    def __init__(self, use_mask: bool) -> None:
        super().__init__(use_mask)
        self.rnn = nn.LSTM(16, 16, batch_first=True, bidirectional=True)
        self.head = nn.Linear(32, 3)

    def forward(self, ids: Tensor, pad: Tensor) -> Tensor:
        h = self.embed(ids)
        if self.use_mask:
            lengths = (~pad).sum(1).cpu()
            packed = nn.utils.rnn.pack_padded_sequence(h, lengths, batch_first=True,
                                                       enforce_sorted=False)
            _, (hn, _) = self.rnn(packed)
        else:
            _, (hn, _) = self.rnn(h)
        return self.head(torch.cat([hn[0], hn[1]], dim=1))
