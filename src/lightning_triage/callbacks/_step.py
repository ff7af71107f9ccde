"""The per-step reads the watches share (private): one step path for everything that stays on.

After the first-epochs windows, three checks work on every training step: the loss watch
(:class:`~lightning_triage.LossCurveMonitor`), the gradient watch
(:class:`~lightning_triage.GradientMonitor`) and the NaN tracer
(:class:`~lightning_triage.NonFiniteTracer`). They need the same few numbers: the step's loss,
the per-parameter gradient norms, their total, whether it is finite. A :class:`StepState` reads
each of them once per step, for whichever check asks first, and hands the same values to the
others. Each check owns one when used alone; the :class:`~lightning_triage.Triage` bundle gives
its checks one shared state, so that the bundle pays for each read once. Nothing depends on the
order of the checks: the first to ask computes, the others read.

On CPU every value is read on the host as it is computed (a host read is free there); on an
accelerator the values stay on the device and :class:`RowBuffer` keeps them in a preallocated
device buffer until the owner's flush moves a chunk to the host in one transfer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lightning_triage.functional.tensors import is_plain, plain_values
from lightning_triage.probing import step_loss


class StepState:
    """The loss and gradient norms of the current training step, read once.

    Attributes:
        params: the trainable parameters whose gradient norms are read (the module's
            ``named_parameters()`` order), set by :meth:`bind`.
        names: their names.
        host: whether values are read on the host (CPU runs).
        norms: the current step's per-parameter gradient norms (host: a list of floats;
            device: a float32 tensor).
        total: their 2-norm (host: a float; device: a 0-d tensor, computed on demand).
        norm_reads: how many times the norms were computed (one per optimizer step).
    """

    def __init__(self) -> None:
        self.params: list[nn.Parameter] = []
        self.names: list[str] = []
        self.host = True
        self.norm_reads = 0
        self._zeros: dict[torch.device, Tensor] = {}
        self.reset()

    def reset(self) -> None:
        """Forget the module and the cached values (a new fit)."""
        self.params, self.names = [], []
        self.norms: list[float] | Tensor | None = None
        self._total: float | Tensor | None = None
        self._grad_key: tuple[int, int] | None = None
        self._loss_src: Any = None
        self._loss: tuple[Tensor | None, float | None] = (None, None)

    def bind(self, pl_module: nn.Module) -> list[nn.Parameter]:
        """Collect the trainable parameters of ``pl_module`` (once per fit)."""
        if not self.params:
            for name, p in pl_module.named_parameters():
                if p.requires_grad:
                    self.names.append(name)
                    self.params.append(p)
            self.host = not self.params or self.params[0].device.type == "cpu"
        return self.params

    # ------------------------------------------------------------------ gradients
    def read_grads(self, step: int, optimizer: object) -> None:
        """Compute this optimizer step's per-parameter gradient norms, unless already done for
        (``step``, ``optimizer``): one ``torch._foreach_norm`` over every gradient (a missing
        one counts as 0), and on the host their total."""
        key = (step, id(optimizer))
        if key == self._grad_key:
            return
        self._grad_key = key
        self.norm_reads += 1
        # no gradient this step: norm 0 in its slot
        grads = [p.grad if p.grad is not None else self._zero(p) for p in self.params]
        norms: Sequence[Tensor]
        try:
            norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
        except (NotImplementedError, RuntimeError):  # sparse or complex gradients ...
            norms = [n.float() for n in torch._foreach_norm(self._plain(grads))]
        stacked = torch.stack(norms)
        if self.host:
            values = stacked.tolist()
            self.norms = values
            self._total = math.hypot(*values)
        else:
            self.norms = stacked
            self._total = None

    @property
    def total(self) -> float | Tensor:
        """The total gradient norm of the current step (host float or 0-d device tensor)."""
        if self._total is None:
            assert isinstance(self.norms, Tensor)
            self._total = torch.linalg.vector_norm(self.norms)
        return self._total

    def grads_finite(self) -> bool:
        """Host runs: whether every gradient of the current step is finite (a NaN/Inf makes
        its norm, hence the total, non-finite; a total that overflows reads as non-finite too,
        which the tracer's exact re-check then clears)."""
        total = self.total
        return math.isfinite(total) if isinstance(total, float) else \
            math.isfinite(float(total))

    def _plain(self, grads: list[Tensor]) -> list[Tensor]:
        """Gradients of any layout as dense tensors with the same norm: a sparse gradient's
        coalesced values, a nested one's packed values; no data (meta): norm 0."""
        out = []
        for p, g in zip(self.params, grads, strict=True):
            values = g if is_plain(g) else plain_values(g, coalesce=True)
            out.append(self._zero(p) if values is None or values.numel() == 0 else values)
        return out

    def _zero(self, p: Tensor) -> Tensor:
        zero = self._zeros.get(p.device)
        if zero is None:
            zero = self._zeros[p.device] = torch.zeros(1, device=p.device)
        return zero

    # ------------------------------------------------------------------ loss
    def loss(self, outputs: Any) -> tuple[Tensor | None, float | None]:
        """The scalar loss of a ``training_step`` output, read once per output object:
        ``(detached 0-d tensor, host value or None on accelerators)``."""
        if outputs is self._loss_src and outputs is not None:
            return self._loss
        self._loss_src = outputs  # kept alive until the next step: its identity is the key
        loss = step_loss(outputs)
        if loss is None:
            self._loss = (None, None)
        else:
            value = loss.detach()
            if value.dim():
                value = value.reshape(())
            self._loss = (value, value.item() if value.is_cpu else None)
        return self._loss

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(params=[], names=[], norms=None, _total=None, _grad_key=None,
                     _loss_src=None, _loss=(None, None), _zeros={})
        return state


class RowBuffer:
    """Preallocated rows of numbers between two flushes: a numpy array on the host (CPU runs),
    a float32 tensor on the device (accelerators: written without a host synchronization).

    Args:
        width: numbers per row.
        capacity: rows before the owner flushes (grows if a step writes past it).
        device: where the values live (``None`` or CPU: the host).
    """

    def __init__(self, width: int, capacity: int, device: torch.device | None = None) -> None:
        self.width = width
        self.host = device is None or device.type == "cpu"
        self.device = device
        self.data: np.ndarray | Tensor = self._alloc(max(1, capacity))
        self.steps = np.zeros(max(1, capacity), dtype=np.int64)
        self.n = 0

    def _alloc(self, rows: int) -> np.ndarray | Tensor:
        if self.host:
            return np.zeros((rows, self.width), dtype=np.float64)
        return torch.zeros((rows, self.width), dtype=torch.float32, device=self.device)

    def __len__(self) -> int:
        return self.n

    @property
    def capacity(self) -> int:
        return int(self.steps.size)

    def next_row(self, step: int) -> int:
        """Reserve the next row for ``step``; its index."""
        if self.n == self.capacity:  # manual optimization: several steps in one batch
            old, self.data = self.data, self._alloc(2 * self.n)
            self.data[: self.n] = old  # type: ignore[assignment]
            self.steps = np.concatenate([self.steps, np.zeros_like(self.steps)])
        self.steps[self.n] = step
        self.n += 1
        return self.n - 1

    def peek(self) -> tuple[list[int], np.ndarray]:
        """Every row as ``(steps, float64 array)``, kept (for checkpoints)."""
        rows = self.data[: self.n]
        out = rows.copy() if isinstance(rows, np.ndarray) else rows.cpu().double().numpy()
        return self.steps[: self.n].tolist(), out

    def take(self, n: int | None = None) -> tuple[list[int], np.ndarray]:
        """The first ``n`` rows (default all) as ``(steps, float64 array)``, removed; one host
        transfer on accelerators."""
        n = self.n if n is None else min(n, self.n)
        rows = self.data[:n]
        out = rows.copy() if isinstance(rows, np.ndarray) else rows.cpu().double().numpy()
        steps = self.steps[:n].tolist()
        rest = self.n - n
        if rest:
            self.data[:rest] = self.data[n:self.n].copy() if isinstance(self.data, np.ndarray) \
                else self.data[n:self.n].clone()
            self.steps[:rest] = self.steps[n:self.n]
        self.n = rest
        return steps, out


__all__ = ["RowBuffer", "StepState"]
