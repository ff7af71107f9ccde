"""Gradient clipping that eats the update: how much of each step's gradient norm total-norm
clipping keeps (:func:`clip_kept`), and the ``grad.clipping_eats_update`` verdict
(:func:`clipping_verdict`), for Lightning's ``gradient_clip_val`` and a manual loop's own
clipping alike."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lightning_triage.functional.verdict import Verdict

#: Clipping eats the update when, over the window, the median fraction of the gradient's norm it
#: keeps is at most this (at most 1% of the gradient reaches the optimizer)...
CLIP_KEEP_MAX = 0.01
#: ... over at least this many optimizer steps.
CLIP_MIN_STEPS = 10
#: Optimizers whose update does not scale with the gradient's norm (per-coordinate
#: normalization, signs): clipping by a constant factor leaves their update about the same.
SCALE_INVARIANT_OPTIMIZERS = frozenset({
    "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop", "SparseAdam",
    "Adafactor", "Lion", "Adam8bit", "AdamW8bit",
})


#: A clipping that keeps at most this many ``1 / scale`` of the norm saw the gradients still
#: multiplied by the gradient scaler's ``scale`` (see :func:`clipping_verdict`).
CLIP_SCALED_MAX = 100.0


def clip_kept(norms: Sequence[float], clip_val: float) -> list[float]:
    """The fraction of each total gradient norm that total-norm clipping at ``clip_val`` keeps
    (``min(1, clip_val / norm)``, as ``clip_grad_norm_`` scales; non-finite norms left out).

    Example:
        >>> clip_kept([2.0, 0.5, float("inf")], 1.0)
        [0.5, 1.0]
    """
    return [min(1.0, clip_val / n) if n > 0 else 1.0 for n in norms if math.isfinite(n)]


def clipping_verdict(kept: Sequence[float], *, step: int, optimizer: str, how: str,
                     clip_val: float | None = None, max_kept: float = CLIP_KEEP_MAX,
                     min_steps: int = CLIP_MIN_STEPS, scale: float | None = None
                     ) -> Verdict | None:
    """``grad.clipping_eats_update`` when the median of ``kept`` (the fraction of each step's
    gradient norm that reaches the optimizer after clipping) is at most ``max_kept`` over at
    least ``min_steps`` steps; ``None`` otherwise. ``how`` says where the clipping was measured
    (``"gradient_clip_val"``: Lightning's clipping, from the norms before it; ``"manual"``: the
    norm backward produced, unscaled, against the norm at the optimizer step). A warning,
    except for an optimizer whose update does not scale with the gradient
    (:data:`SCALE_INVARIANT_OPTIMIZERS`: info, the update survives). ``scale``: the gradient
    scaler's scale at the measured backwards (manual optimization); when the clipping kept at
    most ``CLIP_SCALED_MAX / scale`` of the norm, it likely saw the gradients still scaled
    (clipped before ``scaler.unscale_``), and the message says so (evidence
    ``clipped_scaled``).

    Example:
        >>> v = clipping_verdict([1e-4] * 20, step=19, optimizer="SGD", how="gradient_clip_val",
        ...                      clip_val=1e-4)
        >>> v.code, v.severity, v.evidence["median_kept"]
        ('grad.clipping_eats_update', None, 0.0001)
        >>> clipping_verdict([0.6] * 20, step=19, optimizer="SGD", how="manual") is None
        True
    """
    vals = [float(k) for k in kept if math.isfinite(k)]
    if len(vals) < min_steps:
        return None
    med = float(np.median(vals))
    if med > max_kept:
        return None
    share = sum(v <= max_kept for v in vals) / len(vals)
    invariant = optimizer in SCALE_INVARIANT_OPTIMIZERS
    if how == "gradient_clip_val":
        where = f"`gradient_clip_val={clip_val:g}` clips the total gradient norm"
    else:
        where = ("clipping in `training_step` (the gradients reaching the optimizer against "
                 "those backward produced, unscaled) shrinks the total gradient norm")
    effect = (f"{optimizer} normalizes its update, so the update survives" if invariant else
              f"{optimizer}'s update shrinks with it: the effective learning rate is about "
              f"{med:.2g}x the one set")
    # clipped while scaled, the step sees max_norm / scale: the kept share times the scale is
    # the max_norm over the unscaled norm (order 1); clipped after unscaling, it is the scale
    # times a share that is rarely below 1e-3
    s = scale if scale is not None and math.isfinite(scale) else 1.0
    scaled = s > 1 and med * s <= CLIP_SCALED_MAX
    why = (f" That is {med * s:.3g}/{s:g} of the norm, and {scale:g} is the scale the "
           "gradient scaler multiplies the gradients by: the clipping likely saw them still "
           "scaled (clipped before `scaler.unscale_(optimizer)`; unscale first, then clip)."
           if scaled else "")
    return Verdict(
        "grad.clipping_eats_update", step,
        f"Over the first {len(vals)} optimizer steps {where} to a median {med:.3g} of its size "
        f"(at most {max_kept:g} at {100 * share:.0f}% of the steps): {effect}.{why}",
        severity="info" if invariant else None,
        evidence={"median_kept": med, "min_kept": min(vals), "steps": len(vals),
                  "share_below": share, "how": how, "clip_val": clip_val,
                  "optimizer": optimizer, "scale_invariant": invariant,
                  **({"scale": scale, "clipped_scaled": scaled} if scale is not None else {})},
    )


__all__ = [
    "CLIP_KEEP_MAX",
    "CLIP_MIN_STEPS",
    "CLIP_SCALED_MAX",
    "SCALE_INVARIANT_OPTIMIZERS",
    "clip_kept",
    "clipping_verdict",
]
