"""Gradient statistics and their classification: exploding, vanishing, spikes, dead units,
update-to-weight ratios.

Two layers: tensor functions that run on the device every step with fused ops and no host
synchronization (:func:`grad_norms`, :func:`update_norms`, :func:`alive_units`), and
:func:`classify_gradients`, which judges plain numbers moved to the host (per-step total norms,
per-layer norm series, update ratios, dead-unit counts) and returns ``grad.*`` verdicts.

Example:
    >>> import torch
    >>> grads = [torch.full((3,), 2.0), torch.full((4,), 1.0)]
    >>> total, per = grad_norms(grads)
    >>> round(float(total), 3), [round(v, 3) for v in per.tolist()]
    (4.0, [3.464, 2.0])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from lightning_triage._torch_compat import foreach_norms
from lightning_triage.functional.spikes import SpikeEvent, detect_spikes, grew_before
from lightning_triage.functional.verdict import Verdict


# --------------------------------------------------------------------------- device side
def grad_norms(grads: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """``(total, per_tensor)`` L2 norms of ``grads`` with fused ops, left on their device.

    One fused norm (:func:`~lightning_triage._torch_compat.foreach_norms`) over all tensors, a
    stack, and the norm of the stacked norms:
    no host synchronization. Norms are float32.

    Example:
        >>> total, per = grad_norms([torch.full((4,), 1.5), torch.tensor([3.0, 4.0])])
        >>> round(float(total), 3), [round(float(n), 3) for n in per]
        (5.831, [3.0, 5.0])
    """
    if not grads:
        zero = torch.zeros(())
        return zero, torch.zeros(0)
    per = torch.stack(foreach_norms(grads))  # mixed dtypes are promoted
    if per.dtype != torch.float32:
        per = per.float()
    return torch.linalg.vector_norm(per), per


def update_norms(new: Sequence[Tensor], old: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """``(||new - old||, ||old||)`` per tensor, stacked, with fused ops (update-to-weight)."""
    diffs = torch._foreach_sub(list(new), list(old))
    return (torch.stack([n.float() for n in foreach_norms(diffs)]),
            torch.stack([n.float() for n in foreach_norms(old)]))


def alive_units(grad: Tensor) -> Tensor:
    """Per output unit (first dimension) of a weight gradient: any non-zero entry (bool).

    A sparse COO gradient (``nn.Embedding(sparse=True)``) is read through its coalesced rows,
    other non-dense layouts through their dense form.

    Example:
        >>> alive_units(torch.tensor([[0.0, 1.0], [0.0, 0.0]])).tolist()
        [True, False]
        >>> alive_units(torch.sparse_coo_tensor([[2]], [[1.0, 0.0]], (3, 2))).tolist()
        [False, False, True]
    """
    grad = grad.detach()
    if grad.layout == torch.sparse_coo:
        grad = grad.coalesce()
        alive = torch.zeros(grad.shape[0], dtype=torch.bool, device=grad.device)
        values = grad._values()
        rows = grad._indices()[0]
        if values.numel():
            alive[rows[values.reshape(values.shape[0], -1).abs().amax(dim=1) > 0]] = True
        return alive
    if grad.layout != torch.strided or grad.is_nested:
        grad = grad.to_dense()
    if grad.numel() == 0:
        return torch.zeros(grad.shape[0], dtype=torch.bool, device=grad.device)
    return grad.reshape(grad.shape[0], -1).abs().amax(dim=1) > 0


# --------------------------------------------------------------------------- host side
@dataclass(frozen=True)
class GradThresholds:
    """Thresholds of :func:`classify_gradients` (calibrated on the tests' healthy runs).

    Attributes:
        growth: total norm (median of the last fifth of the window over the first fifth)
            above this: exploding.
        depth_ratio: per-layer median norms, first weight layer over the last: above this
            exploding, below ``1 / depth_ratio`` vanishing.
        spike_z: a spike is this many robust standard deviations above the running level,
        spike_ratio: and this many times it.
        spike_warmup: steps of baseline before spikes are looked for.
        follow_steps: a loss spike within this many steps after a gradient spike "followed".
        clip_quantile: the suggested clipping value is this quantile of the healthy norms.
        ratio_low: update-to-weight ratio (median per layer) below this: far below ~1e-3.
        ratio_high: above this: far above ~1e-3.
        dead_fraction: a layer with at least this fraction of units that never got a gradient.
        min_steps: fewer steps than this: only spikes and non-finite norms are judged.
        max_spikes: at most this many ``grad.spike`` verdicts.

    Example:
        A milder spike counts when the thresholds are lowered:

        >>> norms = [1.0 + 0.05 * (i % 5) for i in range(60)]
        >>> norms[40] = 6.0
        >>> [v.code for v in classify_gradients(norms)]
        []
        >>> [v.code for v in classify_gradients(norms, thresholds=GradThresholds(spike_ratio=4.0))]
        ['grad.spike']
    """

    growth: float = 100.0
    depth_ratio: float = 1e3
    spike_z: float = 10.0
    spike_ratio: float = 10.0
    spike_warmup: int = 16
    follow_steps: int = 5
    clip_quantile: float = 0.99
    ratio_low: float = 1e-5
    ratio_high: float = 0.3
    dead_fraction: float = 0.5
    min_steps: int = 20
    max_spikes: int = 5


#: A final window of at least this many steps but fewer than ``min_steps`` (the run ended
#: inside it) is still judged for growth...
SHORT_WINDOW_STEPS = 8
#: ...by more than this many times ``GradThresholds.growth`` (orders of magnitude: a blow-up).
SHORT_WINDOW_GROWTH = 100.0


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def suggest_clip(norms: Sequence[float] | np.ndarray, quantile: float = 0.99) -> float | None:
    """A gradient-clipping value: a high quantile of the finite ``norms``, 2 significant digits.

    Example:
        >>> suggest_clip([1.0] * 99 + [50.0])
        1.5
    """
    arr = np.asarray(norms, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return None
    q = float(np.quantile(arr, quantile))
    if q <= 0:
        return None
    digits = -math.floor(math.log10(q)) + 1
    return float(round(q, digits))


def loss_spike_after(loss: Sequence[float] | np.ndarray, i: int, follow_steps: int,
                     ratio: float = 2.0, baseline: int = 16) -> int | None:
    """The offset (0..``follow_steps``) of the first loss value after index ``i`` that is
    non-finite or above ``ratio`` times the median of the ``baseline`` values before ``i``."""
    arr = np.asarray(loss, dtype=np.float64)
    before = arr[max(0, i - baseline):i]
    before = before[np.isfinite(before)]
    if before.size == 0:
        return None
    level = float(np.median(before))
    for k in range(follow_steps + 1):
        if i + k >= arr.size:
            break
        v = arr[i + k]
        if not math.isfinite(v) or (level > 0 and v > ratio * level):
            return k
    return None


def jumped_first(layer_norms: np.ndarray, names: Sequence[str], i: int,
                 baseline: np.ndarray, lookback: int = 5, ratio: float = 3.0
                 ) -> tuple[str | None, int | None, dict[str, float]]:
    """Which layer's norm jumped first before (or at) row ``i`` of ``layer_norms`` (steps x
    layers), judged against its ``baseline`` norm: ``(name, row, ratios at row i)``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = layer_norms / np.where(baseline > 0, baseline, np.nan)
    ratios = {n: float(r) for n, r in zip(names, rel[i], strict=True) if math.isfinite(float(r))}
    for row in range(max(0, i - lookback), i + 1):
        r = rel[row]
        hit = np.nonzero(np.nan_to_num(r, nan=0.0, posinf=np.inf) > ratio)[0]
        if hit.size:
            j = int(hit[np.argmax(np.nan_to_num(r[hit], posinf=1e300))])
            return names[j], row, ratios
    if ratios:
        name = max(ratios, key=ratios.__getitem__)
        return name, i, ratios
    return None, None, ratios


def spike_verdict(event: SpikeEvent, *, clip: float | None, followed: int | None,
                  first_layer: str | None = None, first_step: int | None = None,
                  layer_ratios: Mapping[str, float] | None = None,
                  after_window: bool = False, follow_steps: int = 5,
                  clip_val: float | None = None) -> Verdict:
    """A ``grad.spike`` verdict from a spike event and what is known around it.

    ``clip_val`` is the user's ``gradient_clip_val`` (total-norm clipping): a spike above it was
    clipped (expected behaviour), and a suggested ``clip`` no tighter than it is dropped.

    Example:
        >>> e = SpikeEvent("spike", 40, 12.0, 0.8, 0.05, 15.0, 40)
        >>> v = spike_verdict(e, clip=1.4, followed=None, clip_val=1.0)
        >>> v.evidence["suggested_clip"], v.evidence["clipped_to"]
        (None, 1.0)
    """
    if clip is not None and clip_val is not None and clip >= clip_val:
        clip = None  # never suggest a clip looser than the user's
    msg = (f"gradient-norm spike at step {event.step}: total norm {_fmt(event.value)}, "
           f"{event.ratio:.1f}x the running level {_fmt(event.level)}")
    if first_layer is not None:
        msg += f"; `{first_layer}` jumped first (step {first_step})"
    if followed is not None:
        msg += (f"; the loss spiked {followed} step(s) later: exploding gradients, clip them")
    else:
        msg += f"; no loss spike followed within {follow_steps} steps"
    clipped = clip_val if clip_val is not None and event.value > clip_val else None
    if clipped is not None:
        msg += f"; your `gradient_clip_val={clip_val:g}` clipped this step's update"
    if clip is not None:
        msg += f". Suggested `gradient_clip_val={clip:g}` (the {99}th percentile of healthy norms)"
    top = dict(sorted((layer_ratios or {}).items(), key=lambda kv: -kv[1])[:5])
    return Verdict(
        "grad.spike", event.step, msg + ".", layer=first_layer,
        evidence={"step": event.step, "norm": event.value, "level_before": event.level,
         "spread": event.spread, "ratio": event.ratio, "loss_spike_followed": followed is not None,
         "loss_spike_after_steps": followed, "suggested_clip": clip,
         "first_layer": first_layer, "first_layer_step": first_step,
         "layer_ratios_top": top, "after_window": after_window, "clipped_to": clipped})


def module_name(param_name: str) -> str:
    """The module of a parameter name (``"enc.0.weight"`` -> ``"enc.0"``)."""
    return param_name.rsplit(".", 1)[0] if "." in param_name else param_name


def layer_groups(param_names: Sequence[str], max_layers: int = 40) -> tuple[list[str], list[int]]:
    """Group parameters by module for the report's per-layer gradient heatmap: the module names
    (cut to a shallower depth until at most ``max_layers`` remain) and each parameter's group.

    Example:
        >>> layer_groups(["enc.0.weight", "enc.0.bias", "head.weight"])
        (['enc.0', 'head'], [0, 0, 1])
        >>> layer_groups(["a.0.w", "a.1.w", "b.w"], max_layers=2)
        (['a', 'b'], [0, 0, 1])
    """
    modules = [module_name(n) for n in param_names]
    depth = max((m.count(".") + 1 for m in modules), default=1)
    while True:
        cut = [".".join(m.split(".")[:depth]) for m in modules]
        names = list(dict.fromkeys(cut))
        if len(names) <= max_layers or depth == 1:
            names = names[:max_layers]  # depth 1 and still too many: the first ones
            index = {n: i for i, n in enumerate(names)}
            return names, [index.get(c, -1) for c in cut]
        depth -= 1


def layer_norms(per: np.ndarray, groups: Sequence[int], n_layers: int) -> np.ndarray:
    """Per-layer gradient norms (steps x layers) from per-parameter ones (steps x parameters),
    each parameter in group ``groups[j]`` (``-1``: none), vectorized over the steps.

    A sum per group, not a product with a 0/1 membership matrix: an Inf norm (a diverging run)
    times 0 would make NaN, and a numpy warning.

    Example:
        >>> layer_norms(np.array([[3.0, 4.0, 1.0]]), [0, 0, 1], 2).tolist()
        [[5.0, 1.0]]
        >>> layer_norms(np.array([[np.inf, 4.0, 1.0]]), [0, 0, 1], 2).tolist()
        [[inf, 1.0]]
    """
    squares = np.square(np.asarray(per, dtype=np.float64))
    group = np.asarray(groups)
    out = np.zeros((squares.shape[0], n_layers))
    for g in range(n_layers):
        out[:, g] = squares[:, group == g].sum(axis=1)
    return np.sqrt(out)


def median_ratios(rows: np.ndarray, names: Sequence[str]) -> dict[str, float]:
    """The median of each column's finite values (sampled update-to-weight ratios, steps x
    layers), by layer name; a layer with none is left out.

    Example:
        >>> median_ratios(np.array([[1e-3, np.nan], [3e-3, np.nan], [2e-3, np.nan]]), ["a", "b"])
        {'a': 0.002}
    """
    out: dict[str, float] = {}
    for k, name in enumerate(names):
        col = rows[:, k][np.isfinite(rows[:, k])]
        if col.size:
            out[name] = float(np.median(col))
    return out


def explosion_verdict(event: SpikeEvent, totals: Sequence[float] | np.ndarray, i: int, *,
                      clip: float | None, growth: float) -> Verdict | None:
    """A ``grad.exploding`` verdict of the long-run watch from a ``"sustained"`` or
    ``"nonfinite"`` event (index ``i`` in this chunk's ``totals``), or ``None``: a sustained
    drop, or a NaN/Inf out of the blue (no growth before it: the numerics stage locates it).

    Example:
        >>> e = SpikeEvent("sustained", 40, 50.0, 1.0, 0.1, 50.0, confirmed_step=56)
        >>> explosion_verdict(e, [50.0], 0, clip=2.0, growth=1e3).evidence["kind"]
        'sustained'
    """
    if event.kind == "sustained" and event.value > event.level:
        return Verdict(
            "grad.exploding", event.step,
            f"the total gradient norm jumped from a running level of {event.level:.3g} to "
            f"{event.value:.3g} ({event.ratio:.1f}x) at step {event.step} and stayed there "
            f"(confirmed at step {event.confirmed_step}).", layer=None,
            evidence={"step": event.step, "norm": event.value, "level_before": event.level,
                      "ratio": event.ratio, "suggested_clip": clip, "kind": "sustained"})
    if event.kind == "nonfinite" and grew_before(totals, i, event.level, growth / 10):
        return Verdict(
            "grad.exploding", event.step,
            f"the total gradient norm became {event.value} at step {event.step} (running level "
            f"before: {event.level:.3g}).", layer=None,
            evidence={"step": event.step, "norm": str(event.value), "level_before": event.level,
                      "kind": "nonfinite"})
    return None


def classify_gradients(
    total: Sequence[float] | np.ndarray,
    *,
    steps: Sequence[int] | None = None,
    layers: Mapping[str, Sequence[float] | np.ndarray] | None = None,
    loss: Sequence[float] | np.ndarray | None = None,
    update_ratios: Mapping[str, float] | None = None,
    dead_units: Mapping[str, tuple[int, int]] | None = None,
    nonfinite_is_skip: bool = False,
    final: bool = True,
    thresholds: GradThresholds | None = None,
    clip_val: float | None = None,
    depth_layers: Sequence[str] | None = None,
) -> list[Verdict]:
    """Classify the gradient norms of a window of training.

    Args:
        total: the total gradient norm per optimizer step.
        steps: the global step of each value (default ``0, 1, ...``).
        layers: per-layer (weight tensors, in depth order) norm series aligned with ``total``.
        loss: the training loss aligned with ``total`` (says whether a loss spike followed a
            gradient spike).
        update_ratios: per-layer median ``||delta w|| / ||w||``.
        dead_units: per layer ``(units that never got a gradient, units)``.
        nonfinite_is_skip: non-finite norms are steps the fp16 gradient scaler skips: ignore.
        final: judge the whole window (growth, depth ratios, update ratios, dead units); if
            ``False`` only spikes and non-finite norms. A final window shorter than
            ``min_steps`` (the run ended there) is judged for growth only, and only by more than
            :data:`SHORT_WINDOW_GROWTH` times ``growth``.
        thresholds: see :class:`GradThresholds`.
        clip_val: the user's ``gradient_clip_val`` (total-norm clipping), if any: a spike's
            message says the update was clipped, and no looser clip is suggested.
        depth_layers: the layers (keys of ``layers``, in depth order) whose first and last
            are compared for exploding or vanishing gradients (default: all of them). A
            parameter-efficient fine-tune compares its adapter layers only: a fresh task head
            beside adapters over a frozen base says nothing about depth.

    Example:
        >>> norms = [1.0 + 0.05 * (i % 5) for i in range(60)]
        >>> norms[40] = 80.0
        >>> [(v.code, v.step) for v in classify_gradients(norms)]
        [('grad.spike', 40)]
    """
    th = thresholds or GradThresholds()
    x = np.asarray(total, dtype=np.float64).reshape(-1)
    st = np.arange(x.size) if steps is None else np.asarray(steps, dtype=np.int64)
    out: list[Verdict] = []
    if x.size == 0:
        return out
    finite = np.isfinite(x)
    if nonfinite_is_skip:
        keep = finite
        x, st = x[keep], st[keep]
        layers = {k: np.asarray(v, dtype=np.float64)[keep] for k, v in (layers or {}).items()}
        if loss is not None:
            loss = np.asarray(loss, dtype=np.float64)[keep]
    elif not finite.all():
        i = int(np.argmin(finite))
        verdict = _nonfinite_verdict(x, st, i, th)
        if verdict is None:  # NaN/Inf out of the blue: a numerics bug (the numerics stage says where)
            return out
        out.append(verdict)
        x, st = x[:i], st[:i]
    if x.size == 0:
        return out
    layer_map = dict(layers or {})
    names = list(layer_map.keys())
    mat = (np.stack([np.asarray(layer_map[n], dtype=np.float64)[: x.size] for n in names], axis=1)
           if names else None)
    out += _window_spikes(x, st, names, mat, loss, th, clip_val)
    exploded = any(v.code == "grad.exploding" for v in out)
    if not final or x.size < th.min_steps:
        # a run that ended inside a short window still reports norms that grew by orders of
        # magnitude more than the usual threshold (a blow-up, not noise)
        if final and not exploded and x.size >= SHORT_WINDOW_STEPS:
            out += _growth_verdicts(x, st, th, th.growth * SHORT_WINDOW_GROWTH)
        return out
    if not exploded:
        out += _growth_verdicts(x, st, th, th.growth)
    depth = [n for n in (depth_layers if depth_layers is not None else names) if n in layer_map]
    if mat is not None and len(depth) >= 3:
        cols = [names.index(n) for n in depth]
        out += _depth_verdicts(depth, mat[:, cols], int(st[-1]), th)
    out += _ratio_verdicts(update_ratios or {}, int(st[-1]), th)
    out += _dead_verdicts(dead_units or {}, names, mat, int(st[-1]), x.size, th)
    return out


def _nonfinite_verdict(x: np.ndarray, st: np.ndarray, i: int, th: GradThresholds) -> Verdict | None:
    """``grad.exploding`` for a window's first non-finite norm (index ``i``) after growth, else
    ``None``."""
    ref = float(np.median(x[: max(1, min(8, i))])) if i else math.nan
    if not grew_before(x, i, ref, th.growth / 10):
        return None
    return Verdict(
        "grad.exploding", int(st[i]),
        f"the total gradient norm became {x[i]} at step {int(st[i])} (median before: "
        f"{_fmt(float(np.median(x[:i]))) if i else 'n/a'}).",
        layer=None, evidence={"first_nonfinite_step": int(st[i]), "value": str(x[i]),
                              "median_before": float(np.median(x[:i])) if i else None})


def _window_spikes(x: np.ndarray, st: np.ndarray, names: list[str], mat: np.ndarray | None,
                   loss: Sequence[float] | np.ndarray | None, th: GradThresholds,
                   clip_val: float | None) -> list[Verdict]:
    """``grad.spike`` verdicts of a window's (finite) total norms."""
    out = []
    events = [e for e in detect_spikes(x, z=th.spike_z, ratio=th.spike_ratio,
                                       warmup=th.spike_warmup) if e.kind == "spike"]
    for e in events[: th.max_spikes]:
        followed = None if loss is None else loss_spike_after(loss, e.step, th.follow_steps)
        first: str | None = None
        first_row: int | None = None
        ratios: dict[str, float] = {}
        if mat is not None:
            base = np.median(mat[max(0, e.step - 32):e.step], axis=0)
            first, first_row, ratios = jumped_first(mat, names, e.step, base)
        healthy = x[max(0, e.step - 256):e.step]
        ev = SpikeEvent(e.kind, int(st[e.step]), e.value, e.level, e.spread, e.ratio,
                        int(st[e.step]))
        out.append(spike_verdict(ev, clip=suggest_clip(healthy, th.clip_quantile),
                                 followed=followed, first_layer=first,
                                 first_step=None if first_row is None else int(st[first_row]),
                                 layer_ratios=ratios, follow_steps=th.follow_steps,
                                 clip_val=clip_val))
    return out


def _growth_verdicts(x: np.ndarray, st: np.ndarray, th: GradThresholds,
                     growth: float) -> list[Verdict]:
    """``grad.exploding`` for total norms that grow over the window by more than ``growth``."""
    fifth = max(2, x.size // 5)
    head, tail = float(np.median(x[:fifth])), float(np.median(x[-fifth:]))
    if not (head > 0 and tail > growth * head):
        return []
    roll = np.lib.stride_tricks.sliding_window_view(x, min(8, x.size)).mean(axis=1)
    cross = np.nonzero(roll > 10 * head)[0]
    i = int(cross[0]) + min(8, x.size) - 1 if cross.size else x.size - 1
    return [Verdict(
        "grad.exploding", int(st[i]),
        f"the total gradient norm grew {tail / head:.3g}x over the window: median "
        f"{_fmt(head)} in the first {fifth} steps, {_fmt(tail)} in the last {fifth} "
        f"(above 10x the start from step {int(st[i])}).",
        layer=None, evidence={"first_median": head, "last_median": tail, "growth": tail / head})]


def _depth_verdicts(names: list[str], mat: np.ndarray, step: int,
                    th: GradThresholds) -> list[Verdict]:
    """The first weight layer's gradient against the last one's: exploding or vanishing."""
    med = np.median(mat, axis=0)
    head_n, last = float(med[0]), float(med[-1])
    if not (head_n > 0 and last > 0):
        return []
    r = head_n / last
    evidence = {"first_layer_norm": head_n, "last_layer_norm": last, "ratio": r,
                "layer_medians": {n: float(m) for n, m in zip(names, med, strict=True)}}
    if r > th.depth_ratio:
        return [Verdict(
            "grad.exploding", step,
            f"gradient norms grow by {r:.3g}x from the last layer `{names[-1]}` "
            f"({_fmt(last)}) back to the first `{names[0]}` ({_fmt(head_n)}): each "
            "layer amplifies the gradient (initialization too large?).",
            layer=names[0], evidence=evidence)]
    if r < 1 / th.depth_ratio:
        return [Verdict(
            "grad.vanishing", step,
            f"the first layer `{names[0]}` gets gradients {1 / r:.3g}x smaller than the "
            f"last `{names[-1]}` (median norms {_fmt(head_n)} vs {_fmt(last)}).",
            layer=names[0], evidence=evidence)]
    return []


def _ratio_verdicts(update_ratios: Mapping[str, float], step: int,
                    th: GradThresholds) -> list[Verdict]:
    """``grad.update_ratio`` for layers whose update-to-weight ratio is far from ~1e-3."""
    out = []
    ratios = {k: float(v) for k, v in update_ratios.items() if math.isfinite(float(v))}
    low = {k: v for k, v in ratios.items() if v < th.ratio_low}
    high = {k: v for k, v in ratios.items() if v > th.ratio_high}
    for group, word, advice in ((high, "above", "lower the learning rate"),
                                (low, "below", "raise the learning rate (0?)")):
        if not group:
            continue
        worst = max(group, key=lambda k: abs(math.log10(max(group[k], 1e-30)) + 3))
        out.append(Verdict(
            "grad.update_ratio", step,
            f"update-to-weight ratio far {word} ~1e-3 in {len(group)} of {len(ratios)} "
            f"layer(s): `{worst}` {group[worst]:.2g} (median ||dw||/||w|| per step): {advice}.",
            layer=worst, evidence={"ratios": group, "all_ratios": ratios, "direction": word}))
    return out


def _dead_verdicts(dead_units: Mapping[str, tuple[int, int]], names: list[str],
                   mat: np.ndarray | None, step: int, n_steps: int,
                   th: GradThresholds) -> list[Verdict]:
    """``grad.dead_units`` for layers with units that never got a gradient, or none at all."""
    dead = {k: (int(d), int(u)) for k, (d, u) in dead_units.items() if u > 0}
    bad = {k: du for k, du in dead.items() if du[0] / du[1] >= th.dead_fraction}
    if mat is not None:
        zero = [n for j, n in enumerate(names) if float(np.max(mat[:, j])) == 0.0]
        for n in zero:
            bad.setdefault(n, dead.get(n, (0, 0)))
    if not bad:
        return []
    worst = max(bad, key=lambda k: bad[k][0] / bad[k][1] if bad[k][1] else 1.0)
    d, u = bad[worst]
    what = (f"{d} of {u} units never got a gradient" if u else "its gradient was always 0")
    return [Verdict(
        "grad.dead_units", step,
        f"`{worst}`: {what} over {n_steps} steps"
        + (f" (and {len(bad) - 1} more layer(s))" if len(bad) > 1 else "") + ".",
        layer=worst, evidence={"layers": {k: {"dead": v[0], "units": v[1]} for k, v in bad.items()}})]

__all__ = [
    "GradThresholds",
    "Verdict",
    "alive_units",
    "classify_gradients",
    "explosion_verdict",
    "grad_norms",
    "jumped_first",
    "layer_groups",
    "layer_norms",
    "loss_spike_after",
    "median_ratios",
    "module_name",
    "spike_verdict",
    "suggest_clip",
    "update_norms",
]
