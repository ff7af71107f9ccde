"""Demo models with wiring bugs (stage 3): the digits MLP with a broken gradient path."""

from __future__ import annotations

from torch import Tensor, nn

from lightning_triage.demo.digits import DigitsMLP


class DetachedEncoderMLP(DigitsMLP):
    """The digits MLP split into ``encoder`` and ``head``, with the encoder's output detached.

    ``h = self.encoder(x).detach()`` is a classic leftover of feature extraction or of a
    debugging session: only the head trains, on random features, and the loss still falls, so
    nothing looks wrong in the curve.

    Args:
        lr: learning rate (SGD).
        hidden: encoder width.
        detach: detach the encoder's output (the bug); ``False`` is its fixed twin.
    """

    def __init__(self, lr: float = 0.1, hidden: int = 32, detach: bool = True) -> None:
        super().__init__(lr=lr, hidden=hidden)
        del self.net
        self.detach = detach
        self.encoder = nn.Sequential(nn.Linear(64, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, 10)

    def forward(self, x: Tensor) -> Tensor:
        h = self.encoder(x)
        return self.head(h.detach() if self.detach else h)
