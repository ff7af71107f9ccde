"""Evaluation contracts (mode stage): evaluation is deterministic, and the model evaluated is
the model that trains.

Two rules over what a probe recorded on copies of the model:

- :func:`nondeterministic_eval`: the same validation examples, run twice in eval mode from two
  different random states, gave different module outputs (:func:`first_divergence` finds the
  first module whose output differs, and whether its input already differed).
- :func:`eval_loss_gap`: the loss of the same examples in eval mode is far above their loss in
  training mode, and the gap does not shrink as training goes on (an eval-only path).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_triage.functional.verdict import Verdict

#: Two outputs differ when their largest absolute difference exceeds this fraction of their
#: largest magnitude (dropout or noise differ by O(1); non-deterministic kernels by ~1e-6).
DIFF_TOLERANCE = 1e-3
#: The eval-mode loss must be at least this multiple of the training-mode loss of the same
#: examples.
GAP_RATIO = 2.0
#: ... and above it by at least this fraction of the chance level (or of the step-0 loss).
GAP_MIN_FRACTION = 0.25
#: A run is judged only from this many optimizer steps on (BatchNorm running statistics lag the
#: batch statistics at first).
GAP_MIN_STEPS = 50
#: The gap "shrinks" when its ratio fell below this fraction of the first run's ratio.
GAP_SHRINK = 0.5


@dataclass(frozen=True)
class ModuleCall:
    """One module call of a probe pass: its name (``named_modules``), type, training flag, and
    its first floating input and output (detached copies; ``None`` when there was none)."""

    name: str
    kind: str
    training: bool
    inputs: Tensor | None
    output: Tensor | None


def relative_difference(a: Tensor | None, b: Tensor | None) -> float:
    """Largest absolute difference of ``a`` and ``b`` over their largest magnitude (``inf``
    for different shapes or one missing; 0 for both missing; NaNs at the same places equal).

    Example:
        >>> relative_difference(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 1.0]))
        0.5
    """
    if a is None or b is None:
        return 0.0 if a is None and b is None else math.inf
    if a.shape != b.shape:
        return math.inf
    a, b = a.detach().double(), b.detach().double()
    if not torch.equal(torch.isnan(a), torch.isnan(b)):
        return math.inf
    a, b = torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0)
    if a.numel() == 0:
        return 0.0
    scale = float(torch.maximum(a.abs().max(), b.abs().max()))
    diff = float((a - b).abs().max())
    if diff == 0.0:
        return 0.0
    return diff / scale if scale > 0 and math.isfinite(scale) else math.inf


@dataclass(frozen=True)
class Divergence:
    """Where two passes first differ: the call, the one before it that still agreed, whether
    the call's input already differed, and the relative output difference."""

    call: ModuleCall
    previous: str | None
    input_differs: bool
    difference: float


def first_divergence(a: Sequence[ModuleCall], b: Sequence[ModuleCall],
                     tolerance: float = DIFF_TOLERANCE) -> Divergence | None:
    """The first call (in completion order) whose output differs between passes ``a`` and
    ``b``, or ``None`` when every output agrees.

    Example:
        >>> x = torch.ones(2, 3)
        >>> a = [ModuleCall("fc1", "Linear", False, x, x), ModuleCall("fc2", "Linear", False, x, x)]
        >>> b = [a[0], ModuleCall("fc2", "Linear", False, 2 * x, 2 * x)]
        >>> d = first_divergence(a, b)
        >>> d.call.name, d.previous, d.input_differs
        ('fc2', 'fc1', True)
    """
    previous: str | None = None
    for ca, cb in zip(a, b, strict=False):
        if ca.name != cb.name:  # different control flow: the calls themselves diverge
            return Divergence(ca, previous, True, math.inf)
        diff = relative_difference(ca.output, cb.output)
        if diff > tolerance:
            return Divergence(ca, previous,
                              relative_difference(ca.inputs, cb.inputs) > tolerance, diff)
        previous = ca.name
    return None


def _parent(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def nondeterministic_eval(divergence: Divergence, *, examples: int, root: str,
                          step: int | None = None) -> Verdict:
    """``mode.nondeterministic_eval``: where two eval-mode passes of ``validation_step`` over
    the same ``examples`` validation examples first differed. ``root`` is the model's class
    name (for the top-level module, whose name is ``""``).

    The layer is the module whose own code holds the randomness: the first differing module
    when its input agreed on both passes, else the module calling it (its input already
    differed: a functional dropout or noise between two calls).

    Example:
        >>> x = torch.ones(2, 3)
        >>> call = ModuleCall("head", "Linear", False, x, x)
        >>> v = nondeterministic_eval(Divergence(call, "body", True, 0.8), examples=2, root="Net")
        >>> v.layer, v.evidence["input_differs"]
        (None, True)
    """
    call = divergence.call
    shown = call.name or root
    if divergence.input_differs:
        where = _parent(call.name) if call.name else None
        holder = (where or root) if call.name else None
        after = f", after `{divergence.previous or root}`" if divergence.previous else ""
        place = (f"in the forward of `{holder}`{after}" if holder is not None
                 else "in `validation_step` before the model")
        text = (f"`{shown}` ({call.kind}) is the first module whose output differs, and its "
                f"input already differed: the randomness is in code outside modules, {place}")
        layer = where or None
    else:
        text = (f"`{shown}` ({call.kind}) is the first module whose output differs, from an "
                "identical input: the randomness is in its own forward")
        layer = call.name or None
    diff = divergence.difference
    shown_diff = "different calls" if math.isinf(diff) else f"largest difference {diff:.3g} of " \
        "the output's magnitude"
    return Verdict(
        "mode.nondeterministic_eval", step,
        f"In eval mode, two runs of `validation_step` on the same {examples} validation "
        f"example(s), from two random states, gave different outputs ({shown_diff}). {text}.",
        layer=layer,
        evidence={"module": call.name, "module_type": call.kind, "previous": divergence.previous,
                  "input_differs": divergence.input_differs,
                  "relative_difference": None if math.isinf(diff) else diff,
                  "examples": examples},
    )


@dataclass(frozen=True)
class GapRun:
    """One validation run's probe: the loss of the same validation examples in eval and in
    training mode (the user's ``training_step`` on copies of the model), at optimizer step
    ``step``."""

    step: int
    eval_loss: float
    train_loss: float
    sanity: bool = False

    @property
    def ratio(self) -> float:
        return self.eval_loss / self.train_loss if self.train_loss > 0 else math.inf


def eval_loss_gap(runs: Sequence[GapRun], *, reference: float | None, reference_name: str,
                  ratio: float = GAP_RATIO, min_fraction: float = GAP_MIN_FRACTION,
                  min_steps: int = GAP_MIN_STEPS) -> Verdict | None:
    """``mode.eval_loss_gap`` when the latest run (at ``min_steps`` or later) shows an eval-mode
    loss at least ``ratio`` times the training-mode loss of the same examples, above it by at
    least ``min_fraction`` of ``reference`` (the chance level, else the step-0 loss), and the
    gap has not shrunk since the first run; ``None`` otherwise.

    Harder validation data raises both losses (no gap); BatchNorm statistics that lag at first
    give a gap that shrinks.

    Example:
        >>> runs = [GapRun(0, 2.3, 2.3, sanity=True), GapRun(60, 2.3, 0.2)]
        >>> v = eval_loss_gap(runs, reference=2.303, reference_name="chance")
        >>> v.code, v.step, round(v.evidence["ratio"], 1)
        ('mode.eval_loss_gap', 60, 11.5)
        >>> eval_loss_gap([GapRun(0, 9.0, 1.0), GapRun(60, 1.1, 1.0)], reference=2.3,
        ...               reference_name="chance") is None
        True
    """
    if not runs:
        return None
    last, first = runs[-1], runs[0]
    values = (last.eval_loss, last.train_loss)
    if last.step < min_steps or not all(math.isfinite(v) for v in values):
        return None
    floor = min_fraction * reference if reference is not None and reference > 0 else 0.0
    if last.eval_loss < ratio * last.train_loss or last.eval_loss - last.train_loss <= floor:
        return None
    if first is not last and math.isfinite(first.ratio) and last.ratio < GAP_SHRINK * first.ratio:
        return None
    history = ", ".join(f"step {r.step}{' (sanity check)' if r.sanity else ''}: "
                        f"{r.eval_loss:.4g} vs {r.train_loss:.4g}" for r in runs[-4:])
    ref = f" ({reference_name} {reference:.4g})" if reference is not None else ""
    return Verdict(
        "mode.eval_loss_gap", last.step,
        f"At the validation run of step {last.step}, the loss of the same validation examples "
        f"is {last.eval_loss:.4g} in eval mode and {last.train_loss:.4g} in training mode "
        f"({last.ratio:.1f}x){ref}; eval vs training mode by run: {history}.",
        evidence={"eval_loss": last.eval_loss, "train_mode_loss": last.train_loss,
                  "ratio": last.ratio, "reference": reference, "reference_name": reference_name,
                  "runs": [[r.step, r.eval_loss, r.train_loss] for r in runs]},
    )


__all__ = ["DIFF_TOLERANCE", "GAP_MIN_FRACTION", "GAP_MIN_STEPS", "GAP_RATIO", "GAP_SHRINK",
           "Divergence", "GapRun", "ModuleCall", "eval_loss_gap", "first_divergence",
           "nondeterministic_eval", "relative_difference"]
