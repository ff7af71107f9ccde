"""What a replayed remedy tries, read off the remedy table: the variants and the symptom.

After the as-is replay, :func:`plan_remedy` turns a kind's row of the remedy table
(:data:`~lightning_triage.codes.remedies.REMEDIES`) and what the copy showed
(:class:`ReplayFacts`: the as-is replay's gradient norms and stale gradients, the parameters no
param group holds, the recorded batches, the labels' realignment) into a :class:`RemedyPlan`: the
:class:`Variant` replays to run in order, whether the as-is run showed the symptom, and the change
in the report's words. The replay engine (``callbacks/_remedy.py``) applies a :class:`Variant`
without knowing its kind. Free of Lightning.

Example:
    >>> from lightning_triage.functional.remedy import Replay
    >>> slow = Replay([2.3] * 10, [2.29, 2.3])
    >>> plan = plan_remedy("lr_up", [2.3, 2.3], slow, ReplayFacts(batches=[]))
    >>> plan.symptom[0], [(key, v.label, v.lr_factor) for key, v in plan.variants][:2]
    (True, [(10.0, 'x10', 10.0), (100.0, 'x100', 100.0)])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lightning_triage.codes.remedies import REMEDIES, RemedySpec, RemedyThresholds
from lightning_triage.findings import RemedyKind
from lightning_triage.functional.batch import locate_batch
from lightning_triage.functional.collection import map_tensors

if TYPE_CHECKING:
    from lightning_triage.functional.realign import LabelPlan


@dataclass(frozen=True)
class Replay:
    """One replay of the recorded batches.

    Attributes:
        steps: the training loss of each replayed step, in order (it stops at the first
            non-finite one).
        end: the loss of the model after the replay on each evaluation batch (empty when the
            replay blew up).
    """

    steps: list[float]
    end: list[float] = field(default_factory=list)

    @property
    def finite(self) -> bool:
        """Whether every step and every final loss was finite."""
        return bool(self.end) and all(math.isfinite(v) for v in (*self.steps, *self.end))

    @property
    def end_loss(self) -> float:
        """The mean final loss (``inf`` when the replay blew up)."""
        return sum(self.end) / len(self.end) if self.finite else math.inf

    def summary(self, lr: float | None = None) -> dict[str, Any]:
        """The report's ``before``/``after`` entry: steps, final loss, finite, learning rate."""
        out: dict[str, Any] = {"steps": len(self.steps), "finite": self.finite,
                               "loss": self.end_loss if self.finite else None}
        if not self.finite:
            bad = next((i for i, v in enumerate(self.steps) if not math.isfinite(v)), None)
            out["nonfinite_at_step"] = bad
        if lr is not None:
            out["lr"] = lr
        return out


@dataclass(frozen=True)
class Variant:
    """One replay's change (nothing: the as-is replay).

    Attributes:
        label: the report's name of the replay (``tried``).
        lr_factor: every param group's learning rate (and the schedulers' base rates) times it.
        clip: a total-norm clip besides the run's own.
        transform: applied to every recorded batch.
        zero_grads: zero before every backward instead of the model's hook.
        add_missing: the parameters no param group holds added to a new one.
        order: the recorded batches' order in the replay (``None``: as recorded).
    """

    label: str = "as is"
    lr_factor: float = 1.0
    clip: float | None = None
    transform: Callable[[Any], Any] | None = None
    zero_grads: bool = False
    add_missing: bool = False
    order: tuple[int, ...] | None = None


AS_IS = Variant()


def placebo(steps: int) -> Variant:
    """The placebo of a confirmation: nothing changed but the order of the batches (reversed)."""
    return Variant(PLACEBO_LABEL, order=tuple(reversed(range(steps))))


#: The placebo's label and change, in the report's words.
PLACEBO_LABEL = "placebo"
PLACEBO_CHANGE = "nothing changed, the same batches replayed in reverse order"


@dataclass(frozen=True)
class ReplayFacts:
    """What the copy showed besides the losses.

    Attributes:
        batches: the recorded batches (host copies).
        norms: the total gradient norm of each optimizer step of the as-is replay.
        stale_steps: the as-is replay's steps whose backward found gradients from before.
        missing: the trainable parameter tensors in no param group, and their values.
        labels: ``realign_labels``: the realignment and the symptom in the recorded batches.
    """

    batches: Sequence[Any]
    norms: Sequence[float] = ()
    stale_steps: int = 0
    missing: tuple[int, int] = (0, 0)
    labels: tuple[LabelPlan, tuple[bool, str]] | None = field(default=None)


@dataclass(frozen=True)
class RemedyPlan:
    """What a trial tries after the as-is replay, and whether that replay showed the symptom.

    Attributes:
        symptom: whether the as-is run showed the symptom, and what it showed.
        variants: ``(key, variant)`` in order (the key: the learning-rate factor or the label).
        change: the change in the report's words, with what the plan knows of it.
        clip: the clip norm of a clipping kind.
    """

    symptom: tuple[bool, str]
    variants: list[tuple[float | str, Variant]]
    change: str
    clip: float | None = None


def recorded_inputs(batches: Sequence[Any]) -> list[Tensor]:
    """The float input tensor of each recorded batch where one is found."""
    found = [locate_batch(b).inputs for b in batches]
    return [x for x in found if x is not None and x.is_floating_point() and x.ndim >= 1]


def channel_stats(inputs: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """The mean and standard deviation of each channel (dim 1; the one feature of a 1-D input)
    over the recorded inputs, shaped to broadcast against one of them. A channel that never
    varies gets a standard deviation of 1 (it is only centered).

    Example:
        >>> x = torch.tensor([[0.0, 16.0, 3.0], [0.0, 8.0, 3.0]])
        >>> mean, std = channel_stats([x, x])
        >>> mean.tolist(), [round(v, 3) for v in std.flatten().tolist()]
        ([[0.0, 12.0, 3.0]], [1.0, 4.619, 1.0])
    """
    first = inputs[0]
    dims = [d for d in range(first.ndim) if d != 1] if first.ndim >= 2 else [0]
    total = total_sq = None
    count = 0
    for x in inputs:
        x = x.detach().double()
        n = x.numel() // (x.shape[1] if x.ndim >= 2 else 1)
        part, part_sq = x.sum(dim=dims, keepdim=True), (x * x).sum(dim=dims, keepdim=True)
        total = part if total is None else total + part
        total_sq = part_sq if total_sq is None else total_sq + part_sq
        count += n
    assert total is not None
    assert total_sq is not None
    mean = total / count
    var = (total_sq / count - mean * mean).clamp(min=0) * count / max(1, count - 1)
    std = var.sqrt()
    std = torch.where(std > 1e-12 * (1 + mean.abs()), std, torch.ones_like(std))
    return mean.to(first.dtype), std.to(first.dtype)


def standardize(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """``x`` standardized with :func:`channel_stats`' statistics (on ``x``'s device)."""
    return (x - mean.to(x.device)) / std.to(x.device)


def input_scale_symptom(inputs: Sequence[Tensor]) -> tuple[bool, str]:
    """Whether the recorded inputs are far from standardized (the data stage's rules:
    ``data.unnormalized_input``'s rms above 4 or tiny values, ``data.tiny_input_scale``'s
    non-negative intensities below 0.1), and what they are.

    Example:
        >>> input_scale_symptom([torch.arange(17.0).repeat(4, 1)])[0]
        True
        >>> input_scale_symptom([torch.randn(8, 4, generator=torch.Generator().manual_seed(0))])
        (False, 'the recorded inputs are near unit scale (rms 1.01)')
    """
    from lightning_triage.functional.data.inputs import (
        far_below_unit_scale,
        scale_verdict,
        summarize_tensor,
    )

    summary = summarize_tensor(torch.cat([x.detach().reshape(x.shape[0], -1).double()
                                          for x in inputs]).to(inputs[0].dtype))
    rms = summary.rms if summary.rms is not None else math.nan
    if scale_verdict(summary) is not None or far_below_unit_scale(summary):
        return True, (f"the recorded inputs are far from standardized (rms {rms:.3g}, range "
                      f"{summary.min:.3g} to {summary.max:.3g})")
    return False, f"the recorded inputs are near unit scale (rms {rms:.3g})"


def _median(values: Sequence[float]) -> float | None:
    finite = sorted(v for v in values if math.isfinite(v) and v > 0)
    return finite[len(finite) // 2] if finite else None


def _standardizer(batches: Sequence[Any]) -> tuple[Callable[[Any], Any], str]:
    mean, std = channel_stats(recorded_inputs(batches))

    def transform(batch: Any) -> Any:
        x = locate_batch(batch).inputs
        return map_tensors(lambda t: standardize(t, mean, std) if t is x else t, batch)

    return transform, (f" (mean {float(mean.mean()):.3g}, std {float(std.mean()):.3g} on average "
                       f"over {mean.numel()} channel(s))")


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def symptom_reproduced(kind: RemedyKind, start: Sequence[float], as_is: Replay,
                       thresholds: RemedyThresholds | None = None) -> tuple[bool, str]:
    """Whether the as-is replay shows the symptom the remedy targets, and what it showed.

    ``lr_down``: the loss went non-finite, rose above ``rise_ratio`` x the starting loss, or
    fell by less than ``low_progress``. ``lr_up``: the loss stayed finite and fell by less than
    ``low_progress``.

    Example:
        >>> symptom_reproduced("lr_up", [2.3], Replay([2.3] * 20, [2.29]))[0]
        True
        >>> symptom_reproduced("lr_up", [2.3], Replay([1.0] * 20, [0.5]))
        (False, 'the as-is replay made real progress (loss 2.3 -> 0.5, 78% lower)')
    """
    th = thresholds or RemedyThresholds()
    s = _mean(start)
    down = REMEDIES[kind].lr == "down"
    if not as_is.finite:
        if down:
            return True, "the as-is replay went non-finite"
        return False, "the as-is replay went non-finite (not a slow loss)"
    end = as_is.end_loss
    progress = (s - end) / abs(s) if s else 0.0
    peak = max(as_is.steps, default=s)
    if down and s > 0 and peak > th.rise_ratio * s:
        return True, f"the as-is replay's loss rose to {_fmt(peak)} ({peak / s:.2f}x the start)"
    if progress < th.low_progress:
        return True, (f"the as-is replay made no real progress (loss {_fmt(s)} -> {_fmt(end)}, "
                      f"{100 * progress:+.1f}%)")
    return False, (f"the as-is replay made real progress (loss {_fmt(s)} -> {_fmt(end)}, "
                   f"{100 * progress:.0f}% lower)")


_Symptom = Callable[[RemedySpec, Sequence[float], Replay, ReplayFacts, RemedyThresholds],
                    tuple[bool, str]]


def _from_losses(spec: RemedySpec, start: Sequence[float], as_is: Replay, facts: ReplayFacts,
                 th: RemedyThresholds) -> tuple[bool, str]:
    return symptom_reproduced(spec.kind, start, as_is, th)


def _from_stale(spec: RemedySpec, start: Sequence[float], as_is: Replay, facts: ReplayFacts,
                th: RemedyThresholds) -> tuple[bool, str]:
    if facts.stale_steps:
        return True, (f"the as-is replay kept the gradients of earlier steps in "
                      f"{facts.stale_steps} of its {len(as_is.steps)} steps")
    return False, "the as-is replay zeroed the gradients before every step"


def _from_missing(spec: RemedySpec, start: Sequence[float], as_is: Replay, facts: ReplayFacts,
                  th: RemedyThresholds) -> tuple[bool, str]:
    count, numel = facts.missing
    if count:
        return True, (f"{count} trainable parameter tensor(s) ({numel} values) are in no param "
                      "group, so the as-is replay never updates them")
    return False, "every trainable parameter is in a param group of the optimizer"


#: How each symptom source of the table is read.
_SYMPTOMS: dict[str, _Symptom] = {
    "losses": _from_losses,
    "inputs": lambda spec, start, as_is, facts, th: input_scale_symptom(
        recorded_inputs(facts.batches)),
    "stale_grads": _from_stale,
    "missing_params": _from_missing,
    "labels": lambda spec, start, as_is, facts, th: facts.labels[1] if facts.labels
    else (False, "no realignment of the labels"),
}


def plan_remedy(kind: str, start: Sequence[float], as_is: Replay, facts: ReplayFacts,
                thresholds: RemedyThresholds | None = None) -> RemedyPlan | str:
    """The variants of ``kind``'s replayed remedy and the symptom, from its row of the remedy
    table (a string: why the trial cannot run).

    Example:
        >>> from lightning_triage.functional.remedy import Replay
        >>> plan_remedy("lr_down_clip", [2.3], Replay([2.3]), ReplayFacts(batches=[]))
        'the as-is replay saw no finite gradient norm to clip at'
    """
    spec = REMEDIES[kind]
    th = thresholds or spec.thresholds
    change = spec.change
    clip: float | None = None
    if spec.clip:
        clip = _median(facts.norms)
        if clip is None:
            return "the as-is replay saw no finite gradient norm to clip at"
    symptom = _SYMPTOMS[spec.symptom_from](spec, start, as_is, facts, th)
    if spec.lr is not None:
        down = spec.lr == "down"
        variants: list[tuple[float | str, Variant]] = [
            (f, Variant(f"/{f:g}" if down else f"x{f:g}", lr_factor=1 / f if down else f,
                        clip=clip)) for f in th.factors]
        return RemedyPlan(symptom, variants, change, clip)
    transform: Callable[[Any], Any] | None = None
    if spec.transform == "standardize":
        transform, stats = _standardizer(facts.batches)
        change += stats
    elif spec.transform == "realign" and facts.labels is not None:
        transform, change = facts.labels[0].transform(), facts.labels[0].describe()
    if spec.add_missing:
        change += f": {facts.missing[0]} tensor(s), {facts.missing[1]} values"
    return RemedyPlan(symptom, [(spec.label, Variant(spec.label, transform=transform,
                                                     zero_grads=spec.zero_grads,
                                                     add_missing=spec.add_missing))], change)


__all__ = [
    "AS_IS",
    "PLACEBO_CHANGE",
    "PLACEBO_LABEL",
    "RemedyPlan",
    "Replay",
    "ReplayFacts",
    "Variant",
    "channel_stats",
    "input_scale_symptom",
    "placebo",
    "plan_remedy",
    "recorded_inputs",
    "standardize",
    "symptom_reproduced",
]
