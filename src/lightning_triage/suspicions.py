"""A suspicion without a symptom is info: the severity pass of the report.

Some findings predict trouble rather than show it: inputs far from unit scale, an isolated
gradient-norm spike, a rise of the validation loss that the user's own ``EarlyStopping`` or
``ModelCheckpoint`` already handles. Such a finding is a warning only when the run shows the
trouble (the overfit probe or the curve fails, a loss spike follows, the norms keep growing);
otherwise it becomes info whose message says what was seen and that training looks fine so far.

The rules are one table, :data:`SUSPICIONS` (suspicion code -> the codes that confirm it), and
one pass, :func:`settle_suspicions`, which the report runs before
:func:`~lightning_triage.findings.explain_findings`. Pure Python, no Lightning import.

Example:
    >>> from lightning_triage.findings import Finding
    >>> spike = Finding.create("grad.spike", "gradient-norm spike at step 40", check="T",
    ...                        global_step=40, evidence={"loss_spike_followed": False})
    >>> [f.severity for f in settle_suspicions([spike])]
    ['info']
    >>> loss = Finding.create("curve.loss_spike", "loss spike at step 42", check="T",
    ...                       global_step=42)
    >>> [f.severity for f in settle_suspicions([spike, loss])]
    ['warning', 'warning']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from lightning_triage.findings import SPIKE_WINDOW, Finding


@dataclass(frozen=True)
class Suspicion:
    """One row of :data:`SUSPICIONS`.

    Attributes:
        code: the finding code that predicts trouble.
        confirmed_by: problem codes (error or warning) whose presence shows the trouble: the
            suspicion then keeps its severity.
        within_steps: a confirming finding counts only at most this many steps after the
            suspicion (``None``: anywhere in the report).
        cleared_by: codes that show training works (e.g. ``overfit.passed``); when given, one
            of them must be in the report for the suspicion to become info.
        applies_if: an evidence key of the suspicion; when given, the row applies only when it
            is truthy (e.g. ``handled_by``: the user's callbacks handle the rise).
        shown_by: an evidence key of the suspicion; truthy: the finding itself saw the trouble
            (e.g. ``loss_spike_followed``) and keeps its severity...
        overruled_by: ...unless one of these codes is in the report: a finer judgement of the
            same symptom found none (``curve.healthy``: the curve stage, which weighs a loss
            against its noise, saw no spike where one batch's loss doubled).
        fine: what the info message adds: why this is context so far.
    """

    code: str
    confirmed_by: frozenset[str]
    fine: str
    within_steps: int | None = None
    cleared_by: frozenset[str] = frozenset()
    applies_if: str | None = None
    shown_by: str | None = None
    overruled_by: frozenset[str] = frozenset()


#: A NaN/Inf anywhere: the trouble an input scale or a gradient spike predicts.
_NONFINITE = frozenset({"numerics.nonfinite_loss", "numerics.nonfinite_forward",
                        "numerics.nonfinite_backward", "numerics.nonfinite_params",
                        "numerics.nonfinite_detected", "numerics.precision_overflow"})
#: What inputs far from unit scale make go wrong: the loss at step 0, memorizing one batch,
#: the curve, the gradients, the numerics.
_SCALE_TROUBLE = frozenset({
    "init.loss_above_chance", "overfit.failed", "curve.not_learning",
    "curve.plateau_at_chance", "curve.lr_too_low", "curve.diverging", "grad.vanishing",
    "grad.exploding", "grad.dead_units",
}) | _NONFINITE
#: What shows that training works: the probe memorized a batch, the curve looked healthy.
_TRAINS = frozenset({"overfit.passed", "curve.healthy"})
_SCALE_FINE = ("Nothing in this run shows trouble from it so far (the overfit probe or the "
               "curve would have failed): info, not a warning.")

#: The suspicions: code -> the codes that confirm it (see :class:`Suspicion`).
SUSPICIONS: dict[str, Suspicion] = {s.code: s for s in (
    Suspicion("data.unnormalized_input", _SCALE_TROUBLE, _SCALE_FINE, cleared_by=_TRAINS),
    Suspicion("data.tiny_input_scale", _SCALE_TROUBLE, _SCALE_FINE, cleared_by=_TRAINS),
    Suspicion("grad.spike", frozenset({"curve.loss_spike", "curve.diverging", "grad.exploding"})
              | _NONFINITE,
              "An isolated spike: no loss spike, divergence or NaN followed, training looks fine "
              "so far: info, not a warning.",
              within_steps=SPIKE_WINDOW, shown_by="loss_spike_followed",
              overruled_by=frozenset({"curve.healthy"})),
    # issue 35: clipping that keeps a small share of the gradient slows an SGD-like update; a
    # warning only when the run is slow or flat (a short run, a curve that still learns: info)
    Suspicion("grad.clipping_eats_update",
              frozenset({"curve.lr_too_low", "curve.not_learning", "curve.plateau_at_chance",
                         "grad.update_ratio"}),
              "Nothing in this run shows a slow or flat loss from it so far (the curve and the "
              "update ratios would): info, not a warning."),
    Suspicion("curve.overfitting", frozenset(),
              "Your callbacks monitor this validation loss (they stop the run or keep the best "
              "checkpoint): info, not a warning.", applies_if="handled_by"),
)}

_FINE_PREFIX = " Info: "


def _confirmed(f: Finding, rule: Suspicion, findings: Sequence[Finding]) -> bool:
    """Whether the run shows the trouble ``f`` predicts."""
    if rule.shown_by is not None and f.evidence.get(rule.shown_by) \
            and not any(g.code in rule.overruled_by for g in findings):
        return True
    for g in findings:
        if g is f or not g.is_problem or g.code not in rule.confirmed_by:
            continue
        if rule.within_steps is None:
            return True
        if f.global_step is not None and g.global_step is not None \
                and 0 <= g.global_step - f.global_step <= rule.within_steps:
            return True
    if rule.cleared_by:
        return not any(g.code in rule.cleared_by for g in findings)
    return False


def settle_suspicions(findings: Sequence[Finding]) -> list[Finding]:
    """Turn each suspicion of :data:`SUSPICIONS` that nothing in ``findings`` confirms into an
    info finding whose message says so (the order of ``findings`` is kept).

    A suspicion keeps its severity when the run shows the trouble: a problem of its
    ``confirmed_by`` codes (within ``within_steps`` steps after it, where given), or its own
    evidence (``shown_by``); with ``cleared_by``, also when nothing shows that training works.
    Idempotent: a settled finding is info and is left alone.

    Example:
        >>> from lightning_triage.findings import Finding
        >>> scale = Finding.create("data.unnormalized_input", "inputs rms 70", check="T")
        >>> passed = Finding.create("overfit.passed", "memorized 8 examples", check="T")
        >>> settled = settle_suspicions([scale, passed])
        >>> settled[0].severity, settled[0].evidence["severity_if_confirmed"]
        ('info', 'warning')
        >>> failed = Finding.create("overfit.failed", "could not overfit", check="T")
        >>> settle_suspicions([scale, failed])[0].severity
        'warning'
    """
    out: list[Finding] = []
    for f in findings:
        rule = SUSPICIONS.get(f.code)
        if rule is None or not f.is_problem \
                or (rule.applies_if is not None and not f.evidence.get(rule.applies_if)) \
                or _confirmed(f, rule, findings):
            out.append(f)
            continue
        out.append(replace(f, severity="info", message=f"{f.message}{_FINE_PREFIX}{rule.fine}",
                           evidence={**f.evidence, "severity_if_confirmed": f.severity}))
    return out


__all__ = ["SUSPICIONS", "Suspicion", "settle_suspicions"]
