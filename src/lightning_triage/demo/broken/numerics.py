"""Broken runs of stage 8, numerics: NaN and Inf from a layer, a loss or a precision too narrow,
and layers that slip out of autocast."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage.demo.broken.common import HEALTHY, fit, raw_digits
from lightning_triage.demo.digits import DigitsMLP, digits_loaders, load_digits_tensors
from lightning_triage.demo.numerics import log_softmax_scenario
from lightning_triage.demo.scenario import Scenario


class Log(nn.Module):
    """``torch.log`` as a layer: the log of a negative activation is NaN."""

    def forward(self, h: Tensor) -> Tensor:
        return torch.log(h)


class LogLayerMLP(DigitsMLP):
    """The digits MLP with ``torch.log`` where its ReLU was."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = nn.Sequential(nn.Linear(64, 32), Log(), nn.Linear(32, 10))


class Square(nn.Module):
    def forward(self, h: Tensor) -> Tensor:
        return h * h * 1000.0


class SquareMLP(DigitsMLP):
    """Squares its hidden activations times 1000: past float16's range on raw pixels."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = nn.Sequential(nn.Linear(64, 32), Square(), nn.Linear(32, 10))


class ManualMLP(DigitsMLP):
    """Manual optimization, with a ``torch.log`` layer that makes NaN (``log=False``: a ReLU)."""

    def __init__(self, log: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.automatic_optimization = False
        self.net = nn.Sequential(nn.Linear(64, 32), Log() if log else nn.ReLU(), nn.Linear(32, 10))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        opt = self.optimizers()
        loss = F.cross_entropy(self(x), y)
        opt.zero_grad()  # type: ignore[union-attr]
        self.manual_backward(loss)
        opt.step()  # type: ignore[union-attr]
        return loss


class Float32BodyMLP(DigitsMLP):
    """The hidden layers run under ``torch.autocast(enabled=False)``, in float32 (``bypass``;
    ``False``: under the precision plugin's autocast, the fix)."""

    def __init__(self, bypass: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bypass = bypass
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                 nn.Linear(256, 10))

    def forward(self, x: Tensor) -> Tensor:
        if not self.bypass:
            return self.net(x)
        with torch.autocast("cpu", enabled=False):
            h = self.net[:4](x.float())
        return self.net[4](h)


class RBF(nn.Module):
    """A radial-basis layer, with its sign wrong by default: ``exp(+||x - c||^2)`` instead of
    ``exp(-||x - c||^2)``. For standardized 64-pixel inputs the squared distance is ~128, past
    float32's ``exp`` limit of ~88: Inf from the first step, from ordinary inputs."""

    def __init__(self, features: int, centers: int, sign: float = 1.0) -> None:
        super().__init__()
        self.sign = sign  # the fix: -1 / (2 width^2), a Gaussian
        self.centers = nn.Parameter(torch.randn(centers, features))

    def forward(self, x: Tensor) -> Tensor:
        return torch.exp(self.sign * torch.cdist(x, self.centers) ** 2)


class RowNorm(nn.Module):
    """Standardize each example over its features, with no epsilon by default: a constant
    example (a blank image) gives ``0 / 0``."""

    def __init__(self, eps: float = 0.0) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return (x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + self.eps)


class SharpSoftmax(nn.Module):
    """A softmax with temperature 0.1 written by hand (``exp`` then normalize): ``exp(h / 0.1)``
    overflows float16 (above 65504) once ``h`` passes 1.1, float32 only past 8.8 (``stable``:
    ``torch.softmax``, which subtracts the maximum first, the fix)."""

    def __init__(self, stable: bool = False) -> None:
        super().__init__()
        self.stable = stable

    def forward(self, x: Tensor) -> Tensor:
        if self.stable:
            return torch.softmax(x / 0.1, -1)
        w = torch.exp(x / 0.1)
        return w / w.sum(-1, keepdim=True)


class SeqDigits(DigitsMLP):
    """:class:`DigitsMLP` with a custom ``net``."""

    def __init__(self, net: nn.Sequential, lr: float, optimizer: str = "sgd") -> None:
        super().__init__(lr=lr, optimizer=optimizer)  # type: ignore[arg-type]
        self.net = net


def exp_overflow(sign: float = 1.0) -> Any:
    train, val = digits_loaders()
    net = nn.Sequential(RBF(64, 32, sign), nn.Linear(32, 10))
    return SeqDigits(net, lr=0.1), train, val


def norm_without_eps(eps: float = 0.0) -> Any:
    # pixels scaled to [0, 1]; the first training example is a blank scan (all zeros), as real
    # scanned data sets hold; unshuffled, so it is in the first batch and the probe's batch
    x, y, xv, yv = load_digits_tensors(standardize=False)
    x, xv = x / 16, xv / 16
    x[0] = 0.0
    train = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=False)
    val = DataLoader(TensorDataset(xv, yv), batch_size=256)
    net = nn.Sequential(RowNorm(eps), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return SeqDigits(net, lr=0.1), train, val


def fp16_overflow(stable: bool = False) -> Any:
    train, val = digits_loaders()
    net = nn.Sequential(nn.Linear(64, 32), SharpSoftmax(stable), nn.Linear(32, 10))
    return SeqDigits(net, lr=0.1), train, val


NUMERICS_RUNS: list[Scenario] = [
    Scenario("log-softmax-loss", "hand-written `-log(softmax(z))` loss, SGD lr 2",
             "numerics.nonfinite_loss", log_softmax_scenario, max_epochs=3,
             # SGD at lr 2 stays: once the loss is stable, the run diverges
             fixed=fit(lambda: DigitsMLP(lr=2.0)), full_fix=False),
    Scenario("log-layer", "`torch.log` of hidden activations", "numerics.nonfinite_forward",
             fit(lambda: LogLayerMLP(lr=0.1)), fixed=HEALTHY),
    Scenario("fp16-square", "activations squared x1000 in `16-true` (fp16) on raw pixels",
             "numerics.precision_overflow", fit(lambda: SquareMLP(lr=1e-6), raw_digits),
             trainer_kwargs={"precision": "16-true"},
             # the raw pixels stay: data.unnormalized_input
             fixed_trainer_kwargs={"precision": "32-true"}, full_fix=False),
    Scenario("manual-log-layer", "manual optimization with a `torch.log` layer",
             "numerics.nonfinite_detected", fit(lambda: ManualMLP(lr=0.1)),
             fixed=fit(lambda: ManualMLP(log=False, lr=0.1))),
    Scenario("autocast-bypassed", "hidden layers under `torch.autocast(enabled=False)` in "
             "`bf16-mixed`", "numerics.autocast_bypassed", fit(lambda: Float32BodyMLP(lr=0.1)),
             trainer_kwargs={"precision": "bf16-mixed"},
             fixed=fit(lambda: Float32BodyMLP(bypass=False, lr=0.1))),
    # issue 14's causes: the report leads with them and the probe's failure names them
    Scenario("exp-overflow", "an RBF layer computing `exp(+d^2)` (sign bug), SGD lr 0.1",
             "numerics.nonfinite_forward", exp_overflow, fixed=lambda: exp_overflow(-1 / 64),
             lead=True, full_fix=False),  # a Gaussian RBF learns slowly: curve.lr_too_low
    Scenario("norm-without-eps", "per-example standardization without epsilon, one blank image",
             "numerics.nonfinite_forward", norm_without_eps,
             fixed=lambda: norm_without_eps(1e-5), lead=True),
    Scenario("fp16-overflow", "an `exp` activation overflowing float16 (precision 16-true)",
             "numerics.precision_overflow", fp16_overflow, trainer_kwargs={"precision": "16-true"},
             fixed=lambda: fp16_overflow(stable=True), lead=True),
]
