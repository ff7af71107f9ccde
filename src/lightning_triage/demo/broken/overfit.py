"""Broken runs of stage 4, overfitting one batch, whose curve-level lead is wrong: the loss falls
slowly, the curve reads "the learning rate is too low", but a larger learning rate, tried on a
copy, does not cure it (``not confirmed``), and the overfit probe has seen the real cause, so the
report starts there (``tests/scenarios/test_remedy_not_confirmed.py``).

Each bug is a reported one, reproduced on the digits MLP:

- ``label-smoothing-0.9``: ``label_smoothing=0.9`` where ``0.1`` was meant (the target gets 0.19
  of the mass, each other class 0.09): the smallest loss reachable is 2.266, 1.6% below chance;
  "the loss increases gradually, no matter how much learning rate I set"
  (WongKinYiu/CrossStagePartialNetworks#39).
- ``logit-penalty``: an L2 penalty on the logits (logit squeezing) with coefficient 10 where
  ``1e-3`` was meant, on a zero-initialized head: the penalty holds every logit near zero, so the
  loss floor is near chance.
- ``random-teacher``: a distillation loss whose teacher checkpoint was never loaded (the teacher
  stays at its random init, frozen), at temperature 4: the soft targets are near uniform and
  unrelated to the classes, so the student cannot learn the task at any learning rate. The
  teacher's weights are still its constructor's draw: ``wiring.frozen_at_init`` leads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from typing_extensions import override

from lightning_triage.demo.broken.common import Loaders, digits, fit
from lightning_triage.demo.digits import DigitsMLP, load_digits_tensors
from lightning_triage.demo.scenario import Scenario


class LossMLP(DigitsMLP):
    """The digits MLP (SGD, lr 0.1) whose training and validation steps log :meth:`loss`."""

    def __init__(self) -> None:
        super().__init__(lr=0.1)

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        """The loss of a batch (cross-entropy here)."""
        return F.cross_entropy(self(x), y)

    @override
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = self.loss(*batch)
        self.log("train_loss", loss)
        return loss

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.loss(*batch))


class SmoothedMLP(LossMLP):
    """Cross-entropy with ``label_smoothing``."""

    def __init__(self, smoothing: float) -> None:
        super().__init__()
        self.smoothing = smoothing

    @override
    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(self(x), y, label_smoothing=self.smoothing)


class LogitPenaltyMLP(LossMLP):
    """Cross-entropy plus ``coefficient`` times the mean squared logit, on a zero-initialized
    head (a common init for classifier heads)."""

    def __init__(self, coefficient: float) -> None:
        super().__init__()
        self.coefficient = coefficient
        head = self.net[2]
        assert isinstance(head, nn.Linear)
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)

    @override
    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        logits = self(x)
        return F.cross_entropy(logits, y) + self.coefficient * logits.pow(2).mean()


def trained_teacher() -> nn.Linear:
    """A linear classifier of digits fit on the training split (the checkpoint a distillation
    run should load): full-batch Adam, 200 steps, its own generator (no global RNG drawn)."""
    x, y, _, _ = load_digits_tensors()
    teacher = nn.Linear(64, 10)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        teacher.weight.copy_(torch.randn(10, 64, generator=gen) * 0.01)
        teacher.bias.zero_()
    opt = torch.optim.Adam(teacher.parameters(), lr=0.05)
    for _ in range(200):
        opt.zero_grad()
        F.cross_entropy(teacher(x), y).backward()
        opt.step()
    return teacher.requires_grad_(False)


class DistilledMLP(LossMLP):
    """The student of a distillation at ``temperature``: soft cross-entropy against the
    teacher's softened predictions (the hard labels unused, as in pure distillation)."""

    def __init__(self, teacher: nn.Linear, temperature: float = 4.0) -> None:
        super().__init__()
        self.teacher = teacher.requires_grad_(False)
        self.temperature = temperature

    @override
    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        with torch.no_grad():
            soft = F.softmax(self.teacher(x) / self.temperature, dim=1)
        return -(soft * F.log_softmax(self(x), dim=1)).sum(1).mean()


class SigmoidBCE(DigitsMLP):
    """Binary or multilabel digits (targets from :func:`digit_flags`) with
    ``BCEWithLogitsLoss``; ``sigmoid``: the bug, an ``nn.Sigmoid`` left at the end of the model
    (the loss applies its own)."""

    def __init__(self, sigmoid: bool = True, labels: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.labels = labels
        self.net[2] = nn.Linear(32, labels)
        if sigmoid:
            self.net.append(nn.Sigmoid())

    def forward(self, x: Tensor) -> Tensor:
        out = self.net(x)
        return out.squeeze(-1) if self.labels == 1 else out

    def _loss(self, batch: Any) -> Tensor:
        x, y = batch
        return F.binary_cross_entropy_with_logits(self(x), y)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._loss(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch))


def digit_flags(labels: int = 1) -> Callable[[Tensor], Tensor]:
    """Digit classes to float flags: 5 or more (``labels=1``), with even and a multiple of 3
    (``labels=3``, multilabel)."""
    def flags(y: Tensor) -> Tensor:
        out = torch.stack([y >= 5, y % 2 == 0, y % 3 == 0], dim=1)[:, :labels].float()
        return out.squeeze(1) if labels == 1 else out
    return flags


def flag_loaders(labels: int = 1) -> Loaders:
    """Digits loaders whose targets are :func:`digit_flags`."""
    return digits(y=digit_flags(labels), yv=digit_flags(labels))


OVERFIT_RUNS: list[Scenario] = [
    Scenario("label-smoothing-0.9", "cross-entropy with `label_smoothing=0.9` (0.1 was meant)",
             "overfit.loss_floor", fit(lambda: SmoothedMLP(0.9)),
             fixed=fit(lambda: SmoothedMLP(0.1))),
    Scenario("logit-penalty", "an L2 penalty on the logits with coefficient 10 (1e-3 was meant)",
             "overfit.loss_floor", fit(lambda: LogitPenaltyMLP(10.0)),
             fixed=fit(lambda: LogitPenaltyMLP(1e-3))),
    # the teacher is frozen at its random initialization: `wiring.frozen_at_init` names it and
    # leads (issue 42); the probe's failure and the slow curve are its symptoms
    Scenario("random-teacher", "distillation from a teacher whose checkpoint was never loaded",
             "wiring.frozen_at_init", fit(lambda: DistilledMLP(nn.Linear(64, 10))),
             fixed=fit(lambda: DistilledMLP(trained_teacher())), lead=True),
    # avBuffer/UNet3plus_pth#23 ("bceloss not decrease": the model returns `F.sigmoid(d1)` to a
    # BCE-with-logits loss; the sigmoid applied twice): the loss cannot fall below ~0.5
    Scenario("sigmoid-before-bce-with-logits",
             "an `nn.Sigmoid` at the end of the model, trained with `BCEWithLogitsLoss`",
             "overfit.loss_on_probabilities", fit(lambda: SigmoidBCE(lr=0.1), flag_loaders),
             fixed=fit(lambda: SigmoidBCE(sigmoid=False, lr=0.1), flag_loaders), lead=True),
]

#: The runs whose learning-rate lead a larger learning rate does not cure: the report challenges
#: it and starts at ``expect``, the cause the overfit probe saw.
REFUTED_LEAD_RUNS = tuple(s.name for s in OVERFIT_RUNS if not s.lead)
