"""Loss-curve classification: read a training curve the way an expert does.

:func:`classify_curve` takes plain sequences of numbers (the training loss per optimizer step,
optionally the validation loss per validation run and the chance level of the task) and returns
verdicts with the ``curve.*`` codes of the protocol, their step, a message with the numbers and
the evidence. No Trainer needed: it works as well on a metrics CSV after the fact.

Shape codes (at most one, decided on the whole window): ``diverging``, ``plateau_at_chance``,
``not_learning``, ``lr_too_low``, ``lr_too_high``; a plateau at chance that follows a blow-up at
the first steps comes with ``lr_too_high`` (an error: the learning rate killed the network,
evidence ``collapse``); event codes: ``loss_spike`` (one per spike),
``overfitting``; ``healthy`` (info) when nothing else was found.

Example:
    >>> import math
    >>> flat = [2.30 + 0.02 * ((i * 7) % 5 - 2) for i in range(200)]
    >>> [v.code for v in classify_curve(flat, chance=math.log(10))]
    ['curve.not_learning']
    >>> falling = [2.3 * 0.99 ** i + 0.02 * ((i * 7) % 5 - 2) for i in range(200)]
    >>> [v.code for v in classify_curve(falling, chance=math.log(10))]
    ['curve.healthy']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_triage.codes.curve import UNBOUNDED_BELOW_HINT
from lightning_triage.functional.spikes import detect_spikes, grew_before
from lightning_triage.functional.verdict import Verdict


@dataclass(frozen=True)
class CurveThresholds:
    """The thresholds of :func:`classify_curve` (calibrated on the labeled curves in the tests).

    Attributes:
        min_steps: fewer training steps than this: no shape verdict.
        diverge_ratio: the running median (over ``smooth`` steps) above this multiple of the
            step-0 loss, still there at the end: diverging.
        smooth: width of the running median used for divergence and rebounds.
        chance_tol: "at chance" means within this fraction of the chance level (or the prior).
        moved_frac: the curve "moved" if it left the chance level by this fraction first.
        low_progress: a relative decrease (start to end) below this is "no real progress".
        flat_tol: a relative change below this, without a significant trend, is "flat".
        trend_t: a slope with a t-statistic beyond this is significant (train loss).
        val_constant_tol: validation losses within this relative range are "identical" (the
            weights did not change).
        rise_ratio: a block median above this multiple of the step-0 loss: the loss rose.
        rebound_ratio: a block median above this multiple of the best earlier block, by more
            than ``rebound_min_frac`` of the loss scale: the loss bounced back up.
        rebound_min_frac: see ``rebound_ratio``.
        spike_z: a loss spike is this many robust standard deviations above the running level
            (12: small batches at a low loss are heavy-tailed; healthy BERT baselines hold
            4-7 deviation excursions and healthy one-example spikes reach 9, injected bad
            batches 30 and more; see docs/curves.md),
        spike_ratio: this many times the running level,
        spike_jump_frac: and above it by this fraction of the loss scale (the chance level, else
            the step-0 loss).
        spike_warmup: steps of baseline before spikes are looked for.
        max_spikes: at most this many ``loss_spike`` verdicts.
        overfit_rise: validation above its best by this fraction...
        overfit_confirm: ...for this many validation runs in a row, while the training loss
            keeps falling: overfitting.
        overfit_z: ...and the rise exceeds this many standard errors of the validation mean,
            estimated as ``best / sqrt(val_examples)`` (per-example losses with a spread about
            their mean, as cross-entropy's), when the number of validation examples is known.
        noisy_margin_z: for a noisy objective (``classify_curve(noisy=True)``), a rise or a
            rebound of the block medians must also exceed this many standard errors of the
            difference of two block medians (estimated from the per-step noise; 4: the best
            earlier block is the least of several, biased low by their noise).

    Example:
        Stricter spike detection than the default:

        >>> strict = CurveThresholds(spike_ratio=1.5, spike_jump_frac=0.5)
        >>> spiky = [1.0 + 0.01 * (i % 4) for i in range(100)]
        >>> spiky[60] = 1.8  # 1.8x the running level, 0.8 above it
        >>> [v.code for v in classify_curve(spiky, chance=1.0, final=False)]
        []
        >>> [v.code for v in classify_curve(spiky, chance=1.0, final=False, thresholds=strict)]
        ['curve.loss_spike']
    """

    min_steps: int = 20
    diverge_ratio: float = 10.0
    smooth: int = 8
    chance_tol: float = 0.05
    moved_frac: float = 0.2
    low_progress: float = 0.1
    flat_tol: float = 0.03
    trend_t: float = 4.0
    val_constant_tol: float = 1e-6
    rise_ratio: float = 1.2
    rebound_ratio: float = 1.5
    rebound_min_frac: float = 0.1
    spike_z: float = 12.0
    spike_ratio: float = 2.0
    spike_jump_frac: float = 1.0
    spike_warmup: int = 16
    max_spikes: int = 5
    overfit_rise: float = 0.1
    overfit_confirm: int = 2
    overfit_z: float = 2.0
    noisy_margin_z: float = 4.0


def _slope_t(y: np.ndarray) -> tuple[float, float]:
    """Least-squares slope per step of ``y`` and its t-statistic (0, 0 when undefined)."""
    n = y.size
    if n < 4:
        return 0.0, 0.0
    t = np.arange(n, dtype=np.float64)
    t -= t.mean()
    slope = float((t * (y - y.mean())).sum() / (t * t).sum())
    resid = y - y.mean() - slope * t
    dof = n - 2
    se = math.sqrt(float((resid * resid).sum()) / dof / float((t * t).sum()))
    if se == 0.0:
        return slope, 0.0 if slope == 0.0 else math.copysign(math.inf, slope)
    return slope, slope / se


def _running_median(x: np.ndarray, width: int) -> np.ndarray:
    """Median of each window of ``width`` consecutive values (``len(x) - width + 1`` values)."""
    width = max(1, min(width, x.size))
    windows = np.lib.stride_tricks.sliding_window_view(x, width)
    return np.median(windows, axis=1)


def _block_medians(x: np.ndarray, blocks: int) -> np.ndarray:
    return np.array([float(np.median(b)) for b in np.array_split(x, blocks) if b.size])


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def classify_curve(
    train: Sequence[float] | np.ndarray,
    *,
    steps: Sequence[int] | None = None,
    val: Sequence[tuple[int, float]] | Sequence[Sequence[float]] | None = None,
    chance: float | None = None,
    prior: float | None = None,
    final: bool = True,
    thresholds: CurveThresholds | None = None,
    val_examples: int | None = None,
    noisy: bool = False,
    heavy_tailed: bool = False,
) -> list[Verdict]:
    """Classify a loss curve.

    Args:
        train: the training loss per optimizer step (NaN/Inf allowed).
        steps: the global step of each training value (default ``0, 1, 2, ...``).
        val: ``(global_step, loss)`` per validation run.
        chance: the chance-level loss of the task (``ln C``, the target variance for MSE...),
            enables ``plateau_at_chance`` and scales the spike threshold.
        prior: the best-constant (prior) loss; "at chance" also matches it.
        final: ``True`` at the end of the window (shape verdicts); ``False`` mid-window: only
            what can be decided early (``diverging``, ``loss_spike``, ``overfitting``).
        thresholds: see :class:`CurveThresholds`.
        val_examples: examples in one validation run; when known, a validation rise must also
            be significant (see ``overfit_z``) to count as overfitting.
        noisy: the objective draws fresh noise, masks, timesteps or views per step, or contrasts
            in-batch negatives: its loss has an unknown floor and per-batch noise by nature.
            A slow or flat loss is not judged (``lr_too_low``; ``not_learning`` only when the
            validation loss is identical at every run), and a rise or rebound must exceed the
            noise of the block medians (``noisy_margin_z``) to read as ``lr_too_high``.
        heavy_tailed: the per-batch loss is heavy-tailed by design (a robust loss, Huber,
            smooth L1 or L1, chosen for outlier targets: each batch's loss swings with the
            outliers it holds). Its pace is judged, but a rise or rebound must exceed the block
            medians' noise as for ``noisy``, that noise read with a spread that sees the tails
            (the standard deviation of the steps, when above the robust one).

    Returns:
        The verdicts, shape verdict first; ``curve.healthy`` alone when nothing was found
        (only when ``final``).

    Example:
        >>> spiky = [1.0 + 0.01 * (i % 4) for i in range(100)]
        >>> spiky[60] = 8.0
        >>> [(v.code, v.step) for v in classify_curve(spiky, chance=2.3, final=False)]
        [('curve.loss_spike', 60)]
    """
    th = thresholds or CurveThresholds()
    x = np.asarray(train, dtype=np.float64).reshape(-1)
    n = x.size
    st = np.arange(n) if steps is None else np.asarray(steps, dtype=np.int64)
    if st.size != n:
        raise ValueError(f"`steps` has {st.size} values for {n} training losses.")
    vals = [(int(s), float(v)) for s, v in (val or [])]
    out: list[Verdict] = []
    if n == 0:
        return out
    finite = np.isfinite(x)
    step0 = float(x[0]) if finite[0] else math.nan
    scale = chance if chance is not None and chance > 0 else (
        abs(step0) if math.isfinite(step0) and step0 != 0 else 1.0)

    # ---------------------------------------------------------------- spikes
    upto = int(np.argmin(finite)) if not finite.all() else n
    spikes = [e for e in detect_spikes(x[:upto], z=th.spike_z, ratio=th.spike_ratio,
                                       min_jump=th.spike_jump_frac * scale,
                                       warmup=th.spike_warmup)
              if e.kind == "spike"]
    spike_verdicts = [
        Verdict(
            "curve.loss_spike", int(st[e.step]),
            f"loss spike at step {int(st[e.step])}: {_fmt(e.value)}, {e.ratio:.1f}x the running "
            f"level {_fmt(e.level)} (robust std {_fmt(e.spread)}).",
            evidence={"step": int(st[e.step]), "value": e.value, "level_before": e.level,
             "spread": e.spread, "ratio": e.ratio,
             "back_to_level_within": _recovery(x, e.step, e.level, e.spread, th)})
        for e in spikes[: th.max_spikes]]

    # ---------------------------------------------------------------- divergence
    diverging = _divergence(x, st, vals, step0, th)
    if diverging is not None:
        return [diverging, *spike_verdicts]
    if upto < n:  # a NaN/Inf without growth before it: the numerics stage says where
        return spike_verdicts

    overfit = _overfitting(x, st, vals, th, val_examples)
    events = [*([] if overfit is None else [overfit]), *spike_verdicts]
    if not final or n < th.min_steps:
        return events
    shape = _shape(x, st, vals, step0, chance, prior, scale, th, noisy, heavy_tailed)
    if shape is not None:
        return [shape, *_collapse_verdict(shape), *events]
    if events:
        return events
    start, end = float(np.median(x[: max(3, n // 10)])), float(np.median(x[-max(5, n // 4):]))
    return [Verdict(
        "curve.healthy", int(st[-1]),
        f"the loss fell from {_fmt(start)} to {_fmt(end)} over {n} steps without spikes, "
        "rebounds or plateaus" + (" beyond its noise (a noisy objective: its pace is not "
                                  "judged)." if noisy else "."),
        evidence={"start": start, "end": end, "steps": n})]


def _recovery(x: np.ndarray, i: int, level: float, spread: float, th: CurveThresholds
              ) -> int | None:
    """Steps after the spike at ``i`` until the loss is back near ``level`` (None: not seen)."""
    back = level + max(3 * spread, 0.5 * (x[i] - level))
    after = x[i + 1: i + 1 + 50]
    hits = np.nonzero(after <= back)[0]
    return int(hits[0]) + 1 if hits.size else None


def _divergence(x: np.ndarray, st: np.ndarray, vals: list[tuple[int, float]], step0: float,
                th: CurveThresholds) -> Verdict | None:
    finite = np.isfinite(x)
    if not finite.all():
        i = int(np.argmin(finite))
        ref = step0 if math.isfinite(step0) else math.nan
        fell = math.isfinite(ref) and bool(np.any(
            x[max(0, i - 8):i] < -th.diverge_ratio * max(abs(ref), 1.0)))
        if not grew_before(x, i, ref, th.diverge_ratio) and not fell:
            return None  # NaN/Inf out of the blue: a numerics bug, not the curve's shape
        last = float(x[i - 1]) if i > 0 else math.nan
        down = fell and not grew_before(x, i, ref, th.diverge_ratio)
        early = " so early that the learning rate is the first suspect" if i < 50 and not down \
            else ""
        return Verdict(
            "curve.diverging", int(st[i]),
            f"the training loss became {x[i]} at step {int(st[i])}{early} (step-0 loss "
            f"{_fmt(step0)}, last finite value {_fmt(last)})"
            + (": it fell without bound first, a loss no objective can reach." if down else "."),
            evidence={"first_nonfinite_step": int(st[i]), "value": str(x[i]), "step0": step0,
             "last_finite": last, "max_finite": float(np.max(x[:i])) if i else math.nan,
             **({"direction": "down"} if down else {})},
            hint=UNBOUNDED_BELOW_HINT if down else None)
    for s, v in vals:
        if not math.isfinite(v):
            return Verdict(
                "curve.diverging", s,
                f"the validation loss became {v} at step {s} while the training loss was "
                f"finite (step-0 loss {_fmt(step0)}).",
                evidence={"first_nonfinite_val_step": s, "value": str(v), "step0": step0})
    if math.isfinite(step0) and x.size >= 2 * th.smooth:
        fall = _unbounded_fall(x, st, step0, th)
        if fall is not None:
            return fall
    if not math.isfinite(step0) or step0 <= 0 or x.size < th.smooth:
        return None
    med = _running_median(x, th.smooth)
    high = med > th.diverge_ratio * step0
    if not high[-1]:
        return None
    # the last crossing into the high region
    below = np.nonzero(~high)[0]
    first = int(below[-1]) + 1 if below.size else 0
    i = first + th.smooth - 1  # the step at which the running median crossed
    slope, _ = _slope_t(np.log(np.maximum(x[first:], 1e-30)))
    return Verdict(
        "curve.diverging", int(st[i]),
        f"the training loss grew to {_fmt(float(med[-1]))} (running median), "
        f"{med[-1] / step0:.3g}x the step-0 loss {_fmt(step0)}, and has stayed above "
        f"{th.diverge_ratio:g}x since step {int(st[i])}.",
        evidence={"step0": step0, "level": float(med[-1]), "ratio_to_step0": float(med[-1] / step0),
         "since_step": int(st[i]), "log_slope_per_step": slope})


def _unbounded_fall(x: np.ndarray, st: np.ndarray, step0: float, th: CurveThresholds
                    ) -> Verdict | None:
    """``curve.diverging`` for a loss that falls without bound: its running median below
    ``-diverge_ratio`` times the step-0 loss's size (at least 1) and its magnitude still growing
    over the second half of the window (a likelihood with a flipped term heads to minus
    infinity; a Gaussian NLL that settles below zero does not)."""
    ref = max(abs(step0), 1.0)
    med = _running_median(x, th.smooth)
    if not med[-1] < -th.diverge_ratio * ref:
        return None
    tail = x[x.size // 2:]
    if tail.size < 4 or not bool(np.all(tail < 0)):
        return None
    slope, t = _slope_t(np.log(-tail))
    if not (slope > 0 and t > th.trend_t):
        return None
    above = np.nonzero(med >= -th.diverge_ratio * ref)[0]
    i = (int(above[-1]) + 1 if above.size else 0) + th.smooth - 1
    return Verdict(
        "curve.diverging", int(st[i]),
        f"the training loss fell without bound: {_fmt(float(med[-1]))} (running median) from "
        f"{_fmt(step0)} at step 0, below -{th.diverge_ratio:g}x its size since step "
        f"{int(st[i])} and still falling ({math.exp(slope):.3g}x per step): a loss that no "
        "objective can reach, e.g. a term with the wrong sign.",
        evidence={"step0": step0, "level": float(med[-1]), "since_step": int(st[i]),
                  "log_slope_per_step": slope, "direction": "down"},
        hint=UNBOUNDED_BELOW_HINT)


def _overfitting(x: np.ndarray, st: np.ndarray, vals: list[tuple[int, float]],
                 th: CurveThresholds, val_examples: int | None = None) -> Verdict | None:
    if len(vals) < 3:
        return None
    v = np.array([val for _, val in vals])
    for j in range(1, len(vals)):
        best_i = int(np.argmin(v[:j]))
        best = float(v[best_i])
        run = v[best_i + 1: j + 1]
        if run.size < th.overfit_confirm or best <= 0:
            continue
        tail = run[-th.overfit_confirm:]
        rising = bool(np.all(tail > best * (1 + th.overfit_rise))) and bool(
            np.all(np.diff(run[-th.overfit_confirm - 1:]) >= 0) if run.size > th.overfit_confirm
            else np.all(np.diff(tail) >= 0))
        if not rising:
            continue
        # significance: the validation mean over N examples moves by ~best/sqrt(N) by chance
        se = best / math.sqrt(val_examples) if val_examples else 0.0
        if float(v[j]) - best <= th.overfit_z * se:
            continue
        s_best, s_now = vals[best_i][0], vals[j][0]
        before = x[(st <= s_best)]
        after = x[(st > s_best) & (st <= s_now)]
        if before.size < 3 or after.size < 1:
            continue
        tr_best = float(np.median(before[-max(3, before.size // 4):]))
        tr_now = float(np.median(after[-max(1, after.size // 2):]))
        if not tr_now < tr_best:
            continue  # training loss not falling: not overfitting (maybe lr_too_high)
        gap_best, gap_now = best - tr_best, float(v[j]) - tr_now
        return Verdict(
            "curve.overfitting", s_now,
            f"validation loss rose from its best {_fmt(best)} (step {s_best}) to "
            f"{_fmt(float(v[j]))} (step {s_now}) while the training loss kept falling "
            f"({_fmt(tr_best)} -> {_fmt(tr_now)}); the gap widened from {_fmt(gap_best)} to "
            f"{_fmt(gap_now)}.",
            evidence={"best_val": best, "best_val_step": s_best, "val": float(v[j]), "step": s_now,
             "train_at_best": tr_best, "train_now": tr_now, "gap_at_best": gap_best,
             "gap_now": gap_now, "val_examples": val_examples,
             "standard_error": se if val_examples else None})
    return None


def _step_noise(x: np.ndarray, heavy_tailed: bool) -> float:
    """The per-step noise of ``x``: the robust (MAD) spread of its step-to-step differences,
    or their standard deviation when larger for a heavy-tailed loss (the robust spread does
    not see the outlier batches)."""
    diffs = np.diff(x)
    if not diffs.size:
        return 0.0
    noise = float(1.4826 * np.median(np.abs(diffs - np.median(diffs))) / math.sqrt(2))
    if heavy_tailed and diffs.size > 1:
        noise = max(noise, float(np.std(diffs)) / math.sqrt(2))
    return noise


def _collapse_verdict(plateau: Verdict) -> list[Verdict]:
    """``[curve.lr_too_high]`` (an error) beside a plateau at chance that followed a blow-up at
    the first steps (its evidence's ``collapse``), else ``[]``: the learning rate killed the
    network, and the plateau is what it left (the report explains the plateau by it)."""
    c = plateau.evidence.get("collapse")
    if not c:
        return []
    ev = plateau.evidence
    return [Verdict(
        "curve.lr_too_high", plateau.step,
        f"the first updates blew the loss up to {_fmt(c['peak'])} at step {c['step']} "
        f"({c['ratio']:.3g}x the step-0 loss {_fmt(ev['step0'])}), then it settled at "
        f"{_fmt(ev['level'])}, the chance level: the network died at the first steps (every "
        "input gets the same prediction since). The learning rate is far too high for the start "
        "of training.",
        evidence={"step0": ev["step0"], "level": ev["level"], "chance": ev["chance"],
                  "prior": ev["prior"], "collapse": c}, severity="error")]


def _early_collapse(x: np.ndarray, st: np.ndarray, step0: float, chance: float,
                    th: CurveThresholds) -> dict[str, Any] | None:
    """The blow-up at the first steps of a curve that then settled at chance: a loss above
    ``diverge_ratio`` times the step-0 loss (and the chance level) within the first
    ``spike_warmup`` steps (``None``: none). The first updates wrecked the weights (dead units,
    saturated outputs) and the model fell back to predicting the prior: a learning-rate
    collapse, not a plateau to explain elsewhere."""
    head = x[1: th.spike_warmup + 1]
    if head.size == 0 or not math.isfinite(step0) or step0 <= 0:
        return None
    i = int(np.argmax(head)) + 1
    peak = float(x[i])
    if not peak > th.diverge_ratio * max(step0, chance):
        return None
    return {"step": int(st[i]), "peak": peak, "ratio": peak / step0}


def _shape(x: np.ndarray, st: np.ndarray, vals: list[tuple[int, float]], step0: float,
           chance: float | None, prior: float | None, scale: float, th: CurveThresholds,
           noisy: bool = False, heavy_tailed: bool = False) -> Verdict | None:
    n = x.size
    start = float(np.median(x[: max(3, min(20, n // 10))]))
    end = float(np.median(x[-max(5, n // 4):]))
    progress = (start - end) / abs(start) if start != 0 else 0.0
    blocks = _block_medians(x, 8 if n >= 32 else 4)
    noise = _step_noise(x[n // 2:], heavy_tailed)
    slope, t = _slope_t(x)
    _last_half_slope, last_half_t = _slope_t(x[n // 2:])
    v = np.array([val for _, val in vals]) if vals else np.array([])
    ev: dict[str, Any] = {
        "steps": n, "step0": step0, "start": start, "end": end, "progress": progress,
        "slope_per_step": slope, "slope_t": t, "noise": noise,
        "block_medians": [float(b) for b in blocks], "chance": chance, "prior": prior,
        "val": [float(a) for a in v[-10:]]}
    last = int(st[-1])

    # ---- plateau at chance: moved away, then settled at the chance level (or the prior)
    if chance is not None and chance > 0:
        refs = [r for r in (chance, prior) if r is not None and r > 0]
        near = [r for r in refs if abs(end - r) <= th.chance_tol * r]
        moved = (abs(step0 - chance) > th.moved_frac * chance
                 or float(np.max(x)) > 2 * chance
                 or float(blocks.min()) < (1 - th.moved_frac) * chance)
        settled = last_half_t > -th.trend_t
        if near and moved and settled:
            return Verdict(
                "curve.plateau_at_chance", last,
                f"the loss moved (step-0 {_fmt(step0)}, max {_fmt(float(np.max(x)))}) and then "
                f"settled at {_fmt(end)}, the chance level {_fmt(chance)}"
                f"{'' if prior is None else f' (prior {_fmt(prior)})'}: the model predicts "
                "the same distribution for every input.",
                evidence={**ev, "level": end, "max": float(np.max(x)),
                          "collapse": _early_collapse(x, st, step0, chance, th)})

    # a noisy (or heavy-tailed) objective's block medians move by chance: a rise must clear
    # their noise
    margin = th.noisy_margin_z * 1.2533 * noise * math.sqrt(2 / max(1, n // blocks.size)) \
        if noisy or heavy_tailed else 0.0
    ev["margin"] = margin
    rose = (float(blocks[1:].max()) > th.rise_ratio * step0
            and float(blocks[1:].max()) - max(step0, float(blocks[0])) > margin) \
        if blocks.size > 1 else False
    # ---- no real progress: flat (not learning) or a steady crawl (learning rate too low)
    from_step0 = (step0 - end) / abs(step0) if step0 else 0.0
    if abs(progress) < th.low_progress and abs(from_step0) < th.low_progress and not rose:
        val_constant = v.size >= 2 and float(np.ptp(v)) <= th.val_constant_tol * abs(float(v[0]))
        val_falling = v.size >= 2 and bool(np.all(np.diff(v) < 0))
        # a noisy objective: its floor and its pace cannot be told apart in the window
        judged = val_constant or not noisy
        # the window's fall read from its trend over every step (the start and end medians
        # hold a few noisy steps each): a slow pace needs both readings below the threshold
        ev["trend_fall"] = trend_fall = -slope * (n - 1) / abs(start) if start else 0.0
        if val_constant:
            declining = False
        elif val_falling or t < -th.trend_t:
            declining = True
        else:
            declining = False
        if judged and declining and (progress > 0 or val_falling) \
                and trend_fall < th.low_progress:
            rate = (float(v[0] - v[-1]) / abs(float(v[0]))) if val_falling else progress
            # say which signal decided: the training trend, or a validation loss that falls at
            # every run by amounts too small to show in the training noise
            trend = (f"the training loss declines slowly and steadily: {_fmt(start)} -> "
                     f"{_fmt(end)} over {n} steps ({100 * progress:.2f}%; slope {slope:.3g}/step, "
                     f"t = {t:.1f})" if t < -th.trend_t else
                     f"the training loss barely moves ({_fmt(start)} -> {_fmt(end)} over {n} "
                     f"steps, t = {t:.1f})")
            val_text = (f"; the validation loss falls at every run, by {100 * rate:.3g}% in all "
                        f"({float(v[0]):.6g} -> {float(v[-1]):.6g})" if val_falling else "")
            return Verdict("curve.lr_too_low", last, f"{trend}{val_text}.",
                                evidence={**ev, "relative_decrease": rate, "val_falling": val_falling})
        if judged and (abs(progress) < th.flat_tol or val_constant or not declining):
            why = ("the validation loss is identical at every run (the weights do not change)"
                   if val_constant else f"no significant trend (t = {t:.1f})")
            return Verdict(
                "curve.not_learning", last,
                f"the loss stays at its step-0 value: {_fmt(start)} -> {_fmt(end)} over {n} "
                f"steps ({100 * progress:+.2f}%), {why}.",
                evidence={**ev, "val_constant": val_constant})

    # ---- learning rate too high: the loss rises above its start or bounces back up
    reasons = []
    if rose:
        b = int(np.argmax(blocks[1:])) + 1
        reasons.append(f"it rose to {_fmt(float(blocks[b]))} (block median), "
                       f"{float(blocks[b]) / step0:.2f}x the step-0 loss {_fmt(step0)}")
    rebound = None
    for b in range(1, blocks.size):
        best = float(blocks[:b].min())
        if blocks[b] > th.rebound_ratio * best \
                and blocks[b] - best > max(th.rebound_min_frac * scale, margin):
            rebound = (b, best, float(blocks[b]))
            break
    if rebound is not None:
        reasons.append(f"it bounced back up from {_fmt(rebound[1])} to {_fmt(rebound[2])} "
                       f"(block medians, {rebound[2] / rebound[1]:.2f}x)")
    if reasons:
        return Verdict(
            "curve.lr_too_high", last,
            f"the loss is unstable: {'; '.join(reasons)}; noise {_fmt(noise)} per step "
            f"around {_fmt(end)}.",
            evidence={**ev, "rose": rose, "rebound": None if rebound is None else list(rebound)})
    return None


__all__ = ["CurveThresholds", "Verdict", "classify_curve"]
