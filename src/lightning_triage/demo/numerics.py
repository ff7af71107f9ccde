"""Numerics demo material: the digits MLP trained with a hand-written ``-log(softmax(z))`` loss."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor

from lightning_triage.demo.digits import DigitsMLP, digits_loaders


class LogSoftmaxMLP(DigitsMLP):
    """:class:`DigitsMLP` whose loss is ``-log(softmax(z))`` written by hand: once the logits
    spread by more than ~100, the softmax of the true class underflows to 0 and the loss is Inf
    (``F.cross_entropy`` computes the same value stably)."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        probs = torch.softmax(self(x), dim=1)
        loss = -torch.log(probs.gather(1, y[:, None])).mean()
        self.log("train_loss", loss)
        return loss


def log_softmax_scenario(lr: float = 2.0) -> tuple[pl.LightningModule, Any, Any]:
    """The model and digits loaders of the ``log-softmax-loss`` demo scenario."""
    train, val = digits_loaders()
    return LogSoftmaxMLP(lr=lr), train, val
