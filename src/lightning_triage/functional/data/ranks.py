"""Data-parallel partitioning: do the ranks train on disjoint examples that reshuffle each epoch?

Pure Python over example fingerprints (:func:`~.duplicates.example_fingerprints`) and plain
descriptions of a loader's samplers; no Lightning, no collective. The callback
(:class:`~lightning_triage.RankDataCheck`) fingerprints each rank's first training batches,
gathers one :class:`RankBatches` per rank and calls the rules here on every rank alike.

Example:
    >>> a = RankBatches(rank=0, fingerprints=[[1, 2], [3, 4]])
    >>> b = RankBatches(rank=1, fingerprints=[[1, 2], [3, 4]])
    >>> partition_rule("train_dataloader", [a, b]).code
    'data.ranks_same_data'
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import IterableDataset, RandomSampler, Sampler, SequentialSampler

from lightning_triage.functional.verdict import Verdict

#: Where Lightning calls ``set_epoch`` at each epoch start (``_set_sampler_epoch``, Lightning
#: 2.6): on the loader's ``sampler`` and on its ``batch_sampler.sampler``, nowhere else.
SET_EPOCH_REACHED = ("sampler", "batch_sampler.sampler")
#: Overlap between ranks (a share of the distinct examples seen) that is reported.
OVERLAP_FRACTION = 0.1


@dataclass(frozen=True)
class SamplerInfo:
    """What a sampler object reachable from a loader says about partitioning (plain values).

    Attributes:
        path: where it sits, relative to the loader (``"sampler"``, ``"batch_sampler.base"``).
        kind: its class name.
        shuffle: whether it shuffles (``None``: it does not say).
        seed: its ``seed`` attribute, if any.
        rank: its ``rank`` attribute (a rank-aware sampler), if any.
        num_replicas: its ``num_replicas`` attribute, if any.
        has_set_epoch: whether it has a ``set_epoch`` method.
    """

    path: str
    kind: str
    shuffle: bool | None = None
    seed: int | None = None
    rank: int | None = None
    num_replicas: int | None = None
    has_set_epoch: bool = False

    @property
    def rank_aware(self) -> bool:
        return self.num_replicas is not None or self.rank is not None

    @property
    def epoch_reached(self) -> bool:
        """Whether Lightning calls its ``set_epoch`` (see :data:`SET_EPOCH_REACHED`)."""
        return self.path in SET_EPOCH_REACHED


@dataclass(frozen=True)
class RankBatches:
    """One rank's view: the example fingerprints of its first batches, and its loader.

    Attributes:
        rank: the global rank.
        fingerprints: one list of example fingerprints per batch, in order.
        samplers: the samplers of its training loader.
        iterable: whether the loader's dataset is an ``IterableDataset``.
    """

    rank: int
    fingerprints: list[list[int]]
    samplers: list[SamplerInfo] = field(default_factory=list)
    iterable: bool = False

    @property
    def flat(self) -> list[int]:
        return [fp for batch in self.fingerprints for fp in batch]


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _info(path: str, obj: Any) -> SamplerInfo:
    shuffle = getattr(obj, "shuffle", None)
    if isinstance(obj, RandomSampler):
        shuffle = True
    elif isinstance(obj, SequentialSampler):
        shuffle = False
    return SamplerInfo(path, type(obj).__name__, shuffle if isinstance(shuffle, bool) else None,
                       _int_or_none(getattr(obj, "seed", None)),
                       _int_or_none(getattr(obj, "rank", None)),
                       _int_or_none(getattr(obj, "num_replicas", None)),
                       callable(getattr(obj, "set_epoch", None)))


def _is_sampler(obj: Any) -> bool:
    return isinstance(obj, Sampler) or callable(getattr(obj, "set_epoch", None))


def _reachable(loader: Any) -> Iterator[tuple[str, Any]]:
    """The loader's ``sampler`` and ``batch_sampler`` and the samplers among their attributes
    (one level, read-only: ``vars()`` only, no property is called)."""
    for name in ("sampler", "batch_sampler"):
        obj = getattr(loader, name, None)
        if obj is None:
            continue
        yield name, obj
        for attr, value in sorted(vars(obj).items()) if hasattr(obj, "__dict__") else ():
            if _is_sampler(value) and not isinstance(value, type):
                yield f"{name}.{attr}", value


def describe_samplers(loader: Any) -> list[SamplerInfo]:
    """:class:`SamplerInfo` of every sampler reachable from ``loader`` (each object once).

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> dl = DataLoader(TensorDataset(torch.zeros(4)), shuffle=True)
        >>> [(s.path, s.kind, s.shuffle) for s in describe_samplers(dl)][0]
        ('sampler', 'RandomSampler', True)
    """
    seen: set[int] = set()
    infos = []
    for path, obj in _reachable(loader):
        if id(obj) not in seen:
            seen.add(id(obj))
            infos.append(_info(path, obj))
    return infos


def is_iterable_loader(loader: Any) -> bool:
    return isinstance(getattr(loader, "dataset", None), IterableDataset)


def _same_data_cause(ranks: Sequence[RankBatches]) -> str:
    first = ranks[0]
    aware = [s for s in first.samplers if s.rank_aware]
    if first.iterable:
        return ("its dataset is an `IterableDataset` that does not split its stream by rank "
                "(no `DistributedSampler` applies to it)")
    if aware:
        s = aware[0]
        return (f"`{s.path}` ({s.kind}) is rank-aware but holds `num_replicas={s.num_replicas}`, "
                f"`rank={s.rank}` on every rank")
    kinds = ", ".join(f"`{s.path}` ({s.kind})" for s in first.samplers) or "its sampler"
    return (f"no sampler of the loader is rank-aware ({kinds}): with "
            "`use_distributed_sampler=False`, or a custom sampler Lightning does not replace, "
            "every rank draws from the whole dataset")


def _seeds(ranks: Sequence[RankBatches]) -> tuple[str, list[int | None]] | None:
    """The path and per-rank seeds of a rank-aware sampler whose seed differs across ranks."""
    for s in ranks[0].samplers:
        if not s.rank_aware or s.shuffle is False:
            continue
        seeds = []
        for r in ranks:
            match = [o for o in r.samplers if o.path == s.path]
            seeds.append(match[0].seed if match else None)
        if None not in seeds and len(set(seeds)) > 1:
            return s.path, seeds
    return None


def _overlap(ranks: Sequence[RankBatches]) -> tuple[int, int, float]:
    """``(overlapping, distinct, repeat_fraction)``: the distinct examples of a rank also seen by
    another rank (summed over ranks), the distinct examples (summed), and the largest share of a
    rank's own examples that repeat within it (duplicates in the dataset itself)."""
    sets = [set(r.flat) for r in ranks]
    overlapping = sum(len(s & set().union(*(o for j, o in enumerate(sets) if j != i)))
                      for i, s in enumerate(sets))
    distinct = sum(len(s) for s in sets)
    repeats = max(((len(r.flat) - len(s)) / len(r.flat)
                   for r, s in zip(ranks, sets, strict=True) if r.flat), default=0.0)
    return overlapping, distinct, repeats


def partition_rule(loader: str, ranks: Sequence[RankBatches],
                   step: int | None = 0) -> Verdict | None:
    """``data.ranks_same_data`` (every rank saw the same examples) or ``data.ranks_overlap``
    (ranks share examples, or their distributed samplers have different seeds).

    Example:
        >>> a = RankBatches(0, [[1, 2, 3, 4, 5]])
        >>> partition_rule("dl", [a, RankBatches(1, [[5, 6, 7, 8, 9]])]).code
        'data.ranks_overlap'
        >>> partition_rule("dl", [a, RankBatches(1, [[6, 7, 8, 9, 10]])]) is None
        True
    """
    if len(ranks) < 2 or any(not r.flat for r in ranks):
        return None
    names = [r.rank for r in ranks]
    n = len(ranks[0].flat)
    if len(set(ranks[0].flat)) > 1 and all(set(r.flat) == set(ranks[0].flat) for r in ranks):
        order = "in the same order" if all(r.flat == ranks[0].flat for r in ranks) \
            else "in different orders"
        return Verdict(
            "data.ranks_same_data", step,
            f"`{loader}`: the first {len(ranks[0].fingerprints)} training batches ({n} examples) "
            f"are the same examples on all {len(ranks)} ranks {names}, {order}: the run trains "
            f"{len(ranks)} times on one shard. Likely cause: {_same_data_cause(ranks)}.",
            evidence={"loader": loader, "ranks": names, "examples": n, "batches":
                      len(ranks[0].fingerprints), "same_order": order == "in the same order"})
    overlapping, distinct, repeats = _overlap(ranks)
    fraction = overlapping / max(distinct, 1)
    seeds = _seeds(ranks)
    seen = overlapping >= 2 and fraction >= max(OVERLAP_FRACTION, 3 * repeats)
    if not seen and seeds is None:
        return None
    cause = (f"the ranks' `{seeds[0]}` use different seeds {seeds[1]}: each rank permutes the "
             "dataset its own way, so the shards overlap and other examples are never seen"
             if seeds else _same_data_cause(ranks))
    return Verdict(
        "data.ranks_overlap", step,
        f"`{loader}`: {overlapping} of the {distinct} distinct examples of the first training "
        f"batches of ranks {names} were also seen by another rank ({fraction:.0%}). "
        f"Likely cause: {cause}.",
        evidence={"loader": loader, "ranks": names, "overlapping": overlapping,
                  "distinct": distinct, "fraction": round(fraction, 4),
                  "seeds": seeds[1] if seeds else None})


def _shuffler(samplers: Sequence[SamplerInfo]) -> SamplerInfo | None:
    """The sampler that says it shuffles, preferring one Lightning cannot reach."""
    shuffling = [s for s in samplers if s.shuffle]
    unreached = [s for s in shuffling if s.has_set_epoch and not s.epoch_reached]
    found = unreached or shuffling
    return found[0] if found else None


def reshuffle_rule(loader: str, first: Sequence[RankBatches], later: Sequence[RankBatches],
                   epoch: int, step: int | None = None) -> Verdict | None:
    """``data.order_not_reshuffled``: on every rank the first batches of epoch ``epoch`` repeat
    those of the first epoch in the same order, though a sampler of the loader shuffles (a
    loader that does not shuffle keeps its order by design: silent).

    Example:
        >>> s = [SamplerInfo("batch_sampler.base", "DistributedSampler", shuffle=True,
        ...                  has_set_epoch=True)]
        >>> a = [RankBatches(0, [[1, 2], [3, 4]], s)]
        >>> reshuffle_rule("dl", a, a, epoch=1).evidence["sampler"]
        'batch_sampler.base'
    """
    if not first or len(first) != len(later):
        return None
    same = all(a.flat and len(set(a.flat)) > 1 and a.flat == b.flat[:len(a.flat)]
               and len(b.flat) >= len(a.flat) for a, b in zip(first, later, strict=True))
    shuffler = _shuffler(first[0].samplers)
    if not same or shuffler is None:
        return None
    if shuffler.has_set_epoch and not shuffler.epoch_reached:
        cause = (f"`{shuffler.path}` ({shuffler.kind}) shuffles by epoch, but Lightning calls "
                 f"`set_epoch` only on `{SET_EPOCH_REACHED[0]}` and `{SET_EPOCH_REACHED[1]}`, "
                 "so its epoch never changes")
    elif shuffler.has_set_epoch:
        cause = (f"`{shuffler.path}` ({shuffler.kind}) has `set_epoch`, but its order does not "
                 "depend on the epoch it is given")
    else:
        cause = (f"`{shuffler.path}` ({shuffler.kind}) shuffles with a fixed seed and has no "
                 "`set_epoch`")
    n = len(first[0].flat)
    return Verdict(
        "data.order_not_reshuffled", step,
        f"`{loader}`: the first {len(first[0].fingerprints)} training batches of epoch {epoch} "
        f"({n} examples) repeat those of the first epoch in the same order on every rank "
        f"{[r.rank for r in first]}. Likely cause: {cause}.",
        evidence={"loader": loader, "epoch": epoch, "examples": n, "sampler": shuffler.path,
                  "sampler_kind": shuffler.kind, "ranks": [r.rank for r in first]})


def uneven_rule(loader: str, counts: Sequence[float], ranks: Sequence[int] | None = None,
                step: int | None = 0) -> Verdict | None:
    """``data.ranks_uneven_batches``: the ranks' training loaders hold different numbers of
    batches per epoch (known at the epoch start for sized loaders; ``inf`` for the others, which
    are not judged).

    Example:
        >>> uneven_rule("dl", [5, 4]).evidence["batches"]
        [5, 4]
        >>> uneven_rule("dl", [4, 4]) is None, uneven_rule("dl", [4, float("inf")]) is None
        (True, True)
    """
    if len(counts) < 2 or any(c != c or c == float("inf") for c in counts):
        return None
    sizes = [int(c) for c in counts]
    if len(set(sizes)) == 1:
        return None
    names = list(ranks) if ranks is not None else list(range(len(sizes)))
    return Verdict(
        "data.ranks_uneven_batches", step,
        f"`{loader}`: the ranks {names} hold {sizes} training batches per epoch: past batch "
        f"{min(sizes)} the ranks with more wait for a gradient reduction the others never join "
        "(a hang until the process group's timeout), or take steps the others do not.",
        evidence={"loader": loader, "ranks": names, "batches": sizes})


__all__ = ["OVERLAP_FRACTION", "SET_EPOCH_REACHED", "RankBatches", "SamplerInfo",
           "describe_samplers", "is_iterable_loader", "partition_rule", "reshuffle_rule", "uneven_rule"]
