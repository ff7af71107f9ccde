"""The functional core of the structure probes, on plain PyTorch modules."""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_triage.functional.structure import (
    LossWatch,
    aligned_start,
    batch_mixing,
    broadcast_mismatch,
    causal_leak,
    example_dependence,
    is_next_token,
    output_change,
    pairwise_output,
    parse_size_warning,
    redraw_targets,
    replace_tensor,
)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_batch_mixing_zero_for_independent_models() -> None:
    cnn = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
    cnn(torch.randn(4, 1, 6, 6))  # materialize, accumulate BN statistics
    result = batch_mixing(cnn.eval(), torch.randn(5, 1, 6, 6))
    assert result.conclusive
    assert result.other_grad_norm == 0.0
    assert not result.mixing


def test_batch_mixing_detects_batch_statistics_and_softmax_over_dim0() -> None:
    lin = nn.Linear(4, 3)
    for fn in (lambda x: torch.log_softmax(lin(x), dim=0), lambda x: lin(x) - lin(x).mean(0),
               lambda x: lin(x.T.reshape(x.shape).contiguous())):
        result = batch_mixing(fn, torch.randn(6, 4))
        assert result.mixing
        assert result.worst_example is not None
        assert result.worst_example != 0


def test_example_dependence_inconclusive_without_gradient() -> None:
    leaf = torch.randn(3, 2, requires_grad=True)
    out = torch.zeros(3, 2) + 0 * leaf.detach()
    out.requires_grad_(True)
    result = example_dependence(out, leaf)
    assert not result.conclusive
    assert not result.mixing


def _attention(mask: Tensor) -> nn.Module:
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)

    class Net(nn.Module):
        def forward(self, h: Tensor) -> Tensor:
            return layer(h, src_mask=mask)

    return Net().eval()


def test_causal_leak_on_attention_masks() -> None:
    t = 6
    full = torch.full((t, t), float("-inf"))
    x = torch.randn(2, t, 8)
    causal = causal_leak(_attention(torch.triu(full, 1)), x)
    assert [r.leak for r in causal] == [False, False, False]
    assert all(r.conclusive for r in causal)
    backwards = causal_leak(_attention(torch.tril(full, -1)), x)
    assert backwards[0].leak
    assert backwards[0].future_positions == [1, 2, 3, 4, 5]
    shifted = causal_leak(_attention(torch.triu(full, 2)), x)  # sees one position ahead
    assert [r.future_positions for r in shifted] == [[1], [4], [5]]


def test_next_token_detection() -> None:
    seq = torch.randint(0, 10, (4, 9))
    x, y = seq[:, :-1], seq[:, 1:].clone()
    assert is_next_token(x, y)
    y[:, -3:] = -100  # padding ignored
    assert is_next_token(x, y)
    assert not is_next_token(x, x)  # targets equal to the inputs: not shifted
    assert not is_next_token(x, seq[:, :-1].flip(1))
    assert not is_next_token(x.float(), y.float())
    assert not is_next_token(x[:, 0], y[:, 0])
    assert not is_next_token(x, None)


def test_redraw_targets_keeps_values_and_prefix() -> None:
    y = torch.randint(0, 5, (4, 8))
    new = redraw_targets(y, start=2)
    assert new is not None
    assert torch.equal(new[:, :2], y[:, :2])
    assert sorted(new[:, 2:].flatten().tolist()) == sorted(y[:, 2:].flatten().tolist())
    assert bool((new != y).any())
    assert redraw_targets(torch.zeros(5)) is None
    floats = torch.randn(7)
    assert sorted(redraw_targets(floats).tolist()) == sorted(floats.tolist())  # type: ignore[union-attr]


def test_aligned_start_and_output_change() -> None:
    assert aligned_start((4, 8, 16), (4, 8)) == 0
    assert aligned_start((4, 7, 16), (4, 8)) == 1
    assert aligned_start((4, 16), (4,)) is None
    assert aligned_start((4, 9, 3), (4, 8)) is None
    a = torch.randn(2, 5, 3)
    b = a.clone()
    b[:, 3] += 1.0
    assert not output_change(a, b, positions=slice(0, 1)).changed
    change = output_change(a, b)
    assert change.changed
    assert change.max_abs_diff == pytest.approx(1.0)
    assert change.fraction_changed == pytest.approx(0.2)
    assert output_change(a, a[:, :4]).changed


def test_broadcast_helpers() -> None:
    assert broadcast_mismatch((8, 1), (8,)) == [8, 8]
    assert broadcast_mismatch((8, 3), (8, 3)) is None
    assert broadcast_mismatch((8, 3), (4,)) is None  # not broadcastable: torch raises itself
    assert parse_size_warning("no") is None


def test_loss_watch_records_mismatch_and_loss_inputs() -> None:
    y = torch.randint(0, 3, (8,))
    logits = torch.randn(8, 3, requires_grad=True)
    with LossWatch(y) as watch:
        F.cross_entropy(logits, y)  # (N, C) with (N,): not elementwise, no mismatch
        _ = (logits.argmax(1) == y).float().mean()
        _ = y.view(-1, 1) == y.view(1, -1)  # both from the targets: intended broadcasting
    assert watch.events == []
    assert [name for name, _ in watch.loss_inputs] == ["cross_entropy"]
    assert watch.loss_inputs[0][1] is logits

    yf = torch.randn(8)
    with LossWatch(yf) as watch:
        with pytest.warns(UserWarning, match="target size"):
            F.l1_loss(torch.randn(8, 1), yf)
        _ = torch.randn(8, 1) * yf.double()
    assert [(e.op, e.result_shape) for e in watch.events] == [("l1_loss", [8, 8]), ("mul", [8, 8])]


class Pair(NamedTuple):
    x: Tensor
    y: Tensor


@dataclasses.dataclass
class Batch:
    x: Tensor
    y: Tensor
    ids: list[str]


def test_replace_tensor_in_any_structure() -> None:
    x, y, new = torch.zeros(2), torch.ones(2), torch.full((2,), 3.0)
    pair = replace_tensor(Pair(x, y), y, new)
    assert isinstance(pair, Pair)
    assert pair.y is new
    batch = replace_tensor(Batch(x, y, ["a", "b"]), y, new)
    assert isinstance(batch, Batch)
    assert batch.y is new
    assert batch.ids == ["a", "b"]
    nested = replace_tensor([x, (y, {"k": y})], y, new)
    assert nested[1][0] is new
    assert nested[1][1]["k"] is new
    assert math.isclose(float(replace_tensor(y, y, new).sum()), 6.0)


def test_pairwise_output_and_target_uses() -> None:
    x = torch.randn(6, 4, requires_grad=True)
    sim = x @ x.T
    assert pairwise_output(sim, x, retain_graph=True)
    assert not pairwise_output(torch.log_softmax(sim, dim=0), x)
    assert not pairwise_output(torch.randn(6, 5, requires_grad=True), x)  # not (N, N)

    y = torch.randint(0, 3, (6,))
    other = torch.randn(6, 4)
    with LossWatch(y) as watch:
        _ = (other - other.mean(0)) * 2  # no targets involved
        _ = other[:, 0] - y  # targets against a tensor without grad: not a loss
    assert watch.target_uses == 0
    with LossWatch(y) as watch:
        F.cross_entropy(torch.randn(6, 3, requires_grad=True), y.view(-1))
        _ = x[:, 0] - y.float()
    assert watch.target_uses == 2


def test_aligned_start_shapes() -> None:
    assert aligned_start((4, 6, 3), (4, 6, 3)) == 0  # feature sequences
    assert aligned_start((4, 6, 2), (4, 6, 3)) is None
    assert aligned_start((4, 3, 8, 8), (4, 8, 8)) is None  # segmentation
    assert aligned_start((4, 8, 16), (4, 1)) is None  # a single target position
