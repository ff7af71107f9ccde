"""Examples coupled on purpose: what an objective computes across the batch.

In-batch-negative objectives (CLIP's InfoNCE over a ``(B, B)`` logit matrix, SimCLR's NT-Xent
over ``(2B, 2B)`` similarities) and batch-statistic losses (VICReg's variance and covariance,
Barlow Twins' cross-correlation, a sum over the batch through a matrix product) couple a batch's
examples by design. A :class:`CouplingWatch` records those computations while the user's step
runs, by the shapes of the tensors involved, so the batch-independence probe can say that the
coupling is the objective's (the per-example outputs being independent) instead of calling it
batch mixing. It only observes: every call runs as it is.

Example:
    >>> import torch
    >>> z = torch.randn(8, 4, requires_grad=True)
    >>> with CouplingWatch(8) as watch:
    ...     logits = z @ z.T
    ...     spread = z.var(0)
    >>> watch.pairs, watch.statistics
    ([(8, 8)], ['var'])
"""

from __future__ import annotations

from typing import Any

from torch import Tensor
from torch.overrides import TorchFunctionMode

#: Matrix products (an ``(N, N)`` result: in-batch pairs; contracted over N: a batch statistic).
MATMULS = frozenset({"matmul", "mm", "__matmul__", "__rmatmul__", "einsum"})
#: Reductions that, over dim 0 of a batch, are batch statistics.
STATISTICS = frozenset({"mean", "var", "std", "var_mean", "std_mean", "logsumexp", "norm"})
#: Statistics over the columns of a ``(features, N)`` input.
COLUMN_STATISTICS = frozenset({"cov", "corrcoef"})
MAX_RECORDS = 16


def _dims(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, ...] | None:
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if dim is None or isinstance(dim, bool):
        return None
    if isinstance(dim, int):
        return (dim,)
    if isinstance(dim, (tuple, list)) and all(isinstance(d, int) for d in dim):
        return tuple(dim)
    return None


class CouplingWatch(TorchFunctionMode):
    """A torch function mode recording computations that couple a batch of ``batch_size``
    examples on purpose, on tensors that require gradients (the model's outputs, not data).

    ``pairs`` holds the shapes of 2-D matrix products whose result is ``(kN, kN)`` (``k`` 1 or 2:
    one or two views): in-batch similarity matrices. ``statistics`` names reductions over dim 0
    of a ``(kN, ...)`` tensor and matrix products contracted over ``kN`` (a cross-correlation
    over the batch): batch statistics.

    Example:
        >>> import torch
        >>> a = torch.randn(6, 3, requires_grad=True)
        >>> with CouplingWatch(6) as watch:
        ...     _ = torch.cat([a, a]) @ torch.cat([a, a]).T  # two views: (12, 12)
        ...     _ = a.T @ a  # (3, 3) cross-correlation over the batch
        ...     _ = a.mean(1)  # per example: not a coupling
        >>> watch.pairs, watch.statistics, watch.coupled
        ([(12, 12)], ['matmul over the batch'], True)
    """

    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.pairs: list[tuple[int, int]] = []
        self.statistics: list[str] = []

    @property
    def coupled(self) -> bool:
        """Whether the step computed any in-batch pairs or batch statistics."""
        return bool(self.pairs or self.statistics)

    def _batch(self, n: int) -> bool:
        return self.batch_size >= 2 and n in (self.batch_size, 2 * self.batch_size)

    def _record(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        tensors = [a for a in args if isinstance(a, Tensor)]
        if not any(t.requires_grad for t in tensors) or not isinstance(out, Tensor):
            return
        if name in MATMULS:
            operands = [t for t in tensors if t.dim() == 2]
            if out.dim() == 2 and out.shape[0] == out.shape[1] and self._batch(int(out.shape[0])):
                self.pairs.append((int(out.shape[0]), int(out.shape[1])))
            elif len(operands) == 2 and self._batch(int(operands[0].shape[1])) \
                    and operands[0].shape[1] == operands[1].shape[0]:
                self.statistics.append("matmul over the batch")
        elif name in STATISTICS:
            x = tensors[0]
            dims = _dims(args, kwargs)
            if dims is not None and x.dim() >= 2 and self._batch(int(x.shape[0])) \
                    and any(d % x.dim() == 0 for d in dims):
                self.statistics.append(name)
        elif name in COLUMN_STATISTICS:
            x = tensors[0]
            if x.dim() == 2 and self._batch(int(x.shape[1])):
                self.statistics.append(name)

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(getattr(func, "__name__", ""))
        if len(self.pairs) + len(self.statistics) < MAX_RECORDS and \
                (name in MATMULS or name in STATISTICS or name in COLUMN_STATISTICS):
            self._record(name, tuple(args), kwargs, out)  # the mode is off inside its handler
        return out


__all__ = ["COLUMN_STATISTICS", "MATMULS", "STATISTICS", "CouplingWatch"]
