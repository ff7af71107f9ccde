"""Broken runs of stages 6 and 7, the loss curve and the gradients: learning rates far off,
units that never fire, gradients that die out or are clipped away (by a threshold far below
their norm, or by clipping them while a gradient scaler still scales them), a model that
memorizes."""

from __future__ import annotations

from typing import Any, cast

import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage.demo.broken.common import HEALTHY, Loaders, fit, mlp
from lightning_triage.demo.broken.numerics import SeqDigits
from lightning_triage.demo.digits import DigitsMLP, digits_loaders, load_digits_tensors
from lightning_triage.demo.scenario import Scenario


class DeadReluMLP(DigitsMLP):
    """Hidden biases start at -20: most ReLUs never fire."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        nn.init.constant_(cast(nn.Linear, self.net[0]).bias, -20.0)


class WideMLP(DigitsMLP):
    """A 256-unit MLP trained with Adam."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(hidden=256, optimizer="adam", **kwargs)


class FrozenBodyMLP(DigitsMLP):
    """A 64-16-10 MLP whose hidden layer is frozen by mistake (``requires_grad_(False)``): the
    head alone trains on 16 random features (``frozen=False``: the fix)."""

    def __init__(self, frozen: bool = True, **kwargs: Any) -> None:
        super().__init__(hidden=16, **kwargs)
        if frozen:
            self.net[0].requires_grad_(False)


class WideCNN(DigitsMLP):
    """The PyTorch MNIST example's shape on the 8x8 digits: two 3x3 convolutions (32
    channels each), a 128-unit dense layer, ReLUs, trained with Adam."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(optimizer="adam", **kwargs)
        self.net = nn.Sequential(nn.Unflatten(1, (1, 8, 8)),
                                 nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.Flatten(),
                                 nn.Linear(32 * 64, 128), nn.ReLU(), nn.Linear(128, 10))


class ScalerClipMLP(DigitsMLP):
    """Manual optimization with the user's own ``torch.amp.GradScaler("cpu")`` (on CPU it scales
    and unscales as on a GPU), clipping the total gradient norm at 1 by hand as AMP loops do.

    Args:
        clip_first: clip before ``scaler.unscale_`` (the bug: the threshold applies to the
            gradients still multiplied by the scale, 2**16 at first, so every update shrinks by
            about the scale); ``False``: unscale, then clip (the fix).
        raw_step: the scaler unscales and steps the raw torch optimizer
            (``scaler.step(opt.optimizer)``: Lightning's ``global_step`` stays 0) instead of
            Lightning's wrapper (``scaler.step(opt)``).
    """

    def __init__(self, clip_first: bool = True, raw_step: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.automatic_optimization = False
        self.clip_first, self.raw_step = clip_first, raw_step
        self.scaler = torch.amp.GradScaler("cpu")

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        opt = cast(LightningOptimizer, self.optimizers())
        opt.zero_grad()
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.scaler.scale(loss).backward()
        target: Any = opt.optimizer if self.raw_step else opt
        if self.clip_first:
            nn.utils.clip_grad_norm_(self.parameters(), 1.0)
            self.scaler.unscale_(target)
        else:
            self.scaler.unscale_(target)
            nn.utils.clip_grad_norm_(self.parameters(), 1.0)
        self.scaler.step(target)
        self.scaler.update()
        self.log("train_loss", loss)
        return loss.detach()


def small_loaders(n: int = 64) -> Loaders:
    """``n`` training examples (64: two batches), the whole validation set."""
    x, y, xv, yv = load_digits_tensors()
    train = DataLoader(TensorDataset(x[:n], y[:n]), batch_size=32, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    return train, DataLoader(TensorDataset(xv, yv), batch_size=256)


def deep_sigmoid(activation: type[nn.Module] = nn.Sigmoid) -> Any:
    """Twelve linear layers with ``activation`` between them, SGD lr 0.1."""
    train, val = digits_loaders()
    layers: list[nn.Module] = [nn.Linear(64, 32), activation()]
    for _ in range(10):
        layers += [nn.Linear(32, 32), activation()]
    net = nn.Sequential(*layers, nn.Linear(32, 10))
    return SeqDigits(net, lr=0.1), train, val


CURVE_RUNS: list[Scenario] = [
    Scenario("lr-50", "SGD at learning rate 50", "curve.diverging", fit(mlp(50.0)),
             fixed=HEALTHY),
    Scenario("dead-relu", "hidden biases initialized at -20 (dead ReLUs)", "grad.dead_units",
             fit(lambda: DeadReluMLP(lr=0.1)), fixed=HEALTHY),
    Scenario("lr-3", "SGD at learning rate 3", "curve.loss_spike", fit(mlp(3.0)), fixed=HEALTHY),
    Scenario("clip-1e-4", "`gradient_clip_val=1e-4` with SGD (gradient norms about 1)",
             "grad.clipping_eats_update", fit(mlp()), trainer_kwargs={"gradient_clip_val": 1e-4},
             fixed_trainer_kwargs={"gradient_clip_val": None}),
    # the fix is more data: ten times as much (320 examples still overfit on some seeds)
    Scenario("wide-mlp-64-examples", "256-unit MLP, Adam, 64 training examples, 30 epochs",
             "curve.overfitting", fit(lambda: WideMLP(lr=1e-2), small_loaders), max_epochs=30,
             fixed=fit(lambda: WideMLP(lr=1e-2), lambda: small_loaders(640))),
    # issue 14's causes: the report leads with them and the probe's failure names them
    Scenario("lr-1e-5", "SGD at learning rate 1e-5", "curve.lr_too_low", fit(mlp(1e-5)),
             fixed=HEALTHY, lead=True),
    # issue 41: the loss falls, the model ends below a nearest-centroid or linear model
    Scenario("frozen-body", "the hidden layer frozen by mistake, 4 epochs",
             "curve.below_baseline", fit(lambda: FrozenBodyMLP(lr=0.1)), max_epochs=4,
             fixed=fit(lambda: FrozenBodyMLP(frozen=False, lr=0.1))),
    # "loss stuck at 2.30 with Adam(lr=0.1)" (the PyTorch forums' most frequent MNIST question):
    # the first step blows the loss up hundreds of times, the ReLUs die, and the model predicts
    # the prior from then on. The learning rate leads (not the plateau it leaves behind)
    Scenario("adam-lr-0.1-cnn", "a CNN trained with Adam at learning rate 0.1 (dies at step 1)",
             "curve.lr_too_high", fit(lambda: WideCNN(lr=0.1)),
             fixed=fit(lambda: WideCNN(lr=1e-3)), lead=True),
    # milesial/Pytorch-UNet#468, "Gradients are clipped before the unscaling" (fixed in #470):
    # `clip_grad_norm_(..., 1.0)` on gradients still multiplied by the scaler's 2**16 leaves
    # an unscaled norm of at most 2**-16, "effectively halting training"
    # (victorchall/EveryDream2trainer#175). The clipping leads, not the slow loss it leaves
    Scenario("scaler-clip-before-unscale",
             "manual optimization with the user's `GradScaler`, gradients clipped before "
             "`scaler.unscale_` (milesial/Pytorch-UNet#468)",
             "grad.clipping_eats_update", fit(lambda: ScalerClipMLP(lr=0.1)),
             fixed=fit(lambda: ScalerClipMLP(clip_first=False, lr=0.1)), lead=True),
    Scenario("deep-sigmoid", "twelve layers with sigmoids between them, SGD lr 0.1",
             "grad.vanishing", deep_sigmoid, fixed=lambda: deep_sigmoid(nn.ReLU), lead=True,
             full_fix=False),  # twelve ReLU layers do not learn in 2 epochs at SGD lr 0.1
]
