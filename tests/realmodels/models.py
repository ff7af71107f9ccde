"""Real models and real set-ups for the real-model tests: transformers' BERT and GPT-2 built from
small configs (no downloads), a ResNet-style CNN with BatchNorm written here (torchvision is not
usable with the CPU torch of this project), and a small digits classifier for the Lightning
set-ups. Each builder is seeded by the caller (``pl.seed_everything``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightning_triage import Triage
from lightning_triage.demo.digits import load_digits_tensors

VOCAB = 100
LENGTH = 16  # every sequence is padded to the model's maximum length
PAD = 0


def quiet_trainer(tmp_path: Path, callbacks: list[Any], **kwargs: Any) -> pl.Trainer:
    defaults: dict[str, Any] = dict(
        default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, accelerator="cpu",
        max_epochs=2, num_sanity_val_steps=0,
    )
    defaults.update(kwargs)
    return pl.Trainer(callbacks=callbacks, **defaults)


def triage(tmp_path: Path, **kwargs: Any) -> Triage:
    # a long probe budget: a loaded machine must not skip a probe (the probes end on steps)
    return Triage(report_dir=tmp_path / "triage", strict=True, verbose=False,
                  overfit_time_budget=120.0, **kwargs)


def problems(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The warnings and errors of a report, as ``(code, message)``."""
    return [(f["code"], f["message"]) for f in report["findings"] if f["severity"] != "info"]


# ---------------------------------------------------------------------------------------------
# token data, padded to the maximum length
# ---------------------------------------------------------------------------------------------
class Tokens(Dataset):
    """Right-padded token sequences of random lengths 6..LENGTH, padded to ``LENGTH``.

    ``task="classify"``: a label (is the first token in the upper half of the vocabulary);
    ``task="lm"``: random tokens each followed by a function of it, ``labels = input_ids``
    with ``-100`` at the padding, the convention of transformers' language models.
    """

    def __init__(self, task: str, n: int = 256, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.task = task
        self.ids = torch.full((n, LENGTH), PAD, dtype=torch.long)
        self.mask = torch.zeros(n, LENGTH, dtype=torch.long)
        lengths = torch.randint(6, LENGTH + 1, (n,), generator=gen)
        for i, k in enumerate(lengths.tolist()):
            if task == "lm":  # random tokens, each followed by a function of it
                tokens = torch.randint(1, VOCAB, (k,), generator=gen)
                tokens[1::2] = (tokens[0::2][: k // 2] * 7) % (VOCAB - 1) + 1
                self.ids[i, :k] = tokens
            else:
                self.ids[i, :k] = torch.randint(1, VOCAB, (k,), generator=gen)
            self.mask[i, :k] = 1
        self.labels = (self.ids.masked_fill(self.mask == 0, -100) if task == "lm"
                       else (self.ids[:, 0] >= VOCAB // 2).long())

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


def token_loaders(task: str, seed: int = 0, batch_size: int = 16) -> tuple[DataLoader, DataLoader]:
    train = DataLoader(Tokens(task, 256, seed), batch_size=batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(seed))
    return train, DataLoader(Tokens(task, 64, seed + 100), batch_size=32)


class LossSteps(pl.LightningModule):
    """``training_step`` and ``validation_step`` over ``self._loss(batch)``, logged as
    ``train_loss`` and ``val_loss``."""

    def _loss(self, batch: Any) -> Tensor:
        raise NotImplementedError

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch))


class DigitsCE(pl.LightningModule):
    """Cross-entropy over ``self(x)`` on ``(x, y)`` batches, Adam at 1e-2; the training loss is
    not logged (a whole-module ``torch.compile`` traces ``training_step``)."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class HFModule(LossSteps):
    """A transformers model trained on dict batches: ``self.model(**batch).loss``.

    ``use_mask=False`` drops the attention mask (the padding bug)."""

    def __init__(self, model: nn.Module, lr: float = 1e-3, use_mask: bool = True) -> None:
        super().__init__()
        self.model, self.lr, self.use_mask = model, lr, use_mask

    def _loss(self, batch: dict[str, Tensor]) -> Tensor:
        kwargs = dict(batch) if self.use_mask else {k: v for k, v in batch.items()
                                                    if k != "attention_mask"}
        return self.model(**kwargs).loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def bert_classifier(use_mask: bool = True) -> HFModule:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=LENGTH, num_labels=2)
    return HFModule(BertForSequenceClassification(config), use_mask=use_mask)


def gpt2_lm() -> HFModule:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=LENGTH)
    return HFModule(GPT2LMHeadModel(config), lr=3e-3)


def bidirectional_lm() -> HFModule:
    """BERT trained as a language model with ``is_decoder=False``: every position sees the
    whole sequence, the token it must predict included (the causal bug)."""
    from transformers import BertConfig, BertLMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()  # "add `is_decoder=True`": the bug this model carries
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=LENGTH, is_decoder=False)
    return HFModule(BertLMHeadModel(config), lr=3e-3)


# ---------------------------------------------------------------------------------------------
# digits: a ResNet-style CNN with BatchNorm and a small classifier for the Lightning set-ups
# ---------------------------------------------------------------------------------------------
def digits(seed: int = 0, batch_size: int = 32, n_train: int = 512,
           raw: bool = False) -> tuple[DataLoader, DataLoader]:
    """Digits loaders: standardized pixels, or ``raw`` ones scaled to 0-256 like 8-bit images."""
    x, y, xv, yv = load_digits_tensors(standardize=not raw)
    if raw:
        x, xv = 16 * x, 16 * xv
    train = DataLoader(TensorDataset(x[:n_train], y[:n_train]), batch_size=batch_size,
                       shuffle=True, generator=torch.Generator().manual_seed(seed))
    return train, DataLoader(TensorDataset(xv[:128], yv[:128]), batch_size=64)


class BasicBlock(nn.Module):
    """ResNet's basic block: conv-BN-ReLU-conv-BN plus the (projected) shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False),
                                          nn.BatchNorm2d(c_out))

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResNet(nn.Module):
    """A ResNet-style CNN for 8x8 digits: stem, two stages of basic blocks, global pooling."""

    def __init__(self, width: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        self.layer1 = BasicBlock(width, width)
        self.layer2 = BasicBlock(width, 2 * width, stride=2)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x: Tensor) -> Tensor:
        h = self.layer2(self.layer1(self.stem(x.view(-1, 1, 8, 8))))
        return self.fc(h.mean(dim=(2, 3)))


class DigitsClassifier(pl.LightningModule):
    """Cross-entropy over ``net`` (an MLP by default); ``softmax_in_loss=True`` writes the
    double-softmax bug in the loss code."""

    def __init__(self, net: nn.Module | None = None, lr: float = 3e-3,
                 softmax_in_loss: bool = False) -> None:
        super().__init__()
        self.net = net if net is not None else nn.Sequential(
            nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        self.lr, self.softmax_in_loss = lr, softmax_in_loss

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def split(self, batch: Any) -> tuple[Tensor, Tensor]:
        return batch[0], batch[1]

    def loss(self, batch: Any) -> Tensor:
        x, y = self.split(batch)
        logits = self(x)
        if self.softmax_in_loss:
            return F.cross_entropy(torch.softmax(logits, 1), y)
        return F.cross_entropy(logits, y)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.loss(batch))

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


__all__ = [
    "LENGTH",
    "VOCAB",
    "BasicBlock",
    "DigitsClassifier",
    "HFModule",
    "ResNet",
    "Tokens",
    "bert_classifier",
    "bidirectional_lm",
    "digits",
    "gpt2_lm",
    "problems",
    "quiet_trainer",
    "token_loaders",
    "triage",
]
