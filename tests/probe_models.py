"""Small real models for the wiring, overfit and mode tests: healthy ones and broken ones."""

from __future__ import annotations

import functools
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage.demo.digits import load_digits_tensors


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return load_digits_tensors(standardize=True)


def digits(batch_size: int = 32, n_train: int = 512) -> tuple[DataLoader, DataLoader]:
    """Seeded digits loaders (train shuffled with its own generator)."""
    x, y, xv, yv = _digits()
    train = DataLoader(TensorDataset(x[:n_train], y[:n_train]), batch_size=batch_size,
                       shuffle=True, generator=torch.Generator().manual_seed(0))
    val = DataLoader(TensorDataset(xv[:128], yv[:128]), batch_size=64)
    return train, val


def mlp(hidden: int = 32, dropout: float = 0.0) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(64, hidden), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers, nn.Linear(hidden, 10))


def cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Dropout(0.1), nn.Flatten(), nn.Linear(8 * 64, 10),
    )


class Classifier(pl.LightningModule):
    """Cross-entropy classifier over any ``net``; counts its real ``self.log`` calls."""

    def __init__(self, net: nn.Module | None = None, lr: float = 0.05,
                 optimizer: str = "sgd", weight_decay: float = 0.0) -> None:
        super().__init__()
        self.net = net if net is not None else mlp()
        self.lr = lr
        self.optimizer_name = optimizer
        self.weight_decay = weight_decay
        self.log_calls = 0
        self.seen_batches: list[int] = []

    def log(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self.log_calls += 1
        super().log(*args, **kwargs)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.seen_batches.append(batch_idx)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.loss(batch))

    def configure_optimizers(self) -> Any:
        if self.optimizer_name == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9,
                               weight_decay=self.weight_decay)


class EncoderHead(Classifier):
    """``encoder`` then ``head``: the shape the wiring bugs are injected into."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(net=nn.Identity(), **kwargs)
        self.encoder = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x))


class DetachedEncoder(EncoderHead):
    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x).detach())


class UnusedModule(EncoderHead):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.aux = nn.Linear(10, 10)  # defined, never called


class ZeroBranch(EncoderHead):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.aux = nn.Linear(64, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x)) + 0.0 * self.aux(x)


class FrozenEncoder(EncoderHead):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.encoder.requires_grad_(False)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.head.parameters(), lr=self.lr)


class HeadOnlyOptimizer(EncoderHead):
    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.head.parameters(), lr=self.lr)


class DetachedLoss(EncoderHead):
    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x).detach(), y)


class DoubleSoftmax(EncoderHead):
    """The model ends in a softmax and the loss is cross-entropy over its probabilities."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.softmax(self.head(self.encoder(x)), dim=-1)


class DetachedTrunkWithBias(EncoderHead):
    """Only a class bias added after the detached trunk can learn: the path is broken."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bias = nn.Parameter(torch.zeros(10))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x)).detach() + self.bias


class TrainInValidation(Classifier):
    """Calls ``self.train()`` at the start of validation: dropout/BN stay in training mode."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(net=cnn(), **kwargs)

    def on_validation_epoch_start(self) -> None:
        self.train()


class ManualClassifier(Classifier):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        opt = self.optimizers()
        opt.zero_grad()  # type: ignore[union-attr]
        loss = self.loss(batch)
        self.manual_backward(loss)
        opt.step()  # type: ignore[union-attr]
        self.log("train_loss", loss)
        return loss.detach()


class ManualDetached(ManualClassifier):
    def forward(self, x: Tensor) -> Tensor:
        return self.net[2](self.net[1](self.net[0](x)).detach())  # type: ignore[index]


# ---------------------------------------------------------------------- a tiny causal LM
VOCAB, SEQ = 16, 12


def lm_loaders(n: int = 256, batch_size: int = 16) -> tuple[DataLoader, DataLoader]:
    """Next-token data: each sequence counts up modulo VOCAB from a random start."""
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, VOCAB, (n, 1), generator=g)
    tokens = (starts + torch.arange(SEQ + 1)) % VOCAB
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    train = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    val = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=32)
    return train, val


class TinyLM(pl.LightningModule):
    def __init__(self, d: int = 32, lr: float = 3e-3) -> None:
        super().__init__()
        self.lr = lr
        self.embed = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.zeros(SEQ, d))
        self.block = nn.TransformerEncoderLayer(d, nhead=2, dim_feedforward=64, dropout=0.1,
                                                batch_first=True)
        self.out = nn.Linear(d, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ))

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x) + self.pos[: x.shape[1]]
        return self.out(self.block(h, src_mask=self.mask, is_causal=True))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x).reshape(-1, VOCAB), y.reshape(-1))
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x).reshape(-1, VOCAB), y.reshape(-1)))

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.1)


class DictBatchClassifier(Classifier):
    """Batches are dicts with an id list: the probe must slice every tensor in them."""

    def loss(self, batch: Any) -> Tensor:
        return F.cross_entropy(self(batch["image"]), batch["label"])


def dict_loaders() -> tuple[DataLoader, DataLoader]:
    x, y, xv, yv = _digits()

    def collate(items: list[tuple[Tensor, Tensor]]) -> dict[str, Any]:
        xs, ys = zip(*items, strict=True)
        return {"image": torch.stack(xs), "label": torch.stack(ys),
                "ids": [f"ex{i}" for i in range(len(xs))]}

    train = DataLoader(TensorDataset(x[:256], y[:256]), batch_size=32, collate_fn=collate)
    val = DataLoader(TensorDataset(xv[:64], yv[:64]), batch_size=32, collate_fn=collate)
    return train, val


class WarmupClassifier(Classifier):
    """A linear warmup from lr 0: the probe must use the base learning rate."""

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, step / 1000))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Regressor(pl.LightningModule):
    """MSE regression of a smooth function of the digits pixels."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 1))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.mse_loss(self.net(x).squeeze(-1), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def regression_loaders() -> tuple[DataLoader, DataLoader]:
    x, _, xv, _ = _digits()
    w = torch.linspace(-1, 1, 64)
    y, yv = torch.tanh(x @ w / 8), torch.tanh(xv @ w / 8)
    return (DataLoader(TensorDataset(x[:256], y[:256]), batch_size=32),
            DataLoader(TensorDataset(xv[:64], yv[:64]), batch_size=32))


class FrozenAllButBias(EncoderHead):
    """``self.freeze()``-style bug: everything frozen except the head's bias."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.requires_grad_(False)
        self.head.bias.requires_grad_(True)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD([self.head.bias], lr=self.lr, momentum=0.9)


class TinyGAN(pl.LightningModule):
    """Manual optimization with two optimizers and `toggle_optimizer`: each backward reaches
    only part of the model."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 64))
        self.discriminator = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, _ = batch
        opt_g, opt_d = self.optimizers()  # type: ignore[misc]
        z = torch.randn(x.shape[0], 8, device=x.device)
        ones = torch.ones(x.shape[0], 1, device=x.device)
        self.toggle_optimizer(opt_g)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self.generator(z)), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)
        self.toggle_optimizer(opt_d)
        fake = self.generator(z).detach()
        d_loss = (F.binary_cross_entropy_with_logits(self.discriminator(x), ones)
                  + F.binary_cross_entropy_with_logits(self.discriminator(fake), 0 * ones))
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        self.untoggle_optimizer(opt_d)

    def configure_optimizers(self) -> Any:
        return (torch.optim.Adam(self.generator.parameters(), lr=1e-3),
                torch.optim.Adam(self.discriminator.parameters(), lr=1e-3))
