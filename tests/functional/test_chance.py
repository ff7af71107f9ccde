from __future__ import annotations

import math

import pytest
import torch

from lightning_triage.functional.chance import (
    binary_chance,
    chance_level,
    compare_to_chance,
    infer_task,
    multiclass_chance,
    prior_entropy,
    regression_chance,
    sequence_chance,
)


def test_chance_levels_per_task() -> None:
    assert multiclass_chance(10) == pytest.approx(2.302585, abs=1e-6)
    assert binary_chance() == pytest.approx(math.log(2))
    assert sequence_chance(32) == pytest.approx(math.log(32))
    y = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert regression_chance(y) == pytest.approx(1.25)
    with pytest.raises(ValueError, match="`num_classes` must be >= 2, got 1"):
        multiclass_chance(1)


def test_uniform_predictions_reach_the_chance_level_exactly() -> None:
    logits = torch.zeros(64, 7)
    y = torch.randint(0, 7, (64,))
    loss = torch.nn.functional.cross_entropy(logits, y)
    assert float(loss) == pytest.approx(multiclass_chance(7), rel=1e-6)
    mean_pred = torch.full((4,), 2.5)
    yr = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert float(torch.nn.functional.mse_loss(mean_pred, yr)) == pytest.approx(regression_chance(yr))


def test_prior_entropy() -> None:
    assert prior_entropy(torch.tensor([3, 3, 3])) == 0.0
    assert prior_entropy(torch.arange(4)) == pytest.approx(math.log(4))
    assert prior_entropy(torch.tensor([0, 1, -100, -100])) == pytest.approx(math.log(2))
    assert prior_entropy(torch.tensor([0.0, 1.0, 1.0, 1.0])) == pytest.approx(
        -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))


@pytest.mark.parametrize(
    ("output", "target", "expected"),
    [
        ((8, 10), torch.randint(0, 10, (8,)), ("multiclass", 10)),
        ((4, 6, 32), torch.randint(0, 32, (4, 6)), ("sequence", 32)),
        ((4, 32, 6), torch.randint(0, 32, (4, 6)), ("sequence", 32)),
        ((8, 1), torch.randint(0, 2, (8,)).float(), ("binary", None)),
        ((8,), torch.randint(0, 2, (8,)).float(), ("binary", None)),
        ((8, 5), torch.randint(0, 2, (8, 5)).float(), ("binary", None)),
        ((8, 3), torch.nn.functional.one_hot(torch.arange(8) % 3, 3).float(), ("multiclass", 3)),
        ((8, 1), torch.randn(8), ("regression", None)),
        ((8, 2), torch.randn(8, 2), ("regression", None)),
    ],
)
def test_infer_task(output: tuple[int, ...], target: torch.Tensor,
                    expected: tuple[str, int | None]) -> None:
    assert infer_task(torch.randn(output), target) == expected


def test_infer_task_gives_up_when_it_cannot_tell() -> None:
    assert infer_task(torch.randn(8, 10), None) is None
    assert infer_task(None, torch.arange(8)) is None
    assert infer_task(torch.randn(8, 16), torch.randn(8, 3)) is None  # embedding vs features


def test_compare_to_chance_classification() -> None:
    level = chance_level("multiclass", num_classes=10, targets=torch.arange(10))
    assert compare_to_chance(2.35, level).verdict == "ok"
    above = compare_to_chance(33.9, level)
    assert above.verdict == "above"
    assert above.ratio == pytest.approx(33.9 / math.log(10))
    assert compare_to_chance(2.3 / 32, level).verdict == "below"
    # a model initialized to an imbalanced prior starts at the prior entropy: not "below"
    skewed = chance_level("binary", targets=torch.tensor([0.0] * 98 + [1.0] * 2))
    assert compare_to_chance(0.1, skewed).verdict == "ok"
    assert compare_to_chance(0.01, skewed).verdict == "below"


def test_compare_to_chance_regression_tolerates_any_loss_function() -> None:
    y = torch.randn(256) * 100 + 5
    level = chance_level("regression", targets=y)
    mse_at_init = float((y**2).mean())
    l1_at_init = float(y.abs().mean())
    assert compare_to_chance(mse_at_init, level).verdict == "ok"
    assert compare_to_chance(l1_at_init, level).verdict == "ok"
    assert compare_to_chance(mse_at_init * 1000, level).verdict == "above"
    assert compare_to_chance(l1_at_init / 1000, level).verdict == "below"


def test_chance_level_errors() -> None:
    with pytest.raises(ValueError, match="`num_classes` is needed for task='multiclass'"):
        chance_level("multiclass")
    with pytest.raises(ValueError, match="`task` must be one of"):
        chance_level("segmentation")
    with pytest.raises(ValueError, match="Targets are needed"):
        chance_level("regression")
