"""Fingerprints of the data stage: repeated batches, duplicate examples and train/val overlap.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor

from lightning_triage.functional.data.inputs import FEATURES, flat_features


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
