"""The gradient-wiring core from a plain PyTorch loop."""

from __future__ import annotations

import torch
from torch import nn

from lightning_triage.functional.wiring import analyze_wiring, group_by_module, inspect_gradients


def test_group_by_module_names_complete_modules_once() -> None:
    universe = {"enc.0.weight": 8, "enc.0.bias": 2, "enc.2.weight": 4, "enc.2.bias": 1,
                "head.weight": 6, "head.bias": 3}
    groups = group_by_module(["enc.0.weight", "enc.0.bias", "enc.2.weight", "enc.2.bias"],
                             universe)
    assert [(g.module, g.complete, g.numel) for g in groups] == [("enc", True, 15)]
    partial = group_by_module(["enc.0.weight", "head.bias"], universe)
    assert [(g.module, g.complete, g.params) for g in partial] == [
        ("enc.0", False, ("enc.0.weight",)), ("head", False, ("head.bias",))]
    everything = group_by_module(list(universe), universe)
    assert [g.module for g in everything] == [""]
    assert everything[0].describe().startswith("the whole model (all 6 tensors")


def test_group_by_module_keeps_siblings_apart() -> None:
    universe = {"layer1.weight": 1, "layer10.weight": 1}
    assert [g.module for g in group_by_module(["layer1.weight"], universe)] == ["layer1"]


def test_inspect_gradients_plain_loop() -> None:
    torch.manual_seed(0)
    net = nn.ModuleDict({"enc": nn.Linear(4, 4), "head": nn.Linear(4, 2), "aux": nn.Linear(4, 2),
                         "frozen": nn.Linear(2, 2)})
    net["frozen"].requires_grad_(False)
    opt = torch.optim.SGD(net["head"].parameters(), lr=0.1)
    x = torch.randn(5, 4)
    out = net["frozen"](net["head"](net["enc"](x)) + 0 * net["aux"](x))
    out.sum().backward()
    result = inspect_gradients(net, [opt])
    assert result.no_grad == []
    assert [g.module for g in result.zero_grad] == ["aux"]
    assert [g.module for g in result.not_in_optimizer] == ["enc", "aux"]
    assert [g.module for g in result.frozen_groups] == ["frozen"]
    assert not result.healthy


def test_nothing_received_means_loss_detached() -> None:
    r = analyze_wiring({"a.w": 3}, {"b.w": 2}, received=set(), nonzero=set())
    assert r.loss_detached
    assert r.no_grad == []
    assert [g.module for g in r.frozen_groups] == ["b"]


def test_healthy_wiring() -> None:
    r = analyze_wiring({"a.w": 3, "b.w": 1}, {}, {"a.w", "b.w"}, {"a.w", "b.w"}, {"a.w", "b.w"})
    assert r.healthy
