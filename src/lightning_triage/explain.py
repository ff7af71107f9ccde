"""Cause before symptom: which findings of a report explain which, and where to start.

Pure Python over :class:`~lightning_triage.findings.Finding` records (no Lightning import); the
report (``build_report``) applies it. The rules are documented on the report page
(docs/report.md); ``lightning_triage.findings`` re-exports the public names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from lightning_triage.findings import STAGES, Finding, sort_findings

#: A loss or gradient spike this many steps (or fewer) before a non-finite step or a divergence
#: is the start of that blow-up, not a separate problem.
SPIKE_WINDOW = 10

# Finding codes that name a cause when they are a problem (error or warning). A cause is never
# explained by another finding; the symptoms below are explained by the causes present.
_UPDATE_CAUSES = frozenset({
    "wiring.grads_not_zeroed", "wiring.optimizer_not_stepping",
    "wiring.params_changed_outside_step",
})
_OVERFIT_CAUSES = frozenset({
    "data.nonfinite_input", "data.nonfinite_target", "data.unnormalized_input",
    "data.tiny_input_scale",
    "data.constant_input", "data.target_out_of_range",
    "init.loss_above_chance",
    "wiring.no_grad_params", "wiring.zero_grad_params", "wiring.loss_detached",
    "wiring.params_not_in_optimizer", *_UPDATE_CAUSES,
    "overfit.loss_on_probabilities",
    "structure.batch_mixing", "structure.shape_mismatch",
    "curve.lr_too_low", "curve.lr_too_high", "curve.diverging",
    "grad.vanishing", "grad.update_ratio",
    "numerics.nonfinite_loss", "numerics.precision_overflow",
})
_NOT_LEARNING_CAUSES = frozenset({
    "data.constant_input", "data.tiny_input_scale", "data.nonfinite_input", "data.nonfinite_target",
    "wiring.no_grad_params", "wiring.zero_grad_params", "wiring.loss_detached",
    "wiring.params_not_in_optimizer", *_UPDATE_CAUSES,
    "grad.vanishing", "grad.update_ratio",
    "numerics.nonfinite_loss", "numerics.precision_overflow",
})
# Symptoms of a broken update contract (the cause leads): an optimizer that does not step
# shows as a tiny update ratio; gradients that are never zeroed grow step after step.
_UPDATE_SYMPTOMS: dict[str, frozenset[str]] = {
    "grad.update_ratio": _UPDATE_CAUSES,
    "grad.exploding": frozenset({"wiring.grads_not_zeroed"}),
    "grad.spike": frozenset({"wiring.grads_not_zeroed"}),
    "curve.loss_spike": frozenset({"wiring.grads_not_zeroed"}),
    "curve.lr_too_high": frozenset({"wiring.grads_not_zeroed"}),
    "curve.diverging": frozenset({"wiring.grads_not_zeroed"}),
    "curve.lr_too_low": _UPDATE_CAUSES,
}
# --- issue 35: clipping that eats the update, freezing that starts late ----------------------
# (a self-contained block: it moves to the ranking module as it is)
# Clipping that keeps ~nothing of the gradient is the cause of a slow or flat loss and of a tiny
# update-to-weight ratio (a `grad.update_ratio` *below* ~1e-3 only).
# Parameters frozen after the first steps stop moving: a tiny update ratio of their layers and,
# when everything was frozen, a flat loss.
_CLIP_CAUSES = frozenset({"grad.clipping_eats_update", "wiring.frozen_late"})
# Labels misaligned with the inputs (shifted twice, or not at all): the model learns another
# task, so a curve that looks slow or stuck at chance is its symptom.
_LABEL_CAUSES = frozenset({"structure.label_misaligned"})
_CLIP_SYMPTOMS: dict[str, frozenset[str]] = {
    "curve.lr_too_low": _CLIP_CAUSES | _LABEL_CAUSES,
    "curve.not_learning": _CLIP_CAUSES | _LABEL_CAUSES,
    "curve.plateau_at_chance": _LABEL_CAUSES,
    "grad.update_ratio": _CLIP_CAUSES,
}  # not the overfit probe's verdicts: the probe on a copy does not clip


def _clip_explainers(f: Finding, others: Sequence[Finding]) -> list[Finding]:
    if f.code == "grad.update_ratio" and f.evidence.get("direction") != "below":
        return []
    return [g for g in others if g.is_problem and g.code in _CLIP_SYMPTOMS.get(f.code, ())]
# --- end of issue 35 block --------------------------------------------------------------------


# Non-finite findings that mark a blow-up at their step (numerics with a layer are added below).
_BLOW_UPS = frozenset({"curve.diverging", "numerics.nonfinite_loss",
                       "numerics.precision_overflow"})
_SPIKES = frozenset({"curve.loss_spike", "grad.exploding", "grad.spike"})
#: A module that turned inputs below this (largest ``|x|`` of the module outputs before it) into
#: NaN/Inf overflowed by itself (an ``exp``, a division): the module, not the learning rate, is
#: the cause of a divergence at that step.
MODEST_INPUT = 1e4


def _overflowed_by_itself(g: Finding) -> bool:
    """Whether a localized non-finite finding overflowed from modest inputs (see
    :data:`MODEST_INPUT`), or is a precision overflow (finite in float32)."""
    if g.code == "numerics.precision_overflow":
        return True
    if g.code != "numerics.nonfinite_forward" or g.layer is None:
        return False
    frames = g.evidence.get("frames") or []
    peaks = [float(fr.get("max_abs", 0.0)) for fr in frames if isinstance(fr, Mapping)]
    return max(peaks, default=0.0) < MODEST_INPUT


def _names_cause(f: Finding, causes: frozenset[str]) -> bool:
    """Whether ``f`` is a problem in ``causes`` (or a ``numerics.*`` finding with a layer)."""
    if not f.is_problem:
        return False
    return f.code in causes or (f.stage == "numerics" and f.layer is not None)


def _explainers(f: Finding, findings: Sequence[Finding]) -> list[str]:
    """The codes of the findings that explain ``f`` (empty: ``f`` is not explained)."""
    others = [g for g in findings if g is not f and g.code != f.code]
    update = [g for g in others if g.is_problem and g.code in _UPDATE_SYMPTOMS.get(f.code, ())]
    update += _clip_explainers(f, others)  # issue 35 block
    if update:  # a broken update contract explains the symptom before anything else
        found = update
    elif f.code in ("overfit.failed", "overfit.inconclusive"):
        found = [g for g in others if _names_cause(g, _OVERFIT_CAUSES)]
    elif f.code == "curve.not_learning":
        found = [g for g in others if _names_cause(g, _NOT_LEARNING_CAUSES)
                 and (g.code != "grad.update_ratio" or g.evidence.get("direction") == "below")]
    elif f.code == "data.repeated_batch":
        found = [g for g in others if g.is_problem and g.code == "data.shared_worker_rng"]
    elif f.code == "curve.lr_too_low":
        found = [g for g in others if g.is_problem
                 and g.code in ("grad.vanishing", "data.tiny_input_scale")]
    elif f.code == "curve.diverging" and f.global_step is not None:
        found = [g for g in others if g.is_problem and g.global_step == f.global_step
                 and _overflowed_by_itself(g)]
    elif f.code in _SPIKES and f.global_step is not None:
        found = [g for g in others if _names_cause(g, _BLOW_UPS) and g.global_step is not None
                 and 0 <= g.global_step - f.global_step <= SPIKE_WINDOW
                 and g.code not in _SPIKES]
    else:
        return []
    codes: list[str] = []
    for g in sort_findings(found):
        if g.code not in codes:
            codes.append(g.code)
    return codes


def explain_findings(findings: Sequence[Finding]) -> list[Finding]:
    """Set ``explained_by`` on the symptoms that another finding of the report explains.

    A symptom is a finding whose cause is usually elsewhere; when that cause is in the same
    report, the symptom carries its codes in ``explained_by``, its message says so, and it
    never leads the report (see :func:`start_here`). The rules (documented in docs/report.md):

    - ``overfit.failed`` and ``overfit.inconclusive``: explained by the problems that make one
      batch impossible (or slow) to memorize: non-finite, constant or unscaled inputs, class
      targets out of range, a step-0 loss far above chance, the ``wiring.*`` problems, a loss
      fed probabilities, outputs that mix examples or broadcast against the targets, the
      learning rate (``curve.lr_too_low``, ``curve.lr_too_high``, ``curve.diverging``,
      ``grad.update_ratio``), ``grad.vanishing`` and the localized numerics findings.
    - ``curve.not_learning``: explained by a zero update: the ``wiring.*`` problems, constant
      or non-finite data, ``grad.update_ratio`` far *below* ~1e-3, ``grad.vanishing``, the
      localized numerics findings.
    - ``curve.loss_spike``, ``grad.exploding``, ``grad.spike``: explained by a blow-up (a
      localized numerics finding, ``numerics.nonfinite_loss``, ``curve.diverging``) at the
      same step or at most :data:`SPIKE_WINDOW` steps later.
    - ``curve.lr_too_low``, ``curve.not_learning``, ``grad.update_ratio`` (below): explained by
      ``grad.clipping_eats_update`` (a warning: the update shrinks with the clipped gradient)
      and by ``wiring.frozen_late`` (parameters frozen after the first steps stop moving);
      ``curve.lr_too_low``, ``curve.not_learning``, ``curve.plateau_at_chance``: explained by
      ``structure.label_misaligned`` (the model learns another task).
    - ``curve.lr_too_low``: explained by ``grad.vanishing`` (the early layers barely move,
      whatever the learning rate) and by ``data.tiny_input_scale`` (inputs too small to move
      the first layer).
    - ``curve.diverging``: explained, at its non-finite step, by ``numerics.precision_overflow``
      or by a ``numerics.nonfinite_forward`` whose module overflowed from modest inputs (the
      outputs before it all below :data:`MODEST_INPUT`): an ``exp`` or a division, not weights
      grown by the learning rate.

    Every other finding is a cause or context and is never explained. Explanations are one
    level deep and do not chain; the function is idempotent.

    Example:
        >>> spike = Finding.create("curve.loss_spike", "spike at step 20", check="T",
        ...                        global_step=20)
        >>> nan = Finding.create("numerics.nonfinite_loss", "loss inf", check="T", global_step=23)
        >>> out = explain_findings([spike, nan])
        >>> out[0].explained_by, out[1].explained_by
        (['numerics.nonfinite_loss'], [])
        >>> out[0].message
        'spike at step 20 Explained by `numerics.nonfinite_loss`: fix that first.'
    """
    out: list[Finding] = []
    for f in findings:
        codes = _explainers(f, findings)
        if codes == list(f.explained_by):
            out.append(f)
            continue
        message = f.message.split(_EXPLAINED_PREFIX, 1)[0].rstrip()
        if codes:
            named = ", ".join(f"`{c}`" for c in codes)
            which = "that" if len(codes) == 1 else "those"
            message = f"{message}{_EXPLAINED_PREFIX}{named}: fix {which} first."
        out.append(replace(f, explained_by=codes, message=message))
    return out


_EXPLAINED_PREFIX = " Explained by "


def _unconfirmed(f: Finding) -> bool:
    return isinstance(f.remedy, Mapping) and f.remedy.get("verdict") == "not confirmed"


def start_here(findings: Sequence[Finding]) -> str | None:
    """The code of the finding to fix first, or ``None``: cause before symptom, then protocol
    order.

    The first problem (error or warning) in protocol order that no other finding explains
    (see :func:`explain_findings`), a finding whose remedy was tried on a copy and not
    confirmed after the others of its stage; if every problem is explained (explanations by findings
    that are not themselves problems cannot happen), the first problem.

    Example:
        >>> failed = Finding.create("overfit.failed", "could not overfit", check="T", global_step=0)
        >>> low = Finding.create("curve.lr_too_low", "slow decline", check="T", global_step=90)
        >>> start_here([failed, low])
        'curve.lr_too_low'
    """
    problems = [f for f in sort_findings(explain_findings(findings))
                if f.is_problem and f.stage in STAGES]
    # a finding whose remedy, tried on a copy, did not cure the symptom yields to the other
    # findings of its stage (a confirmed one first; docs/remedies.md)
    problems.sort(key=lambda f: (STAGES.index(f.stage), _unconfirmed(f)))
    for f in problems:
        if not f.explained_by:
            return f.code
    return problems[0].code if problems else None


__all__ = ["MODEST_INPUT", "SPIKE_WINDOW", "explain_findings", "start_here"]
