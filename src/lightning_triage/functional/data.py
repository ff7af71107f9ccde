"""Batch statistics for the data stage: summaries, scale, constancy, fingerprints, class counts,
train/val shift and a label-misalignment probe.

Pure functions over tensors (no Lightning). Nothing here consumes the global RNG: the
misalignment probe draws its permutations from a private, seeded ``torch.Generator``.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
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


def example_fingerprints(t: Tensor, keep: int = FEATURES) -> list[int]:
    """A 64-bit hash per example of a downsampled view (``keep`` evenly spaced elements).

    Equal examples get equal fingerprints; examples that differ only outside the sampled
    elements also do (rare for real data). One transfer of ``N x keep`` values to the CPU.

    Example:
        >>> a = torch.tensor([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0]])
        >>> fp = example_fingerprints(a)
        >>> fp[0] == fp[2], fp[0] == fp[1]
        (True, False)
    """
    if t.ndim == 0 or t.shape[0] == 0:
        return []
    x = flat_features(t, keep).contiguous().cpu()
    if x.dtype == torch.bfloat16:
        x = x.float()
    x = x.clone()
    if x.is_floating_point():
        x[x == 0] = 0.0  # -0.0 and 0.0 hash alike
    rows = x.numpy()
    tag = f"{tuple(t.shape[1:])}{t.dtype}".encode()
    return [int.from_bytes(hashlib.blake2b(tag + row.tobytes(), digest_size=8).digest(), "little")
            for row in rows]


def batch_fingerprint(fingerprints: list[int]) -> int:
    """One hash for a whole batch (its examples in order).

    Example:
        >>> batch_fingerprint([1, 2]) == batch_fingerprint([1, 2]) != batch_fingerprint([2, 1])
        True
    """
    data = b"".join(f.to_bytes(8, "little") for f in fingerprints)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def duplicate_stats(fingerprints: list[int]) -> tuple[int, int]:
    """``(repeats, largest_group)``: examples equal to an earlier one, and the largest group.

    Example:
        >>> duplicate_stats([5, 5, 5, 7])
        (2, 3)
    """
    counts: dict[int, int] = {}
    for f in fingerprints:
        counts[f] = counts.get(f, 0) + 1
    return len(fingerprints) - len(counts), max(counts.values(), default=0)


class FingerprintStore:
    """A set of fingerprints with a fixed capacity: memory stays flat on long runs.

    When full, the oldest fingerprints are forgotten first. Values map to where they were first
    seen (any small picklable value).

    Example:
        >>> store = FingerprintStore(capacity=2)
        >>> for i in range(5):
        ...     store.add(i, f"batch {i}")
        >>> len(store), 0 in store, store.get(4)
        (2, False, 'batch 4')
    """

    def __init__(self, capacity: int = 65536) -> None:
        if capacity < 1:
            raise ValueError(f"`capacity` must be >= 1, got {capacity}.")
        self.capacity = capacity
        self._items: OrderedDict[int, Any] = OrderedDict()

    def add(self, fingerprint: int, where: Any = None) -> None:
        if fingerprint in self._items:
            return
        self._items[fingerprint] = where
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, fingerprint: int) -> Any:
        return self._items.get(fingerprint)

    def clear(self) -> None:
        self._items.clear()

    def items(self) -> list[tuple[int, Any]]:
        """``(fingerprint, where)`` pairs, oldest first."""
        return list(self._items.items())

    def __contains__(self, fingerprint: object) -> bool:
        return fingerprint in self._items

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class RangeCheck:
    """Class targets outside ``[0, num_classes)`` (``ignore_index`` excluded)."""

    bad: int
    total: int
    min: int
    max: int
    first_index: int | None
    values: list[int]


def target_range(targets: Tensor, num_classes: int, ignore_index: int = -100) -> RangeCheck:
    """Count class targets outside ``[0, num_classes)``, ignoring ``ignore_index``.

    Example:
        >>> r = target_range(torch.tensor([1, 5, 10, -100]), 10)
        >>> r.bad, r.min, r.max, r.first_index, r.values
        (1, 1, 10, 2, [10])
    """
    t = targets.detach().reshape(-1)
    valid = t != ignore_index
    bad_mask = valid & ((t < 0) | (t >= num_classes))
    kept = t[valid]
    if kept.numel() == 0:
        return RangeCheck(0, 0, 0, 0, None, [])
    stats = torch.stack([bad_mask.sum(), kept.min(), kept.max()]).tolist()
    first = bad_mask.nonzero()
    first_index = None
    if first.numel():
        flat = int(first[0, 0])
        per_example = max(1, t.numel() // max(1, targets.shape[0] if targets.ndim else 1))
        first_index = flat // per_example
    values = sorted({int(v) for v in t[bad_mask][:4096].unique()[:8].tolist()})
    return RangeCheck(int(stats[0]), int(kept.numel()), int(stats[1]), int(stats[2]), first_index,
                      values)


def class_counts(targets: Tensor, ignore_index: int = -100, max_classes: int = 100_000) -> dict[int, int]:
    """Count of each class index in ``targets`` (``ignore_index`` excluded).

    Example:
        >>> class_counts(torch.tensor([0, 2, 2, -100]))
        {0: 1, 2: 2}
    """
    t = targets.detach().reshape(-1)
    t = t[(t != ignore_index) & (t >= 0) & (t < max_classes)]
    if t.numel() == 0:
        return {}
    values, counts = t.unique(return_counts=True)
    return {int(v): int(c) for v, c in zip(values.tolist(), counts.tolist(), strict=True)}


@dataclass(frozen=True)
class Imbalance:
    """Whether one class dominates the targets seen, or batches are made of one class."""

    dominant: int | None
    share: float
    threshold: float
    one_class_batches: int
    batches: int
    expected_one_class: float

    @property
    def dominated(self) -> bool:
        return self.dominant is not None and self.share >= self.threshold

    @property
    def sorted_batches(self) -> bool:
        return (self.batches >= 3 and self.one_class_batches >= max(3, self.batches / 2)
                and self.expected_one_class < 0.1)


def class_imbalance(counts: dict[int, int], batch_classes: list[tuple[int, int]],
                    num_classes: int | None = None, share: float | None = None) -> Imbalance:
    """Judge the class distribution ``counts`` and the per-batch ``(size, distinct classes)``.

    A class dominates when its share reaches ``share`` (default 0.5 with 3+ classes, 0.9 with
    2). Batches are "made of one class" when at least half of the batches of 8+ examples hold a
    single class although the overall distribution makes that unlikely (expected share < 0.1):
    a loader that is not shuffled over data sorted by class.

    Example:
        >>> imb = class_imbalance({0: 90, 1: 5, 2: 5}, [(32, 3)] * 3)
        >>> imb.dominated, imb.dominant, round(imb.share, 2)
        (True, 0, 0.9)
        >>> class_imbalance({0: 64, 1: 64}, [(32, 1)] * 4).sorted_batches
        True
    """
    total = sum(counts.values())
    k = max(len(counts), num_classes or 0)
    threshold = share if share is not None else (0.9 if k <= 2 else 0.5)
    dominant, top = (max(counts.items(), key=lambda kv: kv[1]) if counts else (None, 0))
    big = [(n, c) for n, c in batch_classes if n >= 8]
    probs = [c / total for c in counts.values()] if total else []
    expected = (sum(sum(p ** n for p in probs) for n, _ in big) / len(big)) if big and probs else 1.0
    return Imbalance(dominant=dominant if total else None, share=top / total if total else 0.0,
                     threshold=threshold, one_class_batches=sum(1 for _, c in big if c == 1),
                     batches=len(big), expected_one_class=expected)


class FeatureMoments:
    """Running per-feature sums over the examples of one split (bounded: ``keep`` features).

    Example:
        >>> m = FeatureMoments()
        >>> m.update(torch.ones(4, 3))
        >>> m.count, m.mean().tolist()
        (4, [1.0, 1.0, 1.0])
    """

    def __init__(self, keep: int = FEATURES) -> None:
        self.keep = keep
        self.count = 0
        self.sum: Tensor | None = None
        self.sumsq: Tensor | None = None

    def update(self, t: Tensor) -> None:
        x = flat_features(t, self.keep).double()
        x = torch.where(torch.isfinite(x), x, torch.zeros_like(x)).cpu()
        if self.sum is not None and self.sum.shape[0] != x.shape[1]:
            return  # a different input shape: keep the first
        s, sq = x.sum(0), (x * x).sum(0)
        self.sum = s if self.sum is None else self.sum + s
        self.sumsq = sq if self.sumsq is None else self.sumsq + sq
        self.count += x.shape[0]

    def mean(self) -> Tensor:
        assert self.sum is not None
        return self.sum / max(self.count, 1)

    def var(self) -> Tensor:
        assert self.sumsq is not None
        mean = self.mean()
        return (self.sumsq / max(self.count, 1) - mean * mean).clamp(min=0)

    def state_dict(self) -> dict[str, Any]:
        return {"keep": self.keep, "count": self.count,
                "sum": None if self.sum is None else self.sum.tolist(),
                "sumsq": None if self.sumsq is None else self.sumsq.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.keep = int(state.get("keep", self.keep))
        self.count = int(state.get("count", 0))
        s, sq = state.get("sum"), state.get("sumsq")
        self.sum = None if s is None else torch.tensor(s, dtype=torch.float64)
        self.sumsq = None if sq is None else torch.tensor(sq, dtype=torch.float64)


@dataclass(frozen=True)
class Shift:
    """How train and validation input statistics differ, per feature (medians over features)."""

    mean_shift: float
    std_ratio: float
    features: int
    train_mean: float
    val_mean: float
    train_std: float
    val_std: float

    def clearly_different(self, max_mean_shift: float = 0.5, max_std_ratio: float = 2.0) -> bool:
        return self.mean_shift > max_mean_shift or self.std_ratio > max_std_ratio


def input_shift(train: FeatureMoments, val: FeatureMoments, eps: float = 1e-8) -> Shift | None:
    """Compare per-feature statistics of train and validation inputs.

    ``mean_shift`` is the median over features of ``|mean_train - mean_val|`` divided by the
    pooled std; ``std_ratio`` the median of ``max(std) / min(std)``. Features constant in both
    splits are left out. ``None`` when a split is empty or the shapes differ.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> a, b = FeatureMoments(), FeatureMoments()
        >>> a.update(torch.randn(200, 8, generator=g)); b.update(torch.randn(200, 8, generator=g) * 6 + 5)
        >>> s = input_shift(a, b)
        >>> s.clearly_different(), round(s.std_ratio) >= 5
        (True, True)
    """
    if train.count == 0 or val.count == 0 or train.sum is None or val.sum is None:
        return None
    if train.sum.shape != val.sum.shape:
        return None
    mt, mv, vt, vv = train.mean(), val.mean(), train.var(), val.var()
    st, sv = vt.sqrt(), vv.sqrt()
    live = (vt + vv) / 2 > eps
    if not bool(live.any()):
        return None
    d = (mt - mv).abs()[live] / ((vt + vv)[live] / 2).sqrt()
    both = (st > 1e-6) & (sv > 1e-6)
    if bool(both.any()):
        ratio = float((torch.maximum(st, sv)[both] / torch.minimum(st, sv)[both]).median())
    else:  # constant in one split, varying in the other
        ratio = math.inf
    gt = (train.sumsq.sum() / (train.count * train.sum.numel())) if train.sumsq is not None else 0.0
    gv = (val.sumsq.sum() / (val.count * val.sum.numel())) if val.sumsq is not None else 0.0
    t_mean, v_mean = float(mt.mean()), float(mv.mean())
    return Shift(mean_shift=float(d.median()), std_ratio=ratio, features=int(live.sum()),
                 train_mean=t_mean, val_mean=v_mean,
                 train_std=math.sqrt(max(float(gt) - t_mean ** 2, 0.0)),
                 val_std=math.sqrt(max(float(gv) - v_mean ** 2, 0.0)))


@dataclass(frozen=True)
class LabelSignal:
    """Whether simple probes find the targets predictable from the inputs.

    ``knn``: leave-one-out 1-nearest-neighbour accuracy; ``centroid``: 2-fold nearest-centroid
    accuracy; each with the z-score against the same probe on permuted labels (``z_*``).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> y = torch.randint(0, 3, (300,), generator=g)
        >>> signal = label_signal(torch.randn(300, 5, generator=g) + 2 * y[:, None].float(), y)
        >>> signal.examples, signal.classes, signal.knn > signal.knn_null, signal.related()
        (300, 3, True, True)
    """

    examples: int
    classes: int
    majority: float
    knn: float
    centroid: float
    knn_null: float
    centroid_null: float
    z_knn: float
    z_centroid: float

    def related(self, z: float = 3.5) -> bool:
        """Whether a probe departs from shuffled labels by ``z`` standard deviations.

        The nearest-neighbour probe counts either way (parity-like tasks put neighbours in
        opposite classes: far *below* the permutations is a relation too).
        """
        return abs(self.z_knn) >= z or self.z_centroid >= z

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _centroid_accuracy(x: Tensor, y: Tensor, classes: int, fold: Tensor) -> float:
    correct = 0
    for f in (0, 1):
        train, test = fold != f, fold == f
        sums = torch.zeros(classes, x.shape[1], dtype=x.dtype).index_add_(0, y[train], x[train])
        counts = torch.bincount(y[train], minlength=classes).to(x.dtype)
        present = counts > 0
        centroids = sums[present] / counts[present, None]
        labels = present.nonzero().reshape(-1)
        pred = labels[torch.cdist(x[test], centroids).argmin(1)]
        correct += int((pred == y[test]).sum())
    return correct / x.shape[0]


def label_signal(inputs: Tensor, targets: Tensor, permutations: int = 100, seed: int = 0,
                 min_per_class: int = 8) -> LabelSignal | None:
    """Probe whether class ``targets`` are related to ``inputs`` at all.

    Fits closed-form probes on the examples (each flattened, downsampled to 256 features and
    standardized) and compares them with the same probes on permuted labels, drawn from a
    private generator (the global RNG is not touched). Shuffled labels give z-scores near 0; a
    real task, even a hard one, beats the permutations by several standard deviations.
    Classes with fewer than ``min_per_class`` examples are left out. ``None`` with fewer than 32
    examples or 2 classes left, or when one class holds 95% of the examples.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> y = torch.randint(0, 3, (300,), generator=g)
        >>> x = torch.randn(300, 5, generator=g) + y[:, None].float()
        >>> label_signal(x, y).related(), label_signal(x, y[torch.randperm(300, generator=g)]).related()
        (True, False)
    """
    y_raw = targets.detach().reshape(-1).cpu().long()
    if y_raw.numel() != inputs.shape[0]:
        return None
    values, y, counts = y_raw.unique(return_inverse=True, return_counts=True)
    kept = counts[y] >= min_per_class  # too rare a class says nothing either way
    if int(counts.max()) >= 0.95 * y.numel():
        return None  # nearly one class: the probes cannot beat the majority meaningfully
    x = flat_features(inputs).double().cpu()[kept]
    values, y = y_raw[kept].unique(return_inverse=True)
    n, classes = y.numel(), values.numel()
    if n < 32 or classes < 2:
        return None
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    std = x.std(0)
    x = (x - x.mean(0)) / torch.where(std > 1e-8, std, torch.ones_like(std))
    dist = torch.cdist(x, x)
    dist.fill_diagonal_(math.inf)
    nearest = dist.argmin(1)
    gen = torch.Generator().manual_seed(seed)
    fold = torch.randperm(n, generator=gen) % 2
    knn = float((y[nearest] == y).double().mean())
    centroid = _centroid_accuracy(x, y, classes, fold)
    null_knn, null_centroid = [], []
    for _ in range(permutations):
        yp = y[torch.randperm(n, generator=gen)]
        null_knn.append(float((yp[nearest] == yp).double().mean()))
        null_centroid.append(_centroid_accuracy(x, yp, classes, fold))

    def z(value: float, null: list[float]) -> float:
        t = torch.tensor(null, dtype=torch.float64)
        return (value - float(t.mean())) / max(float(t.std()), 1.0 / n)

    counts = torch.bincount(y, minlength=classes)
    return LabelSignal(examples=n, classes=int(classes), majority=float(counts.max()) / n,
                       knn=knn, centroid=centroid, knn_null=sum(null_knn) / permutations,
                       centroid_null=sum(null_centroid) / permutations,
                       z_knn=z(knn, null_knn), z_centroid=z(centroid, null_centroid))


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


__all__ = [
    "FEATURES",
    "FeatureMoments",
    "FingerprintStore",
    "Imbalance",
    "LabelSignal",
    "RangeCheck",
    "Shift",
    "TensorSummary",
    "batch_fingerprint",
    "batch_picture",
    "class_counts",
    "class_imbalance",
    "constant_across_batch",
    "duplicate_stats",
    "example_fingerprints",
    "first_nonfinite_example",
    "flat_features",
    "input_shift",
    "label_signal",
    "scale_verdict",
    "summarize_tensor",
    "target_range",
]
