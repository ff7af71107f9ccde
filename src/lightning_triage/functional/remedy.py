"""Verified remedies: does the lead's fix, tried on a copy of the run, cure the symptom?

The experiment (run by :class:`~lightning_triage.TriageReport` on a copy of the model, see
docs/remedies.md) replays the fit's first recorded batches from the fit's starting state twice
or more: as it is, then with the remedy (a learning rate divided or multiplied by 10, then 100).
After each replay the model's loss is measured on the same recorded batches. This module holds
the decision over those numbers, free of Lightning and of the model:

- the as-is replay must **reproduce the symptom** (:func:`symptom_reproduced`): for a learning
  rate too high, the loss blows up, rises, or makes no real progress; for one too low, it makes
  no real progress. Otherwise the verdict is ``"inconclusive"``, never ``"confirmed"``;
- a remedied replay **works** (:func:`remedy_works`) when it stays finite and its loss ends lower
  than the as-is one by a margin (``min_gain`` of the as-is loss) *and* by ``z`` standard errors
  of the per-batch paired differences (the same batches measured after both replays), or, when
  the as-is replay blew up, ends finite and below the starting loss by the margin;
- :func:`decide_remedy` turns the replays into the verdict: ``"confirmed"`` (the first remedy
  that works), ``"not confirmed"`` (none did), ``"inconclusive"``.

Example:
    >>> start = [2.3, 2.31, 2.29, 2.3]
    >>> slow = Replay(steps=[2.3] * 30, end=[2.29, 2.3, 2.28, 2.29])
    >>> faster = Replay(steps=[2.0] * 30, end=[0.9, 1.0, 0.95, 1.05])
    >>> d = decide_remedy("lr_up", start, slow, [(10.0, faster)])
    >>> d.verdict, d.factor
    ('confirmed', 10.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
from torch import Tensor

from lightning_triage.findings import CODES, Finding, RemedyKind
from lightning_triage.ranking import start_here

RemedyVerdict = Literal["confirmed", "not confirmed", "inconclusive", "skipped"]
REMEDY_VERDICTS: tuple[RemedyVerdict, ...] = ("confirmed", "not confirmed", "inconclusive",
                                              "skipped")
#: The kinds that run an experiment (the recorded steps replayed on a copy, as they are and
#: with the change).
EXPERIMENT_KINDS: frozenset[str] = frozenset({"lr_down", "lr_up", "lr_down_clip",
                                              "standardize_input", "zero_grads", "add_params",
                                              "realign_labels"})
#: The kinds whose symptom is the cause itself, observed on the copy (gradients left from an
#: earlier step, parameters no optimizer holds): a replay whose loss does not end lower in the
#: short window does not refute them (the verdict is ``"inconclusive"``, never ``"not
#: confirmed"``). Gradients never zeroed act as momentum without decay: with plain SGD or Adam
#: the first steps can be *faster* than with zeroing, and the harm comes later. Labels offset
#: from the inputs are such a fact too (on tokens with nothing to predict, such as uniform
#: random ones, realigned labels cannot lower the loss either).
DIRECT_KINDS: frozenset[str] = frozenset({"zero_grads", "add_params", "realign_labels"})
#: The kinds whose change is a learning-rate factor (tried 10, 100, 1000).
LR_KINDS: frozenset[str] = frozenset({"lr_down", "lr_up", "lr_down_clip"})
#: The mode stage's kinds: the validation path run on copies from two random states, as it is
#: and with the remedy, by the check that found the problem, at the probe (the trial travels in
#: the finding's evidence as ``remedy_trial``; the report moves the lead's into its block).
EVAL_KINDS: frozenset[str] = frozenset({"eval_mode", "gate_dropout"})


@dataclass(frozen=True)
class RemedyThresholds:
    """The margins of the decision (the curve classifier's where they mean the same thing).

    Attributes:
        low_progress: the as-is replay makes "no real progress" when its loss falls by less
            than this fraction of the starting loss (the curve classifier's ``low_progress``).
        rise_ratio: the as-is replay "rose" when a step's loss exceeds this multiple of the
            starting loss (the curve classifier's ``rise_ratio``).
        min_gain: a remedy works only if its final loss is below the as-is one by at least this
            fraction of the as-is loss...
        z: ...and by this many standard errors of the per-batch paired differences.
        factors: the learning-rate factors tried, in order (divided for ``lr_down``, multiplied
            for ``lr_up``); the first that works is reported.
    """

    low_progress: float = 0.1
    rise_ratio: float = 1.2
    min_gain: float = 0.02
    z: float = 3.0
    factors: tuple[float, ...] = (10.0, 100.0, 1000.0)


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
class RemedyDecision:
    """What :func:`decide_remedy` decided.

    Attributes:
        verdict: ``"confirmed"``, ``"not confirmed"`` or ``"inconclusive"``.
        reason: why, with the numbers.
        factor: the factor (or the label of the change) that worked (``None`` unless
            confirmed).
        tried: the factors or labels tried, in order.
    """

    verdict: RemedyVerdict
    reason: str
    factor: float | str | None = None
    tried: tuple[float | str, ...] = ()


@dataclass(frozen=True)
class EvalPasses:
    """Two passes of the validation path over the same examples from random states A and B.

    Attributes:
        difference: the largest relative difference of a module output between the two passes
            (0: identical).
        differs_at: the first module whose output differs (``None``: deterministic; ``""`` is
            the model itself).
        losses: the validation loss of each pass (empty when the path returned or logged none).
        buffers_changed: the buffers (running statistics) a pass changed.
    """

    difference: float
    differs_at: str | None
    losses: tuple[float, ...] = ()
    buffers_changed: tuple[str, ...] = ()

    @property
    def deterministic(self) -> bool:
        """Whether both passes gave the same outputs."""
        return self.differs_at is None

    @property
    def loss(self) -> float | None:
        """The mean validation loss of the passes (``None``: none seen)."""
        finite = [v for v in self.losses if math.isfinite(v)]
        return sum(finite) / len(finite) if finite else None

    def summary(self) -> dict[str, Any]:
        """The report's ``before``/``after`` entry."""
        return {"passes": 2, "deterministic": self.deterministic,
                "difference": self.difference if math.isfinite(self.difference) else None,
                "differs_at": self.differs_at, "loss": self.loss,
                "buffers_changed": len(self.buffers_changed)}


def _where(name: str | None) -> str:
    return f"`{name}`" if name else "the model's output"


def _eval_symptom(kind: RemedyKind, passes: EvalPasses) -> str | None:
    """What of the symptom the passes show (``None``: nothing)."""
    shown = []
    if not passes.deterministic:
        shown.append(f"differ between two random states (largest difference "
                     f"{passes.difference:.3g} of the output's magnitude, first at "
                     f"{_where(passes.differs_at)})" if math.isfinite(passes.difference)
                     else f"differ between two random states (first at {_where(passes.differs_at)})")
    if kind == "eval_mode" and passes.buffers_changed:
        listed = ", ".join(f"`{b}`" for b in passes.buffers_changed[:4])
        shown.append(f"update {len(passes.buffers_changed)} running statistic(s) ({listed})")
    return " and ".join(shown) or None


def decide_eval_remedy(kind: RemedyKind, as_is: EvalPasses, remedied: EvalPasses
                       ) -> RemedyDecision:
    """The verdict of a mode-stage remedy (``"eval_mode"``: the layers in eval mode;
    ``"gate_dropout"``: the dropout calls gated on the mode) over two passes each.

    The as-is passes must show the symptom (outputs that differ between the random states; for
    ``eval_mode`` also running statistics that a pass updates), or the verdict is
    ``"inconclusive"``. The remedy cures it when its passes are identical and update nothing:
    ``"confirmed"``, with the validation loss before and after. Otherwise ``"inconclusive"``,
    never ``"not confirmed"``: the finding is a fact seen on the copy (layers in training mode,
    outputs that differ), and a remedy that leaves other randomness does not refute it.

    Example:
        >>> random = EvalPasses(0.4, "fc2", (0.71, 0.69))
        >>> d = decide_eval_remedy("gate_dropout", random, EvalPasses(0.0, None, (0.52, 0.52)))
        >>> d.verdict
        'confirmed'
        >>> print(d.reason)  # doctest: +NORMALIZE_WHITESPACE
        the validation outputs differ between two random states (largest difference 0.4 of the
        output's magnitude, first at `fc2`); with the remedy they are identical, and the
        validation loss goes 0.7 -> 0.52 (-26%)
        >>> decide_eval_remedy("gate_dropout", random, random).verdict
        'inconclusive'
    """
    label = "eval mode" if kind == "eval_mode" else "dropout gated"
    shown = _eval_symptom(kind, as_is)
    if shown is None:
        return RemedyDecision("inconclusive", "the validation outputs are identical from two "
                              "random states" + (" and no running statistic moved" if
                                                 kind == "eval_mode" else "")
                              + " on the copy: the symptom did not reproduce, so the remedy "
                              "cannot be judged", None, (label,))
    what = f"the validation outputs {shown}"
    left = _eval_symptom(kind, remedied)
    if left is None:
        before, after = as_is.loss, remedied.loss
        change = ""
        if before is not None and after is not None:
            rel = f" ({100 * (after - before) / abs(before):+.0f}%)" if before else ""
            change = f", and the validation loss goes {_fmt(before)} -> {_fmt(after)}{rel}"
        return RemedyDecision("confirmed", f"{what}; with the remedy they are identical"
                              + (" and no running statistic moves" if kind == "eval_mode"
                                 and as_is.buffers_changed else "") + change, label, (label,))
    other = ("a source of randomness besides the layers left in training mode" if kind ==
             "eval_mode" else "randomness that is not a dropout call (noise drawn with "
             "`torch.rand*`/`randn*`, sampling)")
    return RemedyDecision("inconclusive", f"{what}; with the remedy they still "
                          f"{left}: {other}, which only an edit of the code removes. The "
                          "finding is a fact seen on the copy: this does not refute it",
                          None, (label,))


def remedy_kind(finding: Finding) -> RemedyKind:
    """The remedy of ``finding``: its code's (the registry's ``remedy``), except a
    ``grad.update_ratio`` far *above* ~1e-3, whose fix is a lower learning rate, and a
    ``curve.diverging`` that falls without bound (``direction="down"``: a term with the wrong
    sign), which has no mechanical remedy (``"none"``).

    Example:
        >>> f = Finding.create("grad.update_ratio", "ratio 0.9", check="T",
        ...                    evidence={"direction": "above"})
        >>> remedy_kind(f), remedy_kind(Finding.create("curve.lr_too_low", "slow", check="T"))
        ('lr_down', 'lr_up')
    """
    spec = CODES.get(finding.code)
    kind: RemedyKind = spec.remedy if spec is not None else "none"
    if finding.code == "grad.update_ratio" and finding.evidence.get("direction") == "above":
        return "lr_down"
    if finding.code == "curve.diverging" and finding.evidence.get("direction") == "down":
        return "none"  # unbounded below: a sign bug, which no learning rate fixes
    return kind


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
    down = kind in ("lr_down", "lr_down_clip")
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


def remedy_works(start: Sequence[float], as_is: Replay, remedied: Replay,
                 thresholds: RemedyThresholds | None = None) -> tuple[bool, str]:
    """Whether the remedied replay cured the symptom, and why (see the module docstring).

    Example:
        >>> as_is = Replay([2.3] * 5, [2.3, 2.2, 2.4, 2.3])
        >>> remedy_works([2.3] * 4, as_is, Replay([2.0] * 5, [1.1, 1.0, 1.2, 1.1]))[0]
        True
        >>> remedy_works([2.3] * 4, as_is, Replay([2.0] * 5, [2.29, 2.2, 2.39, 2.3]))[0]
        False
    """
    th = thresholds or RemedyThresholds()
    if not remedied.finite:
        return False, "the remedied replay went non-finite too"
    after = remedied.end_loss
    if not as_is.finite:
        s = _mean(start)
        if after < s - th.min_gain * abs(s):
            return True, f"finite, and the loss ends below its start ({_fmt(s)} -> {_fmt(after)})"
        return False, f"finite, but the loss does not end below its start ({_fmt(s)} -> {_fmt(after)})"
    before = as_is.end_loss
    diffs = [a - b for a, b in zip(as_is.end, remedied.end, strict=False)]
    gain = _mean(diffs)
    n = len(diffs)
    if n >= 2:
        var = sum((d - gain) ** 2 for d in diffs) / (n - 1)
        se = math.sqrt(var / n)
    else:
        se = math.inf
    margin = th.min_gain * abs(before)
    if gain > margin and gain > th.z * se:
        return True, (f"the loss ends lower: {_fmt(before)} -> {_fmt(after)} "
                      f"({100 * gain / abs(before):.0f}% lower, {gain / se if se else math.inf:.1f} "
                      "standard errors)")
    return False, (f"the loss does not end clearly lower: {_fmt(before)} -> {_fmt(after)} (needs "
                   f"{100 * th.min_gain:.0f}% and {th.z:g} standard errors)")


def decide_remedy(kind: RemedyKind, start: Sequence[float], as_is: Replay,
                  remedied: Sequence[tuple[float | str, Replay]],
                  thresholds: RemedyThresholds | None = None,
                  symptom: tuple[bool, str] | None = None) -> RemedyDecision:
    """The verdict of a remedy over the replays.

    Args:
        kind: the remedy kind (:data:`EXPERIMENT_KINDS`).
        start: the per-batch losses of the starting state on the evaluation batches.
        as_is: the replay with the run's own settings.
        remedied: ``(factor or label, replay)`` for each remedy tried, in order.
        thresholds: the margins.
        symptom: whether the as-is replay showed the symptom, and what it showed, when the
            caller observed it on the copy (stale gradients, parameters no optimizer holds,
            inputs far from standardized); by default :func:`symptom_reproduced` over the losses.

    Example:
        >>> blew_up = Replay([2.3, 40.0, float("inf")])
        >>> tamed = Replay([2.3] * 30, [0.8, 0.7, 0.9])
        >>> decide_remedy("lr_down", [2.3, 2.3, 2.3], blew_up, [(10.0, tamed)]).verdict
        'confirmed'
        >>> decide_remedy("lr_up", [2.3] * 3, Replay([1.0] * 30, [0.5, 0.5, 0.6]), []).verdict
        'inconclusive'
    """
    th = thresholds or RemedyThresholds()
    shown, what = symptom if symptom is not None else symptom_reproduced(kind, start, as_is, th)
    tried = tuple(f for f, _ in remedied)
    if not shown:
        return RemedyDecision("inconclusive", f"{what}: the symptom did not reproduce on the "
                              "replayed steps, so the remedy cannot be judged", None, tried)
    reasons = []
    for factor, replay in remedied:
        ok, why = remedy_works(start, as_is, replay, th)
        if ok:
            return RemedyDecision("confirmed", f"{what}; with the remedy ({_factor(kind, factor)}) "
                                  f"{why}", factor, tried)
        reasons.append(f"{_factor(kind, factor)}: {why}")
    if not remedied:
        return RemedyDecision("inconclusive", f"{what}; no remedied replay ran", None, tried)
    if kind in DIRECT_KINDS:
        last = remedied[-1][1]
        rose = as_is.finite and last.finite and last.end_loss > as_is.end_loss
        why_rose = f"; {RISES_BECAUSE[kind]}" if rose and kind in RISES_BECAUSE else ""
        return RemedyDecision("inconclusive", f"{what}; " + "; ".join(reasons) + f"{why_rose}. The "
                              "finding is a fact observed on the copy, not a reading of the curve: "
                              f"a replay of {len(as_is.steps)} steps that does not end lower does "
                              "not refute it", None, tried)
    return RemedyDecision("not confirmed", f"{what}; " + "; ".join(reasons), None, tried)


#: Why a direct remedy's short replay may end *higher* than the as-is one although the finding
#: is real (docs/remedies.md, "Direct findings are not refuted by a short replay"): said in the
#: trial's reason, so that a rising loss does not read as a fix that makes things worse.
RISES_BECAUSE: dict[str, str] = {
    "zero_grads": "higher, as expected over a short replay: gradients never zeroed add up like "
                  "momentum without decay, so the first steps run faster as is; the harm, an "
                  "unstable curve, comes later",
}


def _factor(kind: RemedyKind, factor: float | str) -> str:
    if isinstance(factor, str):
        return factor
    return f"x1/{factor:g}" if kind in ("lr_down", "lr_down_clip") else f"x{factor:g}"


def next_candidate(findings: Sequence[Finding], challenged: Finding) -> str | None:
    """The finding to look at when ``challenged``'s remedy was not confirmed: the first lead
    (:func:`~lightning_triage.findings.start_here`) of the report without it and without the
    findings its failed experiment refutes as well (those with the same remedy kind).

    Example:
        >>> low = Finding.create("curve.lr_too_low", "slow", check="T", global_step=90)
        >>> ratio = Finding.create("grad.update_ratio", "tiny", check="T",
        ...                        evidence={"direction": "below"})
        >>> failed = Finding.create("overfit.failed", "no", check="T", global_step=0)
        >>> next_candidate([low, ratio, failed], low)
        'overfit.failed'
    """
    kind = remedy_kind(challenged)
    rest = [f for f in findings if f.code != challenged.code
            and not (kind in EXPERIMENT_KINDS and remedy_kind(f) == kind)]
    return start_here(rest)


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


def with_remedy(finding: Finding, block: dict[str, Any]) -> Finding:
    """``finding`` carrying ``block`` (its message unchanged)."""
    return replace(finding, remedy=dict(block))


__all__ = [
    "DIRECT_KINDS",
    "EVAL_KINDS",
    "EXPERIMENT_KINDS",
    "LR_KINDS",
    "REMEDY_VERDICTS",
    "RISES_BECAUSE",
    "EvalPasses",
    "RemedyDecision",
    "RemedyThresholds",
    "RemedyVerdict",
    "Replay",
    "channel_stats",
    "decide_eval_remedy",
    "decide_remedy",
    "input_scale_symptom",
    "next_candidate",
    "remedy_kind",
    "remedy_works",
    "standardize",
    "symptom_reproduced",
    "with_remedy",
]
