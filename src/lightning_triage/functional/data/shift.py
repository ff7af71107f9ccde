"""Per-feature moments of each split and the train/validation shift between them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_triage.functional.data.inputs import FEATURES, flat_features


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
