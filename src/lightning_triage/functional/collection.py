"""One walk over a batch collection: rebuild it with its tensors (and, optionally, its lists)
mapped.

Understood containers: mappings (their type kept when it can be rebuilt from a dict, a
``defaultdict`` keeps its factory, a plain ``dict`` otherwise), dataclass instances (rebuilt
with :func:`dataclasses.replace` from their ``init`` fields, frozen ones included), namedtuples,
lists and tuples (their subclasses kept). Strings, numbers, ``None`` and any other object are
leaves, returned as they are.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

#: A function applied to the outermost lists of a collection (before their items are walked).
ListFn = Callable[[list[Any]], list[Any]]


def _rebuild_mapping(batch: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    if isinstance(batch, defaultdict):
        return type(batch)(batch.default_factory, items)
    try:
        return type(batch)(items)  # type: ignore[call-arg]
    except TypeError:
        return items


def map_tensors(fn: Callable[[Tensor], Any], batch: Any, *, lists: ListFn | None = None) -> Any:
    """Rebuild ``batch`` with every tensor ``t`` in it replaced by ``fn(t)``.

    Args:
        fn: applied to each tensor (a tensor is never walked into).
        batch: a tensor, a container of the kinds the module docstring lists (nested), or a leaf.
        lists: when given, applied to each outermost list (a list not inside another list)
            before its items are walked: e.g. cut lists of per-example values. Lists inside it
            are walked without it.

    Returns:
        A new collection of the same structure; leaves other than tensors are the same objects.

    Example:
        >>> import torch
        >>> batch = {"x": torch.zeros(3), "pair": (torch.ones(2), "id"), "ids": [1, 2, 3]}
        >>> out = map_tensors(lambda t: t + 1, batch, lists=lambda v: v[:2])
        >>> out["x"].tolist(), out["pair"][0].tolist(), out["pair"][1], out["ids"]
        ([1.0, 1.0, 1.0], [2.0, 2.0], 'id', [1, 2])
    """
    if isinstance(batch, Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return _rebuild_mapping(batch, {k: map_tensors(fn, v, lists=lists) for k, v in batch.items()})
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changes = {f.name: map_tensors(fn, getattr(batch, f.name), lists=lists)
                   for f in dataclasses.fields(batch) if f.init}
        return dataclasses.replace(batch, **changes)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(map_tensors(fn, v, lists=lists) for v in batch))
    if isinstance(batch, list) and lists is not None:
        return type(batch)(map_tensors(fn, v) for v in lists(batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(fn, v, lists=lists) for v in batch)
    return batch


__all__ = ["ListFn", "map_tensors"]
