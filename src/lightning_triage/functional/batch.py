"""Find the inputs and the targets in a batch, whatever its structure.

Understood structures: a lone tensor (inputs only); tuples/lists ``(x, y)`` and
``(x, y, extra...)`` (non-tensor entries such as string ids are skipped); dicts and other
mappings with common key names; namedtuples; dataclasses; plain objects with tensor attributes
or a ``to_dict()`` method;
any of these nested (``((x1, x2), y)``, ``{"inputs": {"input_ids": ...}, "labels": ...}``).
A key, an index or a small callable names the entries otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from numbers import Number
from typing import Any, NamedTuple

from torch import Tensor

INPUT_KEYS = ("input", "inputs", "x", "image", "images", "img", "imgs", "pixel_values",
              "input_ids", "features", "feature", "data", "src", "source", "tokens", "text")
TARGET_KEYS = ("label", "labels", "target", "targets", "y", "tgt", "class", "classes",
               "class_id")

#: How a user names an entry of the batch: a key or attribute name, a position in a sequence,
#: or a callable that takes the batch and returns the tensor.
BatchKey = str | int | Callable[[Any], Any]

_MAX_DEPTH = 6
_MAX_ITEMS = 64


class BatchParts(NamedTuple):
    """The input and target tensors found in a batch (``None`` where none was found).

    Example:
        >>> import torch
        >>> inputs, targets = split_batch((torch.zeros(2, 3), torch.tensor([0, 1])))
        >>> tuple(inputs.shape), targets.tolist()
        ((2, 3), [0, 1])
    """

    inputs: Tensor | None
    targets: Tensor | None


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    """Where the inputs and targets of a batch are, with the names used in messages.

    Attributes:
        inputs: the main input tensor (``None`` if it could not be told).
        targets: the target tensor (``None`` if there is none or it could not be told).
        input_name: its path in the batch, e.g. ``batch[0]`` or ``batch['image']``.
        target_name: the targets' path.
        tensors: every tensor of the batch with its path (inputs and targets included).
        note: why the inputs could not be told, or ``None``.

    Example:
        >>> import torch
        >>> layout = locate_batch({"image": torch.zeros(2, 3), "label": torch.tensor([0, 1]),
        ...                        "mask": torch.ones(2, 3)})
        >>> layout.input_name, layout.target_name
        ("batch['image']", "batch['label']")
        >>> [name for name, _ in layout.other_tensors()]
        ["batch['mask']"]
    """

    inputs: Tensor | None
    targets: Tensor | None
    input_name: str | None
    target_name: str | None
    tensors: tuple[tuple[str, Tensor], ...]
    note: str | None = None

    def parts(self) -> BatchParts:
        return BatchParts(self.inputs, self.targets)

    def other_tensors(self) -> list[tuple[str, Tensor]]:
        """Tensors that are neither the main input nor the targets (masks, extra inputs, ids)."""
        return [(n, t) for n, t in self.tensors if n not in (self.input_name, self.target_name)]


def _is_leaf(value: Any) -> bool:
    return isinstance(value, (str, bytes, Number)) or value is None


def _as_mapping(batch: Any) -> tuple[Mapping[Any, Any], bool] | None:
    """``(entries, by_attribute)`` of a mapping-like batch, or ``None``."""
    if isinstance(batch, Mapping):
        return batch, False
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}, True
    if isinstance(batch, tuple) and hasattr(batch, "_asdict"):  # namedtuple
        return batch._asdict(), True
    if isinstance(batch, (list, tuple, Tensor, type)) or _is_leaf(batch):
        return None
    attrs = getattr(batch, "__dict__", None)
    if isinstance(attrs, dict):
        public = {k: v for k, v in attrs.items() if not str(k).startswith("_")}
        if any(_contains_tensor(v, 1) for v in public.values()):
            return public, True
    to_dict = getattr(batch, "to_dict", None)  # objects keeping their tensors in a store (PyG)
    if callable(to_dict):
        try:
            entries = to_dict()
        except Exception:
            return None
        if isinstance(entries, Mapping):
            return entries, True
    return None


def _contains_tensor(value: Any, depth: int = 0) -> bool:
    return next(iter_tensors(value, "", depth), None) is not None


def _child(path: str, key: Any, by_attribute: bool) -> str:
    if isinstance(key, int) and not by_attribute:
        return f"{path}[{key}]"
    return f"{path}.{key}" if by_attribute else f"{path}[{key!r}]"


def iter_tensors(value: Any, path: str = "batch", depth: int = 0) -> Iterator[tuple[str, Tensor]]:
    """Every tensor inside ``value`` with its path, depth-first (bounded depth and width).

    Example:
        >>> import torch
        >>> [name for name, _ in iter_tensors({"x": torch.zeros(2), "ids": ["a", "b"],
        ...                                    "pair": (torch.ones(2), 3)})]
        ["batch['x']", "batch['pair'][0]"]
    """
    if isinstance(value, Tensor):
        yield path, value
        return
    if depth >= _MAX_DEPTH or _is_leaf(value):
        return
    found = _as_mapping(value)
    if found is not None:
        entries, by_attr = found
        for i, (key, item) in enumerate(entries.items()):
            if i >= _MAX_ITEMS:
                break
            yield from iter_tensors(item, _child(path, key, by_attr), depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value[:_MAX_ITEMS]):
            yield from iter_tensors(item, _child(path, i, False), depth + 1)


def _first(value: Any, path: str) -> tuple[str, Tensor] | None:
    """The main tensor of ``value``: itself, or the inputs of a nested batch, else its first."""
    if isinstance(value, Tensor):
        return path, value
    if _is_leaf(value):
        return None
    nested = _locate(value, path, None, None)
    if nested.inputs is not None and nested.input_name is not None:
        return nested.input_name, nested.inputs
    return next(iter_tensors(value, path), None)


def _lookup(batch: Any, key: BatchKey, path: str) -> tuple[str, Tensor] | None:
    if callable(key) and not isinstance(key, (str, int)):
        name = getattr(key, "__name__", "key")
        return _first(key(batch), f"{name}(batch)")
    found = _as_mapping(batch)
    if found is not None:
        entries, by_attr = found
        if key in entries:
            return _first(entries[key], _child(path, key, by_attr))
        lowered = {str(k).lower(): k for k in entries}
        if isinstance(key, str) and key.lower() in lowered:
            real = lowered[key.lower()]
            return _first(entries[real], _child(path, real, by_attr))
    if isinstance(batch, (list, tuple)) and isinstance(key, int) and -len(batch) <= key < len(batch):
        return _first(batch[key], _child(path, key % len(batch), False))
    return None


_Hit = tuple[str, Tensor] | None


def _by_name(entries: Mapping[Any, Any], by_attr: bool, path: str,
             names: tuple[str, ...]) -> _Hit:
    """The first entry named like one of ``names`` (case-insensitive) that holds a tensor."""
    lowered = {str(k).lower(): k for k in entries}
    for name in names:
        if name in lowered:
            real = lowered[name]
            hit = _first(entries[real], _child(path, real, by_attr))
            if hit is not None:
                return hit
    return None


def _by_names(batch: Any, path: str, input_key: BatchKey | None, target_key: BatchKey | None,
              inputs: _Hit, targets: _Hit) -> tuple[_Hit, _Hit, bool]:
    """Inputs and targets of a mapping-like batch found by their names; the flag says whether
    to look by position next (not a mapping, or a namedtuple with other names)."""
    found = _as_mapping(batch)
    if found is None:
        return inputs, targets, True
    if input_key is not None and target_key is not None:
        return inputs, targets, False
    entries, by_attr = found
    if input_key is None:
        inputs = _by_name(entries, by_attr, path, INPUT_KEYS)
    if target_key is None:
        targets = _by_name(entries, by_attr, path, TARGET_KEYS)
    return inputs, targets, inputs is None and isinstance(batch, tuple)


def _by_position(batch: list[Any] | tuple[Any, ...], path: str, target_key: BatchKey | None,
                 targets: _Hit) -> tuple[_Hit, _Hit]:
    """Inputs and targets of a sequence batch by position: the first two entries holding
    tensors, or the inside of a lone nested entry."""
    inputs: _Hit = None
    items = [(i, item) for i, item in enumerate(batch[:_MAX_ITEMS]) if _contains_tensor(item)]
    if len(items) == 1 and not isinstance(items[0][1], Tensor):
        nested = _locate(items[0][1], _child(path, items[0][0], False), None, None)
        if nested.inputs is not None:
            inputs = (nested.input_name or path, nested.inputs)
        if targets is None and nested.targets is not None:
            targets = (nested.target_name or path, nested.targets)
    elif items:
        inputs = _first(items[0][1], _child(path, items[0][0], False))
        if target_key is None and targets is None and len(items) >= 2:
            targets = _first(items[1][1], _child(path, items[1][0], False))
    return inputs, targets


def _locate(batch: Any, path: str, input_key: BatchKey | None,
            target_key: BatchKey | None) -> BatchLayout:
    tensors = tuple(iter_tensors(batch, path))
    inputs = _lookup(batch, input_key, path) if input_key is not None else None
    targets = _lookup(batch, target_key, path) if target_key is not None else None
    note: str | None = None
    if isinstance(batch, Tensor):
        inputs = inputs or (path, batch)
    else:
        inputs, targets, positional = _by_names(batch, path, input_key, target_key, inputs,
                                                targets)
        if positional and isinstance(batch, (list, tuple)) and inputs is None:
            inputs, targets = _by_position(batch, path, target_key, targets)
    if inputs is None:
        note = ("the batch holds no tensor" if not tensors else
                "could not tell which of " + ", ".join(f"`{n}`" for n, _ in tensors[:8])
                + " is the input")
    return BatchLayout(
        inputs=None if inputs is None else inputs[1],
        targets=None if targets is None else targets[1],
        input_name=None if inputs is None else inputs[0],
        target_name=None if targets is None else targets[0],
        tensors=tensors,
        note=note,
    )


def locate_batch(batch: Any, input_key: BatchKey | None = None,
                 target_key: BatchKey | None = None) -> BatchLayout:
    """Find the inputs and targets of ``batch`` with their names (see the module docstring).

    Args:
        batch: the batch as the model receives it.
        input_key: the input entry (a key or attribute name, a sequence index, or a callable
            ``batch -> tensor``); found by common names or position when ``None``.
        target_key: the target entry, the same way.

    Example:
        >>> import torch
        >>> layout = locate_batch(((torch.zeros(4, 3), torch.ones(4, 2)), torch.arange(4)))
        >>> layout.input_name, layout.target_name
        ('batch[0][0]', 'batch[1]')
        >>> print(locate_batch({"a": torch.zeros(2), "b": torch.ones(2)}).note)
        could not tell which of `batch['a']`, `batch['b']` is the input
    """
    return _locate(batch, "batch", input_key, target_key)


def split_batch(batch: Any, input_key: BatchKey | None = None,
                target_key: BatchKey | None = None) -> BatchParts:
    """Return the input and target tensors of ``batch``.

    Understands a lone tensor (inputs only), ``(x, y, ...)`` sequences, dicts, namedtuples,
    dataclasses and objects with tensor attributes using common key names, nested containers,
    and skips non-tensor entries; ``input_key``/``target_key`` name the entries otherwise
    (see :func:`locate_batch`).

    Example:
        >>> import torch
        >>> parts = split_batch({"image": torch.zeros(2, 3), "label": torch.tensor([0, 1]), "id": ["a", "b"]})
        >>> parts.inputs.shape, parts.targets.tolist()
        (torch.Size([2, 3]), [0, 1])
    """
    return locate_batch(batch, input_key, target_key).parts()

