"""Overfit one small batch: slice the batch, judge the loss curve, name the likely cause.

A model, loss and optimizer that work can memorize a handful of examples: the training loss on
them falls to near zero. These pure functions take the first examples of a batch
(:func:`slice_batch`), decide whether a loss curve reached near zero (:func:`judge_curve`) and
detect a loss that cannot get there, such as cross-entropy applied to probabilities
(:func:`probability_floor`).

Example:
    >>> verdict = judge_curve([2.30, 1.2, 0.4, 0.08], target=0.115, steps_allowed=300)
    >>> verdict.verdict, verdict.steps
    ('passed', 4)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from lightning_triage.functional.collection import map_tensors


def batch_size_of(batch: Any) -> int | None:
    """The size of dim 0 of the first tensor found in ``batch`` (any nesting), or ``None``.

    Example:
        >>> batch_size_of({"x": torch.zeros(5, 3), "y": torch.zeros(5)})
        5
    """
    if isinstance(batch, Tensor):
        return int(batch.shape[0]) if batch.ndim > 0 else None
    if isinstance(batch, Mapping):
        items: Sequence[Any] = list(batch.values())
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        items = [getattr(batch, f.name) for f in dataclasses.fields(batch)]
    elif isinstance(batch, (list, tuple)):
        items = batch
    else:
        return None
    for item in items:
        found = batch_size_of(item)
        if found is not None:
            return found
    return None


def slice_batch(batch: Any, n: int, size: int | None = None) -> Any:
    """The first ``n`` examples of ``batch``: every tensor whose dim 0 is the batch size is sliced.

    Works through dicts, lists, tuples, namedtuples and dataclasses; other values (and tensors
    whose first dimension is not the batch size, such as a shared attention mask) are kept as
    they are. Sliced tensors are copies, so the probe cannot modify the real batch.

    Args:
        batch: the batch, in any structure.
        n: how many examples to keep.
        size: the batch size (default: dim 0 of the first tensor found).

    Example:
        >>> b = slice_batch((torch.arange(10).view(5, 2), torch.arange(5)), 2)
        >>> b[0].tolist(), b[1].tolist()
        ([[0, 1], [2, 3]], [0, 1])
    """
    size = batch_size_of(batch) if size is None else size
    if size is None:
        return batch
    cut = size

    def first(t: Tensor) -> Tensor:
        return t[:n].clone() if t.ndim > 0 and t.shape[0] == cut else t

    return map_tensors(first, batch)


def probability_floor(output: Tensor, class_dim: int = -1, atol: float = 1e-3) -> float | None:
    """The lowest cross-entropy reachable when ``output`` holds probabilities used as logits.

    ``F.cross_entropy`` applies its own softmax: fed probabilities (values in ``[0, 1]``
    summing to 1 over the class dimension, i.e. a softmax already applied), the best it can do
    is a one-hot probability vector as logits, a loss of ``ln(e + C - 1) - 1`` for ``C``
    classes (1.46 for 10 classes), far from zero. Returns that floor, or ``None`` when
    ``output`` does not look like probabilities.

    Example:
        >>> probs = torch.softmax(torch.randn(8, 10), dim=-1)
        >>> round(probability_floor(probs), 3)
        1.461
        >>> probability_floor(torch.randn(8, 10)) is None
        True
    """
    if not output.is_floating_point() or output.ndim < 2 or output.numel() == 0:
        return None
    num_classes = int(output.shape[class_dim])
    if num_classes < 2:
        return None
    out = output.detach().float()
    if not bool(torch.isfinite(out).all()) or out.min() < -atol or out.max() > 1 + atol:
        return None
    if not bool(((out.sum(dim=class_dim) - 1).abs() <= atol * num_classes).all()):
        return None
    return math.log(math.e + num_classes - 1) - 1


#: How an overfit run ended.
Outcome = Literal["passed", "failed", "inconclusive"]


@dataclass(frozen=True)
class OverfitVerdict:
    """The outcome of an overfit run.

    Attributes:
        verdict: ``"passed"`` (the loss reached ``target``), ``"failed"`` (it stopped above it:
            a plateau, a non-finite loss, a loss that rose or never moved) or
            ``"inconclusive"`` (still falling when the steps or the time ran out).
        reason: ``"reached"``, ``"plateau"``, ``"nonfinite"``, ``"rising"``, ``"flat"``,
            ``"floor"`` (a known floor above the target), ``"max_steps"`` or
            ``"still_falling"``.
        start: the first loss. best: the lowest loss. final: the last loss.
        steps: how many steps ran.

    Example:
        >>> v = judge_curve([2.3, 1.1, 0.4, 0.1], target=0.115, steps_allowed=300)
        >>> v.verdict, v.reason, v.best, v.steps
        ('passed', 'reached', 0.1, 4)
    """

    verdict: Outcome
    reason: str
    start: float
    best: float
    final: float
    steps: int
    target: float


def plateaued(losses: Sequence[float], target: float, window: int = 0,
              min_progress: float = 0.02, slowdown: float = 0.25) -> bool:
    """Whether the loss stopped approaching ``target``: the curve flattened above it.

    True when, over the last ``window`` steps (default a quarter of the curve, at least 10),
    the best loss improved by less than ``min_progress`` of the distance still left to
    ``target`` *and* at less than ``slowdown`` times the average rate of the steps before (a
    slow but steady decline, e.g. a small learning rate, is not a plateau).

    Example:
        >>> plateaued([2.3, 1.6, 1.5] + [1.47] * 40, target=0.1)
        True
        >>> plateaued([2.3 * 0.95 ** i for i in range(60)], target=0.1)
        False
        >>> plateaued([2.3 - 0.001 * i for i in range(60)], target=0.1)  # slow, steady
        False
    """
    window = window or max(10, len(losses) // 4)
    if len(losses) < 2 * window:
        return False
    before = min(losses[:-window])
    after = min(losses[-window:])
    left = before - target
    if left <= 0:
        return False
    recent = before - after
    earlier_rate = (float(losses[0]) - before) / (len(losses) - window)
    if recent >= min_progress * left:
        return False
    return earlier_rate <= 0 or recent / window < slowdown * earlier_rate


def judge_curve(losses: Sequence[float], target: float, steps_allowed: int,
                floor: float | None = None, min_progress: float = 0.02) -> OverfitVerdict:
    """Judge an overfit-one-batch loss curve (the loss before each step).

    Args:
        losses: the loss at each probe step.
        target: the loss counted as "near zero" (see :func:`near_zero_target`).
        steps_allowed: the step limit; a curve that ran all of it without even halving its
            start fails; one still falling when the steps or the time ran out is inconclusive.
        floor: a loss the curve cannot go below (e.g. :func:`probability_floor`); when it is
            above ``target`` and the curve stays above it, the probe fails whatever its length.
        min_progress: plateau tolerance, see :func:`plateaued`.

    Example:
        >>> judge_curve([2.3, 1.8, 1.6, 1.5], target=0.115, steps_allowed=300, floor=1.46).reason
        'floor'
    """
    if not losses:
        raise ValueError("`losses` is empty: the probe ran no step.")
    start, final = float(losses[0]), float(losses[-1])
    finite = [v for v in losses if math.isfinite(v)]
    best = min(finite) if finite else math.nan

    def verdict(v: Outcome, reason: str) -> OverfitVerdict:
        return OverfitVerdict(v, reason, start, best, final, len(losses), target)

    if finite and best <= target:
        return verdict("passed", "reached")
    if len(finite) < len(losses):
        return verdict("failed", "nonfinite")
    if floor is not None and floor > target and best >= floor * 0.98:
        return verdict("failed", "floor")
    scale = max(abs(start), 1e-12)
    if len(losses) >= 5 and max(losses) - min(losses) <= 1e-6 * scale:
        return verdict("failed", "flat")
    if len(losses) >= 10 and min(losses[len(losses) // 2:]) > start * 1.5:
        return verdict("failed", "rising")
    if plateaued(losses, target, min_progress=min_progress):
        return verdict("failed", "plateau")
    if len(losses) >= steps_allowed and best > 0.5 * start:
        return verdict("failed", "max_steps")
    return verdict("inconclusive", "still_falling")


def predictions_right(output: Tensor, targets: Tensor, class_dim: int = -1,
                      ignore_index: int = -100) -> bool | None:
    """Whether the class predicted for every example (the argmax over ``class_dim``) is its
    target; ``None`` when ``output`` and ``targets`` do not look like class scores and class
    indices (or nothing is left once ``ignore_index`` targets are dropped).

    Example:
        >>> logits = torch.tensor([[2.0, 0.1, 0.0], [0.0, 0.2, 1.0]])
        >>> predictions_right(logits, torch.tensor([0, 2])), predictions_right(logits, torch.tensor([1, 2]))
        (True, False)
    """
    if not output.is_floating_point() or targets.is_floating_point() or output.ndim < 2:
        return None
    try:
        predicted = output.detach().argmax(dim=class_dim)
    except (IndexError, RuntimeError):
        return None
    if predicted.shape != targets.shape:
        return None
    keep = targets != ignore_index
    if not bool(keep.any()) or not bool(torch.isfinite(output).all()):
        return None
    return bool((predicted[keep] == targets[keep]).all())


def judge_memorization(verdict: OverfitVerdict, all_right: bool | None) -> OverfitVerdict:
    """Memorization judged by the predictions when the loss has a floor.

    A loss that settled on a plateau above the target (``reason`` ``"plateau"`` or
    ``"floor"``) while every probed example is predicted right is a loss with a floor (label
    smoothing, a regularization term in the loss), not a failure to learn: the verdict becomes
    ``"passed"`` with reason ``"memorized_floor"``. Any other verdict is returned unchanged.

    Example:
        >>> stuck = judge_curve([2.3, 1.2, 0.9] + [0.87] * 60, target=0.115, steps_allowed=300)
        >>> stuck.verdict, judge_memorization(stuck, True).verdict, judge_memorization(stuck, False).verdict
        ('failed', 'passed', 'failed')
    """
    if verdict.verdict == "failed" and verdict.reason in ("plateau", "floor") and all_right:
        return dataclasses.replace(verdict, verdict="passed", reason="memorized_floor")
    return verdict


def near_zero_target(start: float, chance: float | None, tolerance: float = 0.05) -> float:
    """The loss counted as "near zero": ``tolerance`` times the chance level when known and
    positive, else times the starting loss.

    Example:
        >>> round(near_zero_target(2.4, math.log(10)), 4)
        0.1151
        >>> round(near_zero_target(0.8, None), 4)
        0.04
    """
    reference = chance if chance is not None and chance > 0 else start
    return tolerance * abs(reference)


__all__ = [
    "OverfitVerdict",
    "batch_size_of",
    "judge_curve",
    "judge_memorization",
    "near_zero_target",
    "plateaued",
    "predictions_right",
    "probability_floor",
    "slice_batch",
]
