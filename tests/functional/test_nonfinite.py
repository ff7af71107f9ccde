"""Non-finite localization over plain PyTorch modules (no Lightning)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from lightning_triage.functional.nonfinite import (
    all_finite,
    dtype_max,
    float_tensors,
    gradients_nonfinite,
    localize_nonfinite,
    max_abs,
    nonfinite_examples,
    overflow_ratio,
    tensor_stats,
)

NAN, INF = float("nan"), float("inf")


def test_max_abs_is_one_reduction_that_propagates_nan_and_inf() -> None:
    ts = [torch.tensor([1.0, -7.0]), torch.tensor([[2.0]]).half()]
    assert float(max_abs(ts)) == 7.0
    assert math.isnan(float(max_abs([*ts, torch.tensor([NAN])])))
    assert math.isinf(float(max_abs([*ts, torch.tensor([-INF])])))
    assert max_abs([]) is None
    assert bool(all_finite(ts))
    assert not bool(all_finite([*ts, torch.tensor([NAN, 1.0])]))


def test_tensor_stats_counts_and_finite_peak() -> None:
    stats = tensor_stats(torch.tensor([3.0, NAN, NAN, -INF, -9.0]))
    assert (stats.max_abs, stats.nan, stats.inf, stats.numel) == (9.0, 2, 1, 5)
    assert not stats.finite
    assert tensor_stats(torch.tensor([1, -4])).max_abs == 4.0
    assert tensor_stats(torch.full((3,), NAN)).max_abs == 0.0


def test_nonfinite_examples_indices_and_limit() -> None:
    x = torch.zeros(50, 2, 3)
    x[[4, 9, 30], 1, 2] = INF
    assert nonfinite_examples(x) == ([4, 9, 30], 3)
    x[:] = NAN
    indices, count = nonfinite_examples(x, limit=5)
    assert indices == [0, 1, 2, 3, 4]
    assert count == 50
    assert nonfinite_examples(torch.ones(3, dtype=torch.long)) == ([], 0)


def test_dtype_range() -> None:
    assert dtype_max(torch.float16) == 65504.0
    assert dtype_max(torch.bfloat16) > 3e38
    assert overflow_ratio(-32752.0, torch.float16) == pytest.approx(0.5)


def test_float_tensors_in_nested_outputs() -> None:
    out = (torch.zeros(1), {"a": [torch.ones(2), torch.arange(3)]}, "text")
    assert [t.numel() for t in float_tensors(out)] == [1, 2]


class Div(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x / x.sum(dim=1, keepdim=True)


def test_forward_names_the_innermost_first_module() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Sequential(nn.Linear(3, 3), nn.ReLU(), Div()), nn.Linear(3, 2))
    with torch.no_grad():
        net[0][0].weight.fill_(-1.0)
        net[0][0].bias.zero_()
    x = torch.rand(4, 3)  # relu(-sum) = 0 everywhere: 0 / 0 in `0.2`
    where = localize_nonfinite(net, lambda: net(x).sum())
    assert where.kind == "forward"
    assert where.layer == "0.2"
    assert where.first is not None
    assert where.first.inputs_finite
    assert where.first.stats.nan == 12
    assert [f.name for f in where.leading] == ["0.0", "0.1"]
    assert not net._forward_hooks
    assert all(not m._forward_hooks for m in net.modules())


def test_loss_kind_when_every_module_is_finite() -> None:
    net = nn.Linear(3, 4)
    x = torch.full((2, 3), 500.0)

    def step() -> Tensor:
        probs = torch.softmax(net(x) * 100, dim=1)
        return -torch.log(probs).mean()

    where = localize_nonfinite(net, step)
    assert where.kind == "loss"
    assert where.layer is None
    assert where.loss == INF
    assert [f.name for f in where.leading] == [""]


class Root(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        h = self.lin(x)
        return torch.sqrt((h * h).sum(dim=1))


def test_backward_names_the_op_and_its_module_and_writes_no_grad() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(Root(), nn.Tanh())
    x = torch.randn(4, 3)
    x[1] = 0.0
    where = localize_nonfinite(net, lambda: net(x).sum())
    assert where.kind == "backward"
    assert where.layer == "0"
    assert where.backward is not None
    assert where.backward.op == "SqrtBackward0"
    assert where.backward.stats.inf == 1
    assert all(p.grad is None for p in net.parameters())


def test_backward_in_the_loss_has_no_layer() -> None:
    net = nn.Linear(2, 2, bias=False)
    x = torch.zeros(3, 2)

    where = localize_nonfinite(net, lambda: torch.sqrt((net(x) ** 2).sum()))
    assert where.kind == "backward"
    assert where.layer is None
    assert where.backward is not None
    assert where.backward.op == "SqrtBackward0"


def test_finite_step_and_shared_module_called_twice() -> None:
    lin = nn.Linear(3, 3)
    net = nn.Sequential(lin, nn.ReLU(), lin)
    where = localize_nonfinite(net, lambda: net(torch.randn(2, 3)).sum(), keep=2)
    assert where.finite
    # named_modules() lists a shared module once, under its first name: both calls are "0"
    assert [f.name for f in where.leading] == ["0", ""]
    assert set(where.max_abs_by_layer) == {"", "0", "1"}


def test_float16_overflow_is_inf_in_the_first_module_past_range() -> None:
    net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)).half()
    with torch.no_grad():
        net[1].weight.fill_(400.0)
    x = torch.full((1, 2), 100.0, dtype=torch.float16)
    with torch.no_grad():
        net[0].weight.copy_(torch.eye(2))
        net[0].bias.zero_()
    where = localize_nonfinite(net, lambda: net(x).float().sum(), backward=False)
    assert where.kind == "forward"
    assert where.layer == "1"
    assert where.dtype_by_layer["1"] == "float16"
    ref = localize_nonfinite(net.float(), lambda: net(x.float()).sum(), backward=False)
    assert ref.finite
    assert ref.max_abs_by_layer["1"] == pytest.approx(80000.0 + abs(float(net[1].bias[0].detach())), rel=0.01)


def test_gradients_nonfinite_is_bit_identical_and_accumulates_in_its_buffer() -> None:
    grads = [torch.tensor([1e-40, -0.0, 3.0]), torch.tensor([65504.0, -1e-7]).half(),
             torch.tensor([0.1], dtype=torch.bfloat16)]
    before = [g.clone() for g in grads]
    buffers: dict[torch.device, tuple[Tensor, Tensor]] = {}
    flag = gradients_nonfinite(grads, buffers)
    assert flag is not None
    assert float(flag) == 0.0
    assert all(torch.equal(a, b) and torch.equal(a.signbit(), b.signbit())
               for a, b in zip(grads, before, strict=True))
    bad = [torch.tensor([-math.inf])]
    assert float(gradients_nonfinite(bad, buffers)) > 0
    # the cached flag stays raised (a device-side accumulator) until the caller clears it
    assert float(gradients_nonfinite(grads, buffers)) > 0
    assert gradients_nonfinite([]) is None
