"""Parts of the model that never train though every gradient flows (issue 42): layers kept in a
plain Python container (`wiring.unregistered_params`) and frozen layers still at their random
initialization (`wiring.frozen_at_init`), on real `Trainer.fit` runs; their twins stay silent."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_triage import GradientWiringCheck
from lightning_triage.demo.broken.parts import AdapterMLP, DigitsCNN, ListLayersMLP
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from tests.helpers import make_trainer, seeds


def wiring(tmp_path: Path, model: Any, seed: int = 0, **kwargs: Any) -> dict[str, Any]:
    """The wiring findings of a short fit, by code."""
    torch.manual_seed(seed)
    check = GradientWiringCheck(strict=True, **kwargs)
    train, val = digits_loaders()
    make_trainer(tmp_path, [check], limit_train_batches=2, limit_val_batches=1).fit(
        model, train, val)
    return {f.code: f for f in check.findings}


# ------------------------------------------------------------------------- unregistered
class Containers(DigitsMLP):
    """Layers in a dict, a tuple nested in a list, and a weight as a plain tensor attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Identity()
        self.heads = {"a": nn.Linear(64, 10)}
        self.stages = [(nn.Linear(64, 64),)]
        self.scale = torch.ones(10, requires_grad=True)
        self.out = nn.Linear(10, 10)  # the one registered layer

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.heads["a"](F.relu(self.stages[0][0](x))) * self.scale)


class ListInOptimizer(ListLayersMLP):
    """The list's layers handed to the optimizer by hand: they train, but are not saved."""

    def configure_optimizers(self) -> torch.optim.Optimizer:
        extra = [p for b in self.blocks for p in b.parameters()]
        return torch.optim.SGD([*self.parameters(), *extra], lr=self.lr)


class GradientPenalty(DigitsMLP):
    """An input made to require grad for a gradient penalty: a leaf of the graph, not a
    parameter, and no bug."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        x = x.clone().requires_grad_(True)
        loss = F.cross_entropy(self(x), y)
        (g,) = torch.autograd.grad(loss, x, create_graph=True)
        return loss + 0.1 * g.square().sum()


@pytest.mark.parametrize("seed", seeds())
def test_layers_in_a_plain_list_are_named_and_their_module_list_twin_is_silent(
        tmp_path: Path, seed: int) -> None:
    found = wiring(tmp_path / "list", ListLayersMLP(), seed)
    f = found["wiring.unregistered_params"]
    assert f.severity == "error" and f.global_step == 0
    assert f.evidence["paths"] == ["blocks[0].bias", "blocks[0].weight", "blocks[1].bias",
                                   "blocks[1].weight"]
    assert f.evidence["containers"] == ["blocks"] and f.evidence["numel"] == 64 * 32 + 32 + 33 * 32
    assert not f.evidence["in_optimizer"] and "`blocks[0].weight`" in f.message
    assert "wiring.unregistered_params" not in wiring(tmp_path / "fixed",
                                                      ListLayersMLP(registered=True), seed)


def test_dicts_nested_tuples_and_plain_tensor_attributes_are_located(tmp_path: Path) -> None:
    f = wiring(tmp_path, Containers())["wiring.unregistered_params"]
    assert f.evidence["paths"] == ["heads['a'].bias", "heads['a'].weight", "scale",
                                   "stages[0][0].bias", "stages[0][0].weight"]
    assert f.evidence["containers"] == ["heads", "stages"]


def test_unregistered_layers_an_optimizer_holds_are_a_warning(tmp_path: Path) -> None:
    f = wiring(tmp_path, ListInOptimizer())["wiring.unregistered_params"]
    assert f.severity == "warning" and f.evidence["in_optimizer"]
    assert "they train" in f.message


def test_an_input_that_requires_grad_is_not_a_parameter(tmp_path: Path) -> None:
    assert wiring(tmp_path, GradientPenalty()).keys() == set()


def test_the_check_can_be_turned_off(tmp_path: Path) -> None:
    assert "wiring.unregistered_params" not in wiring(tmp_path, ListLayersMLP(),
                                                      check_unregistered=False)


# ------------------------------------------------------------------------- frozen at init
class EmaTeacher(DigitsMLP):
    """A frozen EMA copy of the model, made at the start (at the random draw, like the model)."""

    def __init__(self) -> None:
        super().__init__()
        self.ema = copy.deepcopy(self.net).requires_grad_(False)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        with torch.no_grad():
            target = F.softmax(self.ema(x), dim=1)
        return F.cross_entropy(self(x), y) + 0.1 * F.cross_entropy(self(x), target)


class FrozenEmbedding(DigitsMLP):
    """Digits pixels bucketed into tokens through a frozen embedding (``trained``: its weights
    scaled as a trained table's, std 0.05, the twin)."""

    def __init__(self, trained: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(17, 256, padding_idx=0).requires_grad_(False)
        if trained:
            with torch.no_grad():
                self.embed.weight.mul_(0.05)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64 * 256, 10))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(self.embed(x.clamp(-2, 2).add(2).mul(4).long()))


@pytest.mark.parametrize("seed", seeds())
def test_a_body_frozen_at_init_is_a_warning_and_its_twins_are_silent(tmp_path: Path,
                                                                     seed: int) -> None:
    found = wiring(tmp_path / "random", DigitsCNN(freeze_body=True), seed)
    f = found["wiring.frozen_at_init"]
    assert f.severity == "warning" and f.layer == "body.0"
    assert f.evidence["modules"] == ["body.0", "body.2"]
    assert f.evidence["types"] == ["Conv2d"]
    assert found["wiring.frozen_params"].severity == "info"
    # the same body frozen after training on digits: pretrained, info only
    loaded = wiring(tmp_path / "loaded", DigitsCNN(freeze_body=True, pretrained_body=True), seed)
    assert set(loaded) == {"wiring.frozen_params"}
    assert wiring(tmp_path / "unfrozen", DigitsCNN(), seed).keys() == set()


def test_a_head_left_frozen_by_an_adapter_set_up_is_named(tmp_path: Path) -> None:
    f = wiring(tmp_path / "head", AdapterMLP())["wiring.frozen_at_init"]
    assert f.evidence["modules"] == ["head"]  # the body is pretrained: not at its init
    assert set(wiring(tmp_path / "fixed", AdapterMLP(train_head=True))) == {
        "wiring.frozen_params"}


def test_an_ema_copy_and_a_trained_embedding_are_not_frozen_at_init(tmp_path: Path) -> None:
    assert "wiring.frozen_at_init" not in wiring(tmp_path / "ema", EmaTeacher())
    assert "wiring.frozen_at_init" not in wiring(tmp_path / "emb", FrozenEmbedding(True))
    f = wiring(tmp_path / "random", FrozenEmbedding())["wiring.frozen_at_init"]
    assert f.evidence["types"] == ["Embedding"]
    assert "wiring.frozen_at_init" not in wiring(tmp_path / "off", FrozenEmbedding(),
                                                 check_frozen_init=False)
