"""Build the labeled loss-curve fixture (``curves.json``) from real short training runs.

Each case trains a small model on digits (or a synthetic regression) for the default window of
:class:`~lightning_triage.LossCurveMonitor` and records what the monitor sees: the training loss
per optimizer step, the validation loss per validation run and the chance level. The tests
classify these curves with :func:`lightning_triage.functional.curve.classify_curve`.

Regenerate (a minute or two on one core)::

    PYTHONPATH=src python tests/data/make_curves.py            # writes tests/data/curves.json
    PYTHONPATH=src python tests/data/make_curves.py --show     # also prints a summary

The fixture is seed 0. ``--seeds 1 2 --out tests/data/curves_seeds.json`` builds the same cases
on other seeds (another initialization, shuffle and train/validation split of digits, another
synthetic regression target): the thresholds are checked on those too (docs/curves.md).
"""

from __future__ import annotations

import argparse
import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage.demo.digits import DigitsMLP, load_digits_tensors

HERE = Path(__file__).parent


class Recorder(pl.Callback):
    """Record the training loss per step and the validation loss per validation run."""

    def __init__(self) -> None:
        self.train: list[float] = []
        self.val: list[list[float]] = []
        self.grad: list[float] = []
        self._val_sum = 0.0
        self._val_n = 0

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        self.grad.append(float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.train.append(float(loss))

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._val_sum, self._val_n = 0.0, 0

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        n = len(batch[0])
        self._val_sum += float(pl_module.val_loss_fn(batch)) * n  # type: ignore[operator]
        self._val_n += n

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._val_n and not trainer.sanity_checking:
            self.val.append([trainer.global_step, self._val_sum / self._val_n])


class Classifier(pl.LightningModule):
    """A digits classifier around ``net`` (inputs ``(N, 64)``), SGD or Adam."""

    def __init__(self, net: nn.Module, lr: float, optimizer: str = "adam",
                 momentum: float = 0.0) -> None:
        super().__init__()
        self.net, self.lr, self.optimizer, self.momentum = net, lr, optimizer, momentum

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self.val_loss_fn(batch)

    def val_loss_fn(self, batch: Any) -> Tensor:
        x, y = batch
        out = self(x)
        if out.ndim == 2 and out.shape[1] == 1:
            return F.mse_loss(out.squeeze(1), y)
        return F.cross_entropy(out, y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.lr)
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)


class DigitsCNN(nn.Module):
    """A small CNN over 8x8 digits."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 16, 10))

    def forward(self, x: Tensor) -> Tensor:
        return self.features(x.view(-1, 1, 8, 8))


class DigitsTransformer(nn.Module):
    """A one-layer transformer encoder over the 8 rows of a digit (8 tokens of 8 pixels)."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Linear(8, dim)
        self.pos = nn.Parameter(torch.zeros(8, dim))
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=64, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: Tensor) -> Tensor:
        h = self.encoder(self.embed(x.view(-1, 8, 8)) + self.pos)
        return self.head(h.mean(1))


def mlp(hidden: int = 32, depth: int = 1) -> nn.Module:
    layers: list[nn.Module] = []
    width = 64
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    return nn.Sequential(*layers, nn.Linear(width, 10))


def regression_data(seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Digits pixels -> a smooth nonlinear target (standardized)."""
    x_train, _, x_val, _ = load_digits_tensors(standardize=True, seed=seed)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(64, generator=g) / 8
    def target(x: Tensor) -> Tensor:
        return torch.sin(x @ w) + 0.5 * (x @ w)
    y_train, y_val = target(x_train), target(x_val)
    mean, std = y_train.mean(), y_train.std()
    return x_train, (y_train - mean) / std, x_val, (y_val - mean) / std


@dataclass
class Case:
    name: str
    label: str  # the expected curve code ("healthy" for healthy runs)
    build: Callable[[], pl.LightningModule]
    standardize: bool = True
    batch_size: int = 32
    train_size: int | None = None
    regression: bool = False
    max_epochs: int = 5


CASES: list[Case] = [
    Case("mlp_sgd_lr0", "not_learning", lambda: Classifier(mlp(), 0.0, "sgd")),
    Case("mlp_sgd_lr1e-5", "lr_too_low", lambda: Classifier(mlp(), 1e-5, "sgd")),
    Case("mlp_sgd_lr50", "diverging", lambda: DigitsMLP(lr=50.0)),
    Case("mlp_sgd_lr2", "diverging", lambda: Classifier(mlp(), 2.0, "sgd")),
    Case("mlp_sgd_lr1.5", "lr_too_high", lambda: Classifier(mlp(), 1.5, "sgd")),
    Case("mlp_adam_lr0.1", "lr_too_high", lambda: Classifier(mlp(), 0.1, "adam")),
    Case("mlp_adam_lr0.2", "lr_too_high", lambda: Classifier(mlp(), 0.2, "adam")),
    Case("raw_pixels_sgd_lr0.5", "plateau_at_chance", lambda: Classifier(mlp(), 0.5, "sgd"),
         standardize=False),
    Case("regression_sgd_lr0.3", "diverging",
         lambda: Classifier(nn.Sequential(nn.Linear(64, 1)), 0.3, "sgd"), regression=True),
    Case("regression_sgd_lr0.12", "diverging",
         lambda: Classifier(nn.Sequential(nn.Linear(64, 1)), 0.12, "sgd"), regression=True),
    Case("tiny_train_set_overfitting", "overfitting",
         lambda: Classifier(mlp(hidden=256, depth=2), 3e-3, "adam"), train_size=48,
         batch_size=16, max_epochs=70),
    Case("mlp_sgd_lr0.1", "healthy", lambda: DigitsMLP(lr=0.1)),
    Case("mlp_adam_lr1e-3", "healthy", lambda: Classifier(mlp(), 1e-3, "adam")),
    Case("mlp_sgd_momentum_batch8", "healthy", lambda: Classifier(mlp(64), 0.02, "sgd", 0.9),
         batch_size=8, max_epochs=2),
    Case("cnn_adam_lr1e-3", "healthy", lambda: Classifier(DigitsCNN(), 1e-3, "adam")),
    Case("cnn_sgd_lr0.05", "healthy", lambda: Classifier(DigitsCNN(), 0.05, "sgd", 0.9)),
    Case("transformer_adam_lr1e-3", "healthy",
         lambda: Classifier(DigitsTransformer(), 1e-3, "adam")),
    Case("regression_mlp_adam", "healthy",
         lambda: Classifier(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)),
                            1e-3, "adam"), regression=True),
    Case("regression_linear_sgd", "healthy",
         lambda: Classifier(nn.Sequential(nn.Linear(64, 1)), 0.01, "sgd"), regression=True),
]


def run_case(case: Case, seed: int = 0) -> dict[str, Any]:
    pl.seed_everything(seed, verbose=False)
    if case.regression:
        x_train, y_train, x_val, y_val = regression_data(seed)
    else:
        x_train, y_train, x_val, y_val = load_digits_tensors(standardize=case.standardize,
                                                             seed=seed)
    if case.train_size:
        x_train, y_train = x_train[: case.train_size], y_train[: case.train_size]
    train = DataLoader(TensorDataset(x_train, y_train), batch_size=case.batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(seed))
    val = DataLoader(TensorDataset(x_val, y_val), batch_size=512)
    model = case.build()
    if not hasattr(model, "val_loss_fn"):
        model.val_loss_fn = lambda batch: F.cross_entropy(model(batch[0]), batch[1])  # type: ignore[assignment]
    recorder = Recorder()
    trainer = pl.Trainer(max_epochs=case.max_epochs, callbacks=[recorder], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=0)
    trainer.fit(model, train, val)
    first_y = y_train[: case.batch_size]
    chance = float(first_y.var(unbiased=False)) if case.regression else math.log(10)

    def r(v: float) -> float | str:
        return round(v, 6) if math.isfinite(v) else str(v)

    return {"name": case.name, "label": case.label, "chance": round(chance, 6), "seed": seed,
            "task": "regression" if case.regression else "multiclass",
            "train": [r(v) for v in recorder.train],
            "grad_norm": [r(v) for v in recorder.grad],
            "val": [[int(s), r(v)] for s, v in recorder.val]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--show", action="store_true")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--out", default=str(HERE / "curves.json"))
    parser.add_argument("--seeds", nargs="*", type=int, default=[0])
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    curves = [run_case(c, seed) for seed in args.seeds for c in CASES
              if not args.only or c.name in args.only]
    if args.show:
        for c in curves:
            t = c["train"]
            print(f"{c['name']:>34} {c['label']:>18} n={len(t)} first={t[:3]} last={t[-3:]} "
                  f"val={[v for _, v in c['val']][:8]}")
    if not args.only:
        Path(args.out).write_text(json.dumps({"cases": curves}, separators=(",", ":")) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
