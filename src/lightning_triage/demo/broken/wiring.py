"""Broken runs of stages 2 and 3, the step-0 loss and the wiring: a loss at the wrong scale, a
gradient path cut, an optimizer that misses parameters or never steps them."""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage.demo.broken.common import HEALTHY, Loaders, fit, mlp
from lightning_triage.demo.broken.parts import PART_RUNS
from lightning_triage.demo.digits import DigitsMLP, load_digits_tensors
from lightning_triage.demo.scenario import Scenario
from lightning_triage.demo.wiring import DetachedEncoderMLP


class NoTrainMLP(DigitsMLP):
    """Returns a loss that is divided by the batch size a second time."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y) / len(y)


class AutoEncoder(DigitsMLP):
    """Reconstructs its inputs; a batch holds the inputs alone, or ``(inputs, targets)``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 64))

    def _loss(self, batch: Any) -> Tensor:
        x, target = (batch[0], batch[0]) if len(batch) == 1 else batch
        # written out: with `F.mse_loss` the step-0 check reads the loss's own target
        # (docs/objectives.md) and needs no target in the batch
        return (self(x) - target).pow(2).mean()

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._loss(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch))


def inputs_only_loaders(targets: bool = False) -> Loaders:
    """Digits loaders whose batches hold the inputs alone (``targets``: the inputs twice, as
    ``(inputs, targets)``, so that the step-0 loss has a target to be checked against)."""
    x, _, xv, _ = load_digits_tensors()
    train = (x, x.clone()) if targets else (x,)
    val = (xv, xv.clone()) if targets else (xv,)
    return (DataLoader(TensorDataset(*train), batch_size=32, shuffle=True,
                       generator=torch.Generator().manual_seed(0)),
            DataLoader(TensorDataset(*val), batch_size=256))


class ZeroBranchMLP(DigitsMLP):
    """An extra branch multiplied by ``scale``: at 0 its parameters get exactly zero gradient."""

    def __init__(self, scale: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scale = scale
        self.extra = nn.Linear(64, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x) + self.scale * self.extra(x)


class HeadOnlyOptimizerMLP(DigitsMLP):
    """``configure_optimizers`` passes only the last layer's parameters."""

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.net[2].parameters(), lr=self.lr)


class FrozenFirstLayerMLP(DigitsMLP):
    """The first layer frozen (``requires_grad_(False)``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net[0].requires_grad_(False)


class DetachedLossMLP(DigitsMLP):
    """Returns a loss rebuilt as a new leaf tensor: no graph to the parameters."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y).detach().requires_grad_()


class NoZeroGradMLP(DigitsMLP):
    """An ``optimizer_zero_grad`` override that does nothing: gradients add up step after step."""

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        pass


class LRToZeroMLP(DigitsMLP):
    """A step-wise LR schedule whose factor drops to 0 after 10 steps."""

    def configure_optimizers(self) -> Any:
        opt = super().configure_optimizers()
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 if s < 10 else 0.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class ResetEveryMLP(DigitsMLP):
    """Re-runs ``reset_parameters`` on the first layer every 8 batches."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (batch_idx + 1) % 8 == 0:
            cast(nn.Linear, self.net[0]).reset_parameters()


class FreezeLaterMLP(DigitsMLP):
    """Freezes the first layer after ``freeze_at`` batches (``None``: never); AdamW still holds it
    and ``zero_grad`` keeps its gradient as a zero tensor."""

    def __init__(self, freeze_at: int | None = 3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.freeze_at = freeze_at

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.freeze_at:
            self.net[0].requires_grad_(False)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        optimizer.zero_grad(set_to_none=False)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=0.1)


class FrozenBatchNormMLP(DigitsMLP):
    """A frozen input block with BatchNorm, left in training mode (``stem_eval``: put in eval
    mode at every training epoch, the fix)."""

    def __init__(self, stem_eval: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stem_eval = stem_eval
        self.stem = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64)).requires_grad_(False)
        # the frozen stem stands for a pretrained one: weights other than its default draw (a
        # stem frozen at its random init would be `wiring.frozen_at_init`, another bug)
        nn.init.orthogonal_(cast(nn.Linear, self.stem[0]).weight)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(self.stem(x))

    def on_train_epoch_start(self) -> None:
        if self.stem_eval:
            self.stem.eval()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.net.parameters(), lr=self.lr)


WIRING_RUNS: list[Scenario] = [
    Scenario("scaled-logits", "logits multiplied by 100", "init.loss_above_chance",
             fit(mlp(logit_scale=100.0)), fixed=HEALTHY),
    Scenario("loss-divided-twice", "loss divided by the batch size twice",
             "init.loss_below_chance", fit(lambda: NoTrainMLP(lr=0.1)), fixed=HEALTHY),
    Scenario("detached-encoder", "encoder output `.detach()`ed", "wiring.no_grad_params",
             fit(lambda: DetachedEncoderMLP(lr=0.1)),
             fixed=fit(lambda: DetachedEncoderMLP(lr=0.1, detach=False))),
    Scenario("zero-branch", "an extra branch multiplied by 0", "wiring.zero_grad_params",
             fit(lambda: ZeroBranchMLP(lr=0.1)), fixed=fit(lambda: ZeroBranchMLP(1.0, lr=0.1))),
    Scenario("head-only-optimizer", "optimizer built over the last layer only",
             "wiring.params_not_in_optimizer", fit(lambda: HeadOnlyOptimizerMLP(lr=0.1)),
             fixed=HEALTHY),
    Scenario("frozen-first-layer", "first layer frozen", "wiring.frozen_params",
             fit(lambda: FrozenFirstLayerMLP(lr=0.1)), fixed=HEALTHY),
    Scenario("autoencoder", "an autoencoder: batches hold inputs only", "init.chance_unknown",
             fit(lambda: AutoEncoder(lr=0.1), inputs_only_loaders),
             fixed=fit(lambda: AutoEncoder(lr=0.1), lambda: inputs_only_loaders(targets=True))),
    Scenario("detached-loss", "`training_step` returns `loss.detach().requires_grad_()`",
             "wiring.loss_detached", fit(lambda: DetachedLossMLP(lr=0.1)), fixed=HEALTHY),
    Scenario("no-zero-grad", "`optimizer_zero_grad` overridden with `pass`",
             "wiring.grads_not_zeroed", fit(lambda: NoZeroGradMLP(lr=0.1)), fixed=HEALTHY),
    Scenario("lr-schedule-to-zero", "an LR schedule that drops to 0 after 10 steps",
             "wiring.optimizer_not_stepping", fit(lambda: LRToZeroMLP(lr=0.1)), fixed=HEALTHY),
    Scenario("reset-every-8", "the first layer re-initialized every 8 batches",
             "wiring.params_changed_outside_step", fit(lambda: ResetEveryMLP(lr=0.1)),
             fixed=HEALTHY),
    Scenario("freeze-later", "first layer frozen mid-run, AdamW with weight decay still holding it",
             "wiring.frozen_late", fit(lambda: FreezeLaterMLP(lr=0.1)),
             fixed=fit(lambda: FreezeLaterMLP(freeze_at=None, lr=0.1))),
    Scenario("frozen-batchnorm-in-train", "a frozen BatchNorm stem left in training mode",
             "wiring.frozen_batchnorm_in_train", fit(lambda: FrozenBatchNormMLP(lr=0.1)),
             fixed=fit(lambda: FrozenBatchNormMLP(stem_eval=True, lr=0.1))),
    # issue 14's causes: the report leads with them and the probe's failure names them
    Scenario("lr-0", "the digits MLP with SGD at lr 0", "wiring.optimizer_not_stepping",
             fit(mlp(0.0)), fixed=HEALTHY, lead=True),
    *PART_RUNS,
]
