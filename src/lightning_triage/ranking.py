"""Which finding leads: the one ranking policy of every report.

Two tables of the same shape, each keyed by a finding code and naming the codes that act on it:

- :data:`SUSPICIONS`: a finding that predicts trouble (code) -> the codes that *confirm* it. A
  suspicion the run does not confirm becomes info (:func:`settle_suspicions`).
- :data:`EXPLANATIONS`: a symptom (code) -> the codes that *explain* it, tried in order. A
  symptom whose cause is in the same report carries ``explained_by`` and never leads
  (:func:`explain_findings`).

Every warning or error code has a role (:func:`role`): a ``"symptom"`` (a key of
:data:`EXPLANATIONS`), a ``"cause"`` (named by a row of it), or ``"standalone"`` (declared in
:data:`STANDALONE`: neither explains nor is explained). :func:`rank` applies the policy (settle,
explain, sort, lead) and is what every report path calls. Pure Python over
:class:`~lightning_triage.findings.Finding` records, no Lightning import; the rules are
documented on the report page (docs/report.md).

Example:
    >>> from lightning_triage.findings import Finding
    >>> spike = Finding.create("curve.loss_spike", "spike at step 20", check="T", global_step=20)
    >>> nan = Finding.create("numerics.nonfinite_loss", "loss inf", check="T", global_step=23)
    >>> ordered, lead = rank([nan, spike])
    >>> [(f.code, f.explained_by) for f in ordered]
    [('curve.loss_spike', ['numerics.nonfinite_loss']), ('numerics.nonfinite_loss', [])]
    >>> lead
    'numerics.nonfinite_loss'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from lightning_triage.findings import STAGES, Finding, sort_findings

#: A loss or gradient spike this many steps (or fewer) before a non-finite step or a divergence
#: is the start of that blow-up, not a separate problem.
SPIKE_WINDOW = 10
#: A module that turned inputs below this (largest ``|x|`` of the module outputs before it) into
#: NaN/Inf overflowed by itself (an ``exp``, a division): the module, not the learning rate, is
#: the cause of a divergence at that step.
MODEST_INPUT = 1e4

Role = Literal["cause", "symptom", "standalone"]


def remedy_verdict(f: Finding) -> str | None:
    """The verdict of the remedy tried for ``f`` on a copy (docs/remedies.md), ``None`` when none
    was: the report's trial of the lead (``f.remedy``), else the trial the finding's check ran at
    its probe (the mode stage's ``evidence["remedy_trial"]``); both are read the same way.

    Example:
        >>> f = Finding.create("mode.train_mode_in_eval", "dropout on", check="T",
        ...                    evidence={"remedy_trial": {"verdict": "confirmed"}})
        >>> remedy_verdict(f), remedy_verdict(Finding.create("curve.lr_too_low", "slow", check="T"))
        ('confirmed', None)
    """
    for block in (f.remedy, f.evidence.get("remedy_trial")):
        if isinstance(block, Mapping) and isinstance(block.get("verdict"), str):
            return str(block["verdict"])
    return None


def _refuted(f: Finding) -> bool:
    """Whether ``f``'s remedy, tried on a copy, did not cure its symptom."""
    return remedy_verdict(f) == "not confirmed"


def _verified(f: Finding) -> bool:
    """Whether ``f``'s remedy, tried on a copy, cured its symptom."""
    return remedy_verdict(f) == "confirmed"


def _mostly_frozen(f: Finding) -> bool:
    """Whether at least half of the model's parameters are frozen (``f``'s evidence)."""
    share = f.evidence.get("frozen_share")
    return isinstance(share, (int, float)) and share >= 0.5


# --------------------------------------------------------------------------------------------
# The suspicions (a suspicion without a symptom is info; docs/report.md)
# --------------------------------------------------------------------------------------------


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
        refuted_leads: codes whose remedy, tried on a copy and not confirmed, shows the trouble
            (a slow loss that a larger learning rate does not cure is the floor's).
        fine: what the info message adds: why this is context so far.

    A suspicion whose own remedy was confirmed on a copy keeps its severity too: the trial
    showed the trouble.
    """

    code: str
    confirmed_by: frozenset[str]
    fine: str
    within_steps: int | None = None
    cleared_by: frozenset[str] = frozenset()
    applies_if: str | None = None
    shown_by: str | None = None
    overruled_by: frozenset[str] = frozenset()
    refuted_leads: frozenset[str] = frozenset()


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
#: A slow or flat loss whose remedy is a larger learning rate.
_SLOW_LOSS = frozenset({"curve.lr_too_low", "curve.not_learning"})
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
    # clipping that keeps a small share of the gradient slows an SGD-like update: a warning only
    # when the run is slow or flat (a short run, a curve that still learns: info)
    Suspicion("grad.clipping_eats_update",
              frozenset({"curve.lr_too_low", "curve.not_learning", "curve.plateau_at_chance",
                         "grad.update_ratio"}),
              "Nothing in this run shows a slow or flat loss from it so far (the curve and the "
              "update ratios would): info, not a warning."),
    # a loss with a floor (label smoothing, a penalty term) slows the curve only when the floor is
    # what holds it back: shown when a larger learning rate, tried on a copy, did not cure it
    Suspicion("overfit.loss_floor", frozenset(),
              "Nothing in this run shows that the floor holds the loss back (a slow loss that a "
              "larger learning rate, tried on a copy, does not cure): info, not a warning.",
              refuted_leads=_SLOW_LOSS),
    Suspicion("curve.overfitting", frozenset(),
              "Your callbacks monitor this validation loss (they stop the run or keep the best "
              "checkpoint): info, not a warning.", applies_if="handled_by"),
)}

_FINE_PREFIX = " Info: "


def _confirmed(f: Finding, rule: Suspicion, findings: Sequence[Finding]) -> bool:
    """Whether the run shows the trouble ``f`` predicts."""
    if _verified(f) or any(g.code in rule.refuted_leads and _refuted(g) for g in findings):
        return True
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


# --------------------------------------------------------------------------------------------
# The explanations (cause before symptom; docs/report.md)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Explanation:
    """One row of :data:`EXPLANATIONS`: the problems that explain the symptom ``code``.

    Attributes:
        code: the symptom (a finding code whose cause is usually elsewhere).
        explained_by: problem codes (error or warning) that explain it when in the same report.
        layered_numerics: also every ``numerics.*`` problem that names a ``layer`` (a localized
            NaN/Inf explains whatever it breaks).
        within_steps: an explaining finding counts only at the symptom's step or at most this
            many steps later (``None``: anywhere in the report).
        same_step: an explaining finding counts only at the symptom's own step.
        only_if: a further test of the explaining finding (its evidence, say).
        symptom_if: a test of the symptom itself (the row applies only when it holds).
    """

    code: str
    explained_by: frozenset[str]
    layered_numerics: bool = False
    within_steps: int | None = None
    same_step: bool = False
    only_if: Callable[[Finding], bool] | None = None
    symptom_if: Callable[[Finding], bool] | None = None

    def explains(self, symptom: Finding, g: Finding) -> bool:
        """Whether ``g`` (another finding of the report) explains ``symptom`` by this row (never
        when ``g``'s remedy, tried on a copy, did not cure it: the trial refuted it as a cause)."""
        if not g.is_problem or _refuted(g) or not (g.code in self.explained_by or (
                self.layered_numerics and g.stage == "numerics" and g.layer is not None)):
            return False
        if self.symptom_if is not None and not self.symptom_if(symptom):
            return False
        if self.within_steps is not None or self.same_step:
            if symptom.global_step is None or g.global_step is None:
                return False
            after = g.global_step - symptom.global_step
            if not (after == 0 if self.same_step else 0 <= after <= (self.within_steps or 0)):
                return False
        return self.only_if is None or self.only_if(g)


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


def _collapsed(g: Finding) -> bool:
    """A learning rate so high that the first updates killed the network (``curve.lr_too_high``
    whose evidence holds the ``collapse``: the loss blew up at the first steps, then sat at
    chance): the dead units it leaves behind are its symptoms."""
    return bool(g.evidence.get("collapse"))


def _update_ratio_below(g: Finding) -> bool:
    """A zero update stalls the curve: ``grad.update_ratio`` counts only far *below* ~1e-3."""
    return g.code != "grad.update_ratio" or g.evidence.get("direction") == "below"


# A broken update contract: the cause leads over what it shows as (an optimizer that does not
# step shows as a tiny update ratio; gradients that are never zeroed grow step after step).
_UPDATE_CAUSES = frozenset({
    "wiring.grads_not_zeroed", "wiring.optimizer_not_stepping",
    "wiring.params_changed_outside_step",
})
_NOT_ZEROED = frozenset({"wiring.grads_not_zeroed"})
# Parts of the model that never train though the run looks wired: layers in a plain list
# (unregistered, in no optimizer) and parts frozen at their random initialization. The rest of
# the model learns around them: a slow curve, a plateau, a probe that cannot memorize.
_UNTRAINED_PARTS = frozenset({"wiring.unregistered_params", "wiring.frozen_at_init"})
# ... and a loss fed probabilities (a sigmoid or softmax applied twice): it cannot fall below
# its floor, so the curve is slow or flat whatever the learning rate.
_CANNOT_LEARN = _UNTRAINED_PARTS | {"overfit.loss_on_probabilities"}
# An attention or pooling mask that reads the padding instead of the tokens (a mask inverted
# twice, `~mask` of a mask that already marks the pads): the model sees the wrong positions, so
# one batch cannot be memorized and the curve sits at chance.
_PADDING = frozenset({"structure.padding_leak"})
# What makes one batch impossible (or slow) to memorize.
_OVERFIT_CAUSES = frozenset({
    *_PADDING,
    "data.nonfinite_input", "data.nonfinite_target", "data.unnormalized_input",
    "data.tiny_input_scale",
    "data.constant_input", "data.target_out_of_range",
    "init.loss_above_chance",
    "wiring.no_grad_params", "wiring.zero_grad_params", "wiring.loss_detached",
    "wiring.params_not_in_optimizer", *_UPDATE_CAUSES, *_UNTRAINED_PARTS,
    "overfit.loss_on_probabilities",
    "structure.batch_mixing", "structure.shape_mismatch",
    "curve.lr_too_low", "curve.lr_too_high", "curve.diverging",
    "grad.vanishing", "grad.update_ratio",
    "numerics.nonfinite_loss", "numerics.precision_overflow",
})
# A zero update: what stalls the loss curve.
_NOT_LEARNING_CAUSES = frozenset({
    "data.constant_input", "data.tiny_input_scale", "data.nonfinite_input", "data.nonfinite_target",
    "wiring.no_grad_params", "wiring.zero_grad_params", "wiring.loss_detached",
    "wiring.params_not_in_optimizer", *_UPDATE_CAUSES, *_UNTRAINED_PARTS,
    "grad.vanishing", "grad.update_ratio",
    "numerics.nonfinite_loss", "numerics.precision_overflow",
})
# Clipping that keeps ~nothing of the gradient, and parameters frozen after the first steps,
# shrink the update: the cause of a slow or flat loss and of a tiny update-to-weight ratio
# (`grad.update_ratio` *below* ~1e-3 only). Not the overfit probe's verdicts: the probe on a
# copy does not clip.
_SHRUNK_UPDATE = frozenset({"grad.clipping_eats_update", "wiring.frozen_late"})
# Labels misaligned with the inputs (shifted twice, or not at all): the model learns another
# task, so a curve that looks slow or stuck at chance is its symptom.
_MISALIGNED_LABELS = frozenset({"structure.label_misaligned"})
# A blow-up at a step (numerics with a layer count too): a spike just before it is its start.
_BLOW_UPS = frozenset({"curve.diverging", "numerics.nonfinite_loss",
                       "numerics.precision_overflow"})
_SPIKES = ("curve.loss_spike", "grad.exploding", "grad.spike")

# Inputs far from unit scale: a cause of a slow, stuck or unstable curve once standardizing them,
# tried on a copy, cured it (the curve reading alone does not tell the two apart).
_INPUT_SCALE = frozenset({"data.unnormalized_input", "data.tiny_input_scale"})
_SCALE_CURVES = ("curve.not_learning", "curve.lr_too_low", "curve.lr_too_high", "curve.diverging",
                 "curve.plateau_at_chance")
# A loss with a floor (label smoothing, a penalty term, seen by the overfit probe): the cause of
# a curve that cannot fall, once a larger learning rate did not cure it (the suspicion's rule).
_LOSS_FLOOR = frozenset({"overfit.loss_floor"})
# A model that ends below a simple baseline (majority, nearest centroid, linear).
_BELOW_BASELINE = frozenset({"curve.below_baseline"})

#: The rows of :data:`EXPLANATIONS`, in the order they are tried: for one symptom, the first row
#: that finds an explaining finding in the report decides (a cause verified on a copy first, then
#: a broken update contract).
_EXPLANATION_ROWS: tuple[Explanation, ...] = (
    # a cause whose remedy was confirmed on a copy explains the curve it cured
    *(Explanation(code, _INPUT_SCALE, only_if=_verified) for code in _SCALE_CURVES),
    *(Explanation(code, _LOSS_FLOOR) for code in ("curve.lr_too_low", "curve.not_learning",
                                                  "curve.plateau_at_chance")),
    # a broken update contract explains its symptoms before anything else
    Explanation("grad.update_ratio", _UPDATE_CAUSES),
    Explanation("grad.exploding", _NOT_ZEROED),
    Explanation("grad.spike", _NOT_ZEROED),
    Explanation("curve.loss_spike", _NOT_ZEROED),
    Explanation("curve.lr_too_high", _NOT_ZEROED),
    Explanation("curve.diverging", _NOT_ZEROED),
    Explanation("curve.lr_too_low",
                _UPDATE_CAUSES | _SHRUNK_UPDATE | _MISALIGNED_LABELS | _CANNOT_LEARN),
    Explanation("grad.update_ratio", _SHRUNK_UPDATE | _UNTRAINED_PARTS,
                symptom_if=_update_ratio_below),
    Explanation("curve.not_learning", _SHRUNK_UPDATE | _MISALIGNED_LABELS | _CANNOT_LEARN),
    Explanation("curve.plateau_at_chance", _MISALIGNED_LABELS | _CANNOT_LEARN | _PADDING),
    Explanation("curve.not_learning", _PADDING),
    # then each symptom's own causes
    Explanation("overfit.failed", _OVERFIT_CAUSES, layered_numerics=True),
    Explanation("overfit.inconclusive", _OVERFIT_CAUSES, layered_numerics=True),
    Explanation("curve.not_learning", _NOT_LEARNING_CAUSES, layered_numerics=True,
                only_if=_update_ratio_below),
    Explanation("data.repeated_batch", frozenset({"data.shared_worker_rng"})),
    Explanation("curve.lr_too_low", frozenset({"grad.vanishing", "data.tiny_input_scale"})),
    Explanation("curve.diverging", frozenset({"numerics.precision_overflow",
                                              "numerics.nonfinite_forward"}),
                same_step=True, only_if=_overflowed_by_itself),
    *(Explanation(code, _BLOW_UPS, layered_numerics=True, within_steps=SPIKE_WINDOW)
      for code in _SPIKES),
    # a model below a simple baseline: explained by what stops it learning; it explains a flat
    # or stuck curve in turn (the model is not useless by chance, it learns less than a line)
    Explanation("curve.below_baseline", _NOT_LEARNING_CAUSES | _SHRUNK_UPDATE
                | _MISALIGNED_LABELS, layered_numerics=True),
    *(Explanation(code, _BELOW_BASELINE) for code in ("curve.not_learning",
                                                      "curve.plateau_at_chance")),
    # a network killed by its first updates sits at chance and ends below any baseline; the
    # learning rate, not the data or the wiring, is the cause
    *(Explanation(code, frozenset({"curve.lr_too_high"}), only_if=_collapsed)
      for code in ("curve.plateau_at_chance", "curve.below_baseline")),
    # a slow decline of a model that is mostly frozen is not a learning rate to raise
    Explanation("curve.lr_too_low", _BELOW_BASELINE, only_if=_mostly_frozen,
                symptom_if=lambda f: not _verified(f)),
)

#: The explanations: symptom code -> the rows that explain it, tried in order (see
#: :class:`Explanation`).
EXPLANATIONS: dict[str, tuple[Explanation, ...]] = {}
for _row in _EXPLANATION_ROWS:
    EXPLANATIONS[_row.code] = (*EXPLANATIONS.get(_row.code, ()), _row)
del _row

#: Warning and error codes that neither explain nor are explained by another finding: each
#: leads on its own when it is the first problem in protocol order. A new problem code is
#: either named in :data:`EXPLANATIONS` or listed here (``tests/test_ranking.py`` checks).
STANDALONE: frozenset[str] = frozenset({
    "data.class_imbalance", "data.duplicate_samples", "data.label_misalignment",
    "data.short_batches", "data.train_val_overlap",
    "data.ranks_same_data", "data.ranks_overlap", "data.order_not_reshuffled",
    "data.ranks_uneven_batches", "mode.unsynced_metric",
    "wiring.replicas_differ", "wiring.buffers_differ",
    "data.train_val_shift",
    "init.loss_below_chance",
    "wiring.frozen_batchnorm_in_train", "wiring.frozen_params_changed",
    "structure.causal_leak", "structure.target_leak",
    "mode.eval_loss_gap", "mode.nondeterministic_eval", "mode.train_mode_in_eval",
    "data.val_outlier", "mode.eval_broken_before_training",
    "curve.overfitting",
    "grad.dead_units",
    "triage.check_error",
})


def role(code: str) -> Role | None:
    """The part ``code`` plays in the ranking (``None``: none declared).

    A ``"symptom"`` has rows in :data:`EXPLANATIONS` (it may explain others too); a ``"cause"``
    is named by a row (a ``numerics.*`` code counts when a row takes the layered numerics
    findings); a ``"standalone"`` code is in :data:`STANDALONE`.

    Example:
        >>> role("overfit.failed"), role("wiring.no_grad_params"), role("structure.causal_leak")
        ('symptom', 'cause', 'standalone')
    """
    if code in EXPLANATIONS:
        return "symptom"
    if any(code in row.explained_by or (row.layered_numerics and code.startswith("numerics."))
           for row in _EXPLANATION_ROWS):
        return "cause"
    return "standalone" if code in STANDALONE else None


_EXPLAINED_PREFIX = " Explained by "


def _explainers(f: Finding, findings: Sequence[Finding]) -> list[str]:
    """The codes of the findings that explain ``f`` (empty: ``f`` is not explained)."""
    others = [g for g in findings if g is not f and g.code != f.code]
    for row in EXPLANATIONS.get(f.code, ()):
        found = [g for g in others if row.explains(f, g)]
        if found:
            codes: list[str] = []
            for g in sort_findings(found):
                if g.code not in codes:
                    codes.append(g.code)
            return codes
    return []


def explain_findings(findings: Sequence[Finding]) -> list[Finding]:
    """Set ``explained_by`` on the symptoms that another finding of the report explains.

    A symptom (a key of :data:`EXPLANATIONS`) whose cause is in the same report carries the
    cause's codes in ``explained_by``, its message says so, and it never leads the report (see
    :func:`start_here`). The rows, in the order they are tried (documented in docs/report.md):

    - a cause verified on a copy first: ``data.unnormalized_input`` or ``data.tiny_input_scale``
      whose remedy (inputs standardized) was confirmed explains ``curve.not_learning``,
      ``curve.lr_too_low``, ``curve.lr_too_high``, ``curve.diverging`` and
      ``curve.plateau_at_chance``; ``overfit.loss_floor`` (a warning only once a larger learning
      rate, tried on a copy, did not cure the slow loss) explains ``curve.lr_too_low``,
      ``curve.not_learning`` and ``curve.plateau_at_chance``.
    - then a broken update contract: ``wiring.grads_not_zeroed``, ``wiring.optimizer_not_stepping``
      or ``wiring.params_changed_outside_step`` explain ``grad.update_ratio`` and
      ``curve.lr_too_low``; gradients never zeroed explain ``grad.exploding``, ``grad.spike``,
      ``curve.loss_spike``, ``curve.lr_too_high`` and ``curve.diverging``.
    - ``overfit.failed`` and ``overfit.inconclusive``: explained by the problems that make one
      batch impossible (or slow) to memorize: non-finite, constant or unscaled inputs, class
      targets out of range, a step-0 loss far above chance, the ``wiring.*`` problems, a loss
      fed probabilities, outputs that mix examples or broadcast against the targets, the
      learning rate (``curve.lr_too_low``, ``curve.lr_too_high``, ``curve.diverging``,
      ``grad.update_ratio``), ``grad.vanishing`` and the localized numerics findings.
    - ``curve.not_learning``: explained by a zero update: the ``wiring.*`` problems, constant
      or non-finite data, ``grad.update_ratio`` far *below* ~1e-3, ``grad.vanishing``, the
      localized numerics findings.
    - ``data.repeated_batch``: explained by ``data.shared_worker_rng``.
    - ``curve.lr_too_low``, ``curve.not_learning``, ``grad.update_ratio`` (below): explained by
      ``grad.clipping_eats_update`` (the update shrinks with the clipped gradient) and by
      ``wiring.frozen_late`` (parameters frozen after the first steps stop moving);
      ``curve.lr_too_low``, ``curve.not_learning``, ``curve.plateau_at_chance``: explained by
      ``structure.label_misaligned`` (the model learns another task), and with
      ``grad.update_ratio`` (below) by parts of the model that never train:
      ``wiring.unregistered_params`` (layers in a plain list) and ``wiring.frozen_at_init``
      (a part frozen at its random initialization); both also explain ``overfit.failed``.
      ``overfit.loss_on_probabilities`` (a loss fed probabilities cannot fall below its floor)
      explains those curve findings too.
    - ``curve.loss_spike``, ``grad.exploding``, ``grad.spike``: explained by a blow-up (a
      localized numerics finding, ``numerics.nonfinite_loss``, ``curve.diverging``) at the
      same step or at most :data:`SPIKE_WINDOW` steps later.
    - ``curve.lr_too_low``: explained by ``grad.vanishing`` (the early layers barely move,
      whatever the learning rate) and by ``data.tiny_input_scale`` (inputs too small to move
      the first layer).
    - ``overfit.failed``, ``overfit.inconclusive``, ``curve.plateau_at_chance`` and
      ``curve.not_learning``: explained by ``structure.padding_leak`` (a mask that reads the
      padding instead of the tokens, e.g. inverted twice).
    - ``curve.plateau_at_chance`` and ``curve.below_baseline``: explained by a
      ``curve.lr_too_high`` that saw the network collapse at the first steps (evidence
      ``collapse``: the loss blew up, then sat at chance): the plateau is what it left.
    - ``curve.diverging``: explained, at its non-finite step, by ``numerics.precision_overflow``
      or by a ``numerics.nonfinite_forward`` whose module overflowed from modest inputs (the
      outputs before it all below :data:`MODEST_INPUT`): an ``exp`` or a division, not weights
      grown by the learning rate.

    A finding whose remedy was tried on a copy and did not cure its symptom explains nothing
    (the trial refuted it as a cause). Every other finding is a cause or context and is never
    explained. Explanations are one level deep and do not chain; the function is idempotent.

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


# --------------------------------------------------------------------------------------------
# The lead
# --------------------------------------------------------------------------------------------


def _standing(f: Finding) -> int:
    """Within a stage: a finding whose remedy was confirmed on a copy first (0), then the
    untried ones (1), then those whose remedy did not cure the symptom (2)."""
    return 0 if _verified(f) else 2 if _refuted(f) else 1


def _lead(ordered: Sequence[Finding]) -> str | None:
    """The lead of findings already explained and sorted (see :func:`start_here`)."""
    problems = [f for f in ordered if f.is_problem and f.stage in STAGES]
    # a finding whose remedy, tried on a copy, did not cure the symptom yields to the other
    # findings of its stage, a confirmed one goes first (docs/remedies.md)
    problems.sort(key=lambda f: (STAGES.index(f.stage), _standing(f)))
    for f in problems:
        if not f.explained_by:
            return f.code
    return problems[0].code if problems else None


def start_here(findings: Sequence[Finding]) -> str | None:
    """The code of the finding to fix first, or ``None``: cause before symptom, then protocol
    order (the findings' severities are taken as they are: see :func:`rank` for the report's
    whole policy).

    The first problem (error or warning) in protocol order that no other finding explains
    (see :func:`explain_findings`); within a stage, a finding whose remedy was confirmed on a
    copy first and one whose remedy was not confirmed after the others; if every problem is
    explained (explanations by findings that are not themselves problems cannot happen), the
    first problem.

    Example:
        >>> failed = Finding.create("overfit.failed", "could not overfit", check="T", global_step=0)
        >>> low = Finding.create("curve.lr_too_low", "slow decline", check="T", global_step=90)
        >>> start_here([failed, low])
        'curve.lr_too_low'
    """
    return _lead(sort_findings(explain_findings(findings)))


def rank(findings: Sequence[Finding]) -> tuple[list[Finding], str | None]:
    """The report's ranking: each unconfirmed suspicion made info (:func:`settle_suspicions`),
    each explained symptom marked (:func:`explain_findings`), the findings sorted by protocol
    stage then step (:func:`~lightning_triage.findings.sort_findings`), and the lead
    (:func:`start_here`: cause before symptom, a confirmed finding before an unconfirmed one of
    its stage).

    Returns:
        The findings in report order, and the code to start with (``None``: no problem).

    Example:
        >>> from lightning_triage.findings import Finding
        >>> failed = Finding.create("overfit.failed", "could not overfit", check="T", global_step=0)
        >>> low = Finding.create("curve.lr_too_low", "slow decline", check="T", global_step=90)
        >>> ordered, lead = rank([low, failed])
        >>> [f.code for f in ordered], ordered[0].explained_by, lead
        (['overfit.failed', 'curve.lr_too_low'], ['curve.lr_too_low'], 'curve.lr_too_low')
    """
    ordered = sort_findings(explain_findings(settle_suspicions(findings)))
    return ordered, _lead(ordered)


__all__ = [
    "EXPLANATIONS", "MODEST_INPUT", "SPIKE_WINDOW", "STANDALONE", "SUSPICIONS", "Explanation",
    "Role", "Suspicion", "explain_findings", "rank", "remedy_verdict", "role", "settle_suspicions",
    "start_here",
]
