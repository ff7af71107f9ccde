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
from dataclasses import dataclass, replace
from typing import Any, Literal

from lightning_triage.codes.remedies import REMEDIES, RemedyThresholds, remedy_spec
from lightning_triage.findings import CODES, Finding, RemedyKind
from lightning_triage.functional.remedy_plan import (
    Replay,
    _fmt,
    _mean,
    symptom_reproduced,
)
from lightning_triage.ranking import start_here

RemedyVerdict = Literal["confirmed", "not confirmed", "inconclusive", "skipped"]
REMEDY_VERDICTS: tuple[RemedyVerdict, ...] = ("confirmed", "not confirmed", "inconclusive",
                                              "skipped")


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
    if REMEDIES[kind].buffers and passes.buffers_changed:
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
    spec = REMEDIES[kind]
    label = spec.label
    shown = _eval_symptom(kind, as_is)
    if shown is None:
        return RemedyDecision("inconclusive", "the validation outputs are identical from two "
                              "random states" + (" and no running statistic moved" if
                                                 spec.buffers else "")
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
                              + (" and no running statistic moves" if spec.buffers
                                 and as_is.buffers_changed else "") + change, label, (label,))
    return RemedyDecision("inconclusive", f"{what}; with the remedy they still "
                          f"{left}: {spec.left_over}, which only an edit of the code removes. The "
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
                  symptom: tuple[bool, str] | None = None,
                  placebo: Replay | None = None) -> RemedyDecision:
    """The verdict of a remedy over the replays.

    Args:
        kind: the remedy kind (a ``"replay"`` row of the remedy table).
        start: the per-batch losses of the starting state on the evaluation batches.
        as_is: the replay with the run's own settings.
        remedied: ``(factor or label, replay)`` for each remedy tried, in order.
        thresholds: the margins.
        symptom: whether the as-is replay showed the symptom, and what it showed, when the
            caller observed it on the copy (stale gradients, parameters no optimizer holds,
            inputs far from standardized); by default :func:`symptom_reproduced` over the losses.
        placebo: the same batches replayed with nothing changed but their order: a remedy that
            works is confirmed only if this replay does not pass the same margin against the
            as-is one (``"inconclusive"`` otherwise: the order alone moves the loss as much).

    Example:
        >>> blew_up = Replay([2.3, 40.0, float("inf")])
        >>> tamed = Replay([2.3] * 30, [0.8, 0.7, 0.9])
        >>> decide_remedy("lr_down", [2.3, 2.3, 2.3], blew_up, [(10.0, tamed)]).verdict
        'confirmed'
        >>> decide_remedy("lr_up", [2.3] * 3, Replay([1.0] * 30, [0.5, 0.5, 0.6]), []).verdict
        'inconclusive'
    """
    th = thresholds or REMEDIES[kind].thresholds
    shown, what = symptom if symptom is not None else symptom_reproduced(kind, start, as_is, th)
    tried = tuple(f for f, _ in remedied)
    if not shown:
        return RemedyDecision("inconclusive", f"{what}: the symptom did not reproduce on the "
                              "replayed steps, so the remedy cannot be judged", None, tried)
    reasons = []
    for factor, replay in remedied:
        ok, why = remedy_works(start, as_is, replay, th)
        if ok and placebo is not None and remedy_works(start, as_is, placebo, th)[0]:
            return RemedyDecision("inconclusive", f"{what}; with the remedy "
                                  f"({_factor(kind, factor)}) {why}, but so does the placebo "
                                  "(nothing changed, the batches in another order: loss "
                                  f"{_fmt(placebo.end_loss)}): the replay's order alone moves "
                                  "the loss as much", None, tried)
        if ok:
            return RemedyDecision("confirmed", f"{what}; with the remedy ({_factor(kind, factor)}) "
                                  f"{why}", factor, tried)
        reasons.append(f"{_factor(kind, factor)}: {why}")
    if not remedied:
        return RemedyDecision("inconclusive", f"{what}; no remedied replay ran", None, tried)
    spec = REMEDIES[kind]
    if spec.direct:
        last = remedied[-1][1]
        rose = as_is.finite and last.finite and last.end_loss > as_is.end_loss
        why_rose = f"; {spec.rises_because}" if rose and spec.rises_because else ""
        return RemedyDecision("inconclusive", f"{what}; " + "; ".join(reasons) + f"{why_rose}. The "
                              "finding is a fact observed on the copy, not a reading of the curve: "
                              f"a replay of {len(as_is.steps)} steps that does not end lower does "
                              "not refute it", None, tried)
    return RemedyDecision("not confirmed", f"{what}; " + "; ".join(reasons), None, tried)


def _factor(kind: RemedyKind, factor: float | str) -> str:
    if isinstance(factor, str):
        return factor
    return f"x1/{factor:g}" if REMEDIES[kind].lr == "down" else f"x{factor:g}"


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
            and not (remedy_spec(kind).family == "replay" and remedy_kind(f) == kind)]
    return start_here(rest)


def partly(kind: RemedyKind, block: dict[str, Any], findings: Sequence[Finding]
           ) -> dict[str, Any]:
    """``block`` of a confirmed remedy, made partial when a finding of the run that ``kind``
    cannot cure remains (the table's ``cannot_cure``: a part that never trains, a loss fed
    probabilities): the verdict ``"inconclusive"``, the reason ``"partly: ..."``, and the
    finding named in ``remains`` (the loss falls faster, the cause stays).

    Example:
        >>> frozen = Finding.create("wiring.frozen_at_init", "head frozen", check="T")
        >>> b = partly("lr_up", {"verdict": "confirmed", "reason": "it ends lower"}, [frozen])
        >>> b["verdict"], b["remains"], b["reason"][:44]
        ('inconclusive', 'wiring.frozen_at_init', 'partly: the loss falls faster (it ends lower')
    """
    if block.get("verdict") != "confirmed":
        return block
    cannot = REMEDIES[kind].cannot_cure
    left = next((f for f in findings if f.code in cannot and f.is_problem), None)
    if left is None:
        return block
    return {**block, "verdict": "inconclusive", "remains": left.code,
            "reason": f"partly: the loss falls faster ({block.get('reason', '')}), but "
                      f"`{left.code}` remains ({left.title.lower()}): the change cannot remove "
                      "it, so it is the cause to fix first"}


def with_remedy(finding: Finding, block: dict[str, Any]) -> Finding:
    """``finding`` carrying ``block`` (its message unchanged)."""
    return replace(finding, remedy=dict(block))


__all__ = [
    "REMEDY_VERDICTS",
    "EvalPasses",
    "RemedyDecision",
    "RemedyThresholds",
    "RemedyVerdict",
    "Replay",
    "decide_eval_remedy",
    "decide_remedy",
    "next_candidate",
    "partly",
    "remedy_kind",
    "remedy_works",
    "symptom_reproduced",
    "with_remedy",
]
