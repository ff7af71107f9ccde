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

from lightning_triage._torch_compat import foreach_norms
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
        self._noted: tuple[Tensor, float | None] | None = None
        #: automatic optimization: the loss given to backward is the one the step returns
        self.automatic = False

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
            norms = foreach_norms(grads, 2, dtype=torch.float32)
        except (NotImplementedError, RuntimeError):  # sparse or complex gradients ...
            norms = [n.float() for n in foreach_norms(self._plain(grads))]
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
    def note_loss(self, loss: Tensor) -> tuple[Tensor, float | None]:
        """Read the loss given to backward (a one-element tensor): ``(detached 0-d tensor,
        host value or None on accelerators)``. Under automatic optimization it is the loss the
        step returns, so :meth:`loss` hands the same read to the watches at the batch's end."""
        value = loss.detach()
        if value.dim():
            value = value.reshape(())
        read = (value, value.item() if self.host and value.is_cpu else None)
        self._noted = read if self.automatic else None
        return read

    def loss(self, outputs: Any) -> tuple[Tensor | None, float | None]:
        """The scalar loss of a ``training_step`` output, read once per output object (or
        taken from :meth:`note_loss` of the same step): ``(detached 0-d tensor, host value or
        None on accelerators)``."""
        if outputs is self._loss_src and outputs is not None:
            return self._loss
        self._loss_src = outputs  # kept alive until the next step: its identity is the key
        noted, self._noted = self._noted, None
        if outputs is None:
            self._loss = (None, None)
        elif noted is not None:  # automatic optimization: the loss backward was given
            self._loss = noted
        else:
            loss = step_loss(outputs)
            self._loss = (None, None) if loss is None else self.note_loss(loss)
            self._noted = None
        return self._loss

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(params=[], names=[], norms=None, _total=None, _grad_key=None,
                     _loss_src=None, _loss=(None, None), _noted=None, _zeros={})
        return state


class RowBuffer:
    """Preallocated rows of numbers between two flushes: on the host (CPU runs) preallocated
    slots holding each step's row as a list of floats (no array op per step), on an accelerator
    a float32 device tensor written without a host synchronization.

    Args:
        width: numbers per row.
        capacity: rows before the owner flushes (grows if a step writes past it).
        device: where the values live (``None`` or CPU: the host).
        host: keep the values on the host (default: whether ``device`` is the CPU).

    Example:
        >>> buf = RowBuffer(2, capacity=4)
        >>> buf.rows[buf.next_row(7)] = [1.0, 2.0]
        >>> steps, rows = buf.take()
        >>> steps, rows.tolist(), len(buf)
        ([7], [[1.0, 2.0]], 0)
    """

    def __init__(self, width: int, capacity: int, device: torch.device | None = None,
                 host: bool | None = None) -> None:
        capacity = max(1, capacity)
        self.width = width
        self.host = (device is None or device.type == "cpu") if host is None else host
        self.device = device
        self.rows: list[list[float]] = [[]] * capacity if self.host else []
        self.data: Tensor | None = None if self.host else torch.zeros(
            (capacity, width), dtype=torch.float32, device=device)
        self.steps = [0] * capacity
        self.n = 0

    def __len__(self) -> int:
        return self.n

    @property
    def capacity(self) -> int:
        return len(self.steps)

    def next_row(self, step: int) -> int:
        """Reserve the next row for ``step``; its index."""
        n = self.n
        if n == len(self.steps):  # manual optimization: several steps in one batch
            self.steps += [0] * n
            if self.data is None:
                self.rows += [[]] * n
            else:
                self.data = torch.cat([self.data, torch.zeros_like(self.data)])
        self.steps[n] = step
        self.n = n + 1
        return n

    def _read(self, n: int) -> np.ndarray:
        if self.data is None:
            return np.array(self.rows[:n], dtype=np.float64).reshape(n, self.width)
        return self.data[:n].cpu().double().numpy()

    def peek(self) -> tuple[list[int], np.ndarray]:
        """Every row as ``(steps, float64 array)``, kept (for checkpoints)."""
        return self.steps[: self.n], self._read(self.n)

    def take(self, n: int | None = None) -> tuple[list[int], np.ndarray]:
        """The first ``n`` rows (default all) as ``(steps, float64 array)``, removed; one host
        transfer on accelerators."""
        n = self.n if n is None else min(n, self.n)
        out, steps = self._read(n), self.steps[:n]
        rest = self.n - n
        if rest:
            self.steps[:rest] = self.steps[n:self.n]
            if self.data is None:
                self.rows[:rest] = self.rows[n:self.n]
            else:
                self.data[:rest] = self.data[n:self.n].clone()
        self.n = rest
        return steps, out


__all__ = ["RowBuffer", "StepState"]
