"""Broken runs of stage 5, train and eval mode: validation in training mode, randomness left on
in eval mode, eval-mode statistics that never follow training."""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from lightning_triage.demo.broken.common import fit
from lightning_triage.demo.digits import DigitsMLP
from lightning_triage.demo.scenario import Scenario


class TrainModeInValMLP(DigitsMLP):
    """A dropout MLP put back in training mode at each validation (``retrain``; ``False``: the
    fix, validation stays in eval mode)."""

    def __init__(self, retrain: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.retrain = retrain
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 10))

    def on_validation_epoch_start(self) -> None:
        if self.retrain:
            self.train()


class FunctionalDropoutMLP(DigitsMLP):
    """``F.dropout(h, 0.3)`` without ``training=self.training``: still random in eval mode
    (``follow_mode``: with it, the fix)."""

    def __init__(self, follow_mode: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.follow_mode = follow_mode

    def forward(self, x: Tensor) -> Tensor:
        h = self.net[1](self.net[0](x))
        h = F.dropout(h, 0.3, training=self.training) if self.follow_mode else F.dropout(h, 0.3)
        return self.net[2](h)


class StaleBatchNormMLP(DigitsMLP):
    """BatchNorm with ``momentum=0`` after a small-scale layer: in training it normalizes each
    batch; its running statistics, what eval mode uses, never leave their initial values (the
    fix: the default ``momentum=0.1``)."""

    def __init__(self, momentum: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        first = nn.Linear(64, 64)
        nn.init.normal_(first.weight, std=0.01)
        self.net = nn.Sequential(first, nn.BatchNorm1d(64, momentum=momentum), nn.ReLU(),
                                 nn.Linear(64, 10))


class OldSpectralNormMLP(DigitsMLP):
    """Hidden layers under ``torch.nn.utils.spectral_norm``: its power-iteration vectors stay
    random until the first training-mode forward, so the sanity check evaluates garbage (the
    fix: ``torch.nn.utils.parametrizations.spectral_norm``, which iterates when applied)."""

    def __init__(self, parametrized: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        sn = nn.utils.parametrizations.spectral_norm if parametrized else nn.utils.spectral_norm
        self.net = nn.Sequential(sn(nn.Linear(64, 64)), nn.ReLU(), sn(nn.Linear(64, 10)))


MODE_RUNS: list[Scenario] = [
    Scenario("train-mode-in-val", "`self.train()` in `on_validation_epoch_start`",
             "mode.train_mode_in_eval", fit(lambda: TrainModeInValMLP(lr=0.1)),
             fixed=fit(lambda: TrainModeInValMLP(retrain=False, lr=0.1))),
    Scenario("functional-dropout", "`F.dropout(h, 0.3)` without `training=self.training`",
             "mode.nondeterministic_eval", fit(lambda: FunctionalDropoutMLP(lr=0.1)),
             fixed=fit(lambda: FunctionalDropoutMLP(follow_mode=True, lr=0.1))),
    Scenario("stale-batchnorm", "BatchNorm with `momentum=0` (Adam, lr 3e-3)",
             "mode.eval_loss_gap", fit(lambda: StaleBatchNormMLP(lr=3e-3, optimizer="adam")),
             fixed=fit(lambda: StaleBatchNormMLP(0.1, lr=3e-3, optimizer="adam"))),
    Scenario("old-spectral-norm",
             "layers under the old `torch.nn.utils.spectral_norm`, evaluated at the sanity check",
             "mode.eval_broken_before_training", fit(lambda: OldSpectralNormMLP(lr=0.1)),
             fixed=fit(lambda: OldSpectralNormMLP(parametrized=True, lr=0.1))),
]
