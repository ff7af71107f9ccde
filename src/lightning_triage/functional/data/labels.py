"""Targets of the data stage: class range, class counts and imbalance, and the
label-misalignment probe (its permutations come from a private, seeded generator).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_triage.functional.data.inputs import flat_features


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
