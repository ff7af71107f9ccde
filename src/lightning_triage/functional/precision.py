"""Mixed precision: which calls of the operations autocast lowers still ran in float32.

Under ``*-mixed`` precision, autocast runs matrix products and convolutions (``linear``,
``matmul``, ``bmm``, ``conv2d``, attention...) in float16/bfloat16 and keeps the operations that
need the range in float32 (norms, softmax, losses). A lowered operation that still returns float32
ran outside autocast: a block under ``torch.autocast(enabled=False)``, a forward in another
thread (autocast state is per thread), a custom function that casts its inputs back. An
:class:`AutocastRecorder` sees those calls during one forward; :func:`autocast_bypassed` judges
them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle

from lightning_triage.functional.hooks import hooked
from lightning_triage.functional.verdict import Verdict

#: The operations autocast runs in reduced precision (on CUDA and CPU), by function name.
LOWERED_OPS = frozenset({
    "linear", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "baddbmm", "addmm", "addbmm",
    "einsum", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "scaled_dot_product_attention", "multi_head_attention_forward",
})
#: A bypass holding at least this share of the lowered operations' multiply-adds is a warning
#: (the bulk of the compute runs in float32); below it, an info finding.
WARN_SHARE = 0.5
#: At most this many modules are listed in a finding.
MAX_LISTED = 20


@dataclass(frozen=True)
class OpCall:
    """One call of a lowered operation: the innermost module running it, the operation, the
    dtype of its result and its multiply-adds."""

    module: str
    module_type: str
    op: str
    dtype: torch.dtype
    flops: float


def _tensor(value: Any) -> Tensor | None:
    return value if isinstance(value, Tensor) else None


def _einsum_flops(args: Sequence[Any]) -> float:
    """Product of the sizes of every index of a two-or-more-operand ``einsum``."""
    equation = args[0] if args and isinstance(args[0], str) else None
    operands = list(args[1:])
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = list(operands[0])
    if equation is None:
        return 0.0
    sizes: dict[str, int] = {}
    for spec, op in zip(equation.split("->")[0].split(","), operands, strict=False):
        if isinstance(op, Tensor):
            letters = [c for c in spec.strip() if c.isalpha()]
            for c, n in zip(letters, op.shape[-len(letters):] if letters else (), strict=False):
                sizes[c] = int(n)
    return float(math.prod(sizes.values())) if sizes else 0.0


def op_flops(op: str, args: Sequence[Any], kwargs: Mapping[str, Any], out: Tensor) -> float:
    """Estimated multiply-adds of one call of a lowered operation.

    Example:
        >>> x, w = torch.zeros(4, 8), torch.zeros(16, 8)
        >>> op_flops("linear", (x, w), {}, torch.zeros(4, 16))
        512.0
    """
    a = _tensor(args[0]) if args else None
    b = _tensor(args[1]) if len(args) > 1 else _tensor(kwargs.get("weight"))
    if op in ("linear", "matmul", "__matmul__", "mm", "bmm") and a is not None:
        return float(out.numel() * (a.shape[-1] if a.dim() else 1))
    if op == "__rmatmul__" and b is not None:
        return float(out.numel() * (b.shape[-1] if b.dim() else 1))
    if op in ("baddbmm", "addmm", "addbmm") and b is not None:
        k = b.shape[-1] if b.dim() else 1
        return float(out.numel() * k * (b.shape[0] if op == "addbmm" else 1))
    if op == "einsum":
        return _einsum_flops(args)
    if op.startswith("conv_transpose") and a is not None and b is not None:
        return float(a.numel() * b[0].numel())
    if op.startswith("conv") and b is not None:
        return float(out.numel() * b[0].numel())
    if op == "scaled_dot_product_attention" and a is not None and b is not None:
        v = _tensor(args[2]) if len(args) > 2 else _tensor(kwargs.get("value"))
        ev = v.shape[-1] if v is not None else a.shape[-1]
        return float(a.numel() // max(a.shape[-1], 1) * b.shape[-2] * (a.shape[-1] + ev))
    if op == "multi_head_attention_forward" and a is not None and b is not None:
        e = a.shape[-1]
        tokens, keys = a.numel() // e, b.numel() // e
        return float((tokens + 2 * keys) * e * e + 2 * tokens * b.shape[0] * e + tokens * e * e)
    return 0.0


class AutocastRecorder(TorchFunctionMode):
    """Record every call of a :data:`LOWERED_OPS` operation inside :meth:`attached`: the
    innermost module running it (forward pre/post hooks keep the stack), its result's dtype and
    its multiply-adds. Observes only: every call runs unchanged.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> with AutocastRecorder().attached(net) as rec:
        ...     _ = net(torch.randn(3, 4))
        >>> [(c.module, c.op, c.dtype) for c in rec.calls]
        [('0', 'linear', torch.float32), ('2', 'linear', torch.float32)]
    """

    def __init__(self, max_calls: int = 10_000) -> None:
        super().__init__()
        self.max_calls = max_calls
        self.calls: list[OpCall] = []
        self._stack: list[tuple[str, str]] = [("", "")]

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        op = getattr(func, "__name__", "")
        if op in LOWERED_OPS and len(self.calls) < self.max_calls:
            result = out[0] if isinstance(out, (tuple, list)) and out else out
            if isinstance(result, Tensor) and result.is_floating_point():
                name, kind = self._stack[-1]
                self.calls.append(OpCall(name, kind, op, result.dtype,
                                         op_flops(op, args, kwargs, result)))
        return out

    @contextmanager
    def attached(self, module: nn.Module) -> Iterator[AutocastRecorder]:
        """Hooks on every submodule of ``module`` and this mode, for the block."""
        def push(name: str, kind: str) -> Any:
            def fn(mod: nn.Module, args: Any) -> None:
                self._stack.append((name, kind))
            return fn

        def pop(mod: nn.Module, args: Any, output: Any) -> None:
            if len(self._stack) > 1:
                self._stack.pop()

        def register(name: str, sub: nn.Module) -> Iterator[RemovableHandle]:
            yield sub.register_forward_pre_hook(push(name, type(sub).__name__))
            yield sub.register_forward_hook(pop, always_call=True)

        try:
            with hooked(module, register), self:
                yield self
        finally:
            self._stack = [("", "")]


def autocast_bypassed(calls: Sequence[OpCall], *, precision: str, lowered: torch.dtype,
                      step: int | None = 0, warn_share: float = WARN_SHARE) -> Verdict | None:
    """``numerics.autocast_bypassed`` when calls of lowered operations returned float32 under
    ``*-mixed`` precision (autocast should have run them in ``lowered``); ``None`` otherwise.

    A warning when the float32 calls hold at least ``warn_share`` of the lowered operations'
    multiply-adds, info below. The finding's layer is the module holding the most of them.

    Example:
        >>> calls = [OpCall("enc", "Linear", "linear", torch.float32, 900.0),
        ...          OpCall("head", "Linear", "linear", torch.bfloat16, 100.0)]
        >>> v = autocast_bypassed(calls, precision="bf16-mixed", lowered=torch.bfloat16)
        >>> v.layer, v.severity, v.evidence["share"]
        ('enc', 'warning', 0.9)
    """
    total = sum(c.flops for c in calls)
    bad = [c for c in calls if c.dtype == torch.float32]
    if not bad:
        return None
    per_module: dict[str, dict[str, Any]] = {}
    for c in bad:
        entry = per_module.setdefault(c.module, {"module": c.module, "type": c.module_type,
                                                 "ops": [], "flops": 0.0, "calls": 0})
        entry["flops"] += c.flops
        entry["calls"] += 1
        if c.op not in entry["ops"]:
            entry["ops"].append(c.op)
    flops = sum(c.flops for c in bad)
    share = flops / total if total > 0 else 1.0
    ranked = sorted(per_module.values(), key=lambda e: -e["flops"])
    for entry in ranked:
        entry["share"] = round(entry["flops"] / total, 4) if total > 0 else None
    listed = ", ".join(
        f"`{e['module'] or '<root>'}` ({e['type'] or 'no module'}: {'/'.join(e['ops'])}"
        + (f", {e['share']:.0%})" if e["share"] is not None else ")") for e in ranked[:8])
    more = f" and {len(ranked) - 8} more" if len(ranked) > 8 else ""
    low = str(lowered).replace("torch.", "")
    severity: Literal["warning", "info"] = "warning" if share >= warn_share else "info"
    return Verdict(
        "numerics.autocast_bypassed", step,
        f"Under `{precision}` precision, {len(bad)} of {len(calls)} call(s) of operations "
        f"autocast runs in {low} returned float32 at the first training step, "
        f"{share:.0%} of those operations' multiply-adds: {listed}{more}.",
        layer=ranked[0]["module"] or None, severity=severity,
        evidence={"precision": precision, "autocast_dtype": low, "share": round(share, 4),
                  "float32_calls": len(bad), "lowered_calls": len(calls),
                  "float32_flops": flops, "lowered_flops": total,
                  "modules": ranked[:MAX_LISTED], "num_modules": len(ranked)},
    )


__all__ = ["LOWERED_OPS", "MAX_LISTED", "WARN_SHARE", "AutocastRecorder", "OpCall",
           "autocast_bypassed", "op_flops"]
