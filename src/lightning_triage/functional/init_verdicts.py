"""Stage 2 (init): the verdicts on the step-0 loss, with this run's numbers.

:func:`~lightning_triage.functional.chance.compare_to_chance` decides whether the step-0 loss
is far from the chance level; :func:`initial_loss_verdict` says so as a
:class:`~lightning_triage.functional.Verdict`, and :func:`chance_unknown_verdict` when there was
nothing to compare it with. The advice is each code's registry hint.
"""

from __future__ import annotations

from torch import Tensor

from lightning_triage.functional.chance import TASKS, ChanceLevel, compare_to_chance
from lightning_triage.functional.objective import Objective
from lightning_triage.functional.verdict import Verdict


def _shape(t: Tensor | None) -> str:
    return "none found" if t is None else f"{tuple(t.shape)} {t.dtype}"


def chance_unknown_verdict(output: Tensor | None, targets: Tensor | None, *,
                           compiled: bool = False) -> Verdict:
    """``init.chance_unknown``: the task (or the class count) could not be inferred from the
    model's output and the targets. The message names the arguments that were missing.

    Args:
        output: the model's output at step 0, if captured.
        targets: the targets of the first batch, if found.
        compiled: the output was not captured because the module is compiled as a whole.

    Example:
        >>> import torch
        >>> chance_unknown_verdict(torch.zeros(32, 64), None).message[:70]
        'Could not infer the task from the model output ((32, 64) torch.float32'
    """
    seen = _shape(output)
    if output is None and compiled:
        seen = ("not captured: the LightningModule is compiled as a whole, and a hook on it "
                "would change the compiled graph")
    return Verdict(
        "init.chance_unknown", 0,
        f"Could not infer the task from the model output ({seen}) and the targets "
        f"({_shape(targets)}), so the step-0 loss was not checked. Pass `task=` (one of "
        f"{', '.join(TASKS[1:])}) and `num_classes=` to check it.",
        evidence={"output_shape": None if output is None else list(output.shape),
                  "target_shape": None if targets is None else list(targets.shape)})


def objective_unknown_verdict(loss: float, objective: Objective) -> Verdict:
    """``init.chance_unknown`` (info): the step called loss functions, but no chance level is
    known for what it returned (a composite of weighted terms, a metric-learning or likelihood
    loss). The message names the objective.

    Example:
        >>> from lightning_triage.functional.loss_terms import LossCall
        >>> from lightning_triage.functional.objective import infer_objective
        >>> triplet = LossCall("triplet_margin_loss", 0.98, "metric", floor=0.0)
        >>> objective_unknown_verdict(0.98, infer_objective([triplet], 0.98)).message[:64]
        'The step-0 loss 0.98 is a metric-learning loss, which has no cha'
    """
    composite = objective.recognized and not objective.known
    why = ("the check cannot tell the share of each term" if composite
           else "which has no chance level this check knows")
    return Verdict(
        "init.chance_unknown", 0,
        f"The step-0 loss {loss:.4g} is {objective.describe()}, {why}: it was not compared "
        "with a chance level (integer labels in the batch do not make it a cross-entropy).",
        evidence={"objective": objective.describe(), "match": objective.match,
                  "loss_functions": [c.name for c in objective.calls][:8], "loss": loss})


def unrecognized_loss_verdict(loss: float, objective: Objective, level: ChanceLevel
                              ) -> Verdict:
    """``init.chance_unknown`` (info): the step was watched and called no loss function the
    check knows, nor a log-softmax (a hand-written metric-learning loss, a policy-gradient
    surrogate): the chance ``level`` the batch's shapes suggest is not this loss's.

    Example:
        >>> from lightning_triage.functional.chance import chance_level
        >>> from lightning_triage.functional.objective import Objective
        >>> v = unrecognized_loss_verdict(0.04, Objective(), chance_level("multiclass",
        ...                                                                num_classes=32))
        >>> v.code, v.message[:60]
        ('init.chance_unknown', 'The step-0 loss 0.04 was computed without a loss function th')
    """
    seen = "no softmax"
    if objective.compiled:
        seen = objective.describe()
    elif objective.log_probs:
        seen = (f"`{objective.log_probs[0]}` with a random draw per step "
                f"({', '.join(objective.draws[:3])}), as a sampled action or noise")
    return Verdict(
        "init.chance_unknown", 0,
        f"The step-0 loss {loss:.4g} was computed without a loss function the check recognizes "
        f"({seen}): the batch's shapes suggest {level.describe()}, but integer labels in the "
        "batch do not make a loss a cross-entropy, so it was not compared. Pass `task=` and "
        "`num_classes=` if the loss is one.",
        evidence={"objective": objective.describe(), "match": objective.match,
                  "shape_chance": level.describe(), "log_probs": list(objective.log_probs[:4]),
                  "draws": list(objective.draws[:4]), "loss": loss})


def initial_loss_verdict(loss: float, level: ChanceLevel, *, above_ratio: float = 2.0,
                         below_ratio: float = 0.5, peft: bool = False,
                         inferred: bool = False) -> Verdict | None:
    """Is the step-0 ``loss`` far above or below the chance ``level``?

    Args:
        loss: the step-0 training loss.
        level: the chance level of the task.
        above_ratio: see :func:`~lightning_triage.functional.chance.compare_to_chance`.
        below_ratio: see :func:`~lightning_triage.functional.chance.compare_to_chance`.
        peft: the model is a parameter-efficient fine-tune (peft adapters over a pretrained
            base): a loss below chance is expected (info).
        inferred: the task was inferred (for the evidence).

    Returns:
        ``init.loss_above_chance`` or ``init.loss_below_chance``, else ``None``.

    Example:
        >>> from lightning_triage.functional.chance import chance_level
        >>> v = initial_loss_verdict(33.9, chance_level("multiclass", num_classes=10))
        >>> v.code
        'init.loss_above_chance'
        >>> v.message
        'step-0 loss 33.9 is 14.7x the chance level ln(10) = 2.303 for 10 classes.'
    """
    result = compare_to_chance(loss, level, above_ratio=above_ratio, below_ratio=below_ratio)
    evidence = {"loss": loss, "chance": level.value, "ratio": result.ratio,
                "reference": result.reference, "task": level.task,
                "num_classes": level.num_classes, "prior_baseline": level.prior,
                "inferred": inferred}
    if result.verdict == "above":
        return Verdict("init.loss_above_chance", 0,
                       f"step-0 loss {loss:.4g} is {result.ratio:.1f}x the chance level "
                       f"{level.describe()}.", evidence=evidence)
    if result.verdict != "below":
        return None
    reference = (f"the chance level {level.describe()}" if level.task != "regression"
                 else "the smallest constant-prediction baseline")
    if level.task != "regression" and result.reference < level.value:
        reference = (f"the best constant predictor's loss {result.reference:.4g} "
                     f"(chance level {level.describe()})")
    if peft:  # a fine-tune starts from a pretrained base: doing well at step 0 is its point
        return Verdict("init.loss_below_chance", 0,
                       f"step-0 loss {loss:.4g} is only {result.ratio:.3f}x {reference}: "
                       "expected for a parameter-efficient fine-tune (peft adapters over a "
                       "pretrained base that already fits the task).",
                       severity="info", evidence={**evidence, "peft": True})
    return Verdict("init.loss_below_chance", 0,
                   f"step-0 loss {loss:.4g} is only {result.ratio:.3f}x {reference}: a fresh "
                   "model cannot do that well.", evidence=evidence)


__all__ = ["chance_unknown_verdict", "initial_loss_verdict", "objective_unknown_verdict",
           "unrecognized_loss_verdict"]

