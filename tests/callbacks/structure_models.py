"""Tiny models for the structure-probe tests: healthy ones and ones with a known structure bug."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

V, T, D = 16, 8, 32  # vocabulary, sequence length, model width


def random_tokens(n: int, seed: int = 0, length: int = T + 1) -> Tensor:
    return torch.randint(0, V, (n, length), generator=torch.Generator().manual_seed(seed))


def next_token_loader(n: int = 64, batch_size: int = 16, seed: int = 0) -> DataLoader:
    """Pure random tokens as next-token data: inputs s[:, :-1], targets s[:, 1:]."""
    seq = random_tokens(n, seed)
    return DataLoader(TensorDataset(seq[:, :-1], seq[:, 1:]), batch_size=batch_size)


def pair_loader(kind: str, n: int = 64, batch_size: int = 16, seed: int = 0) -> DataLoader:
    """Sequence-to-sequence data: ``reverse`` (targets = inputs reversed) or ``random``
    (targets independent random tokens)."""
    x = random_tokens(n, seed, T)
    y = x.flip(1) if kind == "reverse" else random_tokens(n, seed + 1, T)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


class LossRecorder(pl.LightningModule):
    """Records the real training losses (not the probe's runs of `training_step`)."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class DecoderLM(LossRecorder):
    """Decoder-only transformer LM. ``mask="causal"`` hides the future (correct);
    ``mask="future"`` hides the past and shows the future (the bug)."""

    def __init__(self, mask: str = "causal", lr: float = 3e-3) -> None:
        super().__init__()
        self.mask, self.lr = mask, lr
        self.tok = nn.Embedding(V, D)
        self.pos = nn.Embedding(T, D)
        layer = nn.TransformerEncoderLayer(D, 2, 2 * D, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(D, V)

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[1]
        full = torch.full((t, t), float("-inf"))
        mask = torch.triu(full, 1) if self.mask == "causal" else torch.tril(full, -1)
        h = self.tok(x) + self.pos(torch.arange(t))
        return self.head(self.blocks(h, mask=mask))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x).reshape(-1, V), y.reshape(-1))


class Seq2Seq(LossRecorder):
    """Encoder-decoder transformer. ``decoder_input="shifted"``: teacher forcing with the targets
    shifted right behind a start token (correct); ``"targets"``: the unshifted targets (the
    target leak). The encoder attends to every input position (no mask)."""

    BOS = V

    def __init__(self, decoder_input: str = "shifted", lr: float = 3e-3) -> None:
        super().__init__()
        self.decoder_input, self.lr = decoder_input, lr
        self.tok = nn.Embedding(V + 1, D)
        self.pos = nn.Embedding(T, D)
        self.transformer = nn.Transformer(D, 2, 1, 1, 2 * D, dropout=0.0, batch_first=True)
        self.head = nn.Linear(D, V)

    def embed(self, tokens: Tensor) -> Tensor:
        return self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1])
        h = self.transformer(self.embed(src), self.embed(tgt_in), tgt_mask=mask, tgt_is_causal=True)
        return self.head(h)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        if self.decoder_input == "shifted":
            tgt_in = torch.cat([torch.full_like(y[:, :1], self.BOS), y[:, :-1]], dim=1)
        else:
            tgt_in = y
        logits = self(x, tgt_in)
        return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))


class MLP(LossRecorder):
    """A classifier or regressor MLP with knobs for the structure bugs."""

    def __init__(self, n_in: int = 8, n_out: int = 4, *, dropout: float = 0.0,
                 softmax_dim: int = 1, regression: bool = False, squeeze: bool = True,
                 label_feature: bool = False, lr: float = 0.05) -> None:
        super().__init__()
        self.lr, self.softmax_dim, self.regression, self.squeeze = lr, softmax_dim, regression, squeeze
        self.label_feature, self.n_out = label_feature, n_out
        extra = n_out if label_feature else 0
        self.net = nn.Sequential(nn.Linear(n_in + extra, 16), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(16, 1 if regression else n_out))

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        if self.label_feature:
            assert y is not None
            x = torch.cat([x, F.one_hot(y, self.n_out).float()], dim=1)
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        out = self(x, y) if self.label_feature else self(x)
        if self.regression:
            return F.mse_loss(out.squeeze(-1) if self.squeeze else out, y)
        return F.nll_loss(torch.log_softmax(out, dim=self.softmax_dim), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class CNN(LossRecorder):
    """A small CNN with BatchNorm and Dropout (healthy)."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                 nn.Dropout(0.2), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                                 nn.Linear(16, 3))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)


class PerExampleLoss(nn.Module):
    """A parameter-free loss module (not an `nn.modules.loss._Loss`) returning per-example
    losses: it receives the targets and must not be mistaken for the model."""

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(logits, target, reduction="none")


class DictDataset(Dataset):
    def __init__(self, n: int = 64, n_in: int = 8, classes: int = 4) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, n_in, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"id": f"sample-{i}", "features": self.x[i], "label": self.y[i]}


class DictClassifier(LossRecorder):
    """Dict batches with string ids; targets go only to loss modules."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.lr = lr
        self.body = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
        self.classifier = nn.Linear(16, 4)
        self.criterion = nn.CrossEntropyLoss()
        self.per_example = PerExampleLoss()

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        logits = self.classifier(self.body(batch["features"]))
        return self.criterion(logits, batch["label"]) + 0.0 * self.per_example(logits, batch["label"]).mean()
