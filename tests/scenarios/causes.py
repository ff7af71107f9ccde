"""Broken runs whose report must lead with the cause, not the symptom (issue 14's table).

Each scenario is a real `Trainer.fit` on a small real data set (scikit-learn's digits or
diabetes). The overfit probe fails in most of them *because* of the bug another finding names;
the report must start with that finding and mark the probe's failure `explained_by` it.
"""

from __future__ import annotations

import functools
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage.demo import Scenario
from lightning_triage.demo.digits import DigitsMLP, digits_loaders, load_digits_tensors

Built = tuple[pl.LightningModule, Any, Any]


class RBF(nn.Module):
    """A radial-basis layer with its sign wrong: ``exp(+||x - c||^2)`` instead of
    ``exp(-||x - c||^2)``. For standardized 64-pixel inputs the squared distance is ~128, past
    float32's ``exp`` limit of ~88: Inf from the first step, from ordinary inputs."""

    def __init__(self, features: int, centers: int) -> None:
        super().__init__()
        self.centers = nn.Parameter(torch.randn(centers, features))

    def forward(self, x: Tensor) -> Tensor:
        return torch.exp(torch.cdist(x, self.centers) ** 2)


class RowNorm(nn.Module):
    """Standardize each example over its features with no epsilon: a constant example (a blank
    image) gives ``0 / 0``."""

    def forward(self, x: Tensor) -> Tensor:
        return (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)


class SeqDigits(DigitsMLP):
    """:class:`DigitsMLP` with a custom ``net``."""

    def __init__(self, net: nn.Module, lr: float, optimizer: str = "sgd") -> None:
        super().__init__(lr=lr, optimizer=optimizer)  # type: ignore[arg-type]
        self.net = net


class BatchSoftmaxMLP(DigitsMLP):
    """Log-softmax over dim 0 (the batch) instead of the classes, then `F.nll_loss`."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.nll_loss(torch.log_softmax(self(x), dim=0), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.nll_loss(torch.log_softmax(self(x), dim=0), y))


class BroadcastRegressor(pl.LightningModule):
    """A regression MLP whose `(N, 1)` prediction meets `(N,)` targets in `F.mse_loss`: the loss
    broadcasts to `(N, N)` and every prediction is pulled to the batch mean."""

    def __init__(self, features: int, lr: float = 1e-2) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.mse_loss(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


@functools.lru_cache(maxsize=1)
def _diabetes() -> tuple[Tensor, Tensor]:
    from sklearn.datasets import load_diabetes

    data = load_diabetes()
    x = torch.tensor(data.data, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.float32)
    x = (x - x.mean(0)) / x.std(0)
    return x, (y - y.mean()) / y.std()


def _mse_broadcast() -> Built:
    x, y = _diabetes()
    gen = torch.Generator().manual_seed(0)
    train = DataLoader(TensorDataset(x[:360], y[:360]), batch_size=32, shuffle=True, generator=gen)
    val = DataLoader(TensorDataset(x[360:], y[360:]), batch_size=128)
    return BroadcastRegressor(x.shape[1]), train, val


def _digits_model(**kwargs: Any) -> Any:
    def build() -> Built:
        train, val = digits_loaders()
        return DigitsMLP(**kwargs), train, val

    return build


def _exp_overflow() -> Built:
    train, val = digits_loaders()
    net = nn.Sequential(RBF(64, 32), nn.Linear(32, 10))
    return SeqDigits(net, lr=0.1), train, val


def _norm_without_eps() -> Built:
    # pixels scaled to [0, 1]; the first training example is a blank scan (all zeros), as real
    # scanned data sets hold; unshuffled, so it is in the first batch and the probe's batch
    x, y, xv, yv = load_digits_tensors(standardize=False)
    x, xv = x / 16, xv / 16
    x[0] = 0.0
    train = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=False)
    val = DataLoader(TensorDataset(xv, yv), batch_size=256)
    net = nn.Sequential(RowNorm(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return SeqDigits(net, lr=0.1), train, val


class SharpSoftmax(nn.Module):
    """A softmax with temperature 0.1 written by hand (``exp`` then normalize): ``exp(h / 0.1)``
    overflows float16 (above 65504) once ``h`` passes 1.1, float32 only past 8.8."""

    def forward(self, x: Tensor) -> Tensor:
        w = torch.exp(x / 0.1)
        return w / w.sum(-1, keepdim=True)


def _fp16_overflow() -> Built:
    train, val = digits_loaders()
    net = nn.Sequential(nn.Linear(64, 32), SharpSoftmax(), nn.Linear(32, 10))
    return SeqDigits(net, lr=0.1), train, val


def _deep_sigmoid() -> Built:
    train, val = digits_loaders()
    layers: list[nn.Module] = [nn.Linear(64, 32), nn.Sigmoid()]
    for _ in range(10):
        layers += [nn.Linear(32, 32), nn.Sigmoid()]
    net = nn.Sequential(*layers, nn.Linear(32, 10))
    return SeqDigits(net, lr=0.1), train, val


def _batch_softmax() -> Built:
    train, val = digits_loaders()
    return BatchSoftmaxMLP(lr=0.1), train, val


#: The table of issue 14, plus the demo's own log-softmax run (in the demo's scenarios).
CAUSE_SCENARIOS: list[Scenario] = [
    Scenario("lr-1e-5", "the digits MLP with SGD at lr 1e-5", "curve.lr_too_low",
             _digits_model(lr=1e-5)),
    Scenario("lr-0", "the digits MLP with SGD at lr 0", "wiring.optimizer_not_stepping",
             _digits_model(lr=0.0)),
    Scenario("exp-overflow", "an RBF layer computing `exp(+d^2)` (sign bug), SGD lr 0.1",
             "numerics.nonfinite_forward", _exp_overflow),
    Scenario("norm-without-eps", "per-example standardization without epsilon, one blank image",
             "numerics.nonfinite_forward", _norm_without_eps),
    Scenario("fp16-overflow", "an `exp` activation overflowing float16 (precision 16-true)",
             "numerics.precision_overflow", _fp16_overflow,
             trainer_kwargs={"precision": "16-true"}),
    Scenario("batch-softmax", "log-softmax over the batch axis", "structure.batch_mixing",
             _batch_softmax),
    Scenario("mse-broadcast", "MSE between `(N, 1)` predictions and `(N,)` targets (diabetes)",
             "structure.shape_mismatch", _mse_broadcast),
    Scenario("deep-sigmoid", "12 sigmoid layers, SGD lr 0.1", "grad.vanishing", _deep_sigmoid),
]
