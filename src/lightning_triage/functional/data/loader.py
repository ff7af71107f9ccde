"""The loader's batch-size contract: do the training batches hold the examples the loader was
configured to deliver?

A ``DataLoader(batch_size=B)`` over a map-style dataset delivers ``B`` examples per batch, except
the epoch's last batch (``drop_last=False``). A batch whose tensors all hold fewer than ``B``
entries along their leading dimension, at a position that is not the loader's last, was cut by
something after the sampler: the ``collate_fn`` or a processor that drops, filters or merges
examples. Over an ``IterableDataset`` each worker's stream may end on a partial batch, so at most
``max(num_workers, 1)`` short batches per epoch are normal.

Pure functions over the loader's public attributes and the batch (no Lightning).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from lightning_triage.functional.batch import iter_tensors
from lightning_triage.functional.verdict import Verdict

#: Batch entries that mark packed sequences (several examples in one row, e.g. Hugging Face's
#: ``DataCollatorWithFlattening``): such batches hold fewer rows than examples by design.
PACKING_MARKERS = ("position_ids", "cu_seq", "seq_idx")
#: Most sizes kept per loader for the message and the evidence.
MAX_SIZES = 16


@dataclass(frozen=True)
class LoaderSpec:
    """What a training loader promises about its batches.

    Attributes:
        name: how messages name the loader (``"train_dataloader"``, ``"train_dataloader['a']"``).
        batch_size: the configured ``batch_size``.
        length: batches per epoch (``len(loader)``), ``None`` when unknown.
        drop_last: whether the last partial batch is dropped.
        iterable: whether the dataset is an ``IterableDataset``.
        num_workers: the loader's worker processes.
    """

    name: str
    batch_size: int
    length: int | None
    drop_last: bool
    iterable: bool
    num_workers: int

    def is_last(self, batch_idx: int) -> bool:
        """Whether ``batch_idx`` may be the loader's last batch of an epoch (a cycling loader,
        ``CombinedLoader(mode="max_size_cycle")``, restarts at ``length``)."""
        if self.drop_last:
            return False
        return self.length is None or batch_idx % self.length == self.length - 1


def loader_spec(name: str, loader: Any) -> LoaderSpec | None:
    """The :class:`LoaderSpec` of ``loader``, or ``None`` when it promises no batch size: not a
    ``DataLoader``, ``batch_size=None`` (the dataset batches itself, or a ``batch_sampler`` that
    may yield batches of any size), or a batch sampler other than the one ``batch_size`` builds.

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> ds = TensorDataset(torch.zeros(10, 2))
        >>> loader_spec("train", DataLoader(ds, batch_size=4))
        LoaderSpec(name='train', batch_size=4, length=3, drop_last=False, iterable=False, num_workers=0)
        >>> loader_spec("train", DataLoader(ds, batch_size=None)) is None
        True
    """
    if not isinstance(loader, DataLoader) or not isinstance(loader.batch_size, int):
        return None
    iterable = isinstance(loader.dataset, IterableDataset)
    if not iterable and type(loader.batch_sampler) is not BatchSampler:
        return None
    # an IterableDataset's length is not its batch count (each worker ends on its own partial)
    length = None if iterable else len(loader)
    return LoaderSpec(name, loader.batch_size, length, bool(loader.drop_last), iterable,
                      int(loader.num_workers))


def short_size(batch: Any, batch_size: int) -> int | None:
    """The examples a batch holds when it holds fewer than ``batch_size``, else ``None``.

    The batch is short when it holds at least one tensor and none of its tensors has
    ``batch_size`` or more entries along its leading dimension, and the tensors together are not
    a time-major ``(T, B)`` batch (:func:`time_major`). Packed sequences (an entry named as in
    :data:`PACKING_MARKERS`) are short when the examples they hold
    (:func:`packed_examples`: the sequence starts of ``position_ids``) are fewer than
    ``batch_size``, whatever the shape: a ``(1, T)`` row of a collate that kept one example.
    Batches without tensors are never short. The size returned is the largest leading
    dimension (the examples held, for packed sequences).

    Example:
        >>> import torch
        >>> short_size((torch.zeros(8, 3), torch.zeros(8)), 8) is None
        True
        >>> short_size((torch.zeros(4, 3), torch.zeros(4)), 8)
        4
        >>> short_size(torch.zeros(5, 8), 8) is None  # time-major (T, B)
        True
        >>> one = {"input_ids": torch.ones(1, 6, dtype=torch.long),
        ...        "position_ids": torch.arange(6)[None]}  # one example of 6 tokens, packed
        >>> short_size(one, 8)
        1
    """
    tensors = list(iter_tensors(batch))
    if any(marker in path for path, _ in tensors for marker in PACKING_MARKERS):
        held = packed_examples(tensors)
        return held if held is not None and held < batch_size else None
    largest = None
    shaped = [t for _, t in tensors
              if t.layout == torch.strided and not t.is_nested and t.ndim > 0]
    for t in shaped:
        if t.shape[0] >= batch_size:
            return None
        largest = max(largest or 0, int(t.shape[0]))
    return None if largest is None or time_major(shaped, batch_size) else largest


def time_major(tensors: Sequence[torch.Tensor], batch_size: int) -> bool:
    """Whether tensors none of which holds ``batch_size`` entries on its leading dimension are a
    time-major ``(T, B, ...)`` batch, decided from all of them together: at least one has
    ``batch_size`` on its second axis and every other tensor of two or more dimensions is
    ``(T, B, ...)`` too, or a ``(T, T)`` mask over the same ``T``. A collate that folded the
    whole batch into one sample's list (``(1, B, C, H, W)`` images beside ``(1, T)`` tokens)
    is not: its tokens contradict it, whatever the images' second axis says.

    Example:
        >>> import torch
        >>> time_major([torch.zeros(5, 8, 3), torch.zeros(5, 8), torch.zeros(5, 5)], 8)
        True
        >>> time_major([torch.zeros(1, 8, 3, 4, 4), torch.zeros(1, 12)], 8)
        False
    """
    multi = [t for t in tensors if t.ndim > 1]
    leads = {int(t.shape[0]) for t in multi if t.shape[1] == batch_size}
    return bool(leads) and all(t.shape[1] == batch_size
                               or (t.shape[0] in leads and t.shape[1] in leads) for t in multi)


def packed_examples(tensors: Sequence[tuple[str, torch.Tensor]]) -> int | None:
    """The examples a packed batch holds (several sequences in one row): the starts of
    sequences in its ``position_ids`` (each packed example restarts at position 0, as Hugging
    Face's ``DataCollatorWithFlattening`` writes them), else the intervals of its cumulative
    sequence lengths (``cu_seq_lens``: one more boundary than sequences); ``None`` when neither
    is there.

    Example:
        >>> import torch
        >>> pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
        >>> packed_examples([("batch['position_ids']", pos)])
        3
        >>> packed_examples([("batch['cu_seq_lens_q']", torch.tensor([0, 3, 5, 9]))])
        3
    """
    for path, t in tensors:
        if "position_ids" in path and not t.is_floating_point() and t.numel():
            return int((t == 0).sum())
    for path, t in tensors:
        if "cu_seq" in path and not t.is_floating_point() and t.ndim == 1 and t.numel() >= 2:
            return int(t.numel()) - 1
    return None


@dataclass
class BatchSizes:
    """What the first training batches of one loader held (see :func:`short_batches_rule`).

    Attributes:
        checked: batches checked that had to be full (not the loader's last).
        short: how many of them were short.
        sizes: the sizes of the short ones (at most :data:`MAX_SIZES`).
        first_step: the optimizer step of the first short batch.
        first_batch: its ``batch_idx``.
        most_in_epoch: the most short batches seen in one epoch (what an ``IterableDataset``
            is allowed: one per worker).
    """

    checked: int = 0
    short: int = 0
    sizes: list[int] = field(default_factory=list)
    first_step: int | None = None
    first_batch: int | None = None
    most_in_epoch: int = 0
    _in_epoch: int = 0

    def new_epoch(self) -> None:
        self._in_epoch = 0

    def add(self, spec: LoaderSpec, batch: Any, batch_idx: int, step: int) -> None:
        """Count one batch of the loader (``batch=None``: an exhausted loader, skipped)."""
        if batch is None or (not spec.iterable and spec.is_last(batch_idx)):
            return
        self.checked += 1
        size = short_size(batch, spec.batch_size)
        if size is None:
            return
        self.short += 1
        self._in_epoch += 1
        self.most_in_epoch = max(self.most_in_epoch, self._in_epoch)
        if len(self.sizes) < MAX_SIZES:
            self.sizes.append(size)
        if self.first_step is None:
            self.first_step, self.first_batch = step, batch_idx


def _sizes(sizes: Sequence[int]) -> str:
    distinct = sorted(set(sizes))
    return ", ".join(str(s) for s in distinct[:6]) + (" ..." if len(distinct) > 6 else "")


def short_batches_rule(spec: LoaderSpec, seen: BatchSizes) -> Verdict | None:
    """``data.short_batches``: training batches that hold fewer examples than the loader's
    ``batch_size`` although they are not its last batch.

    A warning when every checked batch was short, info when only some were (examples filtered
    out now and then, e.g. corrupt samples dropped on purpose). Over an ``IterableDataset``,
    reported only when an epoch held more short batches than the loader has streams
    (``max(num_workers, 1)``).

    Example:
        >>> import torch
        >>> spec = LoaderSpec("train_dataloader", 8, 10, False, False, 0)
        >>> seen = BatchSizes()
        >>> for i in range(4):
        ...     seen.add(spec, torch.zeros(4, 3), i, step=i)
        >>> v = short_batches_rule(spec, seen)
        >>> v.code, v.severity, v.evidence["sizes"]
        ('data.short_batches', 'warning', [4, 4, 4, 4])
    """
    if seen.short == 0 or seen.first_step is None:
        return None
    if spec.iterable and seen.most_in_epoch <= max(spec.num_workers, 1):
        return None
    every = seen.short == seen.checked
    share = sum(seen.sizes) / (len(seen.sizes) * spec.batch_size)
    which = "the epoch's last" if not spec.iterable else "a worker's last"
    return Verdict(
        "data.short_batches", seen.first_step,
        f"The training loader `{spec.name}` is configured with `batch_size={spec.batch_size}`, "
        f"but {seen.short} of the {seen.checked} batches checked (none of them {which}) held "
        f"fewer examples: {_sizes(seen.sizes)} ({share:.0%} of the configured size on average; "
        f"first at batch {seen.first_batch}).",
        severity="warning" if every else "info",
        evidence={"loader": spec.name, "batch_size": spec.batch_size, "sizes": list(seen.sizes),
                  "checked": seen.checked, "short": seen.short, "batches_per_epoch": spec.length,
                  "drop_last": spec.drop_last, "iterable": spec.iterable,
                  "first_batch": seen.first_batch})


__all__ = ["MAX_SIZES", "PACKING_MARKERS", "BatchSizes", "LoaderSpec", "loader_spec",
           "short_batches_rule", "short_size", "time_major"]
