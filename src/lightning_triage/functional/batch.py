"""Find the inputs and the targets in a batch, whatever its structure."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from torch import Tensor

INPUT_KEYS = ("input", "inputs", "x", "image", "images", "pixel_values", "input_ids", "features",
              "data", "src")
TARGET_KEYS = ("label", "labels", "target", "targets", "y", "tgt", "class", "classes")


class BatchParts(NamedTuple):
    """The input and target tensors found in a batch (``None`` where none was found)."""

    inputs: Tensor | None
    targets: Tensor | None


def _as_mapping(batch: Any) -> Mapping[str, Any] | None:
    if isinstance(batch, Mapping):
        return batch
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    if hasattr(batch, "_asdict"):  # namedtuple
        return batch._asdict()
    return None


def _first_tensor(value: Any) -> Tensor | None:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], Tensor):
        return value[0]
    return None


def split_batch(batch: Any, input_key: str | None = None, target_key: str | None = None) -> BatchParts:
    """Return the input and target tensors of ``batch``.

    Understands a lone tensor (inputs only), ``(x, y, ...)`` sequences, dicts, namedtuples and
    dataclasses with common key names; ``input_key``/``target_key`` name the entries otherwise.

    Example:
        >>> import torch
        >>> parts = split_batch({"image": torch.zeros(2, 3), "label": torch.tensor([0, 1]), "id": ["a", "b"]})
        >>> parts.inputs.shape, parts.targets.tolist()
        (torch.Size([2, 3]), [0, 1])
    """
    if isinstance(batch, Tensor):
        return BatchParts(batch, None)
    mapping = _as_mapping(batch)
    if mapping is not None:
        lowered = {str(k).lower(): k for k in mapping}

        def pick(explicit: str | None, names: Sequence[str]) -> Tensor | None:
            if explicit is not None:
                return _first_tensor(mapping.get(explicit))
            for name in names:
                if name in lowered:
                    found = _first_tensor(mapping[lowered[name]])
                    if found is not None:
                        return found
            return None

        return BatchParts(pick(input_key, INPUT_KEYS), pick(target_key, TARGET_KEYS))
    if isinstance(batch, (list, tuple)):
        tensors = [item for item in batch if isinstance(item, Tensor)]
        if len(tensors) >= 2:
            return BatchParts(tensors[0], tensors[1])
        if len(tensors) == 1:
            return BatchParts(tensors[0], None)
        if batch and isinstance(batch[0], (list, tuple, Mapping)):
            return split_batch(batch[0], input_key, target_key)
    return BatchParts(None, None)
