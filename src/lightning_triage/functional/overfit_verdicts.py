"""Stage 4 (overfit) rules: the verdicts of :class:`~lightning_triage.OverfitBatchCheck`.

The check trains a copy of the model on a few examples and records what it saw in a
:class:`ProbeRun`; :func:`set_reference` derives the chance level, the near-zero target and a
probability floor from the probe's first step, and :func:`conclude_probe` turns the finished run
into the check's status and its :class:`~lightning_triage.functional.verdict.Verdict` objects
(``overfit.passed``, ``overfit.failed`` with the likely causes, ``overfit.inconclusive``,
``overfit.skipped``, ``overfit.loss_on_probabilities``).

Example:
    >>> run = ProbeRun(losses=[2.3, 1.0, 0.05], examples=4, target=0.115, optimizer="Adam(lr=0.001)")
    >>> out = conclude_probe(run, tolerance=0.05, max_steps=300, min_steps=30, time_budget=5.0)
    >>> out.ran, [v.code for v in out.verdicts]
    (True, ['overfit.passed'])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from lightning_triage.functional.chance import IGNORE_INDEX, chance_level, infer_task
from lightning_triage.functional.objective import Objective
from lightning_triage.functional.overfit import (
    OverfitVerdict,
    judge_curve,
    judge_memorization,
    near_zero_target,
    probability_floor,
)
from lightning_triage.functional.verdict import Verdict
from lightning_triage.functional.wiring import ModuleGroup, describe_groups

#: At most this many points of the probe's loss curve are kept (evidence and series).
MAX_CURVE_POINTS = 60


@dataclass
class ProbeRun:
    """What one overfit probe saw (kept for the finding's evidence and the report series)."""

    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    step_seconds: float = 0.0
    optimizer: str = ""
    fallback: str = ""
    examples: int = 0
    target: float = math.nan
    chance: float | None = None
    chance_text: str = ""
    floor: float | None = None
    targets: Tensor | None = None
    class_dim: int = -1
    all_right: bool | None = None
    #: the floor comes from a softmax in the loss code (the model returns logits)
    softmax_in_loss: bool = False
    #: the floor of `binary_cross_entropy_with_logits` fed probabilities, when its step-0 loss
    #: matches that reading (confirmed only by a probe that stalls on it), and where the
    #: sigmoid is ("model" or "loss")
    bce_floor: float | None = None
    bce_in: str = ""
    detached: bool = False
    stopped: str = ""
    #: `training_step` calls the probe made (on the copy, or in place)
    calls: int = 0
    #: "copy" or "in place: why"
    isolation: str = ""
    #: the user's exception that stopped the probe ("Type: message")
    error: str = ""
    no_grad: list[ModuleGroup] = field(default_factory=list)
    frozen: list[ModuleGroup] = field(default_factory=list)
    outside_optimizer: list[ModuleGroup] = field(default_factory=list)
    #: what the step optimizes, watched at the probe's first step
    objective: Objective | None = None
    #: the objective has no floor the probe can reach (named): a plateau is not judged
    no_floor: str = ""
    #: the objective's memorization floor (soft targets: their entropy), when above 0
    memorization_floor: float = 0.0
    #: the task the chance level was taken from ("" when none)
    task: str = ""


@dataclass
class ProbeConclusion:
    """The check's outcome: ``ran`` (its status follows its findings) or not (skipped or
    inconclusive), its ``detail``, the curve's ``outcome`` and the ``verdicts`` to report."""

    ran: bool
    detail: str
    verdicts: list[Verdict]
    outcome: OverfitVerdict | None = None
    curve: list[list[float]] = field(default_factory=list)


def _cross_entropy(output: Tensor, targets: Tensor, class_dim: int,
                   softmax_first: bool = False) -> float | None:
    """``F.cross_entropy`` of ``output`` taken as logits (of its softmax with
    ``softmax_first``), in float64; ``None`` when the shapes do not fit."""
    try:
        logits = output.detach().double()
        if class_dim != 1:
            logits = logits.movedim(class_dim, 1)
        if softmax_first:
            logits = torch.softmax(logits, dim=1)
        return float(F.cross_entropy(logits, targets.long(), ignore_index=IGNORE_INDEX))
    except (RuntimeError, ValueError, IndexError):
        return None


def matches_cross_entropy(output: Tensor, targets: Tensor, class_dim: int, loss: float) -> bool:
    """Whether ``loss`` is ``F.cross_entropy`` of ``output`` taken as logits.

    Example:
        >>> p, y = torch.tensor([[0.9, 0.1], [0.2, 0.8]]), torch.tensor([0, 1])
        >>> matches_cross_entropy(p, y, -1, float(F.cross_entropy(p, y)))
        True
    """
    ce = _cross_entropy(output, targets, class_dim)
    return ce is not None and abs(ce - loss) <= 1e-3 * max(1.0, abs(loss))


def softmax_in_loss(output: Tensor, targets: Tensor, class_dim: int, loss: float) -> bool:
    """Whether ``loss`` is ``F.cross_entropy`` of the softmax of ``output`` (logits): a softmax
    written in the loss code, ``F.cross_entropy(torch.softmax(logits, 1), y)``.

    Decided only when the two readings (logits, probabilities) are told apart: the loss must
    match the softmax reading to float precision and be clearly off the logits reading (a loss
    with an extra term, label smoothing or class weights matches neither).

    Example:
        >>> z, y = torch.randn(16, 10), torch.randint(0, 10, (16,))
        >>> softmax_in_loss(z, y, -1, float(F.cross_entropy(torch.softmax(z, 1), y)))
        True
        >>> softmax_in_loss(z, y, -1, float(F.cross_entropy(z, y)))
        False
    """
    as_logits = _cross_entropy(output, targets, class_dim)
    as_probs = _cross_entropy(output, targets, class_dim, softmax_first=True)
    if as_logits is None or as_probs is None or not math.isfinite(loss):
        return False
    scale = max(1.0, abs(loss))
    return abs(as_probs - loss) <= 1e-4 * scale and abs(as_logits - loss) > 2e-3 * scale


def _objective_reference(run: ProbeRun, start: float, objective: Objective,
                         tolerance: float) -> bool:
    """The chance level, floor and target of a known objective (``True``), or ``False`` when
    the objective does not decide them (composite, or no recognized loss call)."""
    if objective.fresh_draws or (objective.term is not None
                                 and objective.term.kind == "in_batch_negatives"):
        run.no_floor = objective.describe()
    if not objective.known:
        return False
    level = objective.chance_level()
    scale = abs(objective.scale)  # the loss is its one call times a constant
    chance = None if level is None or level.task == "regression" else level.value * scale
    run.chance = chance
    run.chance_text = level.describe() if chance is not None and level is not None else ""
    floor = (objective.floor_of_draw or 0.0) * scale  # every probe step has the same draw
    term = objective.term
    # soft targets (a mix, a teacher's probabilities) floor at their own entropy; label
    # smoothing on class indices is judged by its predictions at its plateau (below)
    soft = term is not None and term.kind == "soft_targets" \
        and not term.facts.get("label_smoothing")
    run.memorization_floor = floor if floor > 0 and soft else 0.0
    if level is not None and level.task == "regression":  # as below, against the variance
        variance = level.value * scale
        run.target = near_zero_target(start, min(variance, start) if start > 0 else variance,
                                      tolerance)
    else:
        run.target = run.memorization_floor + near_zero_target(start, chance, tolerance)
    return True


def bce_on_probabilities(output: Tensor, targets: Tensor, loss: float) -> tuple[float, str] | None:
    """Whether ``loss`` is ``binary_cross_entropy_with_logits`` of probabilities: of ``output``
    itself, all in ``[0, 1]`` (``"model"``: a sigmoid ends the model), or of its sigmoid, the
    loss clearly off the logits reading (``"loss"``: a sigmoid in the loss code). Returns the
    lowest loss reachable then (``ln 2`` for a 0 target, ``ln(1 + 1/e)`` for a 1 target,
    averaged over the targets) and where the sigmoid is; ``None`` otherwise.

    Example:
        >>> y = torch.tensor([1.0, 0.0, 1.0, 1.0])
        >>> p = torch.sigmoid(torch.randn(4))
        >>> floor, where = bce_on_probabilities(p, y, float(F.binary_cross_entropy_with_logits(p, y)))
        >>> round(floor, 3), where
        (0.408, 'model')
    """
    try:
        z = output.detach().double().reshape(targets.shape)
        y = targets.detach().double()
        as_logits = float(F.binary_cross_entropy_with_logits(z, y))
        as_probs = float(F.binary_cross_entropy_with_logits(torch.sigmoid(z), y))
    except (RuntimeError, ValueError):
        return None
    if not (math.isfinite(loss) and math.isfinite(as_logits) and math.isfinite(as_probs)):
        return None
    scale = max(1.0, abs(loss))
    positive = float(y.mean())
    floor = (1 - positive) * math.log(2) + positive * math.log1p(math.exp(-1))
    if float(z.min()) >= 0 and float(z.max()) <= 1 and abs(as_logits - loss) <= 1e-3 * scale:
        return floor, "model"
    if abs(as_probs - loss) <= 1e-4 * scale and abs(as_logits - loss) > 2e-3 * scale:
        return floor, "loss"
    return None


def _shape_reference(run: ProbeRun, start: float, targets: Tensor | None,
                     output: Tensor | None, *, task: str, num_classes: int | None,
                     tolerance: float) -> None:
    """The chance level and target from the task (inferred from the output's and the targets'
    shapes with ``task="auto"``)."""
    if task == "auto":
        inferred = infer_task(output, targets)
        task, inferred_classes = inferred if inferred is not None else ("", None)
        num_classes = num_classes or inferred_classes
    run.task = task
    chance = None
    try:
        if task in ("multiclass", "sequence", "binary") or (task == "regression"
                                                             and targets is not None):
            level = chance_level(task, num_classes=num_classes, targets=targets)
            chance, run.chance_text = level.value, level.describe()
    except ValueError:
        chance = None
    run.chance = chance
    # the regression loss is unknown (MSE scales with the variance, L1 with the spread):
    # measure "near zero" against the smaller of the start and the variance
    reference = min(chance, start) if task == "regression" and chance is not None \
        and start > 0 else chance
    run.target = near_zero_target(start, reference, tolerance)


def set_reference(run: ProbeRun, start: float, targets: Tensor | None, output: Tensor | None, *,
                  task: str, num_classes: int | None, tolerance: float,
                  objective: Objective | None = None) -> None:
    """Fill ``run``'s chance level, near-zero target and probability floor from the first step.

    Args:
        run: the probe's record (its ``chance``, ``chance_text``, ``target``, ``targets``,
            ``class_dim`` and ``floor`` are set).
        start: the first step's loss.
        targets: the probed batch's targets, if found.
        output: the model's last output at the first step, if captured.
        task: the task (``"auto"`` infers it from ``output`` and ``targets``).
        num_classes: the class count, if given.
        tolerance: "near zero" is this fraction of the chance level (or of ``start``).
        objective: what the step optimizes (watched at the first step): with ``task="auto"``,
            a known objective's chance level and floor decide (soft targets: "near zero" is
            above their entropy); one with no floor the probe can reach is noted.
    """
    known = objective is not None and task == "auto" and _objective_reference(
        run, start, objective, tolerance)
    if known:
        term = objective.term if objective is not None else None
        if term is not None and term.kind in ("binary", "multilabel"):
            task = "binary"
        elif term is None or term.kind not in ("multiclass", "sequence", "masked_lm"):
            return  # the probability floors below read scores against hard targets
        else:
            task = "multiclass" if term.kind == "multiclass" else "sequence"
    else:
        _shape_reference(run, start, targets, output, task=task, num_classes=num_classes,
                         tolerance=tolerance)
        task = run.task
    if output is not None and targets is not None and task in ("multiclass", "sequence"):
        class_dim = -1 if tuple(output.shape[:-1]) == tuple(targets.shape) else 1
        run.targets, run.class_dim = targets, class_dim
        floor = probability_floor(output, class_dim)
        if floor is not None and matches_cross_entropy(output, targets, class_dim, start):
            run.floor = floor
        elif floor is None and softmax_in_loss(output, targets, class_dim, start):
            run.floor = math.log(math.e + int(output.shape[class_dim]) - 1) - 1
            run.softmax_in_loss = True
    if output is not None and targets is not None and task == "binary" \
            and targets.is_floating_point():
        found = bce_on_probabilities(output, targets, start)
        if found is not None:
            run.bce_floor, run.bce_in = found


def skipped_verdict(why: str) -> Verdict:
    """``overfit.skipped``: the probe did not run (or stopped before it could be judged)."""
    return Verdict("overfit.skipped", 0, f"The overfit-one-batch probe was skipped: {why}.")


def _numeric_causes(run: ProbeRun, verdict: OverfitVerdict) -> list[str]:
    causes: list[str] = []
    if verdict.reason == "nonfinite":
        bad = next(i for i, v in enumerate(run.losses) if not math.isfinite(v))
        causes.append(f"the loss became {run.losses[bad]} at probe step {bad}: unstable "
                      "numerics or a learning rate too high (see `numerics.nonfinite_forward`"
                      ", `numerics.nonfinite_loss`, `curve.diverging`)")
    if run.floor is not None and verdict.reason in ("floor", "plateau", "max_steps"):
        where = ("the loss code applies a softmax to the model's logits before "
                 "cross-entropy" if run.softmax_in_loss else
                 "the model's outputs are probabilities (in [0, 1], summing to 1) and the "
                 "loss is cross-entropy over them")
        causes.append(
            f"loss bounded away from zero: {where}, which applies its own softmax and cannot "
            f"go below {run.floor:.3f}; pass logits to `F.cross_entropy` (or use "
            "`F.nll_loss(torch.log(p), y)`; see `overfit.loss_on_probabilities`)")
    if run.bce_floor is not None and verdict.verdict != "passed" \
            and verdict.best >= 0.9 * run.bce_floor:
        causes.append(
            "loss bounded away from zero: `binary_cross_entropy_with_logits` gets "
            f"probabilities and cannot go below {run.bce_floor:.3f}; drop the sigmoid before "
            "it (or use `binary_cross_entropy` on probabilities; see "
            "`overfit.loss_on_probabilities`)")
    return causes


def _wiring_causes(run: ProbeRun) -> list[str]:
    causes: list[str] = []
    if run.no_grad:
        causes.append(f"broken gradient path: {describe_groups(run.no_grad)} got no "
                      "gradient (see `wiring.no_grad_params`)")
    if run.outside_optimizer:
        causes.append(f"parameters missing from the optimizer: "
                      f"{describe_groups(run.outside_optimizer)} are in no param group (see "
                      "`wiring.params_not_in_optimizer`)")
    if run.frozen:
        causes.append(f"frozen layers: {describe_groups(run.frozen)} have "
                      "`requires_grad=False` (see `wiring.frozen_params`)")
    return causes


def overfit_causes(run: ProbeRun, verdict: OverfitVerdict) -> list[str]:
    """The likely causes of a failed probe, most likely first (never empty for a failure).

    Example:
        >>> v = judge_curve([2.3] * 10, target=0.115, steps_allowed=300)
        >>> overfit_causes(ProbeRun(losses=[2.3] * 10), v)[0][:24]
        'the loss never moved: a '
    """
    causes = _numeric_causes(run, verdict) + _wiring_causes(run)
    if verdict.reason == "rising":
        causes.append(f"the loss rose ({verdict.start:.4g} -> {verdict.final:.4g}): the "
                      f"learning rate of {run.optimizer} is too high for this model (see "
                      "`curve.lr_too_high`, `curve.diverging`)")
    if verdict.reason == "flat":
        causes.append("the loss never moved: a learning rate of 0 or an optimizer that does "
                      "not step (see `wiring.optimizer_not_stepping`, `grad.update_ratio`), or "
                      "an output that does not depend on the parameters (`curve.not_learning`)")
    if verdict.reason == "max_steps" and not causes:
        causes.append(
            f"slow progress: the loss fell only from {verdict.start:.4g} to "
            f"{verdict.best:.4g} in {verdict.steps} steps with {run.optimizer} (a learning "
            "rate too low for the probe (see `curve.lr_too_low`), vanishing gradients (see "
            "`grad.vanishing`), a model too small or too constrained, or a loss with a "
            "floor); raise `max_steps`/`overfit_max_steps` to tell them apart")
    if not causes and verdict.reason in ("plateau", "floor"):
        causes.append(
            f"loss bounded away from zero: it stopped at {verdict.best:.4g} with gradients "
            "reaching every parameter (a softmax/sigmoid before a loss that applies its own, "
            "label smoothing or a regularization term in the loss, targets that contradict "
            "each other, or a model too small or too constrained; see `structure.batch_mixing`, "
            "`structure.shape_mismatch`, `grad.vanishing`)")
    return causes


def _failed(run: ProbeRun, causes: list[str], evidence: dict[str, Any], cost: str, opt_text: str,
            target_text: str = "") -> tuple[str, Verdict]:
    losses = run.losses
    best, final = min(losses), losses[-1]
    evidence["causes"] = causes
    evidence["no_grad_modules"] = [g.module for g in run.no_grad]
    evidence["frozen_modules"] = [g.module for g in run.frozen]
    detail = (f"failed: loss {losses[0]:.4g} -> best {best:.4g} on {run.examples} "
              f"examples ({cost}, {opt_text})")
    target = f", target {target_text}" if target_text else ""
    return detail, Verdict(
        "overfit.failed", 0,
        f"Could not overfit {run.examples} examples of the first batch: loss "
        f"{losses[0]:.4g} -> best {best:.4g}, last {final:.4g} after {len(losses)} steps "
        f"({run.seconds:.2f} s, {opt_text}{target}). Likely cause: {causes[0]}."
        + (f" Also: {'; '.join(causes[1:])}." if len(causes) > 1 else ""),
        evidence=evidence,
    )


def _unfinished(run: ProbeRun, *, min_steps: int, time_budget: float) -> str | None:
    """Why a run that stopped before it could be judged was skipped, or ``None``."""
    if run.stopped == "error":
        return (f"the model's code raised {run.error} on the probe's "
                f"{run.examples} examples ({run.calls} `training_step` call(s) on "
                f"{'a copy of the model' if run.isolation == 'copy' else 'the model'})"
                "; the real step runs on the full batch and raises it if it recurs")
    if run.stopped == "no_loss":
        return "`training_step` returned no scalar loss on the probe batch"
    if run.stopped == "budget":
        return (f"one probe step takes {run.step_seconds:.3g} s, so {min_steps} "
                f"steps would exceed the {time_budget:g} s budget (raise `time_budget`/"
                f"`overfit_time_budget`, or lower `batch_size`/`overfit_batch_size`)")
    return None


#: A floor at least this share of the chance level (or of the probe's start loss) leaves the
#: loss little room to fall: ``overfit.loss_floor``.
HIGH_FLOOR = 0.5


def _high_floor(run: ProbeRun, verdict: OverfitVerdict) -> list[Verdict]:
    """``overfit.loss_floor`` when the floor the probe memorized on is high (see
    :data:`HIGH_FLOOR`); the ranking keeps it info unless a larger learning rate, tried on a copy,
    did not cure a slow loss (``ranking.SUSPICIONS``)."""
    ref = run.chance if run.chance is not None and run.chance > 0 else verdict.start
    if not (math.isfinite(ref) and ref > 0 and verdict.best >= HIGH_FLOOR * ref):
        return []
    what = "the chance level" if ref == run.chance else "its start"
    return [Verdict(
        "overfit.loss_floor", 0,
        f"The probe predicts every one of {run.examples} examples right, yet its loss settles at "
        f"{verdict.best:.4g} (from {verdict.start:.4g}), {verdict.best / ref:.0%} of {what} "
        f"{ref:.4g}: the loss can fall only {max(0.0, verdict.start - verdict.best):.3g} from "
        "where it starts.",
        evidence={"floor": verdict.best, "start": verdict.start, "reference": ref,
                  "reference_is": "chance" if ref == run.chance else "start",
                  "share": verdict.best / ref, "examples": run.examples})]


def _cannot_judge(run: ProbeRun, verdict: OverfitVerdict, *, cost: str, opt_text: str,
                  curve: list[list[float]]) -> ProbeConclusion | None:
    """``overfit.inconclusive`` (info) for a loss that settled above the target when the
    objective has no floor the probe can reach (a fresh draw per step, in-batch negatives):
    the probe cannot tell a floor from a failure there. A curve that never moved, rose or went
    non-finite, and a broken gradient path, still fail."""
    if not run.no_floor or verdict.verdict != "failed" or run.floor is not None \
            or verdict.reason not in ("plateau", "max_steps", "floor") or _wiring_causes(run):
        return None
    return ProbeConclusion(False, (
        f"not judged: {run.no_floor}; loss {verdict.start:.4g} -> {verdict.best:.4g} on a fixed "
        f"draw ({cost}, {opt_text})"), [Verdict(
            "overfit.inconclusive", 0,
            f"The probe cannot judge this objective, {run.no_floor}: it has no memorization "
            f"floor the probe knows. On {run.examples} examples with the same draw at every "
            f"step the loss went from {verdict.start:.4g} to {verdict.best:.4g} in "
            f"{verdict.steps} steps ({run.seconds:.2f} s, {opt_text}) and settled above "
            f"{run.target:.3g}.",
            evidence={"objective": run.no_floor, "start": verdict.start, "best": verdict.best,
                      "steps": verdict.steps, "reason": verdict.reason, "curve": curve,
                      "target": run.target})], verdict, curve)


def _judged(run: ProbeRun, verdict: OverfitVerdict, evidence: dict[str, Any], *, cost: str,
            opt_text: str, target_text: str) -> ProbeConclusion:
    """The conclusion for a run whose curve was judged (not detached)."""
    n = len(run.losses)
    if verdict.verdict == "passed" and verdict.reason == "memorized_floor":
        return ProbeConclusion(True, (
            f"passed: every probed example predicted right; loss {verdict.start:.4g}"
            f" -> {verdict.best:.4g}, a floor ({cost}, {opt_text})"), [Verdict(
                "overfit.passed", 0,
                f"Memorized {run.examples} examples of the first batch: every one is predicted "
                f"right after {n} steps ({run.seconds:.2f} s, {opt_text}), and the loss "
                f"settled on a plateau at {verdict.best:.4g} (from {verdict.start:.4g}), above the "
                f"target {target_text}: the loss has a floor (label smoothing, a regularization "
                "term), which is not a failure to learn.",
                evidence=evidence), *_high_floor(run, verdict)])
    if verdict.verdict == "passed":
        floor = [*_high_floor(run, verdict)] if run.memorization_floor else []
        return ProbeConclusion(True, (
            f"passed: loss {verdict.start:.4g} -> {verdict.best:.4g} on "
            f"{run.examples} examples ({cost}, {opt_text})"), [Verdict(
                "overfit.passed", 0,
                f"Memorized {run.examples} examples of the first batch in {n} steps "
                f"({run.seconds:.2f} s, {opt_text}): loss {verdict.start:.4g} -> "
                f"{verdict.best:.4g}, below the target {target_text}.",
                evidence=evidence), *floor])
    if verdict.verdict == "inconclusive":
        why = "the time budget ran out" if run.stopped == "time" else "the steps ran out"
        return ProbeConclusion(False, (
            f"inconclusive: loss {verdict.start:.4g} -> {verdict.best:.4g}, still "
            f"falling when {why} ({cost}, {opt_text})"), [Verdict(
                "overfit.inconclusive", 0,
                f"The loss on {run.examples} examples fell from {verdict.start:.4g} to "
                f"{verdict.best:.4g} in {n} steps ({run.seconds:.2f} s, {opt_text}) "
                f"and was still falling when {why}, above the target {target_text}.",
                evidence=evidence)])
    detail, failed = _failed(run, overfit_causes(run, verdict), evidence, cost, opt_text,
                             target_text)
    return ProbeConclusion(True, detail, [failed])


def conclude_probe(run: ProbeRun, *, tolerance: float, max_steps: int, min_steps: int,
                   time_budget: float) -> ProbeConclusion:
    """The check's status, detail and verdicts for a finished probe.

    Args:
        run: what the probe saw.
        tolerance: the check's ``tolerance`` (named in the target's description).
        max_steps: the probe's step limit (a curve that used it up without progress fails).
        min_steps: the check's ``min_steps`` (named when the budget skipped the probe).
        time_budget: the check's ``time_budget`` in seconds.
    """
    losses = run.losses
    curve = [[float(i), v] for i, v in enumerate(losses)][::max(1, len(losses) //
                                                                MAX_CURVE_POINTS + 1)]
    cost = f"{len(losses)} steps, {run.seconds:.2f} s, {run.calls} `training_step` calls"
    why = _unfinished(run, min_steps=min_steps, time_budget=time_budget)
    if why is not None:
        detail = f"skipped: {why}" + (f" ({cost})" if run.stopped == "budget" else "")
        return ProbeConclusion(False, detail, [skipped_verdict(why)], curve=curve)
    evidence: dict[str, Any] = {
        "examples": run.examples, "steps": len(losses), "seconds": round(run.seconds, 4),
        "optimizer": run.optimizer, "target": run.target, "chance": run.chance,
        "curve": curve, "start": losses[0] if losses else None,
        "tolerance": tolerance, "training_step_calls": run.calls,
        "isolation": run.isolation,
    }
    if run.fallback:
        evidence["optimizer_fallback"] = run.fallback
    opt_text = run.optimizer + (f" ({run.fallback})" if run.fallback else "")
    if run.detached:
        outcome = OverfitVerdict("failed", "detached", losses[0], losses[0], losses[0], 1,
                                 run.target)
        causes = ["loss not connected: the loss returned by `training_step` has no "
                  "`grad_fn`, so nothing can be trained (see `wiring.loss_detached`)"]
        detail, failed = _failed(run, causes, evidence, cost, opt_text)
        return ProbeConclusion(True, detail, [failed], outcome, curve)
    # a probability floor is the bug itself: right predictions do not excuse it
    verdict = judge_memorization(judge_curve(losses, run.target, max_steps, floor=run.floor),
                                 run.all_right if run.floor is None else None)
    evidence.update(best=verdict.best, final=verdict.final, reason=verdict.reason,
                    floor=run.floor, all_predictions_right=run.all_right)
    target_text = (f"{run.target:.3g} ({tolerance:g}x chance {run.chance_text})"
                   if run.chance else f"{run.target:.3g} ({tolerance:g}x the start)")
    if run.memorization_floor:
        target_text = (f"{run.target:.3g} (the targets' own floor {run.memorization_floor:.4g} "
                       f"+ {target_text.split(' (', 1)[1]}")
        evidence["memorization_floor"] = run.memorization_floor
    if run.objective is not None and run.objective.recognized:
        evidence["objective"] = run.objective.describe()
    unjudged = _cannot_judge(run, verdict, cost=cost, opt_text=opt_text, curve=curve)
    if unjudged is not None:
        return unjudged
    floor: list[Verdict] = []
    if run.floor is not None:
        seen = ("The model's outputs on the probed batch are logits, but the step-0 loss "
                f"({verdict.start:.6g}) equals `F.cross_entropy` of their softmax, not of "
                "them: a softmax is applied inside the loss computation"
                if run.softmax_in_loss else
                "The model's outputs on the probed batch are already probabilities (in [0, 1], "
                "summing to 1 over the classes) and the step-0 loss equals `F.cross_entropy` "
                "of them taken as logits")
        floor.append(Verdict(
            "overfit.loss_on_probabilities", 0,
            f"{seen}: the loss applies its own log-softmax to probabilities and cannot go "
            f"below {run.floor:.3f} (the probe's best: {verdict.best:.4g}); its gradients "
            "are squashed too.",
            evidence={"floor": run.floor, "best": verdict.best, "start": verdict.start,
                      "softmax_in": "loss" if run.softmax_in_loss else "model"}))
    if run.bce_floor is not None and verdict.verdict != "passed" \
            and verdict.best >= 0.9 * run.bce_floor:  # the probe stalled on that floor
        where = ("a sigmoid in the loss code turns the model's logits into probabilities"
                 if run.bce_in == "loss" else
                 "the model's outputs are already probabilities (all in [0, 1])")
        floor.append(Verdict(
            "overfit.loss_on_probabilities", 0,
            f"The step-0 loss ({verdict.start:.6g}) equals "
            f"`binary_cross_entropy_with_logits` of probabilities: {where}, and the loss "
            f"applies its own sigmoid, so it cannot go below {run.bce_floor:.3f} (the probe's "
            f"best: {verdict.best:.4g}); its gradients are squashed too.",
            evidence={"floor": run.bce_floor, "best": verdict.best, "start": verdict.start,
                      "sigmoid_in": run.bce_in, "loss": "binary_cross_entropy_with_logits"}))
    out = _judged(run, verdict, evidence, cost=cost, opt_text=opt_text, target_text=target_text)
    return ProbeConclusion(out.ran, out.detail, floor + out.verdicts, verdict, curve)


__all__ = [
    "MAX_CURVE_POINTS",
    "ProbeConclusion",
    "ProbeRun",
    "bce_on_probabilities",
    "conclude_probe",
    "matches_cross_entropy",
    "overfit_causes",
    "set_reference",
    "skipped_verdict",
]
