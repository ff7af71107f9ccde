"""Chance levels: the loss a model that knows nothing gets, per task.

A freshly initialized model predicts (close to) uniform probabilities, so its cross-entropy is
``ln C`` for ``C`` classes; a model that learned only the class frequencies (the best constant
predictor) gets the prior entropy; a regression model that predicts the mean gets the targets'
variance under MSE.

Example:
    >>> round(multiclass_chance(10), 3)
    2.303
    >>> import torch
    >>> level = chance_level("multiclass", num_classes=10)
    >>> level.describe()
    'ln(10) = 2.303 for 10 classes'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

Task = Literal["auto", "multiclass", "binary", "regression", "sequence"]
TASKS: tuple[str, ...] = ("auto", "multiclass", "binary", "regression", "sequence")
IGNORE_INDEX = -100


def multiclass_chance(num_classes: int) -> float:
    """Cross-entropy of uniform predictions over ``num_classes`` classes: ``ln C``.

    Example:
        >>> round(multiclass_chance(10), 3)
        2.303
    """
    if num_classes < 2:
        raise ValueError(f"`num_classes` must be >= 2, got {num_classes}.")
    return math.log(num_classes)


def binary_chance() -> float:
    """Binary cross-entropy of a predicted probability of 0.5: ``ln 2``.

    Example:
        >>> round(binary_chance(), 3)
        0.693
    """
    return math.log(2.0)


def regression_chance(targets: Tensor) -> float:
    """MSE of predicting the mean of ``targets``: their (population) variance.

    Example:
        >>> regression_chance(torch.tensor([1.0, 3.0]))
        1.0
    """
    t = targets.detach().double().flatten()
    t = t[torch.isfinite(t)]
    return float(t.var(unbiased=False)) if t.numel() > 1 else 0.0


def sequence_chance(vocab_size: int) -> float:
    """Token-level cross-entropy of uniform predictions over ``vocab_size`` tokens: ``ln V``.

    Example:
        >>> round(sequence_chance(50257), 2)
        10.82
    """
    return multiclass_chance(vocab_size)


def prior_entropy(targets: Tensor, num_classes: int | None = None,
                  ignore_index: int = IGNORE_INDEX) -> float:
    """Entropy of the class frequencies in ``targets``: the loss of the best constant predictor.

    Integer targets are class indices (``ignore_index`` entries are left out); float targets in
    ``{0, 1}`` are binary labels.

    Example:
        >>> round(prior_entropy(torch.tensor([0, 0, 1, 1])), 3)
        0.693
    """
    t = targets.detach().flatten()
    if t.is_floating_point():
        t = t[torch.isfinite(t)]
        if t.numel() == 0:
            return 0.0
        p = float(t.double().mean().clamp(0, 1))
        return -sum(q * math.log(q) for q in (p, 1 - p) if q > 0)
    t = t[t != ignore_index]
    t = t[t >= 0]
    if t.numel() == 0:
        return 0.0
    del num_classes  # absent classes add nothing: no per-class allocation (any class count)
    counts = torch.unique(t.long(), return_counts=True)[1].double()
    probs = counts / counts.sum()
    return float(-(probs * probs.log()).sum())


def _is_binary_values(t: Tensor) -> bool:
    return bool(((t == 0) | (t == 1)).all())


def infer_task(output: Tensor | None, targets: Tensor | None,
               ignore_index: int = IGNORE_INDEX) -> tuple[str, int | None] | None:
    """Guess ``(task, num_classes)`` from the model's output and the targets, or ``None``.

    - integer targets ``(N,)`` and output ``(N, C)``: multiclass with ``C`` classes;
    - integer targets ``(N, T, ...)`` and output ``(N, T, ..., V)`` or ``(N, V, T, ...)``:
      sequence (token-level) with ``V`` classes;
    - float targets in ``{0, 1}`` with output of the same number of elements: binary (also
      multi-label); one-hot float targets ``(N, C)``: multiclass;
    - other float targets with output of the same number of elements: regression.

    Example:
        >>> infer_task(torch.randn(8, 10), torch.randint(0, 10, (8,)))
        ('multiclass', 10)
        >>> infer_task(torch.randn(8, 1), torch.randint(0, 2, (8,)).float())
        ('binary', None)
    """
    if output is None or targets is None or output.ndim == 0:
        return None
    out_shape, tgt_shape = tuple(output.shape), tuple(targets.shape)
    if not targets.is_floating_point() and not targets.is_complex() and targets.dtype != torch.bool:
        # class indices: the output has one extra (class) dimension
        if output.ndim == targets.ndim + 1:
            if out_shape[:-1] == tgt_shape:
                task = "multiclass" if targets.ndim == 1 else "sequence"
                return task, int(out_shape[-1])
            if targets.ndim >= 2 and out_shape[:1] + out_shape[2:] == tgt_shape:
                return "sequence", int(out_shape[1])
        if output.ndim == targets.ndim + 2 and out_shape[:-1] == (1, *tgt_shape):
            return "sequence", int(out_shape[-1])
        if output.numel() == targets.numel():
            valid = targets[targets != ignore_index]
            if valid.numel() and _is_binary_values(valid):
                return "binary", None
        return None
    t = targets.detach()
    if output.numel() != t.numel():
        return None
    if t.numel() and _is_binary_values(t):
        if t.ndim == 2 and t.shape[1] > 1 and bool((t.sum(dim=1) == 1).all()):
            return "multiclass", int(t.shape[1])
        return "binary", None
    return "regression", None


@dataclass(frozen=True)
class ChanceLevel:
    """The chance-level loss of a task, with the best-constant (prior) baseline when known.

    ``formula``, when set, is how :meth:`describe` names it (a level derived from the loss
    function the step calls, see :mod:`~lightning_triage.functional.objective`).

    For regression, ``value`` is the variance of the targets (MSE of the mean), ``prior`` the
    mean absolute deviation from the median (L1 of the best constant) and ``zero_baseline`` the
    mean square of the targets (MSE of predicting zero, what a fresh model does).

    Example:
        >>> level = chance_level("multiclass", num_classes=10)
        >>> level.task, round(level.value, 3), level.num_classes
        ('multiclass', 2.303, 10)
        >>> level.describe()
        'ln(10) = 2.303 for 10 classes'
    """

    task: str
    value: float
    num_classes: int | None = None
    prior: float | None = None
    zero_baseline: float | None = None
    #: the formula as the objective names it (a level derived from the loss the step calls)
    formula: str | None = None

    def describe(self) -> str:
        """Human-readable formula, e.g. ``ln(10) = 2.303 for 10 classes``."""
        if self.formula:
            return self.formula
        if self.task in ("multiclass", "sequence") and self.num_classes is not None:
            unit = "classes" if self.task == "multiclass" else "tokens in the vocabulary"
            return f"ln({self.num_classes}) = {self.value:.3f} for {self.num_classes} {unit}"
        if self.task == "binary":
            return f"ln(2) = {self.value:.3f} for binary targets"
        return f"Var(targets) = {self.value:.4g} (the MSE of predicting the mean)"


def chance_level(task: str, *, num_classes: int | None = None, targets: Tensor | None = None,
                 ignore_index: int = IGNORE_INDEX) -> ChanceLevel:
    """The chance level of ``task``, with the prior baseline computed from ``targets`` if given.

    Raises:
        ValueError: for an unknown task, a classification task without ``num_classes >= 2``, or
            a regression task without targets.

    Example:
        >>> round(chance_level("binary").value, 3)
        0.693
        >>> level = chance_level("regression", targets=torch.tensor([0.0, 2.0, 4.0]))
        >>> round(level.value, 3), round(level.zero_baseline, 3)
        (2.667, 6.667)
    """
    if task in ("multiclass", "sequence"):
        if num_classes is None:
            raise ValueError(f"`num_classes` is needed for task={task!r}.")
        prior = None if targets is None else prior_entropy(targets, num_classes, ignore_index)
        return ChanceLevel(task, multiclass_chance(num_classes), num_classes, prior)
    if task == "binary":
        prior = None if targets is None else prior_entropy(targets.float())
        return ChanceLevel(task, binary_chance(), 2, prior)
    if task == "regression":
        if targets is None:
            raise ValueError("Targets are needed for the chance level of task='regression'.")
        t = targets.detach().double()
        t = t[torch.isfinite(t)]
        zero = float((t**2).mean()) if t.numel() else 0.0
        mae = float((t - t.median()).abs().mean()) if t.numel() else 0.0
        return ChanceLevel(task, regression_chance(t), None, mae, zero)
    raise ValueError(f"`task` must be one of {TASKS[1:]}, got {task!r}.")


def resolve_chance(task: str, num_classes: int | None, output: Tensor | None,
                   targets: Tensor | None, ignore_index: int = IGNORE_INDEX) -> ChanceLevel | None:
    """The chance level of ``task`` (inferred from ``output`` and ``targets`` when ``"auto"``),
    or ``None`` when it cannot be known.

    Example:
        >>> resolve_chance("auto", None, torch.randn(8, 10), torch.randint(0, 10, (8,))).task
        'multiclass'
        >>> resolve_chance("auto", None, torch.randn(8, 16), None) is None
        True
    """
    if task == "auto":
        inferred = infer_task(output, targets, ignore_index)
        if inferred is None:
            return None
        task, guessed = inferred
        num_classes = num_classes or guessed
    if task == "regression" and targets is None:
        return None
    return chance_level(task, num_classes=num_classes, targets=targets, ignore_index=ignore_index)


Verdict = Literal["above", "below", "ok"]


@dataclass(frozen=True)
class ChanceComparison:
    """How a step-0 loss compares with the chance level."""

    verdict: Verdict
    ratio: float
    reference: float


def compare_to_chance(loss: float, level: ChanceLevel, *, above_ratio: float = 2.0,
                      below_ratio: float = 0.5, min_gap: float = 0.5) -> ChanceComparison:
    """Compare a step-0 ``loss`` with ``level``.

    Classification: above when ``loss > above_ratio * chance`` and ``loss - chance > min_gap``
    nats; below when ``loss < below_ratio * min(chance, prior entropy)`` (a model initialized to
    the class prior legitimately starts at the prior entropy). Regression, where the loss
    function is not known (MSE, L1, Huber), uses wider bounds against the loosest baselines:
    above ``5 * above_ratio`` times the largest, below ``below_ratio / 5`` times the smallest.

    Example:
        >>> level = chance_level("multiclass", num_classes=10)
        >>> compare_to_chance(33.9, level).verdict, compare_to_chance(2.4, level).verdict
        ('above', 'ok')
    """
    if level.task == "regression":
        baselines = [b for b in (level.value, level.zero_baseline, level.prior) if b is not None]
        high, low = max(baselines), min(baselines)
        ratio = loss / high if high > 0 else math.inf
        if high > 0 and loss > 5 * above_ratio * high:
            return ChanceComparison("above", ratio, high)
        if low > 0 and loss < below_ratio / 5 * low:
            return ChanceComparison("below", loss / low, low)
        return ChanceComparison("ok", ratio, high)
    chance = level.value
    ratio = loss / chance
    if loss > above_ratio * chance and loss - chance > min_gap:
        return ChanceComparison("above", ratio, chance)
    floor = min(chance, level.prior) if level.prior is not None else chance
    if loss < below_ratio * floor:
        return ChanceComparison("below", loss / floor, floor)
    return ChanceComparison("ok", ratio, chance)
