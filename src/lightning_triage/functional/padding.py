"""Padding probe: do the outputs at the real positions of a padded batch depend on the padding?

Pure functions over tensors, batches and forward callables (no Lightning). A model that uses its
padding mask gives the same outputs at the real positions (or the same pooled output) whatever
the padded positions hold and however many there are; a model that forgets it (attention
without ``key_padding_mask``, mean pooling over every position, a convolution that reaches into
the padding) does not.

The probe finds the mask (:func:`find_padding_mask`), builds two perturbed batches (other token
ids at the padded positions, :func:`pad_content_batch`; more padded positions,
:func:`more_padding_batch`), runs the model on each while recording every module's output
(:func:`record_outputs`), and compares the outputs at the real positions
(:func:`compare_at_real`), naming the first module whose output moved (:func:`first_moved`).

Example:
    >>> import torch
    >>> ids = torch.tensor([[3, 4, 5, 0, 0], [6, 7, 0, 0, 0]])
    >>> batch = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    >>> mask = find_padding_mask(batch, ids)
    >>> mask.source, mask.side, mask.pad.sum().item()
    ("batch['attention_mask']", 'right', 5)
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.nn.modules.loss import _Loss
from torch.utils.hooks import RemovableHandle

from lightning_triage.functional.batch import BatchKey, locate_batch
from lightning_triage.functional.collection import map_tensors
from lightning_triage.functional.hooks import first_float_tensor, hooked
from lightning_triage.functional.structure import replace_tensor

#: Batch keys recognized as padding masks, with their polarity: ``True`` when a true/1 entry
#: marks a padded position (``key_padding_mask`` convention), ``False`` when it marks a real
#: one (``attention_mask`` convention).
MASK_KEYS: dict[str, bool] = {
    "attention_mask": False, "attn_mask": False, "input_mask": False, "mask": False,
    "src_mask": False, "valid_mask": False, "token_mask": False,
    "padding_mask": True, "pad_mask": True, "key_padding_mask": True,
    "src_key_padding_mask": True,
}
#: Relative change of an output at the real positions (max abs difference over max abs value)
#: above which it counts as moved: float noise from different shapes stays far below.
DEFAULT_PADDING_TOLERANCE = 1e-4
#: Module outputs kept per pass for the localization.
MAX_RECORDED = 512

Side = Literal["right", "left"]


@dataclass(frozen=True)
class PaddingMask:
    """Where the padding of a batch is.

    Attributes:
        pad: ``(N, T)`` bool, true at the padded input positions (perturbed by the probe).
        real: ``(N, T)`` bool, true at the positions whose outputs are compared.
        source: where the mask came from (``batch['attention_mask']``, or the targets).
        side: ``"right"`` or ``"left"`` when every padded row is padded at that end, else
            ``None`` (then the amount of padding is not probed).
        pad_value: the input value at padded positions (the pad token id), used for more padding.
        mask: the batch's mask tensor (``None`` when the mask comes from the targets).
        pad_is_true: the mask tensor's polarity (true/1 marks padding).
    """

    pad: Tensor
    real: Tensor
    source: str
    side: Side | None
    pad_value: float | int
    mask: Tensor | None
    pad_is_true: bool


def _as_bool_mask(t: Tensor, shape: Sequence[int]) -> Tensor | None:
    if tuple(t.shape) != tuple(shape) or t.is_floating_point() or t.is_complex():
        return None
    if t.dtype == torch.bool:
        return t
    if t.numel() and bool(((t != 0) & (t != 1)).any()):
        return None
    return t != 0


def padding_side(pad: Tensor) -> Side | None:
    """``"right"`` when every row's padded positions are a suffix, ``"left"`` for a prefix,
    ``None`` otherwise (or when no row is padded).

    Example:
        >>> padding_side(torch.tensor([[False, True], [False, False]]))
        'right'
        >>> padding_side(torch.tensor([[True, False, False], [True, True, False]]))
        'left'
        >>> print(padding_side(torch.tensor([[False, True, False]])))
        None
    """
    if pad.dim() != 2 or not bool(pad.any()):
        return None
    as_int = pad.long()
    # a suffix never goes from padded back to real: the row is non-decreasing
    if bool((as_int[:, 1:] >= as_int[:, :-1]).all()):
        return "right"
    if bool((as_int[:, 1:] <= as_int[:, :-1]).all()):
        return "left"
    return None


def _mode(values: Tensor) -> float | int:
    flat = values.reshape(-1)
    uniq, counts = torch.unique(flat, return_counts=True)
    top = uniq[int(counts.argmax())]
    return float(top) if top.is_floating_point() else int(top)


def find_padding_mask(batch: Any, inputs: Tensor | None, targets: Tensor | None = None, *,
                      key: BatchKey | None = None,
                      ignore_index: int = -100) -> PaddingMask | str:
    """The padding of ``batch`` as a :class:`PaddingMask`, or a string saying why none was found.

    Looked for, in order: the entry ``key`` (when given); a batch entry named like a padding mask
    (:data:`MASK_KEYS`: ``attention_mask``, ``key_padding_mask``...) holding a bool or 0/1 tensor
    of the inputs' ``(N, T)`` shape; integer targets of the inputs' shape with ``ignore_index``
    forming a padded end of every padded row (the padded positions are those whose target is
    ignored and whose input is the pad token, the most common input there).

    Args:
        batch: the batch as the model receives it.
        inputs: the batch's input tensor, ``(N, T)`` token ids or ``(N, T, ...)`` features.
        targets: the targets, if any.
        key: the mask's entry (a key, an index or a callable ``batch -> tensor``).
        ignore_index: the target value of padded positions.

    Example:
        >>> x = torch.tensor([[0, 0, 5, 6], [0, 7, 8, 9]])
        >>> y = torch.tensor([[-100, 5, 6, 2], [-100, 8, 9, 3]])
        >>> m = find_padding_mask((x, y), x, y)
        >>> m.side, m.pad.long().tolist(), m.real.long().tolist()
        ('left', [[1, 0, 0, 0], [1, 0, 0, 0]], [[0, 1, 1, 1], [0, 1, 1, 1]])
        >>> print(find_padding_mask((x, torch.tensor([1, 0])), x)[:60])
        no padding mask: no batch entry named like one (attention_ma
    """
    if inputs is None or inputs.dim() < 2:
        return "no padding mask: the inputs are not a sequence batch `(N, T, ...)`"
    if key is not None:
        return _mask_by_key(batch, inputs, key)
    layout = locate_batch(batch)
    refused: list[str] = []
    found = _mask_by_name(layout.tensors, inputs, refused)
    if found is None:
        found = _unnamed_mask(layout.tensors, inputs, refused)
    if found is not None:
        return found
    if (targets is not None and tuple(targets.shape) == tuple(inputs.shape[:2])
            and not targets.is_floating_point() and bool((targets == ignore_index).any())):
        return _mask_from_targets(inputs, targets, ignore_index)
    if refused:
        return (f"no padding mask: {', '.join(f'`{n}`' for n in refused)} does not mark one pad "
                "value at one end of every padded row (not padding: e.g. a masked-LM mask); pass "
                "`padding_mask_key=` if it is the padding mask")
    return ("no padding mask: no batch entry named like one (attention_mask, padding_mask, "
            "key_padding_mask...) or a 0/1 tensor of the inputs' shape marking padding, and no "
            "targets with `ignore_index` at padded positions")


def _mask_by_key(batch: Any, inputs: Tensor, key: BatchKey) -> PaddingMask | str:
    """The mask the user named with ``padding_mask_key``."""
    shape = tuple(inputs.shape[:2])
    layout = locate_batch(batch, input_key=key)
    found = layout.inputs
    if found is None:
        return f"no padding mask: `padding_mask_key` = {key!r} names no tensor of the batch"
    as_bool = _as_bool_mask(found, shape)
    if as_bool is None:
        return (f"no padding mask: `padding_mask_key` = {key!r} gives a {found.dtype} tensor "
                f"of shape {tuple(found.shape)}, not a bool or 0/1 mask of the inputs' shape "
                f"{shape}")
    name = layout.input_name or str(key)
    pad_is_true = any(k in name.lower() for k in ("pad",))
    return _from_mask(inputs, found, as_bool, name, pad_is_true)


def _mask_by_name(tensors: Sequence[tuple[str, Tensor]], inputs: Tensor,
                  refused: list[str]) -> PaddingMask | str | None:
    """A batch entry named like a padding mask (:data:`MASK_KEYS`) that marks padding; the
    names of those that do not are added to ``refused``."""
    shape = tuple(inputs.shape[:2])
    for name, tensor in tensors:
        if tensor is inputs:
            continue
        leaf = name.rsplit("[", 1)[-1].rsplit(".", 1)[-1].strip("]'\"").lower()
        if leaf not in MASK_KEYS:
            continue
        as_bool = _as_bool_mask(tensor, shape)
        if as_bool is None:
            continue
        found_mask = _from_mask(inputs, tensor, as_bool, name, MASK_KEYS[leaf])
        if isinstance(found_mask, str) or _padding_like(inputs, found_mask.pad):
            return found_mask
        refused.append(name)
    return None


def _unnamed_mask(tensors: Sequence[tuple[str, Tensor]], inputs: Tensor,
                  refused: list[str]) -> PaddingMask | str | None:
    """An unnamed 0/1 tensor of the inputs' shape (a tuple ``(input_ids, mask, labels)``): a
    padding mask when one polarity puts one pad value at one end of every padded row."""
    shape = tuple(inputs.shape[:2])
    for name, tensor in tensors:
        if tensor is inputs or name in refused:
            continue
        as_bool = _as_bool_mask(tensor, shape)
        if as_bool is None:
            continue
        for pad_is_true in (False, True):
            pad = as_bool if pad_is_true else ~as_bool
            if bool(pad.any()) and _padding_like(inputs, pad):
                return _from_mask(inputs, tensor, as_bool, name, pad_is_true)
    return None


def _mask_from_targets(inputs: Tensor, targets: Tensor, ignore_index: int) -> PaddingMask | str:
    """The padding the targets' ``ignore_index`` marks, where the input is the pad token."""
    ignored = targets == ignore_index
    pad_value = _mode(inputs[ignored])
    pad = ignored & _equal_to(inputs, pad_value)
    side = padding_side(pad)
    if side is not None and not bool(pad.all(dim=1).any()):
        return PaddingMask(pad=pad, real=~ignored, source="the targets (`ignore_index` = "
                           f"{ignore_index})", side=side, pad_value=pad_value, mask=None,
                           pad_is_true=True)
    return (f"no padding mask: the targets hold `ignore_index` = {ignore_index}, but not at a "
            "padded end of every row")


def _padding_like(inputs: Tensor, pad: Tensor) -> bool:
    """Whether ``pad`` marks padding of ``inputs``: at one end of every padded row (no row all
    padding), every marked position holding the same value (the pad token, a constant vector)."""
    if padding_side(pad) is None or bool(pad.all(dim=1).any()):
        return False
    values = inputs[pad]
    return bool((values == values[:1]).all())


def _equal_to(inputs: Tensor, value: float | int) -> Tensor:
    eq = inputs == value
    while eq.dim() > 2:
        eq = eq.all(dim=-1)
    return eq


def _from_mask(inputs: Tensor, mask: Tensor, as_bool: Tensor, name: str,
               pad_is_true: bool) -> PaddingMask | str:
    pad = as_bool if pad_is_true else ~as_bool
    if not bool(pad.any()):
        return f"no padding in this batch: `{name}` marks every position as real"
    if bool(pad.all(dim=1).any()):
        return f"`{name}` marks a whole row as padding (or its polarity is not the expected one)"
    pad_value = _mode(inputs[pad]) if not inputs.is_floating_point() else 0.0
    return PaddingMask(pad=pad, real=~pad, source=name, side=padding_side(pad),
                       pad_value=pad_value, mask=mask, pad_is_true=pad_is_true)


def pad_content_batch(batch: Any, inputs: Tensor, mask: PaddingMask, seed: int = 0) -> Any:
    """``batch`` with other values at the padded positions of ``inputs``: token ids drawn from
    the real tokens of the batch (never the pad id), or Gaussian noise for float inputs.

    Example:
        >>> x = torch.tensor([[3, 4, 0], [5, 0, 0]])
        >>> m = find_padding_mask({"x": x, "attention_mask": x != 0}, x)
        >>> new = pad_content_batch({"x": x, "attention_mask": x != 0}, x, m)
        >>> bool((new["x"][m.real] == x[m.real]).all()), bool((new["x"][m.pad] != 0).all())
        (True, True)
    """
    gen = torch.Generator().manual_seed(seed)
    new = inputs.clone()
    where = mask.pad
    count = int(where.sum())
    if inputs.is_floating_point():
        noise = torch.randn((count, *inputs.shape[2:]), generator=gen)
        new[where] = noise.to(device=inputs.device, dtype=inputs.dtype)
    else:
        pool = inputs[mask.real]
        pool = pool[pool != mask.pad_value] if pool.dim() == 1 else pool
        if pool.numel() == 0:
            pool = torch.tensor([int(mask.pad_value) + 1], device=inputs.device, dtype=inputs.dtype)
        pick = torch.randint(0, pool.shape[0], (count,), generator=gen).to(inputs.device)
        new[where] = pool[pick]
    return replace_tensor(batch, inputs, new)


def more_padding_batch(batch: Any, inputs: Tensor, mask: PaddingMask, extra: int,
                       targets: Tensor | None = None, ignore_index: int = -100) -> Any:
    """``batch`` with ``extra`` more padded positions at the padded end of every row.

    The inputs get the pad value, the mask tensor its padding value, targets of the inputs'
    shape ``ignore_index``, and every other tensor sharing the ``(N, T)`` leading shape a copy of
    its value at that end.

    Raises:
        ValueError: when the mask's side is unknown.

    Example:
        >>> x = torch.tensor([[3, 4, 0], [5, 0, 0]])
        >>> b = {"x": x, "attention_mask": (x != 0).long()}
        >>> new = more_padding_batch(b, x, find_padding_mask(b, x), extra=2)
        >>> new["x"].tolist(), new["attention_mask"].tolist()
        ([[3, 4, 0, 0, 0], [5, 0, 0, 0, 0]], [[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    """
    if mask.side is None:
        raise ValueError("the padded side of the batch is unknown")
    n, length = inputs.shape[:2]

    def grow(t: Tensor, fill: Any | None) -> Tensor:
        edge = t[:, -1:] if mask.side == "right" else t[:, :1]
        if fill is None:
            block = edge.expand(-1, extra, *t.shape[2:]).clone()
        else:
            block = torch.full((n, extra, *t.shape[2:]), fill, dtype=t.dtype, device=t.device)
        return torch.cat([t, block] if mask.side == "right" else [block, t], dim=1)

    new = replace_tensor(batch, inputs, grow(inputs, mask.pad_value))
    if mask.mask is not None:
        value: Any = mask.pad_is_true if mask.mask.dtype == torch.bool else int(mask.pad_is_true)
        new = replace_tensor(new, mask.mask, grow(mask.mask, value))
    done = {id(inputs), id(mask.mask)}
    if targets is not None and tuple(targets.shape[:2]) == (n, length) \
            and not targets.is_floating_point() and targets.dim() == 2:
        new = replace_tensor(new, targets, grow(targets, ignore_index))
        done.add(id(targets))
    for _, t in locate_batch(batch).tensors:
        if id(t) not in done and t.dim() >= 2 and tuple(t.shape[:2]) == (n, length):
            new = replace_tensor(new, t, grow(t, None))
            done.add(id(t))
    return new


def fewer_padding_batch(batch: Any, inputs: Tensor, mask: PaddingMask,
                        most: int) -> tuple[Any, Tensor, int] | None:
    """``batch`` cut to its padded rows, with ``cut`` fewer padded positions at the padded end:
    ``(batch, rows, cut)``, or ``None`` when the side is unknown or no row is padded.

    The way to vary the amount of padding of a batch already at the model's maximum length
    (``max_position_embeddings``): every tensor with the batch's examples on dim 0 keeps the
    padded rows, and those that also share the ``(N, T)`` leading shape lose ``cut`` (at most
    ``most``, at most the padding of the least padded row) positions at the padded end.

    Example:
        >>> x = torch.tensor([[3, 4, 0, 0], [5, 6, 7, 8], [5, 0, 0, 0]])
        >>> b = {"x": x, "attention_mask": (x != 0).long(), "y": torch.tensor([0, 1, 2])}
        >>> new, rows, cut = fewer_padding_batch(b, x, find_padding_mask(b, x), most=3)
        >>> new["x"].tolist(), new["y"].tolist(), rows.tolist(), cut
        ([[3, 4], [5, 0]], [0, 2], [0, 2], 2)
    """
    counts = mask.pad.sum(dim=1)
    rows = torch.nonzero(counts > 0).flatten()
    if mask.side is None or rows.numel() == 0:
        return None
    n, length = inputs.shape[:2]
    cut = min(int(counts[rows].min()), most)
    keep = slice(0, length - cut) if mask.side == "right" else slice(cut, length)

    def shorten(t: Tensor) -> Tensor:
        if t.dim() == 0 or t.shape[0] != n:
            return t
        t = t[rows.to(t.device)]
        return t[:, keep] if t.dim() >= 2 and t.shape[1] == length else t

    return map_tensors(shorten, batch), rows, cut


# ---------------------------------------------------------------------------------------------
# recording and comparing
# ---------------------------------------------------------------------------------------------
@dataclass
class Recording:
    """Module outputs of one pass, in completion order (detached): ``(name, call index, tensor)``
    with examples on dim 0; ``head`` is the last of them (the model's head output)."""

    outputs: list[tuple[str, int, Tensor]]

    @property
    def head(self) -> tuple[str, Tensor] | None:
        return (self.outputs[-1][0], self.outputs[-1][2]) if self.outputs else None


@contextmanager
def record_outputs(module: nn.Module, n: int) -> Iterator[Recording]:
    """Record the floating outputs with ``n`` examples on dim 0 of every submodule of ``module``
    (loss modules excluded) while the block runs; hooks removed on exit.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
        >>> with record_outputs(net, 2) as rec:
        ...     _ = net(torch.randn(2, 4))
        >>> [(name, i) for name, i, _ in rec.outputs]
        [('0', 0), ('1', 0), ('', 0)]
    """
    rec = Recording([])
    calls: dict[str, int] = {}

    def make(name: str) -> Any:
        def hook(mod: nn.Module, args: Any, output: Any) -> None:
            out = first_float_tensor(output)
            if out is None or out.is_nested or out.dim() == 0 or out.shape[0] != n:
                return  # nested tensors: the fast path of `nn.TransformerEncoder` under no_grad
            index = calls.get(name, 0)
            calls[name] = index + 1
            if len(rec.outputs) < MAX_RECORDED:
                rec.outputs.append((name, index, out.detach()))

        return hook

    def register(name: str, sub: nn.Module) -> Iterator[RemovableHandle]:
        yield sub.register_forward_hook(make(name))

    with hooked(module, register, skip=(_Loss,)):
        yield rec


@dataclass(frozen=True)
class RealChange:
    """How much an output moved at the real positions between two passes."""

    compared: Literal["positions", "pooled"]
    max_abs_diff: float
    relative_diff: float
    moved: bool


def compare_at_real(before: Tensor, after: Tensor, real: Tensor, *, offset: int = 0,
                    tolerance: float = DEFAULT_PADDING_TOLERANCE) -> RealChange | None:
    """Compare two outputs at the real positions, or as a whole for pooled outputs.

    ``before`` has ``T = real.shape[1]`` positions on dim 1 (per-position output; on the last
    dim for channels-first outputs ``(N, C, T)``) or is
    ``(N,)``/``(N, C)`` (pooled). ``after`` may have more positions, with the real ones shifted
    by ``offset`` (left padding grown). ``None`` when the two cannot be aligned.

    Example:
        >>> real = torch.tensor([[True, True, False]])
        >>> a = torch.tensor([[[1.0], [2.0], [3.0]]])
        >>> compare_at_real(a, torch.tensor([[[1.0], [2.0], [9.0], [9.0]]]), real).moved
        False
        >>> compare_at_real(a, torch.tensor([[[1.0], [2.5], [3.0]]]), real).relative_diff
        0.25
    """
    n, length = real.shape
    if before.dim() >= 3 and before.shape[1] != length and before.shape[-1] == length:
        # channels first (a `Conv1d` over the sequence): positions on the last dim
        before, after = before.movedim(-1, 1), after.movedim(-1, 1)
    if before.dim() >= 2 and before.shape[1] == length:
        if after.dim() != before.dim() or after.shape[0] != n or after.shape[2:] != before.shape[2:] \
                or after.shape[1] < length + offset:
            return None
        shifted = after[:, offset:offset + length]
        a, b = before[real], shifted[real]
        compared: Literal["positions", "pooled"] = "positions"
    elif before.dim() <= 2 and before.shape == after.shape and before.shape[0] == n:
        a, b = before, after
        compared = "pooled"
    else:
        return None
    if a.numel() == 0:
        return None
    a64, b64 = a.double(), b.double()
    both_nan = torch.isnan(a64) & torch.isnan(b64)
    diff = torch.where(both_nan, torch.zeros_like(a64), (a64 - b64).abs())
    diff = torch.nan_to_num(diff, nan=math.inf)
    max_diff = float(diff.max())
    scale = float(torch.nan_to_num(a64.abs(), nan=0.0, posinf=0.0).max())
    relative = max_diff / scale if scale > 0 else (math.inf if max_diff > 0 else 0.0)
    return RealChange(compared, max_diff, relative, relative > tolerance)


def first_moved(before: Recording, after: Recording, real: Tensor, *, offset: int = 0,
                tolerance: float = DEFAULT_PADDING_TOLERANCE) -> str | None:
    """The first module (in completion order of ``before``) whose output at the real positions
    moved between the two recordings; calls are matched by module name and call index.

    Example:
        >>> a = Recording([("emb", 0, torch.ones(1, 2, 1)), ("attn", 0, torch.ones(1, 2, 1))])
        >>> b = Recording([("emb", 0, torch.ones(1, 2, 1)), ("attn", 0, torch.full((1, 2, 1), 2.0))])
        >>> first_moved(a, b, torch.tensor([[True, False]]))
        'attn'
    """
    later = {(name, i): t for name, i, t in after.outputs}
    for name, i, t in before.outputs:
        other = later.get((name, i))
        if other is None:
            continue
        change = compare_at_real(t, other, real, offset=offset, tolerance=tolerance)
        if change is not None and change.moved:
            return name
    return None


__all__ = [
    "DEFAULT_PADDING_TOLERANCE",
    "MASK_KEYS",
    "PaddingMask",
    "RealChange",
    "Recording",
    "compare_at_real",
    "fewer_padding_batch",
    "find_padding_mask",
    "first_moved",
    "more_padding_batch",
    "pad_content_batch",
    "padding_side",
    "record_outputs",
]
