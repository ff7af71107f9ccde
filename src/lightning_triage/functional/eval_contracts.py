"""Evaluation contracts (mode stage): evaluation is deterministic, and the model evaluated is
the model that trains.

Two rules over what a probe recorded on copies of the model:

- :func:`nondeterministic_eval`: the same validation examples, run twice in eval mode from two
  different random states, gave different module outputs (:func:`first_divergence` finds the
  first module whose output differs, and whether its input already differed).
- :func:`eval_loss_gap`: the loss of the same examples in eval mode is far above their loss in
  training mode, and the gap does not shrink as training goes on (an eval-only path).
- :func:`eval_broken_before_training`: at the sanity check (or the first validation, before
  ``GAP_MIN_STEPS``), the eval-mode loss is orders of magnitude above chance while the
  training-mode loss of the same examples is at chance: eval mode reads state that only a
  training-mode forward sets (:func:`first_scale_change` names the module).
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


#: Before training, the eval-mode loss must be at least this multiple of the chance level and of
#: the training-mode loss of the same examples ("orders of magnitude": a BatchNorm whose running
#: statistics are still at their init gives about 2x)...
START_RATIO = 10.0
#: ... while the training-mode loss is at most this multiple of the chance level.
START_TRAIN_MAX = 2.0
#: A module's output changes scale between the modes when the root mean squares of its eval-mode
#: and training-mode outputs differ by this factor (dropout changes it by ``1/sqrt(1-p)``).
SCALE_FACTOR = 4.0


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


def unique(names: Sequence[str], at_most: int = 4) -> list[str]:
    """``names`` without repeats, in order, at most ``at_most`` of them.

    Example:
        >>> unique(["randn", "randint", "randn"])
        ['randn', 'randint']
    """
    return list(dict.fromkeys(names))[:at_most]


def _ticked(names: Sequence[str]) -> str:
    return ", ".join(f"`{n}`" for n in unique(names))


def sampling_eval(draws: Sequence[str], *, step: int | None = None) -> Verdict:
    """``mode.nondeterministic_eval`` at info: the validation outputs differ between random
    states because ``validation_step`` draws random numbers other than dropout (``draws``: the
    noise and timesteps of diffusion, a masked autoencoder's mask, a VAE's sampled latent). The
    objective samples: evaluation is random by design, not left in training mode.

    Example:
        >>> v = sampling_eval(["randn", "randint", "randn"])
        >>> v.severity, v.evidence["draws"]
        ('info', ['randn', 'randint'])
        >>> print(v.message)  # doctest: +NORMALIZE_WHITESPACE
        `validation_step` draws `randn`, `randint` (no dropout active in eval mode): the objective
        samples; evaluation is random by design.
    """
    return Verdict(
        "mode.nondeterministic_eval", step,
        f"`validation_step` draws {_ticked(draws)} (no dropout active in eval mode): the "
        "objective samples; evaluation is random by design.",
        evidence={"draws": unique(draws), "dropouts": [], "by_design": True},
        severity="info",
    )


def nondeterministic_eval(divergence: Divergence, *, examples: int, root: str,
                          step: int | None = None, dropouts: Sequence[str] = (),
                          draws: Sequence[str] = ()) -> Verdict:
    """``mode.nondeterministic_eval``: where two eval-mode passes of ``validation_step`` over
    the same ``examples`` validation examples first differed. ``root`` is the model's class
    name (for the top-level module, whose name is ``""``). ``dropouts`` names the dropout calls
    that drew in eval mode, ``draws`` the objective's other random draws (see
    :class:`~lightning_triage.functional.draws.DrawWatch`), when known.

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
    drew = ""
    if dropouts:
        drew = f" Dropout is active in eval mode ({_ticked(dropouts)} dropped values)"
        drew += (f", besides the objective's own draws ({_ticked(draws)}, random by design)."
                 if draws else ".")
    return Verdict(
        "mode.nondeterministic_eval", step,
        f"In eval mode, two runs of `validation_step` on the same {examples} validation "
        f"example(s), from two random states, gave different outputs ({shown_diff}). {text}."
        f"{drew}",
        layer=layer,
        evidence={"module": call.name, "module_type": call.kind, "previous": divergence.previous,
                  "input_differs": divergence.input_differs,
                  "relative_difference": None if math.isinf(diff) else diff,
                  "examples": examples, "dropouts": unique(dropouts), "draws": unique(draws)},
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


def _rms(t: Tensor | None) -> float | None:
    if t is None or t.numel() == 0:
        return None
    return float(t.detach().double().pow(2).mean().sqrt())


def _scale_ratio(a: Tensor | None, b: Tensor | None) -> float | None:
    """``rms(a) / rms(b)`` (``inf`` when only ``a`` is non-finite or ``b`` is zero; ``None``
    when either is missing)."""
    ra, rb = _rms(a), _rms(b)
    if ra is None or rb is None:
        return None
    if not math.isfinite(ra) or not math.isfinite(rb):
        return 1.0 if math.isfinite(ra) == math.isfinite(rb) else math.inf
    if rb == 0.0:
        return 1.0 if ra == 0.0 else math.inf
    return ra / rb


def _off(ratio: float | None, factor: float) -> bool:
    return ratio is not None and (ratio >= factor or ratio <= 1.0 / factor)


def first_scale_change(eval_calls: Sequence[ModuleCall], train_calls: Sequence[ModuleCall],
                       factor: float = SCALE_FACTOR) -> tuple[ModuleCall, float] | None:
    """The first module call (in completion order) whose output scale differs by ``factor`` or
    more between an eval-mode and a training-mode pass of the same examples while its input's
    scale did not, with ``rms(eval output) / rms(train output)``; ``None`` when there is none or
    the two passes call different modules first.

    Dropout (a scale change of ``1/sqrt(1-p)``) and noise do not reach ``factor``; a module that
    reads uninitialized state in eval mode does.

    Example:
        >>> x = torch.ones(2, 3)
        >>> ev = [ModuleCall("fc1", "Linear", False, x, 90 * x), ModuleCall("", "Net", False, x, x)]
        >>> tr = [ModuleCall("fc1", "Linear", True, x, x), ModuleCall("", "Net", True, x, x)]
        >>> call, ratio = first_scale_change(ev, tr)
        >>> call.name, ratio
        ('fc1', 90.0)
    """
    for ce, ct in zip(eval_calls, train_calls, strict=False):
        if ce.name != ct.name:
            return None
        ratio = _scale_ratio(ce.output, ct.output)
        if _off(ratio, factor) and not _off(_scale_ratio(ce.inputs, ct.inputs), factor):
            return ce, float(ratio) if ratio is not None else math.inf
    return None


def eval_broken_before_training(run: GapRun, *, chance: float, module: str | None = None,
                                module_kind: str | None = None, scale: float | None = None,
                                ratio: float = START_RATIO,
                                train_max: float = START_TRAIN_MAX) -> Verdict | None:
    """``mode.eval_broken_before_training`` when a validation run before training (the sanity
    check, or the first validation) gives an eval-mode loss at least ``ratio`` times the chance
    level and the training-mode loss of the same examples, the training-mode loss being at most
    ``train_max`` times chance; ``None`` otherwise. ``module`` (with its type and output
    ``scale`` ratio) is where the eval-mode pass first departs (:func:`first_scale_change`).

    Example:
        >>> v = eval_broken_before_training(GapRun(0, 156.5, 2.35, sanity=True), chance=2.303,
        ...                                 module="fc1", module_kind="Linear", scale=95.0)
        >>> v.code, v.layer, round(v.evidence["chance_multiple"])
        ('mode.eval_broken_before_training', 'fc1', 68)
        >>> eval_broken_before_training(GapRun(0, 4.0, 2.4, sanity=True), chance=2.303) is None
        True
    """
    e, t = run.eval_loss, run.train_loss
    if not (math.isfinite(t) and chance > 0 and math.isfinite(chance)):
        return None
    if t > train_max * chance:
        return None
    if math.isfinite(e) and (e < ratio * chance or e < ratio * t):
        return None
    when = "the sanity check" if run.sanity else f"the first validation (step {run.step})"
    if module is not None:
        times = "non-finite" if scale is None or not math.isfinite(scale) else f"{scale:.3g}x"
        where = (f" `{module}` ({module_kind}) is the first module whose output changes scale "
                 f"between the modes from the same input (eval/train output scale {times}).")
    else:
        where = " No single module's output changes scale first (the difference is in code " \
                "outside modules or builds up)."
    return Verdict(
        "mode.eval_broken_before_training", run.step,
        f"At {when}, the loss of the same validation examples is {e:.4g} in eval mode and "
        f"{t:.4g} in training mode ({e / chance if math.isfinite(e) else math.inf:.3g}x the chance "
        f"level {chance:.4g}): eval mode reads state that only a training-mode forward sets, so "
        f"every evaluation before training is wrong.{where}",
        layer=module or None,
        evidence={"eval_loss": e, "train_mode_loss": t, "chance": chance,
                  "chance_multiple": e / chance, "sanity_check": run.sanity,
                  "module": module, "module_type": module_kind, "scale_ratio": scale},
    )


__all__ = ["DIFF_TOLERANCE", "GAP_MIN_FRACTION", "GAP_MIN_STEPS", "GAP_RATIO", "GAP_SHRINK",
           "SCALE_FACTOR", "START_RATIO", "START_TRAIN_MAX",
           "Divergence", "GapRun", "ModuleCall", "eval_broken_before_training", "eval_loss_gap",
           "first_divergence", "first_scale_change",
           "nondeterministic_eval", "relative_difference", "sampling_eval", "unique"]
