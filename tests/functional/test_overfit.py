"""The overfit core: batch slicing, curve verdicts and the probability floor."""

from __future__ import annotations

import math
from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch

from lightning_triage.functional.overfit import (
    batch_size_of,
    judge_curve,
    judge_memorization,
    near_zero_target,
    plateaued,
    predictions_right,
    probability_floor,
    slice_batch,
)


@dataclass
class Batch:
    x: torch.Tensor
    mask: torch.Tensor
    ids: list[str]


def test_slice_batch_any_structure() -> None:
    Pair = namedtuple("Pair", "x y")
    batch = {"pair": Pair(torch.arange(20).view(10, 2), torch.arange(10)),
             "extra": [torch.ones(10, 3), torch.zeros(4, 4)], "name": "b0", "scalar": torch.tensor(1.0)}
    small = slice_batch(batch, 3)
    assert isinstance(small["pair"], Pair)
    assert small["pair"].y.tolist() == [0, 1, 2]
    assert small["extra"][0].shape == (3, 3)
    assert small["extra"][1].shape == (4, 4)
    assert small["name"] == "b0"
    assert small["scalar"].ndim == 0
    d = slice_batch(Batch(torch.zeros(6, 2), torch.ones(6, 6), ["a"] * 6), 2)
    assert d.x.shape == (2, 2)
    assert d.mask.shape == (2, 6)
    assert batch_size_of([["no"], torch.zeros(7, 1)]) == 7
    assert batch_size_of({"a": 1}) is None


def test_slice_batch_copies() -> None:
    x = torch.zeros(4, 2)
    small = slice_batch(x, 2)
    small += 1
    assert x.sum() == 0


def test_probability_floor() -> None:
    probs = torch.softmax(torch.randn(8, 5, 10), dim=1)  # (N, C, T) layout
    assert probability_floor(probs, class_dim=1) == pytest.approx(math.log(math.e + 4) - 1)
    assert probability_floor(torch.sigmoid(torch.randn(8, 10))) is None  # rows do not sum to 1
    assert probability_floor(torch.softmax(torch.randn(8, 1), -1)) is None


def test_judge_curve_reasons() -> None:
    assert judge_curve([2.3, 0.05], 0.1, 300).verdict == "passed"
    assert judge_curve([2.3, math.nan], 0.1, 300).reason == "nonfinite"
    assert judge_curve([2.3] * 10, 0.1, 300).reason == "flat"
    assert judge_curve([2.3 * 1.2 ** i for i in range(12)], 0.1, 300).reason == "rising"
    assert judge_curve([2.3, 1.9, 1.8] + [1.75] * 60, 0.1, 300).reason == "plateau"
    slow = [2.3 - 0.001 * i for i in range(300)]
    assert judge_curve(slow, 0.1, 300).reason == "max_steps"
    assert judge_curve(slow[:100], 0.1, 300).verdict == "inconclusive"
    assert judge_curve([2.3 * 0.99 ** i for i in range(300)], 0.1, 300).verdict == "inconclusive"
    with pytest.raises(ValueError, match="losses"):
        judge_curve([], 0.1, 3)


def test_plateau_needs_a_slowdown() -> None:
    assert not plateaued([2.3 - 0.0005 * i for i in range(100)], 0.1)
    assert plateaued([2.3 * 0.9 ** i + 1.0 for i in range(100)], 0.1)


def test_near_zero_target() -> None:
    assert near_zero_target(33.0, math.log(10)) == pytest.approx(0.05 * math.log(10))
    assert near_zero_target(0.5, None, tolerance=0.1) == pytest.approx(0.05)


def test_predictions_right_handles_classes_last_or_first_and_ignore_index() -> None:
    logits = torch.tensor([[3.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    assert predictions_right(logits, torch.tensor([0, 2])) is True
    assert predictions_right(logits, torch.tensor([0, 1])) is False
    assert predictions_right(logits, torch.tensor([0, -100])) is True  # ignored position
    assert predictions_right(logits, torch.tensor([-100, -100])) is None
    seq = torch.zeros(2, 3, 4)  # (N, C, L): classes on dim 1
    seq[:, 1] = 1.0
    assert predictions_right(seq, torch.ones(2, 4, dtype=torch.long), class_dim=1) is True
    assert predictions_right(logits, torch.tensor([0.0, 2.0])) is None  # regression targets
    assert predictions_right(torch.tensor([[float("nan"), 0.0]]), torch.tensor([0])) is None


def test_judge_memorization_turns_only_a_plateau_or_floor_into_a_pass() -> None:
    rising = judge_curve([2.3] * 5 + [4.0] * 20, target=0.1, steps_allowed=300)
    assert rising.reason == "rising"
    assert judge_memorization(rising, True) == rising
    nan = judge_curve([2.3, float("nan")], target=0.1, steps_allowed=300)
    assert judge_memorization(nan, True) == nan
    floor = judge_curve([2.3, 1.8, 1.6, 1.5], target=0.115, steps_allowed=300, floor=1.46)
    assert judge_memorization(floor, True).reason == "memorized_floor"
    assert judge_memorization(floor, None) == floor
