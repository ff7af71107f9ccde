"""Broken runs of stage 3 (wiring) where a part of the model never trains though every gradient
flows: layers kept in a plain Python list (unregistered), and parts frozen at their random
initialization (a leftover ``requires_grad_(False)``, an adapter set-up that freezes the new
head)."""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_triage.demo.broken.common import fit
from lightning_triage.demo.digits import DigitsMLP, load_digits_tensors
from lightning_triage.demo.scenario import Scenario


class ListLayersMLP(DigitsMLP):
    """A 64-32-32-10 MLP whose hidden layers are kept in a plain ``list`` (``registered``: in an
    ``nn.ModuleList``, the fix): the optimizer never sees them."""

    def __init__(self, registered: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        layers = [nn.Linear(64, 32), nn.Linear(32, 32)]
        self.net = nn.Sequential()  # unused: the layers below replace it
        self.blocks: Any = nn.ModuleList(layers) if registered else layers
        self.head = nn.Linear(32, 10)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = F.relu(block(x))
        return self.head(x)


class DigitsCNN(DigitsMLP):
    """A small CNN over the 8x8 digits images: a convolution body and a linear head.

    Args:
        freeze_body: the body frozen (``requires_grad_(False)``).
        pretrained_body: the body loaded with weights trained on digits first (a frozen
            pretrained feature extractor, the right way to freeze).
    """

    def __init__(self, freeze_body: bool = False, pretrained_body: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = nn.Sequential()  # unused: the layers below replace it
        self.body = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(2), nn.Flatten())
        self.head = nn.Linear(64, 10)
        if pretrained_body:
            self.body.load_state_dict(_pretrained_body())
        if freeze_body:
            self.body.requires_grad_(False)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x.view(-1, 1, 8, 8)))


@cache
def _pretrained_body() -> dict[str, Tensor]:
    """The CNN's body after 3 epochs on digits (a plain loop, its own RNG: the caller's global
    RNG is left as it was)."""
    with torch.random.fork_rng():
        torch.manual_seed(1234)
        model = DigitsCNN()
        x, y, _, _ = load_digits_tensors()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            for i in torch.randperm(len(x)).split(32):
                opt.zero_grad()
                F.cross_entropy(model(x[i]), y[i]).backward()
                opt.step()
    return {k: v.detach().clone() for k, v in model.body.state_dict().items()}


class AdapterMLP(DigitsMLP):
    """A pretrained body (the CNN's, frozen), a small residual adapter and a new classification
    head, set up the way an adapter library does it: everything frozen but the adapter's
    parameters (``train_head``: the head declared trainable too, as peft's
    ``modules_to_save=["head"]`` or ``task_type="SEQ_CLS"`` does)."""

    def __init__(self, train_head: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = nn.Sequential()  # unused: the layers below replace it
        self.body = DigitsCNN(pretrained_body=True).body
        self.adapter = nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 64))
        self.head = nn.Linear(64, 10)
        for name, p in self.named_parameters():
            p.requires_grad_("adapter" in name or (train_head and name.startswith("head")))

    def forward(self, x: Tensor) -> Tensor:
        h = self.body(x.view(-1, 1, 8, 8))
        return self.head(h + self.adapter(h))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam([p for p in self.parameters() if p.requires_grad], lr=self.lr)


PART_RUNS: list[Scenario] = [
    # pytorch/pytorch#715: "parameters are not included if the module is initialized in a list"
    # (`self.hids = []` filled with `nn.Linear` layers; the answer: wrap them in `nn.ModuleList`)
    Scenario("layers-in-plain-list", "hidden layers kept in a plain Python `list`",
             "wiring.unregistered_params", fit(lambda: ListLayersMLP(lr=0.1)),
             fixed=fit(lambda: ListLayersMLP(registered=True, lr=0.1)), lead=True),
    # a feature extractor frozen by a leftover `requires_grad_(False)` though nothing was loaded
    # into it: a fixed random projection that the head learns around
    Scenario("frozen-random-body", "a CNN body frozen at its random initialization",
             "wiring.frozen_at_init", fit(lambda: DigitsCNN(freeze_body=True, lr=1e-2, optimizer="adam")),
             fixed=fit(lambda: DigitsCNN(lr=1e-2, optimizer="adam")), lead=True),
    # huggingface/peft#2367: a sequence classifier fine-tuned with LoRA whose new `score` head
    # is saved only when `modules_to_save`/`task_type` declares it; otherwise peft freezes it
    # with the base, at its random initialization
    Scenario("frozen-random-head", "adapters trained, the new classification head left frozen",
             "wiring.frozen_at_init", fit(lambda: AdapterMLP(lr=1e-2)),
             fixed=fit(lambda: AdapterMLP(train_head=True, lr=1e-2)), lead=True),
]
