"""Per-feature moments of each split and the train/validation shift between them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_triage.functional.data.inputs import FEATURES, _downsample_index, flat_features

#: A validation value this many training scales away from the training mean of its feature is
#: an extreme outlier (the scale: the feature's training std, at least the median std of the
#: features, so that a feature constant in training is judged on the data's own scale).
OUTLIER_SCALES = 1000.0


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


class FeatureExtremes:
    """Per-feature largest and smallest values of one split, and where each was seen
    (``(dataloader_idx, batch_idx, row)``), over the same features as :class:`FeatureMoments`.

    Example:
        >>> e = FeatureExtremes()
        >>> e.update(torch.tensor([[0.0, 1.0], [5.0, -2.0]]), (0, 3))
        >>> e.high.tolist(), e.where(0, high=True)
        ([5.0, 1.0], (0, 3, 1))
    """

    def __init__(self, keep: int = FEATURES) -> None:
        self.keep = keep
        self.width = 0
        self.high: Tensor | None = None
        self.low: Tensor | None = None
        self._high_at: list[tuple[int, int, int]] = []
        self._low_at: list[tuple[int, int, int]] = []

    def update(self, t: Tensor, key: tuple[int, int]) -> None:
        x = flat_features(t, self.keep).double()
        if x.shape[0] == 0 or (self.high is not None and self.high.shape[0] != x.shape[1]):
            return
        x = x.cpu()
        finite = torch.isfinite(x)
        hi, hi_row = torch.where(finite, x, -math.inf).max(0)
        lo, lo_row = torch.where(finite, x, math.inf).min(0)
        if self.high is None or self.low is None:
            self.width = int(t.reshape(t.shape[0], -1).shape[1]) if t.ndim > 1 else 1
            self.high, self.low = hi, lo
            self._high_at = [(*key, int(r)) for r in hi_row.tolist()]
            self._low_at = [(*key, int(r)) for r in lo_row.tolist()]
            return
        for f in torch.nonzero(hi > self.high).flatten().tolist():
            self._high_at[f] = (*key, int(hi_row[f]))
        for f in torch.nonzero(lo < self.low).flatten().tolist():
            self._low_at[f] = (*key, int(lo_row[f]))
        self.high, self.low = torch.maximum(self.high, hi), torch.minimum(self.low, lo)

    def where(self, feature: int, high: bool) -> tuple[int, int, int]:
        return (self._high_at if high else self._low_at)[feature]

    def feature_index(self, feature: int) -> int:
        """The index in the flattened example of feature ``feature`` (of the kept subset)."""
        index = _downsample_index(self.width, self.keep, torch.device("cpu"))
        return feature if index is None else int(index[feature])

    def state_dict(self) -> dict[str, Any]:
        return {"keep": self.keep, "width": self.width,
                "high": None if self.high is None else self.high.tolist(),
                "low": None if self.low is None else self.low.tolist(),
                "high_at": [list(a) for a in self._high_at],
                "low_at": [list(a) for a in self._low_at]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.keep = int(state.get("keep", self.keep))
        self.width = int(state.get("width", 0))
        hi, lo = state.get("high"), state.get("low")
        self.high = None if hi is None else torch.tensor(hi, dtype=torch.float64)
        self.low = None if lo is None else torch.tensor(lo, dtype=torch.float64)
        self._high_at = [(int(a), int(b), int(c)) for a, b, c in state.get("high_at", [])]
        self._low_at = [(int(a), int(b), int(c)) for a, b, c in state.get("low_at", [])]


@dataclass(frozen=True)
class Outlier:
    """The validation value farthest from the training data: its feature (index in the
    flattened example), where it was seen, its value, the feature's training mean and std, and
    how many training scales away it is."""

    feature: int
    where: tuple[int, int, int]
    value: float
    train_mean: float
    train_std: float
    scales: float


def val_outlier(train: FeatureMoments, val: FeatureExtremes) -> Outlier | None:
    """The validation value farthest from its feature's training mean, in training scales
    (the feature's training std, at least the median training std over the features, so that a
    feature constant in training is judged on the data's scale); ``None`` without statistics.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> m, e = FeatureMoments(), FeatureExtremes()
        >>> m.update(torch.randn(200, 4, generator=g))
        >>> v = torch.randn(50, 4, generator=g)
        >>> v[7, 2] = 3e6
        >>> e.update(v, (0, 1))
        >>> o = val_outlier(m, e)
        >>> o.feature, o.where, o.scales > 1e6
        (2, (0, 1, 7), True)
    """
    if train.count < 2 or train.sum is None or val.high is None or val.low is None:
        return None
    if train.sum.shape != val.high.shape:
        return None
    mean, std = train.mean(), train.var().sqrt()
    positive = std[std > 0]
    floor = float(positive.median()) if positive.numel() else 1.0
    scale = torch.clamp(std, min=floor)
    up, down = (val.high - mean) / scale, (mean - val.low) / scale
    far = torch.maximum(up, down)
    far = torch.where(torch.isfinite(far), far, torch.zeros_like(far))
    f = int(far.argmax())
    high = bool(up[f] >= down[f])
    return Outlier(val.feature_index(f), val.where(f, high),
                   float(val.high[f] if high else val.low[f]), float(mean[f]), float(std[f]),
                   float(far[f]))


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
