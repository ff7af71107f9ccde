"""Stage 9 (numerics) rules: the verdicts of :class:`~lightning_triage.NonFiniteTracer`.

The tracer detects and replays (:func:`~lightning_triage.functional.nonfinite.localize_nonfinite`);
these functions turn what it saw into :class:`~lightning_triage.functional.verdict.Verdict`
objects (codes ``numerics.*`` and ``data.nonfinite_input``/``data.nonfinite_target``), and
:class:`DeferredFlags` keeps the deferred mode's flags on the device until they are read.

Example:
    >>> v = deferred_verdict(DeferredRead(bits=LOSS, first=7), read_at=50, every=50)
    >>> v.code, v.step, v.evidence["signals"]
    ('numerics.nonfinite_detected', 7, ['loss'])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lightning_triage.functional.nonfinite import (
    Localization,
    dtype_max,
    max_abs,
    nonfinite_examples,
    tensor_stats,
)
from lightning_triage.functional.verdict import Verdict

OnNonFinite = Literal["stop", "skip", "warn"]
Mode = Literal["auto", "sync", "deferred"]
ON_NONFINITE: tuple[OnNonFinite, ...] = ("stop", "skip", "warn")
MODES: tuple[Mode, ...] = ("auto", "sync", "deferred")

#: Bits of the deferred flags: the loss, the gradients, the parameters went non-finite.
LOSS, GRAD, PARAMS = 1, 2, 4

#: ``trainer.precision`` values that compute in a reduced floating dtype.
REDUCED_PRECISIONS: dict[str, torch.dtype] = {
    "16-mixed": torch.float16, "16-true": torch.float16, "16": torch.float16,
    "bf16-mixed": torch.bfloat16, "bf16-true": torch.bfloat16, "bf16": torch.bfloat16,
}


def short_dtype(dtype: torch.dtype | str) -> str:
    """``torch.float16`` -> ``"float16"``."""
    return str(dtype).replace("torch.", "")


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def describe_module(root: nn.Module, layer: str | None) -> str:
    """How a message names ``layer`` (a qualified module name, ``""``: the root, ``None``: no module).

    Example:
        >>> describe_module(nn.Sequential(nn.Linear(2, 2)), "0")
        'module `0` (Linear)'
    """
    if layer is None:
        return "the loss computation in `training_step` (outside every module)"
    if layer == "":
        return f"the root module `{type(root).__name__}` (its own `forward` code)"
    module = dict(root.named_modules()).get(layer)
    kind = f" ({type(module).__name__})" if module is not None else ""
    return f"module `{layer}`{kind}"


def nonfinite_batch_verdicts(inputs: Tensor | None, targets: Tensor | None, *, step: int,
                             batch_idx: int) -> list[Verdict]:
    """``data.nonfinite_input``/``data.nonfinite_target`` for floating inputs/targets holding NaN/Inf.

    Example:
        >>> x = torch.ones(4, 2)
        >>> x[2, 0] = float("nan")
        >>> [v.evidence["examples"] for v in nonfinite_batch_verdicts(x, None, step=3, batch_idx=1)]
        [[2]]
    """
    out: list[Verdict] = []
    for code, tensor, what in (("data.nonfinite_input", inputs, "inputs"),
                               ("data.nonfinite_target", targets, "targets")):
        if tensor is None or not tensor.is_floating_point():
            continue
        indices, count = nonfinite_examples(tensor)
        if not count:
            continue
        stats = tensor_stats(tensor)
        out.append(Verdict(
            code, step,
            f"step {step} (batch {batch_idx}): the {what} "
            f"{tuple(tensor.shape)} {stats.dtype} hold {stats.nan} NaN and {stats.inf} Inf "
            f"values in {count} example(s), at indices {indices}"
            f"{' (first 32)' if count > len(indices) else ''}.",
            evidence={"batch_idx": batch_idx, "examples": indices, "num_examples": count,
                      "nan": stats.nan, "inf": stats.inf, "shape": list(tensor.shape),
                      "dtype": stats.dtype},
        ))
    return out


def localized_verdict(run: Localization, root: nn.Module, *, step: int,
                      evidence: Mapping[str, Any], also_fp32: bool) -> Verdict | None:
    """``numerics.nonfinite_forward``/``_loss``/``_backward`` for a replay that localized the NaN.

    Args:
        run: the replay's localization (``None`` is returned for a finite one).
        root: the replayed module (names the layer's type).
        step: the failing step.
        evidence: the finding's evidence (the run's, plus what only the run knows).
        also_fp32: the step was non-finite in a float32 replay too.
    """
    evidence = dict(evidence)
    fp32 = " It is non-finite in float32 too: not a precision problem." if also_fp32 else ""
    if run.kind == "forward" and run.first is not None:
        s = run.first.stats
        before = (f" The {len(run.leading)} module output(s) before it were finite, peaking "
                  f"at max |x| = {_fmt(max(f.stats.max_abs for f in run.leading))}."
                  if run.leading else "")
        source = (" Its inputs were already non-finite (they came from the batch or from "
                  "code outside any module)." if not run.first.inputs_finite else
                  f" Its inputs were finite (largest finite output value "
                  f"{_fmt(s.max_abs)}).")
        return Verdict(
            "numerics.nonfinite_forward", step,
            f"step {step}: the output of {describe_module(root, run.layer)} is the first "
            f"non-finite one in forward order: {s.nan} NaN and {s.inf} Inf of {s.numel} values "
            f"({s.dtype}).{source}{before}{fp32}",
            layer=run.layer, evidence=evidence,
        )
    if run.kind == "loss":
        last = run.leading[-1] if run.leading else None
        tail = (f" (the last, {describe_module(root, last.name)}, peaked at max "
                f"|x| = {_fmt(last.stats.max_abs)})" if last is not None else "")
        return Verdict(
            "numerics.nonfinite_loss", step,
            f"step {step}: every module output was finite{tail}, but the loss was "
            f"{run.loss}: the loss computation in `training_step` produced it (e.g. "
            f"`log(softmax(z))` underflowing to `log(0)`).{fp32}",
            evidence=evidence,
        )
    if run.kind == "backward" and run.backward is not None:
        b = run.backward
        return Verdict(
            "numerics.nonfinite_backward", step,
            f"step {step}: forward and loss ({_fmt(run.loss)}) were finite, but in backward "
            f"the gradient computed by `{b.op}` in {describe_module(root, b.layer)} is "
            f"the first non-finite one ({b.stats.nan} NaN, {b.stats.inf} Inf of "
            f"{b.stats.numel}) while the gradient arriving there was finite (max |g| = "
            f"{_fmt(b.incoming_max_abs)}).{fp32}",
            layer=b.layer, evidence=evidence,
        )
    return None


def precision_overflow_verdict(run: Localization, ref: Localization, dtype: torch.dtype,
                               root: nn.Module, *, step: int, precision: str,
                               batch_idx: int) -> Verdict:
    """``numerics.precision_overflow``: non-finite under ``precision``, finite in float32 (``ref``).

    Args:
        run: the localization under the run's precision.
        ref: the float32 replay's (finite).
        dtype: the reduced dtype of the run.
        root: the replayed module.
        step: the failing step.
        precision: ``str(trainer.precision)``.
        batch_idx: the step's batch index.
    """
    limit = dtype_max(dtype)
    over = {name: v for name, v in ref.max_abs_by_layer.items() if v > limit}
    layer = run.layer
    peak32 = ref.max_abs_by_layer.get(layer) if layer is not None else None
    where = {"forward": "output", "backward": "gradient", "loss": "loss"}[run.kind]
    values = "; replayed in float32 the step is finite"
    if peak32 is not None and layer is not None and peak32 > limit:
        values += (f" and `{layer}` peaks at max |x| = {_fmt(peak32)}, {peak32 / limit:.2f}x the "
                   f"largest {short_dtype(dtype)} value {limit:.6g}")
    elif peak32 is not None and layer is not None:  # its output fits: a value inside it did not
        values += (f"; `{layer}`'s output peaks at max |x| = {_fmt(peak32)}, within "
                   f"{short_dtype(dtype)}'s {limit:.6g}: a value computed inside it overflows")
    return Verdict(
        "numerics.precision_overflow", step,
        f"step {step}: under precision {precision!r} the {where} of "
        f"{describe_module(root, layer)} became non-finite{values}.",
        layer=layer,
        evidence={**run.evidence(), "dtype": short_dtype(dtype), "dtype_max": limit,
                  "float32_max_abs": peak32, "float32_loss": ref.loss,
                  "exceeding_in_float32": over, "precision": precision,
                  "batch_idx": batch_idx},
    )


def not_localized_verdict(signal: str, why: str, *, step: int, batch_idx: int,
                          grad_peak: float | None) -> Verdict:
    """``numerics.nonfinite_detected`` for a sync-mode event that could not be localized.

    Example:
        >>> not_localized_verdict("loss", "manual optimization", step=4, batch_idx=4,
        ...                       grad_peak=None).message
        'step 4: the loss went non-finite, but it was not localized: manual optimization.'
    """
    return Verdict(
        "numerics.nonfinite_detected", step,
        f"step {step}: the {signal} went non-finite"
        f"{'' if grad_peak is None else f' (max |grad| = {grad_peak})'}, but it "
        f"was not localized: {why}.",
        evidence={"signal": signal, "batch_idx": batch_idx, "grad_max_abs": grad_peak},
    )


def nonfinite_params_verdict(bad_names: Sequence[str], num_params: int, lrs: Sequence[float], *,
                             update_step: int | None, seen_at_step: int, applied_bad: bool,
                             on_nonfinite: str) -> Verdict:
    """``numerics.nonfinite_params``: parameters found NaN/Inf before a step's update.

    Args:
        bad_names: the non-finite parameters' names.
        num_params: how many parameter tensors were checked.
        lrs: the optimizers' learning rates (sorted).
        update_step: the step whose update wrote them (``None``: no update in this run yet).
        seen_at_step: the step at which they were found.
        applied_bad: that update applied non-finite gradients (``on_nonfinite="warn"``).
        on_nonfinite: the tracer's policy (named in the message).

    Example:
        >>> v = nonfinite_params_verdict(["fc.weight"], 2, [10.0], update_step=5, seen_at_step=6,
        ...                              applied_bad=False, on_nonfinite="stop")
        >>> v.step, v.layer
        (5, 'fc')
    """
    step = update_step
    if step is None:
        when = ("before the first optimizer step of this run (initialization, or a loaded "
                "checkpoint?)")
        step = seen_at_step
    else:
        cause = ("its non-finite gradients were applied (`on_nonfinite="
                 f"{on_nonfinite!r}`)" if applied_bad
                 else "its gradients were finite: the update itself overflowed; check the "
                 f"learning rate {list(lrs)}, weight decay and the optimizer's `eps`")
        when = f"by the optimizer update of step {step}: {cause}"
    return Verdict(
        "numerics.nonfinite_params", step,
        f"step {step}: {len(bad_names)} of {num_params} parameter tensors became NaN/Inf "
        f"({', '.join(f'`{n}`' for n in bad_names[:8])}{', ...' if len(bad_names) > 8 else ''}) "
        f"{when}.",
        evidence={"params": list(bad_names[:32]), "num_params": len(bad_names), "lr": list(lrs),
                  "seen_at_step": seen_at_step},
        layer=bad_names[0].rsplit(".", 1)[0] if bad_names and "." in bad_names[0] else None,
    )


def near_overflow_verdicts(peaks: Sequence[tuple[str, float]], dtype: torch.dtype, ratio: float, *,
                           step: int, reported: set[str]) -> list[Verdict]:
    """``numerics.near_overflow`` for each module whose sampled output peaks (``(module, max |x|)``
    pairs) exceed ``ratio`` of the largest ``dtype`` value (and not beyond it); modules in
    ``reported`` are skipped and the ones reported are added to it.

    Example:
        >>> seen: set[str] = set()
        >>> pairs = [("a", 40000.0), ("b", 1.0), ("a", 2.0)]
        >>> [v.layer for v in near_overflow_verdicts(pairs, torch.float16, 0.25, step=0, reported=seen)]
        ['a']
        >>> seen
        {'a'}
    """
    worst: dict[str, float] = {}
    for name, v in peaks:
        worst[name] = max(worst.get(name, 0.0), v)
    limit = dtype_max(dtype)
    out: list[Verdict] = []
    for name, v in worst.items():
        if name in reported or not (ratio * limit < v <= limit):
            continue
        reported.add(name)
        out.append(Verdict(
            "numerics.near_overflow", step,
            f"step {step}: the output of module `{name}` reached max |x| = "
            f"{v:.4g}, {v / limit:.0%} of the largest {short_dtype(dtype)} "
            f"value {limit:.6g} (threshold {ratio:.0%}).",
            layer=name,
            evidence={"max_abs": v, "dtype_max": limit, "ratio": v / limit,
                      "dtype": short_dtype(dtype)},
        ))
    return out


@dataclass(frozen=True)
class DeferredRead:
    """The deferred flags as read on the host: ``bits`` (:data:`LOSS` | :data:`GRAD` |
    :data:`PARAMS`) and the first flagged step (``-1``: none recorded)."""

    bits: int
    first: int


def deferred_verdict(read: DeferredRead, *, read_at: int, every: int) -> Verdict:
    """``numerics.nonfinite_detected`` for flags read late in deferred mode (``read.bits`` != 0).

    Args:
        read: the flags read on the host.
        read_at: the step at which they were read (also the step reported when no first step
            was recorded).
        every: the deferred mode's read period (``check_every_n_steps``).
    """
    step = read.first if read.first >= 0 else read_at
    what = [name for bit, name in ((LOSS, "loss"), (GRAD, "gradients"), (PARAMS, "parameters"))
            if read.bits & bit]
    return Verdict(
        "numerics.nonfinite_detected", step,
        f"step {step}: the {' and '.join(what)} went non-finite (read in deferred mode, "
        f"every {every} steps, at step {read_at}); the "
        f"update of that step was not prevented and the step cannot be replayed. "
        f"The tracer now runs in sync mode to localize the next occurrence.",
        evidence={"signals": what, "read_at_step": read_at, "check_every_n_steps": every},
    )


class DeferredFlags:
    """Non-finite flags kept on the device (no host synchronization) until :meth:`read`.

    Each step's losses, gradients and parameters are reduced to one peak each
    (:func:`~lightning_triage.functional.nonfinite.max_abs`) and folded into ``bits``; the first
    flagged step is kept alongside, on the device too.

    Example:
        >>> flags = DeferredFlags()
        >>> nan = torch.tensor(float("nan"))
        >>> flags.note_step(3, [nan], [torch.ones(2)], [torch.ones(2)])
        >>> flags.note_step(4, [], [nan], [])
        >>> flags.read()
        DeferredRead(bits=3, first=3)
    """

    def __init__(self) -> None:
        self.bits: Tensor | None = None
        self.first: Tensor | None = None

    def note_step(self, step: int, losses: list[Tensor], grads: list[Tensor],
                  params: list[Tensor]) -> None:
        """Fold this step's ``losses``, ``grads`` and ``params`` (pass ``[]`` for what is not
        watched) into the flags, without reading anything on the host."""
        flags: list[Tensor] = []
        for chunk, bit in ((losses, LOSS), (grads, GRAD), (params, PARAMS)):
            if not chunk:
                continue
            peak = max_abs(chunk)
            if peak is not None:
                flags.append((~torch.isfinite(peak)).to(torch.int32) * bit)
        if not flags:
            return
        bad = flags[0]
        for flag in flags[1:]:
            bad = bad | flag
        if self.bits is None or self.first is None:
            self.bits = torch.zeros((), dtype=torch.int32, device=bad.device)
            self.first = torch.full((), -1, dtype=torch.int64, device=bad.device)
        self.first = torch.where((self.first < 0) & (bad > 0), step, self.first)
        self.bits = self.bits | bad

    def flag_params(self) -> None:
        """Set the parameters' bit (found non-finite on the host)."""
        self.bits = torch.full((), PARAMS, dtype=torch.int32) if self.bits is None \
            else self.bits | PARAMS

    def read(self) -> DeferredRead:
        """The flags on the host (one synchronization)."""
        return DeferredRead(0 if self.bits is None else int(self.bits),
                            -1 if self.first is None else int(self.first))

    def clear(self) -> None:
        """Forget the device flags (after a read that found something on some rank)."""
        self.bits = None
        self.first = None


def finite_or_none(value: Tensor | None) -> bool:
    """Whether a peak (a device scalar, ``None``: nothing to check) is finite; reads it."""
    return value is None or math.isfinite(float(value))


def describe_tracer(*, sync: bool, every: int, nonfinite_steps: int, first_step: int | None,
                    skipped: int, scaler_skips: int, replay_calls: int) -> str:
    """The tracer's check detail (its mode and counts).

    Example:
        >>> describe_tracer(sync=True, every=50, nonfinite_steps=1, first_step=3, skipped=1,
        ...                 scaler_skips=0, replay_calls=2)
        'mode sync, 1 non-finite step(s), first at step 3, 1 skipped, 2 `training_step` call(s) in replays'
    """
    mode = "sync" if sync else f"deferred (read every {every} steps)"
    parts = [f"mode {mode}", f"{nonfinite_steps} non-finite step(s)"]
    if first_step is not None:
        parts.append(f"first at step {first_step}")
    if skipped:
        parts.append(f"{skipped} skipped")
    if scaler_skips:
        parts.append(f"{scaler_skips} gradient-scaler skip(s) (normal)")
    if replay_calls:
        parts.append(f"{replay_calls} `training_step` call(s) in replays")
    return ", ".join(parts)


def step_healthy(total: float | Tensor | None, peak: Tensor | None) -> bool:
    """Whether a step is finite, with at most one host read: a non-finite total gradient norm or
    a non-finite peak means a problem (a NaN/Inf in any gradient makes its norm, hence the
    total, non-finite).

    Example:
        >>> step_healthy(torch.tensor(3.0), torch.tensor(float("inf"))), step_healthy(2.0, None)
        (False, True)
    """
    if isinstance(total, float):  # read on the host already (CPU)
        return math.isfinite(total) and (peak is None or math.isfinite(peak.item()))
    if total is None:
        return peak is None or math.isfinite(peak.item())
    return math.isfinite((total if peak is None else total + peak.to(total.device)).item())

__all__ = [
    "GRAD",
    "LOSS",
    "MODES",
    "ON_NONFINITE",
    "PARAMS",
    "REDUCED_PRECISIONS",
    "DeferredFlags",
    "DeferredRead",
    "Mode",
    "OnNonFinite",
    "deferred_verdict",
    "describe_module",
    "describe_tracer",
    "finite_or_none",
    "localized_verdict",
    "near_overflow_verdicts",
    "nonfinite_batch_verdicts",
    "nonfinite_params_verdict",
    "not_localized_verdict",
    "precision_overflow_verdict",
    "short_dtype",
    "step_healthy",
]
