"""Find where a NaN/Inf is born: the first module output in forward order, the first gradient in
backward order, or the loss computation itself; and how close activations come to a dtype's range.

Pure PyTorch, no Lightning: usable from a plain training loop.

* Cheap detection (no host synchronization): :func:`max_abs` and :func:`all_finite` reduce many
  tensors with one fused ``inf``-norm and return a device tensor (NaN propagates through it).
* Localization: :func:`localize_nonfinite` runs a step function (forward + loss) under temporary
  forward hooks on every module, then a backward pass under temporary autograd-node hooks, and
  reports the first non-finite value with per-module max-abs evidence. Every hook is removed when
  it returns.
* Range: :func:`dtype_max` and :func:`overflow_ratio` compare values with ``torch.finfo``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lightning_triage._torch_compat import foreach_norms
from lightning_triage.functional.tensors import is_plain, plain_values

NonFiniteKind = Literal["forward", "backward", "loss", "finite"]

#: How many finite module outputs before the first non-finite one are kept as evidence.
DEFAULT_KEEP = 8

#: GradScaler's fused multi-tensor non-finite check (``None`` where this torch lacks it).
_FUSED_CHECK = getattr(torch, "_amp_foreach_non_finite_check_and_unscale_", None)


# ---------------------------------------------------------------------- cheap reductions
def abs_peaks(tensors: Iterable[Tensor]) -> list[Tensor]:
    """The largest ``|x|`` of each tensor, as 0-dim device tensors (no host sync).

    One multi-tensor ``inf``-norm (:func:`~lightning_triage._torch_compat.foreach_norms`).
    Empty tensors and tensors without data (meta) are left out; sparse, nested and quantized
    tensors are read through their stored values (:func:`~lightning_triage.functional.tensors.plain_values`).

    Example:
        >>> [float(p) for p in abs_peaks([torch.tensor([1.0, -3.0]), torch.tensor([2.0])])]
        [3.0, 2.0]
    """
    items = []
    for t in tensors:
        if not is_plain(t):
            values = plain_values(t)
            if values is None:
                continue
            t = values
        if t.numel():
            items.append(t if t.is_floating_point() or t.is_complex() else t.float())
    if not items:
        return []
    with torch.no_grad():
        return foreach_norms(items, math.inf)


def max_abs(tensors: Iterable[Tensor]) -> Tensor | None:
    """The largest ``|x|`` over many tensors, as a 0-dim device tensor (no host sync).

    A NaN anywhere gives NaN, an Inf gives Inf: the result is finite exactly when every value
    is. ``None`` for no (non-empty) tensors. See :func:`abs_peaks`.

    Example:
        >>> max_abs([torch.tensor([1.0, -3.0]), torch.tensor([2.0])])
        tensor(3.)
        >>> max_abs([torch.tensor([1.0, float("nan")])])
        tensor(nan)
    """
    peaks = abs_peaks(tensors)
    if not peaks:
        return None
    with torch.no_grad():
        return torch.stack([p.float() for p in peaks]).amax()


def gradients_nonfinite(grads: Sequence[Tensor],
                        buffers: dict[torch.device, tuple[Tensor, Tensor]] | None = None
                        ) -> Tensor | None:
    """A 1-element float tensor, > 0 when any gradient holds NaN/Inf (no host sync).

    Uses the fused check of ``torch.amp.GradScaler``
    (``torch._amp_foreach_non_finite_check_and_unscale_`` with a scale of exactly 1: one kernel
    per device, each value rewritten in place as ``x * 1.0``, which is bit-identical), else
    :func:`max_abs`. Meant for gradients, which may be written; ``None`` for no tensors.
    ``buffers`` caches the per-device ``(found, one)`` tensors between calls: a raised
    ``found`` stays raised (a flag accumulated on the device) until the caller zeroes it.

    Example:
        >>> grads = [torch.tensor([0.5, -2.0]), torch.tensor([float("-inf")])]
        >>> float(gradients_nonfinite(grads)), grads[0].tolist()
        (1.0, [0.5, -2.0])
    """
    by_device: dict[torch.device, list[Tensor]] = {}
    tracked = False
    for g in grads:
        if (g.is_floating_point() or g.is_complex()) and g.numel():
            by_device.setdefault(g.device, []).append(g)
            tracked = tracked or g.requires_grad  # only with `create_graph=True`
    if not by_device:
        return None
    flags: list[Tensor] = []
    with torch.no_grad() if tracked else nullcontext():  # called every step: skip the switch
        for device, group in by_device.items():
            if _FUSED_CHECK is not None and all(is_plain(g) and g.is_floating_point()
                                                for g in group):
                cached = None if buffers is None else buffers.get(device)
                if cached is None:
                    cached = (torch.zeros(1, device=device), torch.ones(1, device=device))
                    if buffers is not None:
                        buffers[device] = cached
                found, one = cached
                _FUSED_CHECK(group, found, one)
                flags.append(found)
            else:
                peak = max_abs(group)
                flags.append((~torch.isfinite(peak)).float().reshape(1) if peak is not None
                             else torch.zeros(1, device=device))
        if len(flags) == 1:
            return flags[0]
        return torch.stack([f.to(flags[0].device) for f in flags]).amax().reshape(1)


def all_finite(tensors: Iterable[Tensor]) -> Tensor | None:
    """Whether every value of every tensor is finite, as a 0-dim bool device tensor (no sync).

    Example:
        >>> bool(all_finite([torch.ones(3), torch.tensor([float("inf")])]))
        False
    """
    peak = max_abs(tensors)
    return None if peak is None else torch.isfinite(peak)


@dataclass(frozen=True)
class TensorStats:
    """Summary of one tensor: largest finite ``|x|``, NaN and Inf counts, size and dtype.

    Example:
        >>> stats = tensor_stats(torch.tensor([2.0, float("nan")]))
        >>> stats.finite, stats.max_abs, stats.nan
        (False, 2.0, 1)
    """

    max_abs: float
    nan: int
    inf: int
    numel: int
    dtype: str

    @property
    def finite(self) -> bool:
        return self.nan == 0 and self.inf == 0

    def to_dict(self) -> dict[str, Any]:
        return {"max_abs": self.max_abs, "nan": self.nan, "inf": self.inf, "numel": self.numel,
                "dtype": self.dtype}


def tensor_stats(t: Tensor) -> TensorStats:
    """NaN/Inf counts and the largest finite ``|x|`` of a tensor (synchronizes; for probes).

    Example:
        >>> tensor_stats(torch.tensor([1.0, -5.0, float("inf"), float("nan")]))
        TensorStats(max_abs=5.0, nan=1, inf=1, numel=4, dtype='float32')
    """
    dtype = str(t.dtype).replace("torch.", "")
    values = plain_values(t)  # sparse, nested, quantized: their stored values
    if values is None:  # no data (meta)
        return TensorStats(0.0, 0, 0, 0, dtype)
    t = values
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    if not t.is_floating_point() and not t.is_complex():
        peak = float(t.abs().max()) if t.numel() else 0.0
        return TensorStats(peak, 0, 0, t.numel(), dtype)
    nan = int(torch.isnan(t).sum())
    inf = int(torch.isinf(t).sum())
    finite = t[torch.isfinite(t)] if nan or inf else t
    peak = float(finite.abs().max()) if finite.numel() else 0.0
    return TensorStats(peak, nan, inf, t.numel(), dtype)


def nonfinite_examples(t: Tensor, limit: int = 32) -> tuple[list[int], int]:
    """Indices (along dim 0) of the examples holding a NaN/Inf, at most ``limit``, and their count.

    Example:
        >>> x = torch.zeros(4, 3)
        >>> x[2, 1] = float("nan")
        >>> nonfinite_examples(x)
        ([2], 1)
    """
    if not t.is_floating_point() or t.numel() == 0:
        return [], 0
    bad = ~torch.isfinite(t.detach())
    per_example = bad.reshape(t.shape[0], -1).any(dim=1) if t.dim() > 0 else bad.reshape(1)
    idx = per_example.nonzero().flatten()
    return [int(i) for i in idx[:limit]], int(idx.numel())


def dtype_max(dtype: torch.dtype) -> float:
    """The largest finite value of a floating dtype (``torch.finfo(dtype).max``).

    Example:
        >>> dtype_max(torch.float16)
        65504.0
    """
    return float(torch.finfo(dtype).max)


def overflow_ratio(value: float, dtype: torch.dtype) -> float:
    """``|value|`` as a fraction of ``dtype``'s largest finite value (>= 1 overflows).

    Example:
        >>> round(overflow_ratio(131008.0, torch.float16), 3)
        2.0
    """
    return abs(value) / dtype_max(dtype)


def float_tensors(obj: Any) -> list[Tensor]:
    """The floating-point tensors in a (nested) output: tensors, sequences, mappings, or objects
    with tensor attributes such as model-output dataclasses.

    Example:
        >>> [t.shape for t in float_tensors({"logits": torch.zeros(2, 3), "ids": torch.ones(2).long()})]
        [torch.Size([2, 3])]
    """
    found: list[Tensor] = []

    def visit(value: Any, depth: int) -> None:
        if depth > 6:
            return
        if isinstance(value, Tensor):
            if value.is_floating_point():
                found.append(value)
        elif isinstance(value, Mapping):
            for item in value.values():
                visit(item, depth + 1)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item, depth + 1)
        elif hasattr(value, "__dataclass_fields__"):
            for name in value.__dataclass_fields__:
                visit(getattr(value, name, None), depth + 1)

    visit(obj, 0)
    return found


# ---------------------------------------------------------------------- localization
@dataclass(frozen=True)
class Frame:
    """One module call in forward order: its name, output stats and whether its inputs were finite."""

    name: str
    stats: TensorStats
    inputs_finite: bool

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.name, **self.stats.to_dict(), "inputs_finite": self.inputs_finite}


@dataclass(frozen=True)
class BackwardEvent:
    """The first autograd node whose computed gradient held NaN/Inf while its incoming gradient
    was finite: the node's name (e.g. ``SqrtBackward0``), the module that created it in forward
    (``None``: outside every module, e.g. the loss in ``training_step``) and the gradient's stats."""

    op: str
    layer: str | None
    stats: TensorStats
    incoming_max_abs: float

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "layer": self.layer, **self.stats.to_dict(),
                "incoming_max_abs": self.incoming_max_abs}


@dataclass
class Localization:
    """Where a step's first NaN/Inf appeared.

    ``kind`` is ``"forward"`` (``layer`` is the first module whose output was non-finite, in
    forward order), ``"loss"`` (every module output was finite but the loss was not),
    ``"backward"`` (forward and loss finite, a gradient was not: ``layer`` made the node),
    or ``"finite"`` (nothing non-finite: the step did not reproduce).

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
        >>> where = localize_nonfinite(net, lambda: torch.log(net(torch.ones(3, 2)) - 1e9).sum())
        >>> where.kind, where.layer, where.finite
        ('loss', None, False)
        >>> localize_nonfinite(net, lambda: net(torch.ones(3, 2)).sum()).kind
        'finite'
    """

    kind: NonFiniteKind
    layer: str | None = None
    first: Frame | None = None
    leading: list[Frame] = field(default_factory=list)
    backward: BackwardEvent | None = None
    loss: float | None = None
    loss_dtype: str | None = None
    max_abs_by_layer: dict[str, float] = field(default_factory=dict)
    dtype_by_layer: dict[str, str] = field(default_factory=dict)

    @property
    def finite(self) -> bool:
        return self.kind == "finite"

    def evidence(self) -> dict[str, Any]:
        """The numbers to put in a finding: the frames leading to the first non-finite value."""
        out: dict[str, Any] = {"kind": self.kind, "loss": self.loss}
        if self.first is not None:
            out["first_nonfinite"] = self.first.to_dict()
        if self.leading:
            out["frames"] = [f.to_dict() for f in self.leading]
        if self.backward is not None:
            out["backward"] = self.backward.to_dict()
        return out


def _is_within(owner: str, name: str) -> bool:
    return name == "" or owner == name or owner.startswith(name + ".")


class _Tracer:
    """State of one traced step: forward frames, node ownership, the first backward event."""

    def __init__(self, module: nn.Module, keep: int) -> None:
        self.module = module
        self.keep = keep
        self.frames: list[Frame] = []
        self.first: Frame | None = None
        self.first_index = -1
        self.max_abs_by_layer: dict[str, float] = {}
        self.dtype_by_layer: dict[str, str] = {}
        self.owner: dict[Any, str] = {}
        self.event: BackwardEvent | None = None
        self.handles: list[Any] = []

    # forward -----------------------------------------------------------------
    def forward_hook(self, name: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            outs = float_tensors(output)
            if not outs:
                return
            ins = float_tensors((args, kwargs))
            self._claim_nodes(name, ins, outs)
            stats = [tensor_stats(t) for t in outs]
            merged = TensorStats(
                max(s.max_abs for s in stats), sum(s.nan for s in stats),
                sum(s.inf for s in stats), sum(s.numel for s in stats), stats[0].dtype)
            self.max_abs_by_layer[name] = max(self.max_abs_by_layer.get(name, 0.0), merged.max_abs)
            self.dtype_by_layer.setdefault(name, merged.dtype)
            if self.first is not None:
                return
            inputs_finite = all(ok is None or bool(ok) for ok in map(all_finite, ([t] for t in ins)))
            frame = Frame(name, merged, inputs_finite)
            self.frames.append(frame)
            if not merged.finite:
                self.first = frame
            elif len(self.frames) > self.keep:
                del self.frames[0]

        return hook

    def _claim_nodes(self, name: str, ins: Sequence[Tensor], outs: Sequence[Tensor]) -> None:
        """Map the autograd nodes created inside this module call to its name (innermost wins:
        children's hooks run first)."""
        stops = {t.grad_fn for t in ins if t.grad_fn is not None}
        stack: list[Any] = [t.grad_fn for t in outs if t.grad_fn is not None]
        seen: set[Any] = set()
        while stack:
            node = stack.pop()
            if node is None or node in seen or node in stops:
                continue
            seen.add(node)
            owner = self.owner.get(node)
            if owner is None:
                self.owner[node] = name
            elif not _is_within(owner, name):
                continue  # created by an earlier module outside this one
            stack.extend(nxt for nxt, _ in node.next_functions)

    # backward ----------------------------------------------------------------
    def backward(self, loss: Tensor, inputs: Sequence[Tensor]) -> None:
        if loss.grad_fn is None or not inputs:
            return
        stack: list[Any] = [loss.grad_fn]
        seen: set[Any] = set()
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            self.handles.append(node.register_hook(self._node_hook(node)))
            stack.extend(nxt for nxt, _ in node.next_functions)
        torch.autograd.grad(loss, list(inputs), allow_unused=True)

    def _node_hook(self, node: Any) -> Callable[..., None]:
        def hook(grad_inputs: Sequence[Tensor | None], grad_outputs: Sequence[Tensor | None]) -> None:
            if self.event is not None:
                return
            computed = [g for g in grad_inputs if g is not None and g.is_floating_point()]
            if not computed or bool(all_finite(computed)):
                return
            incoming = [g for g in grad_outputs if g is not None and g.is_floating_point()]
            peak = max_abs(incoming)
            if peak is not None and not bool(torch.isfinite(peak)):
                return  # already non-finite when it arrived: not born here
            bad = next(g for g in computed if not bool(torch.isfinite(g).all()))
            self.event = BackwardEvent(node.name(), self.owner.get(node), tensor_stats(bad),
                                       0.0 if peak is None else float(peak))

        return hook

    def remove(self) -> None:
        while self.handles:
            self.handles.pop().remove()


@contextmanager
def _forward_hooks(tracer: _Tracer, module: nn.Module) -> Iterator[None]:
    try:
        for name, sub in module.named_modules():
            if isinstance(sub, torch.jit.ScriptModule):  # takes no hooks
                continue
            tracer.handles.append(sub.register_forward_hook(tracer.forward_hook(name),
                                                            with_kwargs=True))
        yield
    finally:
        tracer.remove()


def localize_nonfinite(
    module: nn.Module,
    step: Callable[[], Tensor | None],
    *,
    backward: bool = True,
    params: Sequence[Tensor] | None = None,
    keep: int = DEFAULT_KEEP,
) -> Localization:
    """Run ``step`` (forward and loss) and its backward under temporary hooks; say where the first
    NaN/Inf appeared.

    Forward hooks on every submodule of ``module`` record each output's max ``|x|`` and NaN/Inf
    counts in the order outputs are produced (a child finishes before its parent, so the first
    non-finite output names the innermost module where it was born). If every module output is
    finite and the loss is too, hooks on every autograd node of the loss's graph find the first
    node whose computed gradient is non-finite while its incoming gradient was finite (backward
    order), attributed to the module whose forward created the node. Gradients are computed with
    ``torch.autograd.grad`` and discarded: no ``.grad`` is written. All hooks are removed on exit.

    The caller owns everything else: run it under ``torch.enable_grad()``, on a copy of the
    state or inside a snapshot/restore (the step may update buffers such as batch-norm
    statistics), with the RNG state it wants.

    Args:
        module: the model whose submodules are traced (names from ``named_modules()``).
        step: runs the forward pass and returns the scalar loss (or ``None``).
        backward: also localize in backward when forward and loss are finite.
        params: tensors to differentiate (default: ``module``'s parameters requiring grad).
        keep: how many finite frames before the first non-finite one to keep as evidence.

    Example:
        >>> class Norm(nn.Module):
        ...     def forward(self, x):
        ...         return (x - x.mean(0)) / x.std(0)  # no epsilon
        >>> net = nn.Sequential(nn.Linear(2, 2), Norm(), nn.Linear(2, 1))
        >>> x = torch.ones(4, 2)  # every example equal: std 0
        >>> where = localize_nonfinite(net, lambda: net(x).sum())
        >>> where.kind, where.layer
        ('forward', '1')
    """
    tracer = _Tracer(module, keep)
    with _forward_hooks(tracer, module):
        loss = step()
    loss_value: float | None = None
    loss_dtype: str | None = None
    if isinstance(loss, Tensor) and loss.numel() == 1:
        loss_value = float(loss.detach().float())
        loss_dtype = str(loss.dtype).replace("torch.", "")
    result = Localization("finite", loss=loss_value, loss_dtype=loss_dtype,
                          max_abs_by_layer=tracer.max_abs_by_layer,
                          dtype_by_layer=tracer.dtype_by_layer)
    if tracer.first is not None:
        result.kind = "forward"
        result.layer = tracer.first.name
        result.first = tracer.first
        result.leading = tracer.frames[:-1]
        return result
    result.leading = tracer.frames
    if loss_value is not None and not math.isfinite(loss_value):
        result.kind = "loss"
        return result
    if backward and isinstance(loss, Tensor) and loss.numel() == 1 and loss.requires_grad:
        inputs = [p for p in (module.parameters() if params is None else params) if p.requires_grad]
        try:
            tracer.backward(loss, inputs)
        finally:
            tracer.remove()
        if tracer.event is not None:
            result.kind = "backward"
            result.layer = tracer.event.layer
            result.backward = tracer.event
    return result


@contextmanager
def float32_state(module: nn.Module) -> Iterator[None]:
    """Temporarily swap reduced-precision parameters and buffers for float32 copies (``.data``),
    restoring the very same tensors (and gradients) afterwards; the originals are not written.

    Example:
        >>> net = nn.Linear(2, 2).half()
        >>> with float32_state(net):
        ...     net.weight.dtype
        torch.float32
        >>> net.weight.dtype
        torch.float16
    """
    saved: list[tuple[Tensor, Tensor]] = []
    saved_grads: list[tuple[Tensor, Tensor]] = []
    try:
        for t in (*module.parameters(), *module.buffers()):
            if t.is_floating_point() and t.dtype in (torch.float16, torch.bfloat16):
                if t.grad is not None:
                    saved_grads.append((t, t.grad))
                    t.grad = None
                saved.append((t, t.data))
                t.data = t.data.float()
        yield
    finally:
        for t, data in saved:
            t.data = data
        for t, grad in saved_grads:
            t.grad = grad


__all__ = [
    "BackwardEvent",
    "Frame",
    "Localization",
    "NonFiniteKind",
    "TensorStats",
    "abs_peaks",
    "all_finite",
    "dtype_max",
    "float32_state",
    "float_tensors",
    "gradients_nonfinite",
    "localize_nonfinite",
    "max_abs",
    "nonfinite_examples",
    "overflow_ratio",
    "tensor_stats",
]
