"""Replicas agree: checksums of a module's parameters and buffers, compared across ranks.

Pure functions over tensors (no Lightning, no collective): :func:`checksums` turns each tensor
into three numbers (its sum, its 2-norm, and a bound on its 1-norm that scales the sum's
rounding) on the tensors' device, the caller gathers one
row per rank (one collective), :func:`differing` finds the tensors whose rows disagree (one host
read) and :func:`replicas_rule` turns the first of them into a verdict.

Example:
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Linear(2, 2)
    >>> entries = replica_entries(net)
    >>> [e.name for e in entries]
    ['weight', 'bias']
    >>> rows = torch.stack([checksums(entries), checksums(entries)])
    >>> differing(rows)
    []
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lightning_triage.functional.verdict import Verdict

#: Relative difference of two ranks' checksums reported, against ``sqrt(numel)`` times the
#: tensor's 2-norm (a bound on its 1-norm, the scale of a sum's rounding) or its 2-norm. The
#: replicas of a data-parallel run are bit-identical: the margin only absorbs a reduction order
#: that differs between processes (the reductions run in float32 for tensors of 32 bits or
#: fewer: float64 reductions are several times slower on CPU).
RTOL = 1e-6
#: For each checksum column (sum, 2-norm, 1-norm bound), the column that gives its scale.
_SCALE = [2, 1, 2]
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.InstanceNorm1d,
          nn.InstanceNorm2d, nn.InstanceNorm3d)
#: Buffer names of running statistics (custom normalization layers follow the convention).
_NORM_BUFFERS = frozenset({"running_mean", "running_var", "num_batches_tracked"})


@dataclass(frozen=True)
class ReplicaEntry:
    """A tensor compared across ranks: its name, whether it is a buffer, whether a batch-norm
    layer owns it (running statistics differ by design without ``SyncBatchNorm``)."""

    name: str
    tensor: Tensor
    buffer: bool = False
    batchnorm: bool = False


def replica_entries(module: nn.Module) -> list[ReplicaEntry]:
    """The parameters, then the buffers, of ``module`` in ``named_*`` order (dense tensors)."""
    entries = [ReplicaEntry(name, p) for name, p in module.named_parameters()]
    for prefix, sub in module.named_modules():
        for name, b in sub.named_buffers(recurse=False):
            if b is not None:
                entries.append(ReplicaEntry(f"{prefix}.{name}" if prefix else name, b, True,
                                            isinstance(sub, _NORMS) or name in _NORM_BUFFERS))
    return [e for e in entries if e.tensor.layout == torch.strided and not e.tensor.is_meta]


def checksums(entries: Sequence[ReplicaEntry]) -> Tensor:
    """A ``[len(entries), 3]`` float64 tensor: each tensor's sum, 2-norm and ``sqrt(numel)``
    times its 2-norm (a bound on the 1-norm, the scale of the sum's rounding), reduced in float32
    (float64 for float64 tensors) without a copy (on the first tensor's device; no host read)."""
    if not entries:
        return torch.zeros(0, 3, dtype=torch.float64)
    device = entries[0].tensor.device
    rows = []
    with torch.no_grad():
        for e in entries:
            t = e.tensor.detach()
            if t.is_complex():
                t = torch.view_as_real(t)
            if not t.is_floating_point():
                t = t.to(torch.float64)
            acc = torch.float64 if t.dtype == torch.float64 else torch.float32
            norm = torch.linalg.vector_norm(t, dtype=acc)
            triple = (t.sum(dtype=acc), norm, norm * math.sqrt(max(t.numel(), 1)))
            rows.append(torch.stack(triple).to(device, torch.float64))
    return torch.stack(rows)


def differing(rows: Tensor, rtol: float = RTOL) -> list[int]:
    """The indices of the tensors whose checksums differ between ranks (``rows``: one
    ``[tensors, 3]`` checksum per rank, stacked), in order; one host read.

    Example:
        >>> a = torch.tensor([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]], dtype=torch.float64)
        >>> differing(torch.stack([a, a + torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.0, 0.0]])]))
        [1]
    """
    if rows.ndim != 3 or rows.shape[0] < 2 or rows.shape[1] == 0:
        return []
    ref = rows[:1]
    scale = rows[..., _SCALE].abs().amax(dim=0, keepdim=True)
    bad = ((rows - ref).abs() > rtol * scale) | (rows.isnan() != ref.isnan())
    return [int(i) for i in bad.any(dim=2).any(dim=0).nonzero().flatten().tolist()]


def _ranks_apart(rows: Tensor, index: int, ranks: Sequence[int], rtol: float) -> list[int]:
    """The ranks whose checksum of tensor ``index`` differs from rank 0's."""
    ref = rows[0, index]
    scale = rows[:, index][..., _SCALE].abs().amax(dim=0)
    return [ranks[r] for r in range(1, rows.shape[0])
            if bool(((rows[r, index] - ref).abs() > rtol * scale).any())]


def _steps_cause(steps: Sequence[int] | None, ranks: Sequence[int]) -> str:
    """The cause when the ranks took different numbers of optimizer steps ("" otherwise)."""
    if not steps or len(set(steps)) < 2:
        return ""
    fewest = min(steps)
    behind = [r for r, s in zip(ranks, steps, strict=True) if s == fewest]
    return (f" The ranks {list(ranks)} took {list(steps)} optimizer steps over the same "
            f"batches: ranks {behind} skipped a step the others took. Likely cause: a decision "
            "taken from one rank's own values (its loss, its gradient norm: skipping the batch "
            "whose loss spiked) skips `optimizer.step()` on that rank only; the gradients are "
            "still averaged, so the replicas drift apart from there. Decide on every rank alike "
            "(`trainer.strategy.reduce_boolean_decision`, or from a synced value).")


def replicas_rule(entries: Sequence[ReplicaEntry], rows: Tensor, indices: Sequence[int], *,
                  step: int, when: str, ranks: Sequence[int] | None = None,
                  rtol: float = RTOL, rebroadcast: bool = False,
                  steps: Sequence[int] | None = None) -> list[Verdict]:
    """``wiring.replicas_differ`` for the first parameter among ``indices`` (the differing
    tensors), ``wiring.buffers_differ`` for the first buffer (info when every differing buffer
    holds normalization statistics, or when the wrapper broadcasts rank 0's buffers at each
    forward: ``rebroadcast``, DDP's ``broadcast_buffers=True``). ``rows`` are on the host.
    ``steps``: each rank's ``optimizer.step()`` count at the check; when they differ, the parameter
    finding names the ranks that skipped a step (a decision taken on one rank).

    Example:
        >>> net = nn.Linear(2, 1)
        >>> e = replica_entries(net)
        >>> a = checksums(e)
        >>> rows = torch.stack([a, a * 2])
        >>> [v.code for v in replicas_rule(e, rows, differing(rows), step=3, when="step 3")]
        ['wiring.replicas_differ']
    """
    ranks = list(ranks) if ranks is not None else list(range(rows.shape[0]))
    verdicts = []
    params = [i for i in indices if not entries[i].buffer]
    buffers = [i for i in indices if entries[i].buffer]
    if params:
        i = params[0]
        apart = _ranks_apart(rows, i, ranks, rtol)
        verdicts.append(Verdict(
            "wiring.replicas_differ", step,
            f"{when}: parameter `{entries[i].name}` differs between ranks (sum "
            f"{_values(rows, i, 0)} across ranks {ranks}); ranks {apart} differ from rank 0. "
            f"{len(params)} of the {sum(not e.buffer for e in entries)} parameter tensors "
            f"differ.{_steps_cause(steps, ranks)}",
            layer=entries[i].name,
            evidence={"tensor": entries[i].name, "ranks": ranks, "ranks_apart": apart,
                      "differing_params": len(params), "sums": _values(rows, i, 0),
                      "norms": _values(rows, i, 1),
                      "optimizer_steps": list(steps) if steps is not None else None}))
    if buffers:
        i = buffers[0]
        norms_only = all(entries[j].batchnorm for j in buffers)
        why = (" (batch-norm running statistics: each rank normalizes with its own batch "
               "without `SyncBatchNorm`)" if norms_only else
               " (DDP broadcasts rank 0's buffers at each forward, `broadcast_buffers=True`: "
               "the other ranks' updates are overwritten)" if rebroadcast else "")
        verdicts.append(Verdict(
            "wiring.buffers_differ", step,
            f"{when}: buffer `{entries[i].name}` differs between ranks (sum {_values(rows, i, 0)} "
            f"across ranks {ranks}){why}; {len(buffers)} buffer(s) differ.",
            layer=entries[i].name, severity="info" if norms_only or rebroadcast else None,
            evidence={"tensor": entries[i].name, "ranks": ranks, "differing_buffers": len(buffers),
                      "batchnorm_only": norms_only, "rebroadcast": rebroadcast,
                      "buffers": [entries[j].name for j in buffers[:8]]}))
    return verdicts


def _values(rows: Tensor, index: int, column: int) -> list[float]:
    return [float(f"{v:.10g}") for v in rows[:, index, column].tolist()]


__all__ = ["RTOL", "ReplicaEntry", "checksums", "differing", "replica_entries", "replicas_rule"]
