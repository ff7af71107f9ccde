"""Per-tensor statistics of the data stage: summaries, finiteness, scale, constancy, the
examples' feature view and a small picture of a batch.

Pure functions over tensors (no Lightning).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

#: Elements kept per example by the fingerprint and the feature statistics (an evenly spaced
#: subset of the flattened example).
FEATURES = 256


def is_float(t: Tensor) -> bool:
    return t.is_floating_point()


def is_class_target(t: Tensor) -> bool:
    """Integer (not bool) targets: class indices."""
    return not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool


@dataclass(frozen=True)
class TensorSummary:
    """Statistics of one tensor of a batch (``min``..``std`` over its finite values).

    Example:
        >>> s = summarize_tensor(torch.tensor([1.0, float("inf"), 3.0]), "batch[0]")
        >>> s.name, s.shape, s.dtype, s.inf, s.max
        ('batch[0]', [3], 'float32', 1, 3.0)
        >>> sorted(s.to_dict())[:3]
        ['dtype', 'inf', 'max']
    """

    name: str
    shape: list[int]
    dtype: str
    numel: int
    nan: int
    inf: int
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    rms: float | None
    #: examples (rows) the statistics were computed on when the tensor was too large to read
    #: whole (see :data:`MAX_SUMMARY_ELEMENTS`); ``None``: every value was read
    rows: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Elements processed at once by the batch statistics: the temporaries of a summary stay
#: within a few times this many values (a few MiB) whatever the batch size.
CHUNK_ELEMENTS = 1 << 20
#: Above this many elements a tensor is summarized on evenly spaced examples (rows) that hold
#: at most this many values: the time per inspected batch is bounded (16 MiB of float32).
MAX_SUMMARY_ELEMENTS = 1 << 22


def _chunks(t: Tensor, size: int = CHUNK_ELEMENTS, rows: Tensor | None = None
            ) -> Iterator[Tensor]:
    """Flat pieces of ``t`` (of its ``rows`` along dim 0, if given) of about ``size`` elements:
    views where ``t`` is contiguous, else copies of one piece at a time."""
    if rows is None and (t.is_contiguous() or t.ndim <= 1):
        flat = t.reshape(-1)
        for i in range(0, flat.numel(), size):
            yield flat[i:i + size]
        return
    step = max(1, size // max(1, t[0].numel()))
    if rows is None:
        for i in range(0, t.shape[0], step):
            yield t[i:i + step].reshape(-1)
    else:
        for i in range(0, rows.numel(), step):
            yield t.index_select(0, rows[i:i + step]).reshape(-1)


def _row_sample(t: Tensor, max_elements: int | None) -> Tensor | None:
    """``None`` (read every row), or the indices of evenly spaced rows of ``t`` holding at most
    ``max_elements`` values when it is larger."""
    if max_elements is None or t.numel() <= max_elements or t.ndim == 0 or t.shape[0] < 2:
        return None
    keep = max(1, min(t.shape[0], max_elements // max(1, t[0].numel())))
    if keep >= t.shape[0]:
        return None
    return torch.linspace(0, t.shape[0] - 1, keep, device=t.device).round().long()


def summarize_tensor(t: Tensor, name: str = "tensor",
                     max_elements: int | None = MAX_SUMMARY_ELEMENTS) -> TensorSummary:
    """Shape, dtype, NaN/Inf counts and min/max/mean/std/rms of the finite values of ``t``.

    One host synchronization. Computed in chunks of :data:`CHUNK_ELEMENTS` values, so the
    extra memory is a few MiB whatever the size of ``t``; a tensor larger than ``max_elements``
    is summarized on evenly spaced rows (examples, dim 0) holding at most that many values
    (``rows`` says how many; ``None``: all), which bounds the time.

    Example:
        >>> s = summarize_tensor(torch.tensor([[0.0, 2.0], [float("nan"), 4.0]]), "x")
        >>> s.nan, s.min, s.max, s.mean
        (1, 0.0, 4.0, 2.0)
        >>> summarize_tensor(torch.ones(100, 10), max_elements=250).rows
        25
    """
    shape, dtype, numel = list(t.shape), str(t.dtype).replace("torch.", ""), t.numel()
    if numel == 0 or t.is_complex():
        return TensorSummary(name, shape, dtype, numel, 0, 0, None, None, None, None, None)
    x = t.detach()
    sample = _row_sample(x, max_elements)
    rows = None if sample is None else sample.numel()
    floating = t.is_floating_point()
    work = torch.float64 if x.dtype == torch.int64 else torch.float32
    if floating and x.dtype not in (torch.float16, torch.bfloat16):
        work = x.dtype
    zero64 = torch.zeros((), dtype=torch.float64, device=x.device)
    nan = inf = n_finite = torch.zeros((), dtype=torch.int64, device=x.device)
    total, total_sq = zero64, zero64
    lo = torch.full((), math.inf, dtype=torch.float64, device=x.device)
    hi = torch.full((), -math.inf, dtype=torch.float64, device=x.device)
    for chunk in _chunks(x, rows=sample):
        c = chunk.to(work)
        if floating:
            nan_mask, inf_mask = torch.isnan(c), torch.isinf(c)
            finite = ~(nan_mask | inf_mask)
            nan, inf = nan + nan_mask.sum(), inf + inf_mask.sum()
            del nan_mask, inf_mask
            n_finite = n_finite + finite.sum()
            vals = torch.where(finite, c, torch.zeros((), dtype=c.dtype, device=c.device))
            lo = torch.minimum(lo, torch.where(finite, c, torch.full(
                (), math.inf, dtype=c.dtype, device=c.device)).min().double())
            hi = torch.maximum(hi, torch.where(finite, c, torch.full(
                (), -math.inf, dtype=c.dtype, device=c.device)).max().double())
        else:
            n_finite = n_finite + c.numel()
            vals = c
            lo, hi = torch.minimum(lo, c.min().double()), torch.maximum(hi, c.max().double())
        total = total + vals.sum(dtype=torch.float64)
        total_sq = total_sq + vals.square().sum(dtype=torch.float64)
    count = n_finite.clamp(min=1).double()
    mean = total / count
    sq = total_sq / count
    var = (sq - mean * mean).clamp(min=0) * count / (count - 1).clamp(min=1)
    packed = torch.stack([nan.double(), inf.double(), n_finite.double(), lo, hi,
                          mean, var.sqrt(), sq.sqrt()]).tolist()
    n_nan, n_inf, n_fin = int(packed[0]), int(packed[1]), int(packed[2])
    if n_fin == 0:
        return TensorSummary(name, shape, dtype, numel, n_nan, n_inf, None, None, None, None, None,
                             rows)
    lo_v, hi_v, mean_v, std_v, rms_v = (float(v) for v in packed[3:])
    return TensorSummary(name, shape, dtype, numel, n_nan, n_inf, lo_v, hi_v, mean_v, std_v,
                         rms_v, rows)


def first_nonfinite_example(t: Tensor) -> int | None:
    """Index (along dim 0) of the first example holding a NaN/Inf, or ``None``.

    Example:
        >>> first_nonfinite_example(torch.tensor([[1.0], [float("inf")]]))
        1
    """
    if not t.is_floating_point() or t.ndim == 0:
        return None
    bad = (~torch.isfinite(t.detach())).reshape(t.shape[0], -1).any(dim=1).nonzero()
    return int(bad[0, 0]) if bad.numel() else None


def scale_verdict(summary: TensorSummary, max_rms: float = 4.0) -> str | None:
    """``"large"``/``"tiny"`` when float values are far from standardized, else ``None``.

    ``"large"``: the root mean square of the values exceeds ``max_rms`` (raw 0-16 digits have
    rms 7.8, 0-255 pixels ~100; standardized data ~1, pixels in [0, 1] < 1). ``"tiny"``: every
    value below 0.1 in magnitude and rms < 0.01 (pixels divided by 255 twice). Integer tensors
    (token ids, class indices) are never "unnormalized".

    Example:
        >>> scale_verdict(summarize_tensor(torch.arange(17.0).repeat(4)))
        'large'
        >>> scale_verdict(summarize_tensor(torch.randn(64, generator=torch.Generator().manual_seed(0))))
    """
    if not summary.dtype.startswith(("float", "bfloat")) or summary.rms is None:
        return None
    assert summary.min is not None
    assert summary.max is not None
    if summary.rms > max_rms:
        return "large"
    peak = max(abs(summary.min), abs(summary.max))
    if 0 < peak < 0.1 and summary.rms < 0.01:
        return "tiny"
    return None


#: Features per example from which a non-negative input is read as intensities (an image,
#: a spectrogram), not a handful of tabular measurements.
TINY_MIN_FEATURES = 64


def far_below_unit_scale(summary: TensorSummary, max_peak: float = 0.1, max_rms: float = 0.05,
                         min_features: int = TINY_MIN_FEATURES) -> bool:
    """Whether float inputs look like intensities scaled down twice (``data.tiny_input_scale``).

    True for a non-negative tensor with at least ``min_features`` values per example whose
    largest value stays below ``max_peak`` and whose root mean square is below ``max_rms``
    (digits divided by 16 twice: peak 0.0625, rms ~0.03; 0-255 pixels divided by 255 twice are
    smaller still, and :func:`scale_verdict` already calls them ``"tiny"``). Silent where small
    raw scales are normal: signed signals (audio waveforms, centered tabular features such as
    scikit-learn's diabetes, rms 0.048) and tabular data with few features (iris in metres),
    whatever their scale.

    Example:
        >>> pixels = torch.rand(32, 64, generator=torch.Generator().manual_seed(0))
        >>> far_below_unit_scale(summarize_tensor(pixels / 16))
        True
        >>> far_below_unit_scale(summarize_tensor(pixels))
        False
        >>> wave = 0.03 * torch.randn(32, 16000, generator=torch.Generator().manual_seed(0))
        >>> far_below_unit_scale(summarize_tensor(wave))
        False
    """
    if not summary.dtype.startswith(("float", "bfloat")) or summary.rms is None:
        return False
    assert summary.min is not None
    assert summary.max is not None
    features = summary.numel // max(1, summary.shape[0]) if summary.shape else 0
    return (summary.min >= 0 and 0 < summary.max < max_peak and summary.rms < max_rms
            and features >= min_features)


def constant_across_batch(t: Tensor) -> bool:
    """Whether every example of ``t`` (dim 0) is identical (needs at least 2 examples).

    A constant *feature* (the same column in every example) is not a constant input.

    Example:
        >>> x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
        >>> x[:, 0] = 0.0  # a constant feature column
        >>> constant_across_batch(x), constant_across_batch(torch.ones(4, 3))
        (False, True)
    """
    if t.ndim == 0 or t.shape[0] < 2 or t.numel() == 0:
        return False
    x = t.detach()
    first = x[:1]
    rows = max(1, CHUNK_ELEMENTS // max(1, first.numel()))  # bounded temporaries
    return all(bool((x[i:i + rows] == first).all()) for i in range(1, x.shape[0], rows))


def _downsample_index(width: int, keep: int, device: torch.device) -> Tensor | None:
    if width <= keep:
        return None
    return torch.linspace(0, width - 1, keep, device=device).round().long()


def flat_features(t: Tensor, keep: int = FEATURES) -> Tensor:
    """``(N, <=keep)`` view of ``t``: each example flattened, then an evenly spaced subset."""
    x = t.detach().reshape(t.shape[0], -1) if t.ndim > 1 else t.detach().reshape(-1, 1)
    index = _downsample_index(x.shape[1], keep, x.device)
    return x if index is None else x.index_select(1, index)


def _rounded(t: Tensor) -> Any:
    return [[round(float(v), 4) for v in row] for row in t.tolist()] if t.ndim == 2 else \
        [round(float(v), 4) for v in t.tolist()]


def batch_picture(inputs: Tensor, targets: Tensor | None = None, max_examples: int = 8,
                  max_side: int = 32, max_columns: int = 16) -> dict[str, Any]:
    """A small JSON-able sample of a batch for the report.

    ``kind`` is ``"image"`` (``(N, C, H, W)`` with 1-4 channels, or float ``(N, H, W)``; each
    example a ``[C][H][W]`` list, at most ``max_side`` pixels a side), ``"tokens"`` (integer
    ``(N, T)``; the first ``4 * max_columns`` ids) or ``"table"`` (the first ``max_columns``
    values of each flattened example). For a table whose width is a square of 64 or more
    values, ``image_shape`` suggests how to draw it (digits' 64 pixels: ``[8, 8]``).

    Example:
        >>> pic = batch_picture(torch.zeros(20, 1, 8, 8), torch.arange(20))
        >>> pic["kind"], len(pic["examples"]), pic["targets"][:3]
        ('image', 8, [0, 1, 2])
    """
    x = inputs.detach()[:max_examples].cpu()
    shape = list(inputs.shape)
    picture: dict[str, Any] = {"shape": shape, "dtype": str(inputs.dtype).replace("torch.", "")}
    if x.dtype == torch.bool or x.is_complex():
        x = x.real.float() if x.is_complex() else x.float()
    if (x.ndim == 4 and x.shape[1] <= 4) or (x.ndim == 3 and x.is_floating_point() and min(x.shape[1:]) >= 4):
        images = x if x.ndim == 4 else x[:, None]
        step_h = max(1, math.ceil(images.shape[2] / max_side))
        step_w = max(1, math.ceil(images.shape[3] / max_side))
        images = images[:, :, ::step_h, ::step_w].float()
        picture["kind"] = "image"
        picture["examples"] = [[_rounded(ch) for ch in img] for img in images]
    elif not x.is_floating_point() and x.ndim == 2:
        picture["kind"] = "tokens"
        picture["examples"] = [[int(v) for v in row[: 4 * max_columns].tolist()] for row in x]
    else:
        flat = x.reshape(x.shape[0], -1).float() if x.ndim > 0 else x.reshape(1, 1).float()
        picture["kind"] = "table"
        picture["examples"] = _rounded(flat[:, :max_columns])
        width = flat.shape[1]
        side = math.isqrt(width)
        if x.ndim == 2 and width >= 64 and side * side == width and side <= max_side:
            picture["image_shape"] = [side, side]
            picture["pixels"] = _rounded(flat)
    if targets is not None:
        t = targets.detach()[:max_examples].cpu()
        picture["targets"] = (t.tolist() if t.ndim <= 1 and not t.is_floating_point() else
                              _rounded(t.float().reshape(t.shape[0], -1)[:, :max_columns])
                              if t.ndim >= 1 else [round(float(t), 4)])
    return picture
