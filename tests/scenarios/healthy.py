"""Healthy runs that must raise no warning and no error: the labeled set of issue 14.

Each builder takes a seed and returns ``(model, train_loader, val_loader, trainer_kwargs)`` for
a real `Trainer.fit` with `Triage()` at its defaults. `benchmarks/calibrate_false_alarms.py`
runs all of them over several seeds and prints the false-alarm rate per code; the tests run a
representative subset.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage.demo.digits import load_digits_tensors

Built = tuple[pl.LightningModule, DataLoader, DataLoader, dict[str, Any]]


class Net(pl.LightningModule):
    """A classifier over any ``net`` with a configurable loss, optimizer and schedule."""

    def __init__(self, net: nn.Module, lr: float = 3e-3, optimizer: str = "adam",
                 label_smoothing: float = 0.0, schedule: str = "", total_steps: int = 0,
                 mixup: float = 0.0) -> None:
        super().__init__()
        self.net = net
        self.lr, self.optimizer_name, self.schedule = lr, optimizer, schedule
        self.label_smoothing, self.total_steps, self.mixup = label_smoothing, total_steps, mixup

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        if self.mixup:  # mixup: convex combinations of examples and of their one-hot targets
            lam = float(torch.distributions.Beta(self.mixup, self.mixup).sample())
            perm = torch.randperm(x.shape[0])
            target = F.one_hot(y, 10).float()
            x = lam * x + (1 - lam) * x[perm]
            return F.cross_entropy(self(x), lam * target + (1 - lam) * target[perm])
        return F.cross_entropy(self(x), y, label_smoothing=self.label_smoothing)

    def validation_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("val_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        params = [p for p in self.parameters() if p.requires_grad]
        opt: torch.optim.Optimizer = (torch.optim.Adam(params, lr=self.lr)
                                      if self.optimizer_name == "adam"
                                      else torch.optim.SGD(params, lr=self.lr, momentum=0.9))
        if self.schedule != "warmup-cosine":
            return opt
        warm = max(1, self.total_steps // 10)

        def factor(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, self.total_steps - warm)))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _digits(seed: int, batch_size: int = 32, n_val: float = 0.2
            ) -> tuple[DataLoader, DataLoader, int]:
    x, y, xv, yv = load_digits_tensors(standardize=True, seed=seed, val_fraction=n_val)
    train = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(seed))
    return train, DataLoader(TensorDataset(xv, yv), batch_size=256), len(train)


def mlp(hidden: int = 64) -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def label_smoothing(seed: int) -> Built:
    train, val, _ = _digits(seed)
    return Net(mlp(), label_smoothing=0.2), train, val, {"max_epochs": 3}


def tiny_validation(seed: int) -> Built:
    """38 validation examples (digits), 12 epochs: the validation mean is noisy."""
    x, y, xv, yv = load_digits_tensors(standardize=True, seed=seed)
    train = DataLoader(TensorDataset(x[:300], y[:300]), batch_size=16, shuffle=True,
                       generator=torch.Generator().manual_seed(seed))
    val = DataLoader(TensorDataset(xv[:38], yv[:38]), batch_size=38)
    return Net(mlp()), train, val, {"max_epochs": 12}


def small_batches(seed: int) -> Built:
    train, val, _ = _digits(seed, batch_size=4)
    return Net(mlp(), lr=1e-3), train, val, {"max_epochs": 1}


def warmup_cosine(seed: int) -> Built:
    train, val, steps = _digits(seed)
    epochs = 4
    return (Net(mlp(), lr=0.05, optimizer="sgd", schedule="warmup-cosine",
                total_steps=steps * epochs), train, val, {"max_epochs": epochs})


def frozen_backbone(seed: int) -> Built:
    """Fine-tuning: a backbone trained on digits 0-4 for two epochs, frozen, then a new head
    trained on all ten classes."""
    torch.manual_seed(seed)
    x, y, _, _ = load_digits_tensors(standardize=True, seed=seed)
    backbone = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
    head = nn.Linear(64, 5)
    opt = torch.optim.Adam([*backbone.parameters(), *head.parameters()], lr=3e-3)
    keep = y < 5
    for _ in range(2):
        for i in range(0, int(keep.sum()), 32):
            xb, yb = x[keep][i:i + 32], y[keep][i:i + 32]
            opt.zero_grad()
            F.cross_entropy(head(backbone(xb)), yb).backward()
            opt.step()
    backbone.requires_grad_(False)
    train, val, _ = _digits(seed)
    return Net(nn.Sequential(backbone, nn.Linear(64, 10))), train, val, {"max_epochs": 3}


def mixup(seed: int) -> Built:
    train, val, _ = _digits(seed)
    return Net(mlp(), mixup=0.4), train, val, {"max_epochs": 3}


def augmented(seed: int) -> Built:
    """Heavy augmentation: every training batch gets Gaussian noise (std 0.5) and random pixel
    dropout (20%)."""

    class Augmented(Net):
        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            x, y = batch
            x = (x + 0.5 * torch.randn_like(x)) * (torch.rand_like(x) > 0.2)
            return super().training_step((x, y), batch_idx)

    train, val, _ = _digits(seed)
    return Augmented(mlp()), train, val, {"max_epochs": 3}


def late_start(seed: int) -> Built:
    """A long flat plateau before learning starts: a deep tanh network with a tiny
    initialization (std 0.05) sits near chance, then learns."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    width = 64
    for _ in range(4):
        lin = nn.Linear(width, 64)
        nn.init.normal_(lin.weight, std=0.05)
        nn.init.zeros_(lin.bias)
        layers += [lin, nn.Tanh()]
    net = nn.Sequential(*layers, nn.Linear(64, 10))
    train, val, _ = _digits(seed)
    return Net(net, lr=0.05, optimizer="sgd"), train, val, {"max_epochs": 6}


def cnn(seed: int) -> Built:
    net = nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 16, 3, padding=1),
                        nn.BatchNorm2d(16), nn.ReLU(), nn.Flatten(), nn.Dropout(0.2),
                        nn.Linear(16 * 64, 10))
    train, val, _ = _digits(seed)
    return Net(net), train, val, {"max_epochs": 2}


HEALTHY: dict[str, Callable[[int], Built]] = {
    "label-smoothing": label_smoothing,
    "tiny-validation": tiny_validation,
    "small-batches": small_batches,
    "warmup-cosine": warmup_cosine,
    "frozen-backbone": frozen_backbone,
    "mixup": mixup,
    "heavy-augmentation": augmented,
    "late-start": late_start,
    "cnn-bn-dropout": cnn,
}
