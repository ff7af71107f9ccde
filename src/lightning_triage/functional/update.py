"""The contracts of the update (stage 3, wiring): rules over what the first steps showed.

Four contracts of the training loop that leave the data, the loss and the gradients plausible
when they break, each a rule returning :class:`~lightning_triage.functional.Verdict`:

- :func:`zeroing_verdict`: an optimizer steps on gradients that were not zeroed since its
  previous step (``wiring.grads_not_zeroed``), unless the zeroing is a regular accumulation.
- :func:`stepping_verdict`: ``optimizer.step()`` runs (or Lightning counts a step) and the
  parameters with gradients do not move (``wiring.optimizer_not_stepping``).
- :func:`outside_change_verdicts`: trainable parameters change between one optimizer step and
  the next (``wiring.params_changed_outside_step``).
- :func:`frozen_change_verdict` and :func:`frozen_running_stats_verdict`: frozen parameters
  that change (``wiring.frozen_params_changed``) and running statistics of frozen parts that
  keep moving (``wiring.frozen_batchnorm_in_train``).

The inputs are per-tensor norms (:func:`tensor_norms`: one fused kernel per device and dtype)
read at a few points of each step; a parameter *changed* between two points when its norm did.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from lightning_triage._torch_compat import foreach_norms
from lightning_triage.functional.verdict import Verdict
from lightning_triage.functional.wiring import describe_groups, group_by_module

#: Consecutive optimizer steps that moved nothing before ``wiring.optimizer_not_stepping``.
STALLED_STEPS = 5
#: A phase whose changes are seen at least this often, at every occurrence, is consistent (a
#: projection such as weight clipping), not a reset.
CONSISTENT_AFTER = 3
#: Phase names of :class:`Change`; a change "in forward" is never a projection.
FORWARD = "between the start of the batch and the backward (a batch-start hook or the forward)"

GradState = Literal["ok", "none", "nonfinite"]


#: Dtypes read by the fused kernel into float32 norms.
_FUSED = (torch.float16, torch.bfloat16, torch.float32)


def _real_values(t: Tensor) -> Tensor:
    """The real values of ``t`` that its L2 norm is over: the stored values of a sparse
    tensor, the dequantized values of a quantized one, the real view of a complex one."""
    if t.is_quantized:
        t = t.dequantize()
    if t.layout == torch.sparse_coo:
        t = t.coalesce().values()
    elif t.layout != torch.strided:
        t = t.values()
    return torch.view_as_real(t) if t.is_complex() else t


def tensor_norms(tensors: Sequence[Tensor | None]) -> Tensor:
    """The L2 norm of each tensor (``0`` for ``None``), stacked on the first one's device:
    one fused ``foreach`` kernel for the half and single precision tensors, no host sync, no
    autograd. The norms are float32, or float64 when a tensor is float64 or complex128 (a
    float64 model's small updates stay visible); sparse, complex, quantized, integer and
    boolean tensors are read one by one.

    Example:
        >>> tensor_norms([torch.ones(4), None, torch.zeros(2)]).tolist()
        [2.0, 0.0, 0.0]
        >>> tensor_norms([torch.tensor([3 + 4j]), torch.tensor([3, 4])]).tolist()
        [5.0, 5.0]
    """
    present = [t.detach() for t in tensors if t is not None and t.numel()]
    device = present[0].device if present else torch.device("cpu")
    wide = any(t.dtype in (torch.float64, torch.complex128) for t in present)
    dtype = torch.float64 if wide else torch.float32
    with torch.no_grad():
        fused = [t for t in present if t.layout == torch.strided and t.dtype in _FUSED]
        norms = iter(foreach_norms(fused, 2, dtype=torch.float32) if fused else ())
        zero = torch.zeros((), dtype=dtype, device=device)
        out = []
        for t in tensors:
            if t is None or not t.numel():
                out.append(zero)
            elif t.layout == torch.strided and t.dtype in _FUSED:
                out.append(next(norms).to(device, dtype))
            else:  # float64, sparse, complex, quantized, integer: no fused float32 kernel
                values = _real_values(t.detach())
                out.append(torch.linalg.vector_norm(values.to(dtype)).to(device))
        return torch.stack(out) if out else zero.reshape(0)


def _names(params: Iterable[str], universe: Mapping[str, int], limit: int = 4) -> str:
    return describe_groups(group_by_module(params, universe), limit=limit)


def _first_module(params: Iterable[str], universe: Mapping[str, int]) -> str | None:
    groups = group_by_module(params, universe)
    return (groups[0].module or None) if groups else None


# ---------------------------------------------------------------------- 1. zeroing
def _regular_period(clean: Sequence[bool]) -> int | None:
    """The period ``k >= 2`` when the clean steps (index 0 counts as clean) are equally spaced
    ``k`` apart up to the end of ``clean``, else ``None``."""
    at = [0, *(i for i, c in enumerate(clean) if c and i)]
    gaps = {b - a for a, b in itertools.pairwise(at)}
    period = gaps.pop() if len(gaps) == 1 else None
    if period is None or period < 2 or len(clean) - 1 - at[-1] >= period:
        return None
    return period


def zeroing_verdict(optimizer: str, steps: Sequence[int], clean: Sequence[bool],
                    stale: Sequence[str], universe: Mapping[str, int]) -> Verdict | None:
    """Did ``optimizer`` step on gradients left over from before its previous step?

    Args:
        optimizer: how the optimizer is named in the message (``"optimizer 0 (SGD)"``).
        steps: the global step of each of its steps, in order (the first one included).
        clean: for each step, whether every parameter it updated had a zero (or ``None``)
            gradient at some backward since its previous step (the first step: ``True``).
        stale: the parameters seen with leftover gradients at the first step that was not
            clean.
        universe: every parameter of the optimizer and its number of values (for naming).

    Returns:
        ``None`` when every step was clean, or when the clean steps are equally spaced (a
        deliberate accumulation over ``k`` steps); else a ``wiring.grads_not_zeroed`` verdict
        at the first step that was not.

    Example:
        >>> zeroing_verdict("optimizer 0 (SGD)", [0, 1, 2, 3], [True, False, True, False], [],
        ...                 {}) is None  # zeroed every second step: accumulation
        True
        >>> v = zeroing_verdict("optimizer 0 (SGD)", [0, 1, 2, 3], [True, False, False, False],
        ...                     ["w"], {"w": 4})
        >>> v.code, v.step
        ('wiring.grads_not_zeroed', 1)
    """
    bad = [i for i, c in enumerate(clean) if not c and i]
    if not bad or _regular_period(clean) is not None:
        return None
    first = steps[bad[0]]
    never = len(bad) == len(clean) - 1
    pattern = ("at none of its steps after the first" if never else
               f"at {len(clean) - 1 - len(bad)} of its {len(clean) - 1} steps after the first, "
               "not at regular intervals")
    message = (f"The gradients of {optimizer} were not zeroed between its steps: from step "
               f"{first} on, the backward added to the gradients of the previous step "
               f"({pattern}; {len(clean)} steps seen). Affected: {_names(stale, universe)}.")
    return Verdict("wiring.grads_not_zeroed", first, message,
                   layer=_first_module(stale, universe),
                   severity="error" if never else "warning",
                   evidence={"optimizer": optimizer, "steps": list(steps), "zeroed": list(clean),
                             "params": list(stale)[:50]})


# ---------------------------------------------------------------------- 2. stepping
@dataclass(frozen=True)
class StepRecord:
    """One optimizer step as the contracts saw it.

    Attributes:
        step: the global step.
        called: whether the optimizer's step was reached (``on_before_optimizer_step``); a
            step that Lightning counted without it is ``False``.
        grads: ``"ok"`` (finite, some non-zero), ``"none"`` (all ``None`` or zero: no
            backward, e.g. ``training_step`` returned ``None``), ``"nonfinite"`` (a step a
            gradient scaler skips: neither evidence of a stall nor of progress).
        moved: whether a parameter with a finite non-zero gradient changed during the step.
        lr: the largest learning rate of the optimizer's param groups.
    """

    step: int
    called: bool
    grads: GradState
    moved: bool
    lr: float

    @property
    def stalled(self) -> bool:
        return self.grads != "nonfinite" and not (self.called and self.grads == "ok"
                                                  and self.moved)


def _cause(run: Sequence[StepRecord]) -> tuple[str, str]:
    if not any(r.called for r in run):
        return "not_called", ("`optimizer.step()` was not reached at these steps, although "
                              "Lightning counted them (an `optimizer_step` override that "
                              "runs the closure but not `optimizer.step`?)")
    if all(r.grads == "none" for r in run):
        return "skipped", ("no gradient reached the optimizer at these steps: every step was "
                           "skipped (`training_step` returned `None`, or no backward ran)")
    if all(r.lr == 0.0 for r in run):
        return "zero_lr", "its learning rate is 0 at these steps (an LR scheduler set it to 0?)"
    return "no_effect", ("its step ran on finite, non-zero gradients with a learning rate "
                         f"of {run[-1].lr:.3g} and left the parameters exactly unchanged (a "
                         "step function replaced by a no-op, a stale compiled step?)")


def stepping_verdict(optimizer: str, records: Sequence[StepRecord],
                     consecutive: int = STALLED_STEPS) -> Verdict | None:
    """Did ``optimizer`` stop moving the parameters for ``consecutive`` steps in a row?

    A step *stalls* when it is not reached, has no gradient, or leaves every parameter with a
    finite non-zero gradient unchanged; a step with non-finite gradients (skipped by a
    gradient scaler) breaks a run. One skipped batch or one zero-LR warm-up step is silent.

    Returns:
        A ``wiring.optimizer_not_stepping`` verdict at the first stalled step of the first run
        of ``consecutive`` stalled steps (its ``evidence["cause"]``: ``"not_called"``,
        ``"skipped"``, ``"zero_lr"`` or ``"no_effect"``), else ``None``.

    Example:
        >>> ok = [StepRecord(s, True, "ok", True, 0.1) for s in range(3)]
        >>> stuck = [StepRecord(s, True, "ok", True, 0.0) for s in range(3, 8)]
        >>> stepping_verdict("optimizer 0 (SGD)", ok + stuck) is None  # moved: LR is not 0
        True
        >>> stuck = [StepRecord(s, True, "ok", False, 0.0) for s in range(3, 8)]
        >>> v = stepping_verdict("optimizer 0 (SGD)", ok + stuck)
        >>> v.step, v.evidence["cause"]
        (3, 'zero_lr')
    """
    run: list[StepRecord] = []
    for record in records:
        run = [*run, record] if record.stalled else []
        if len(run) == consecutive:
            cause, why = _cause(run)
            moved_before = sum(r.moved for r in records if r.step < run[0].step)
            message = (f"{optimizer} stopped moving the parameters at step {run[0].step}: "
                       f"{consecutive} steps in a row ({run[0].step}-{run[-1].step}) changed "
                       f"nothing; {why}. Steps before that which moved them: {moved_before}.")
            return Verdict("wiring.optimizer_not_stepping", run[0].step, message,
                           evidence={"optimizer": optimizer, "cause": cause,
                                     "steps": [r.step for r in run],
                                     "lr": [r.lr for r in run],
                                     "grads": [r.grads for r in run]})
    return None


# ---------------------------------------------------------------------- 3. and 4. changes
@dataclass(frozen=True)
class Change:
    """Parameters whose norm changed between two points of a step.

    Attributes:
        step: the global step.
        phase: where it happened (``"between batches"``, :data:`FORWARD`, ``"during the step of
            optimizer 0 (SGD)"`` ...).
        params: the names of the parameters that changed.
        rel: the largest relative change of a norm, ``|after - before| / before``.
        toward_init: whether the changed norms moved back toward their values at the start.
    """

    step: int
    phase: str
    params: tuple[str, ...]
    rel: float
    toward_init: bool = False


def outside_change_verdicts(changes: Sequence[Change], seen: Mapping[str, int],
                            universe: Mapping[str, int]) -> list[Verdict]:
    """Trainable parameters that changed outside the optimizer step, one verdict per phase.

    Args:
        changes: the changes seen in the window, in order.
        seen: how many times each phase was observed in the window (changed or not).
        universe: every trainable parameter and its number of values (for naming).

    Returns:
        ``wiring.params_changed_outside_step`` verdicts at the first change of each phase: a
        warning for a change during the forward and for occasional changes (a
        re-initialization, a ``load_state_dict``, an EMA written into the weights); info for
        a change at every occurrence of its phase (a projection such as weight clipping).

    Example:
        >>> every = [Change(s, "after the step", ("w",), 1e-3) for s in range(4)]
        >>> [v.severity for v in outside_change_verdicts(every, {"after the step": 4}, {"w": 4})]
        ['info']
        >>> once = [Change(6, "between batches", ("w",), 0.4, toward_init=True)]
        >>> [v.severity for v in outside_change_verdicts(once, {"between batches": 9}, {"w": 4})]
        ['warning']
    """
    verdicts: list[Verdict] = []
    for phase in dict.fromkeys(c.phase for c in changes):
        mine = [c for c in changes if c.phase == phase]
        names = list(dict.fromkeys(n for c in mine for n in c.params))
        times = seen.get(phase, len(mine))
        projection = phase != FORWARD and len(mine) == times >= CONSISTENT_AFTER
        if projection:
            kind = ("at every occurrence, consistently: a projection such as weight clipping "
                    "or normalization, if deliberate")
        elif any(c.toward_init for c in mine):
            kind = "back toward their initial scale: a re-initialization or a reload?"
        else:
            kind = ("not at every step: a re-initialization, a `load_state_dict` or an EMA "
                    "copied into the weights?")
        message = (f"{_names(names, universe)} changed {phase}, outside the optimizer step, "
                   f"at step {mine[0].step} ({len(mine)} of {times} times in the first steps; "
                   f"largest relative change of a norm {max(c.rel for c in mine):.3g}): {kind}.")
        verdicts.append(Verdict(
            "wiring.params_changed_outside_step", mine[0].step, message,
            layer=_first_module(names, universe), severity="info" if projection else "warning",
            evidence={"phase": phase, "steps": [c.step for c in mine][:50], "times_seen": times,
                      "rel_change": [c.rel for c in mine][:50], "params": names[:50],
                      "projection": projection}))
    return verdicts


def _consistent(phase: str, changes: Sequence[Change], seen: Mapping[str, int]) -> bool:
    """Whether ``phase`` changed at every one of its (at least :data:`CONSISTENT_AFTER`)
    occurrences, outside the forward and the optimizer steps."""
    mine = sum(c.phase == phase for c in changes)
    return phase != FORWARD and not phase.startswith("during the step") \
        and mine == seen.get(phase, -1) >= CONSISTENT_AFTER


def frozen_change_verdict(changes: Sequence[Change], universe: Mapping[str, int],
                          seen: Mapping[str, int] | None = None,
                          pinned: Collection[str] = ()) -> Verdict | None:
    """Frozen parameters (``requires_grad=False`` or in no optimizer) whose values changed.

    Args:
        changes: the changes of frozen parameters seen in the window, in order.
        universe: every parameter and its number of values (for naming).
        seen: how many times each phase was observed in the window (changed or not).
        pinned: parameters that must never change, whatever the pattern: the frozen base of
            a parameter-efficient fine-tune (peft), which is no EMA copy.

    Returns:
        A ``wiring.frozen_params_changed`` verdict at the first change, naming the parameters
        and where they changed (during an optimizer's step: weight decay or momentum applied
        through a leftover ``.grad``), or ``None``. Info when every phase that changed them
        did so at each of its occurrences, between steps (a copy updated every step on
        purpose: an EMA of the weights, a mean teacher), unless a changed parameter is
        ``pinned``.

    Example:
        >>> v = frozen_change_verdict([Change(2, "during the step of optimizer 0 (AdamW)",
        ...                                   ("backbone.weight",), 0.01)],
        ...                           {"backbone.weight": 16, "head.weight": 4})
        >>> v.code, v.layer
        ('wiring.frozen_params_changed', 'backbone')
    """
    if not changes:
        return None
    names = list(dict.fromkeys(n for c in changes for n in c.params))
    phases = list(dict.fromkeys(c.phase for c in changes))
    by_step = any(p.startswith("during the step") for p in phases)
    base = [n for n in names if n in pinned]
    every = not base and seen is not None and all(_consistent(p, changes, seen) for p in phases)
    why = (" They are the frozen base of a parameter-efficient fine-tune (peft): only the "
           "adapters may change (code that writes to the base weights, a weight decay or merge "
           "applied to every parameter?)." if base else
           " The optimizer still holds them and updates them through a leftover `.grad` "
           "(weight decay, momentum)." if by_step else
           " They changed at every step, consistently: a copy updated on purpose (an EMA of "
           "the weights, a mean teacher), if deliberate." if every else "")
    message = (f"{_names(names, universe)} are frozen but changed {' and '.join(phases)}, from "
               f"step {changes[0].step} on ({len(changes)} times in the first steps; largest "
               f"relative change of a norm {max(c.rel for c in changes):.3g}).{why}")
    return Verdict("wiring.frozen_params_changed", changes[0].step, message,
                   layer=_first_module(names, universe), severity="info" if every else None,
                   evidence={"phases": phases, "every_step": every, "peft_base": bool(base),
                             "steps": [c.step for c in changes][:50],
                             "params": names[:50],
                             "rel_change": [c.rel for c in changes][:50]})


def frozen_running_stats(module: nn.Module) -> list[str]:
    """Running-statistics layers (BatchNorm, InstanceNorm with ``track_running_stats``) in
    training mode inside a frozen part: a submodule (not ``module`` itself) whose parameters
    all have ``requires_grad=False``. A layer with trainable affine parameters (Lightning's
    ``BackboneFinetuning`` leaves BatchNorm trainable) is not frozen.

    Example:
        >>> net = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)), nn.Linear(2, 1))
        >>> _ = net[0].requires_grad_(False)
        >>> frozen_running_stats(net)
        ['0.1']
        >>> _ = net[0].eval()
        >>> frozen_running_stats(net)
        []
    """
    frozen_parts = [name for name, m in module.named_modules() if name
                    and (ps := list(m.parameters())) and not any(p.requires_grad for p in ps)]
    found = []
    for name, m in module.named_modules():
        if not (m.training and isinstance(getattr(m, "running_mean", None), Tensor)
                and getattr(m, "track_running_stats", True)):
            continue
        if any(name == f or name.startswith(f + ".") for f in frozen_parts):
            found.append(name)
    return found


def frozen_running_stats_verdict(moved: Mapping[str, float], kinds: Mapping[str, str],
                                 step: int, steps_seen: int) -> Verdict | None:
    """Running statistics of frozen parts that moved during the first steps.

    Args:
        moved: layer name -> the largest change of the norm of its running mean or running
            variance (only the layers whose statistics moved).
        kinds: layer name -> class name.
        step: the step where they were first seen in training mode.
        steps_seen: training batches between the two readings.

    Example:
        >>> frozen_running_stats_verdict({"backbone.bn": 0.3}, {"backbone.bn": "BatchNorm2d"},
        ...                              0, 3).layer
        'backbone.bn'
    """
    if not moved:
        return None
    names = list(moved)
    listed = ", ".join(f"`{n}` ({kinds.get(n, '?')})" for n in names[:6]) + (
        f" and {len(names) - 6} more" if len(names) > 6 else "")
    message = (f"{len(names)} running-statistics layer(s) inside frozen parts are in training "
               f"mode and their running statistics moved over the first {steps_seen} batches "
               f"(from step {step}; largest change of a running statistic's norm "
               f"{max(moved.values()):.3g}): {listed}.")
    return Verdict("wiring.frozen_batchnorm_in_train", step, message, layer=names[0],
                   evidence={"modules": names[:100], "change": dict(list(moved.items())[:100]),
                             "batches": steps_seen})


# ---------------------------------------------------------------------- 5. late freezing
def late_freeze_verdict(moved: Mapping[str, float], step: int, universe: Mapping[str, int], *,
                        steps_trained: int, running_stats: Mapping[str, float] | None = None,
                        deliberate: bool = False, exact: bool = True) -> Verdict | None:
    """``wiring.frozen_late``: parameters that were trainable for the first ``steps_trained``
    optimizer steps and are frozen (``requires_grad=False``) from ``step`` on, after moving.

    Args:
        moved: each newly frozen parameter and how far it moved since the first batch, relative
            to its norm then: ``||w - w0|| / ||w0||`` (``exact``), else the relative change of its
            norm (a lower bound: ``||w - w0|| >= | ||w|| - ||w0|| |``).
        step: the first optimizer step at which they were seen frozen.
        universe: every parameter and its number of values (for naming).
        steps_trained: the optimizer steps they were trainable for.
        running_stats: BatchNorm-like layers among them and the relative change of their
            running statistics' norm over the same steps.
        deliberate: the freeze came after at least one full epoch of training (a schedule that
            freezes on purpose): info instead of a warning.
        exact: ``moved`` holds distances, not norm changes.

    Returns:
        The verdict, or ``None`` when no parameter measurably moved before the freeze (frozen
        before its first update: nothing was lost).

    Example:
        >>> v = late_freeze_verdict({"stem.weight": 0.04, "stem.bias": 0.1}, 15,
        ...                         {"stem.weight": 64, "stem.bias": 8, "head.weight": 8},
        ...                         steps_trained=15, running_stats={"stem_bn": 0.9})
        >>> v.code, v.layer, v.severity, v.evidence["max_moved"]
        ('wiring.frozen_late', 'stem', None, 0.1)
    """
    names = list(moved)  # named together: a bias a BatchNorm cancels may not have moved
    if steps_trained <= 0 or not any(v > 0.0 for v in moved.values()):
        return None
    top = max(moved.values())
    stats = {k: v for k, v in (running_stats or {}).items() if v > 0.0}
    bn = (f"; the running statistics of {', '.join(f'`{k}`' for k in list(stats)[:4])} moved "
          f"too (norm up to {100 * max(stats.values()):.3g}%)") if stats else ""
    why = (" after more than one epoch of training: a freeze schedule, if deliberate." if
           deliberate else " from the first steps: they were meant to be frozen from the start?")
    return Verdict(
        "wiring.frozen_late", step,
        f"{_names(names, universe)} trained for the first {steps_trained} optimizer step(s) and "
        f"are frozen (`requires_grad=False`) from step {step} on, having moved "
        f"{'' if exact else 'at least '}{100 * top:.3g}% of their norm at the first batch "
        f"({'||w - w0|| / ||w0||' if exact else 'the change of their norms'}){bn}. Frozen "
        f"late{why}",
        layer=_first_module(names, universe), severity="info" if deliberate else None,
        evidence={"params": names[:32], "count": len(names), "steps_trained": steps_trained,
                  "frozen_from_step": step, "max_moved": top,
                  "moved": {n: moved[n] for n in names[:32]}, "running_stats_moved": stats,
                  "deliberate": deliberate, "exact": exact},
    )


__all__ = [
    "CONSISTENT_AFTER",
    "FORWARD",
    "STALLED_STEPS",
    "Change",
    "GradState",
    "StepRecord",
    "frozen_change_verdict",
    "frozen_running_stats",
    "frozen_running_stats_verdict",
    "late_freeze_verdict",
    "outside_change_verdicts",
    "stepping_verdict",
    "tensor_norms",
    "zeroing_verdict",
]
