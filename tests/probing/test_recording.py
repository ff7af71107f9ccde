"""Module-hook recording for the probes: the head output, the leaf a gradient pass uses."""

from __future__ import annotations

import time

import torch
from torch import nn

from lightning_triage.probing.recording import ModuleRecorder, plan_leaf


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(x))


def test_recorder_finds_head_embedding_and_first_showing() -> None:
    net = _Net()
    x = torch.randint(0, 10, (5, 7))
    rec = ModuleRecorder(5, x, None, trace=True, keep_graph=True)
    with rec.attached(net):
        out = net(x)
    assert rec.head_name == "" and rec.embedding == "emb"  # the root completes last
    assert rec.calls == 3 and [t["module"] for t in rec.trace] == ["emb", "head", "<root>"]
    assert rec.head_of(None, 5)[0] == ""
    assert rec.head_of(out, 5)[0] == "<forward_fn>"
    deadline = time.perf_counter() + 10
    assert rec.first_showing(torch.zeros(1), lambda t: t.shape[-1] == 3, deadline) == "head"
    assert rec.first_showing(out, lambda t: False, deadline) is None
    assert not any(m._forward_hooks for m in net.modules())  # hooks removed


def test_plan_leaf_for_integer_and_float_inputs() -> None:
    net = _Net()
    x = torch.randint(0, 10, (5, 7))
    rec = ModuleRecorder(5, x, None, trace=False, keep_graph=False)
    with rec.attached(net):
        net(x)
    plan = plan_leaf(net, (x,), x, rec)
    assert plan is not None and plan.replace_out is net.emb and plan.leaf is None
    assert plan.description == "the output of `emb` (it embeds the integer inputs)"
    floats = torch.randn(5, 4)
    rec_f = ModuleRecorder(5, floats, None, trace=False, keep_graph=False)
    plan_f = plan_leaf(nn.Identity(), {"x": floats}, floats, rec_f)
    assert plan_f is not None and plan_f.leaf is not None and plan_f.leaf.requires_grad
    assert plan_f.batch["x"] is plan_f.leaf
    assert plan_leaf(nn.Identity(), x, x, ModuleRecorder(5, x, None, trace=False,
                                                        keep_graph=False)) is None
