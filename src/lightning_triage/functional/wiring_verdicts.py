"""Gradient wiring (stage 3): the verdicts of the first backward, with this run's numbers.

:func:`~lightning_triage.functional.wiring.analyze_wiring` says which parameters got no
gradient, an exactly zero one, or no optimizer; the rules here turn that into
:class:`~lightning_triage.functional.Verdict` values (the advice is each code's registry hint):

- :func:`detached_loss_verdict`: the loss has no ``grad_fn`` (``wiring.loss_detached``);
- :func:`wiring_verdicts`: one verdict per diagnosis of the first backward;
- :func:`zero_partner_verdict`: a zero gradient that a zero-valued partner (LoRA's ``lora_B``)
  explained at the first backward, still zero after some optimizer steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning_triage.functional.verdict import Verdict
from lightning_triage.functional.wiring import (
    ModuleGroup,
    WiringResult,
    describe_groups,
    group_by_module,
)

#: Parameter names listed in a finding's evidence, at most.
MAX_LISTED = 200


def group_evidence(groups: Sequence[ModuleGroup]) -> dict[str, Any]:
    """The evidence of a diagnosis over module groups: modules, parameters (at most
    :data:`MAX_LISTED`), how many tensors and values.

    Example:
        >>> group_evidence(group_by_module(["head.bias"], {"head.weight": 4, "head.bias": 2}))
        {'modules': ['head'], 'params': ['head.bias'], 'num_params': 1, 'numel': 2}
    """
    names = [n for g in groups for n in g.params]
    return {"modules": [g.module for g in groups], "params": names[:MAX_LISTED],
            "num_params": len(names), "numel": sum(g.numel for g in groups)}


def detached_loss_verdict(where: str, step: int | None, value: float, trainable: int,
                          frozen: int) -> Verdict:
    """``wiring.loss_detached``: the loss handed to the backward has no ``grad_fn``.

    Args:
        where: what produced the loss (```training_step```, the tensor passed to
            ``manual_backward``).
        step: the global step.
        value: the loss's value (its mean).
        trainable: trainable parameter tensors.
        frozen: frozen parameter tensors.

    Example:
        >>> detached_loss_verdict("`training_step`", 0, 2.3, 4, 0).message[:60]
        'The loss returned by `training_step` at step 0 has no `grad_'
    """
    also = f"; {frozen} parameter tensors are frozen" if frozen else ""
    return Verdict(
        "wiring.loss_detached", step,
        f"The loss returned by {where} at step {step} has no `grad_fn` "
        f"(requires_grad=False, value {value:.4g}): it is connected to none of the {trainable} "
        f"trainable parameter tensors{also}. The backward will fail or do nothing.",
        evidence={"requires_grad": False, "trainable_tensors": trainable,
                  "frozen_tensors": frozen})


def wiring_verdicts(result: WiringResult, step: int | None, *, backwards: int, optimizers: int,
                    report_frozen: bool = True, loss_detached: bool = True) -> list[Verdict]:
    """The verdicts of the first backward's wiring.

    Args:
        result: what :func:`~lightning_triage.functional.wiring.analyze_wiring` found.
        step: the global step of the first backward.
        backwards: the backward passes of that batch.
        optimizers: how many optimizers the run has.
        report_frozen: report frozen parameters (``wiring.frozen_params``, info).
        loss_detached: report a loss that reached no trainable parameter (``False`` when it was
            already reported, from its missing ``grad_fn``).

    Returns:
        ``wiring.loss_detached``, ``wiring.no_grad_params``, ``wiring.zero_grad_params``,
        ``wiring.params_not_in_optimizer`` and ``wiring.frozen_params`` verdicts, in this order,
        for the diagnoses that apply.

    Example:
        >>> from lightning_triage.functional.wiring import analyze_wiring
        >>> sizes = {"enc.weight": 8, "head.weight": 4}
        >>> result = analyze_wiring(sizes, {}, {"head.weight"}, {"head.weight"}, None)
        >>> [(v.code, v.layer) for v in wiring_verdicts(result, 0, backwards=1, optimizers=1)]
        [('wiring.no_grad_params', 'enc')]
    """
    trainable = len(result.trainable)
    verdicts = []
    if result.loss_detached and loss_detached:
        verdicts.append(Verdict(
            "wiring.loss_detached", step,
            f"{backwards} backward pass(es) at step {step} reached none of the {trainable} "
            "trainable parameter tensors: the loss depends on no trainable parameter (computed "
            "from detached tensors, or from inputs only).",
            evidence={"backwards": backwards, "trainable_tensors": trainable}))
    if result.no_grad:
        verdicts.append(Verdict(
            "wiring.no_grad_params", step,
            f"After the first backward (step {step}), {describe_groups(result.no_grad)} got no "
            "gradient (`.grad` is None) although `requires_grad=True`: their outputs do not "
            "reach the loss (`.detach()`, `torch.no_grad()`, a module defined but never called).",
            layer=result.no_grad[0].module or None, evidence=group_evidence(result.no_grad)))
    if result.zero_grad:
        verdicts.append(Verdict(
            "wiring.zero_grad_params", step,
            f"After the first backward (step {step}), the gradient of "
            f"{describe_groups(result.zero_grad)} is exactly zero everywhere: something blocks "
            "the path (a multiplication by zero, a mask, dead activations).",
            layer=result.zero_grad[0].module or None, evidence=group_evidence(result.zero_grad)))
    if result.not_in_optimizer:
        verdicts.append(Verdict(
            "wiring.params_not_in_optimizer", step,
            f"{describe_groups(result.not_in_optimizer)} receive gradients but belong to no "
            f"param group of the {optimizers} optimizer(s) returned by `configure_optimizers`: "
            "they are never updated.",
            layer=result.not_in_optimizer[0].module or None,
            evidence=group_evidence(result.not_in_optimizer)))
    if result.frozen_groups and report_frozen:
        frozen = sum(result.frozen.values())
        verdicts.append(Verdict(
            "wiring.frozen_params", step,
            f"{describe_groups(result.frozen_groups)} are frozen (`requires_grad=False`): "
            f"{frozen:,} of {frozen + sum(result.trainable.values()):,} values.",
            evidence={**group_evidence(result.frozen_groups),
                      "per_module": {g.module or "<model>": g.numel
                                     for g in result.frozen_groups}}))
    return verdicts


def zero_partner_verdict(still: Sequence[str], partners: Sequence[str],
                         unmoved: Sequence[str], step: int | None, steps: int,
                         universe: Mapping[str, int]) -> Verdict:
    """``wiring.zero_grad_params`` confirmed after ``steps`` optimizer steps: the gradient of
    ``still`` was exactly zero at the first backward beside all-zero ``partners`` (a
    zero-initialized adapter output such as LoRA's ``lora_B``), and still is.

    Args:
        still: the parameters whose gradient is still exactly zero.
        partners: their zero-valued partners at the first backward.
        unmoved: the partners that are still exactly zero.
        step: the step of the first backward.
        steps: optimizer steps since.
        universe: every trainable parameter and its number of values (for naming).

    Example:
        >>> v = zero_partner_verdict(["a.lora_A.weight"], ["a.lora_B.weight"],
        ...                          ["a.lora_B.weight"], 0, 5,
        ...                          {"a.lora_A.weight": 8, "a.lora_B.weight": 8})
        >>> v.layer, v.evidence["confirmed_after_steps"]
        ('a.lora_A', 5)
    """
    why = ("their zero-valued partners are still exactly zero: they never moved (a zero "
           "learning rate for the adapters' param group, an optimizer step that skips them?)"
           if unmoved else
           "their zero-valued partners moved, so the zero comes from elsewhere: something "
           "blocks the path (a multiplication by zero, a mask, dead activations)")
    groups = group_by_module(still, universe)
    partner_groups = group_by_module(partners, universe)
    return Verdict(
        "wiring.zero_grad_params", step,
        f"The gradient of {describe_groups(groups)} was exactly zero at the first backward "
        f"(step {step}) and still is after {steps} optimizer step(s); at step {step} that was "
        f"explained by the all-zero partner(s) {describe_groups(partner_groups)} (a "
        f"zero-initialized adapter output such as LoRA's `lora_B`), but {why}.",
        layer=groups[0].module or None,
        evidence={**group_evidence(groups), "partners": list(partners)[:MAX_LISTED],
                  "partners_still_zero": list(unmoved)[:MAX_LISTED],
                  "confirmed_after_steps": steps})


def shift_invariant_verdict(biases: Sequence[str], step: int | None,
                            universe: Mapping[str, int]) -> Verdict:
    """``wiring.zero_grad_params`` at **info**: the gradient of each of ``biases`` is exactly
    zero while its layer's weight got one: the loss is invariant to a constant shift of that
    layer's outputs (a pairwise margin or ranking loss on score differences, a batch norm right
    after the layer), so the bias cancels by symmetry; nothing blocks the path.

    Example:
        >>> v = shift_invariant_verdict(["score.bias"], 0, {"score.bias": 1, "score.weight": 8})
        >>> v.code, v.severity, v.layer
        ('wiring.zero_grad_params', 'info', 'score')
    """
    groups = group_by_module(biases, universe)
    return Verdict(
        "wiring.zero_grad_params", step,
        f"After the first backward (step {step}), the gradient of {describe_groups(groups)} is "
        "exactly zero while the weight of the same layer got one: the loss does not change when "
        "every output of that layer shifts by the same amount (a pairwise margin or ranking "
        "loss on score differences, a batch norm right after the layer), so the bias cancels by "
        "symmetry and cannot learn; harmless (`bias=False` drops it).",
        layer=groups[0].module or None, severity="info",
        evidence={**group_evidence(groups), "shift_invariant": True})


__all__ = ["MAX_LISTED", "detached_loss_verdict", "group_evidence", "shift_invariant_verdict",
           "wiring_verdicts",
           "zero_partner_verdict"]
