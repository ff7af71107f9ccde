"""The padding probe's run and verdict: perturb the padded positions of a batch (other
content, more or fewer pads), run the model on each batch while recording every module's output,
and decide whether the outputs at the real positions moved (:func:`probe_padding`).

The batch edits, the mask finding and the output recordings it uses live in
:mod:`lightning_triage.functional.padding`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import Tensor, nn

from lightning_triage.functional.padding import (
    DEFAULT_PADDING_TOLERANCE,
    PaddingMask,
    RealChange,
    Recording,
    compare_at_real,
    fewer_padding_batch,
    first_moved,
    more_padding_batch,
    pad_content_batch,
)


@dataclass(frozen=True)
class PaddingLeak:
    """The result of one perturbation: what changed, how much, and where it first showed."""

    perturbation: Literal["content", "amount", "fewer"]
    change: RealChange
    head: str
    first_module: str | None


PaddingStatus = Literal["ok", "leak", "nondeterministic", "no_head", "unaligned", "skipped"]


@dataclass
class PaddingProbeResult:
    """What :func:`probe_padding` found.

    Attributes:
        status: ``"ok"``, ``"leak"``, ``"nondeterministic"`` (the same batch run twice moved),
            ``"no_head"`` (no head output found), ``"unaligned"`` (the head output is neither
            per position nor pooled) or ``"skipped"`` (another rank could not run a pass).
        leaks: one :class:`PaddingLeak` per perturbation that moved the real positions.
        head: the head module's name (``None`` when none was found).
        passes: the forward passes run.
        noise: the relative difference of the twin run (``None`` when it did not run).
        failed: pass name -> why it failed or did not run.
        fewer: the padded positions removed by the ``"fewer"`` pass, when it ran.
        shape: the head output's shape, for ``"unaligned"``.
    """

    status: PaddingStatus = "ok"
    leaks: list[PaddingLeak] = field(default_factory=list)
    head: str | None = None
    passes: int = 1
    noise: float | None = None
    failed: dict[str, str] = field(default_factory=dict)
    fewer: int | None = None
    shape: list[int] | None = None


#: Attributes that declare a model's longest input (Hugging Face configs, nanoGPT-style models).
MAX_LENGTH_ATTRIBUTES = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len",
                         "max_sequence_length", "block_size", "context_length")


def declared_max_length(module: nn.Module) -> int | None:
    """The longest input ``module`` declares (the smallest of its submodules' and their
    ``config``'s :data:`MAX_LENGTH_ATTRIBUTES`), or ``None``.

    Example:
        >>> class Config:
        ...     max_position_embeddings = 512
        >>> net = nn.Sequential(nn.Linear(2, 2))
        >>> net.config = Config()
        >>> declared_max_length(net), declared_max_length(nn.Linear(2, 2))
        (512, None)
    """
    found: list[int] = []
    for sub in module.modules():
        for holder in (sub, getattr(sub, "config", None)):
            for name in MAX_LENGTH_ATTRIBUTES:
                value = getattr(holder, name, None) if holder is not None else None
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    found.append(value)
    return min(found, default=None)


def probe_padding(run: Callable[[Any], Recording], batch: Any, inputs: Tensor, mask: PaddingMask,
                  *, targets: Tensor | None = None, extra: int | None = None,
                  ignore_index: int = -100, tolerance: float = DEFAULT_PADDING_TOLERANCE,
                  gate: Callable[[str, bool], bool] | None = None,
                  pass_errors: tuple[type[Exception], ...] = (),
                  room: int | None = None, room_why: str = "") -> PaddingProbeResult:
    """Run the padding probe with ``run(batch) -> Recording`` (the caller resets RNGs).

    Runs the batch twice (determinism control), then with other content at the padded
    positions (only when the mask is a batch entry the model can read: a model that finds its
    padding from the pad token id, ``input_ids == pad_id``, would see the new ids as real
    tokens), then (when the padded side is known) with ``extra`` more padded positions (default:
    ``max(2, T // 2)``, at most ``room``: the positions the model takes beyond ``T``, where
    known; ``room_why`` says why, for the report). When there is no room for 2 more positions
    (a model padded to its maximum length, ``max_position_embeddings``), or the longer batch
    fails (it raises on longer inputs), the padded rows are run with fewer padded positions
    instead (:func:`fewer_padding_batch`).

    ``gate(pass_name, ready) -> bool`` is asked before each pass after the first (``"twin"``,
    ``"content"``, ``"amount"``, ``"fewer"``, always all four, in order) whether to run it; under
    DDP it returns whether every rank is ready, so that all ranks run the same passes (the
    user's code may hold collectives). Default: run what is ready. ``run`` raising one of
    ``pass_errors`` on a perturbed batch fails that pass only (``"failed"``: pass name ->
    error), and the passes that ran keep their result.

    Returns:
        A :class:`PaddingProbeResult`: the status, the leaks, the head, the passes run, the
        twin run's noise and the passes that failed.

    Example:
        >>> import torch
        >>> from lightning_triage.functional.padding import find_padding_mask, record_outputs
        >>> class Pool(nn.Module):  # mean over every position: ignores the mask
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.emb, self.out = nn.Embedding(10, 4), nn.Linear(4, 2)
        ...     def forward(self, ids):
        ...         return self.out(self.emb(ids).mean(1))
        >>> net, ids = Pool(), torch.tensor([[3, 4, 0], [5, 0, 0]])
        >>> batch = {"input_ids": ids, "attention_mask": ids != 0}
        >>> def run(b):
        ...     with record_outputs(net, 2) as rec, torch.no_grad():
        ...         net(b["input_ids"])
        ...     return rec
        >>> result = probe_padding(run, batch, ids, find_padding_mask(batch, ids))
        >>> result.status, [(leak.perturbation, leak.first_module) for leak in result.leaks]
        ('leak', [('content', 'out'), ('amount', 'out')])
    """
    ask = gate if gate is not None else (lambda name, ready: ready)
    first = run(batch)
    passes = 1
    head_entry = first.head
    result = PaddingProbeResult(head=None if head_entry is None else head_entry[0])
    if head_entry is None:
        result.status = "no_head"
    twin = run(batch) if ask("twin", head_entry is not None) else None
    passes += twin is not None
    if head_entry is not None and twin is not None:
        _twin_check(result, head_entry[1], twin, mask, tolerance)
    elif head_entry is not None:
        result.status = "skipped"  # another rank could not run it
    ready = result.status == "ok"
    failed: dict[str, str] = {}

    def attempt(kind: str, make: Callable[[], Any]) -> Recording | None:
        nonlocal passes
        passes += 1
        try:
            return run(make())
        except pass_errors as err:  # the passes already run keep their result
            describe = getattr(err, "describe", None)
            failed[kind] = describe() if callable(describe) else f"{type(err).__name__}: {err}"
            return None

    leaks: list[PaddingLeak] = []
    k = extra if extra is not None else max(2, inputs.shape[1] // 2)
    if room is not None and room < k:
        if room >= 2:
            k = room
        else:
            failed["amount"] = f"not run: {room_why or 'no room for longer inputs'}"
    if ask("content", ready and mask.mask is not None):
        rec = attempt("content", lambda: pad_content_batch(batch, inputs, mask))
        leaks += _leak("content", first, rec, mask.real, 0, tolerance)
    if ask("amount", ready and mask.side is not None and "amount" not in failed):
        rec = attempt("amount", lambda: more_padding_batch(batch, inputs, mask, k, targets=targets,
                                                          ignore_index=ignore_index))
        leaks += _leak("amount", first, rec, mask.real, k if mask.side == "left" else 0, tolerance)
    # more padding did not run (a model at its maximum length): compare with less padding
    fewer = fewer_padding_batch(batch, inputs, mask, k) if "amount" in failed else None
    if ask("fewer", ready and fewer is not None) and fewer is not None:
        short, rows, cut = fewer
        rec = attempt("fewer", lambda: short)
        kept = Recording([(name, i, t[rows.to(t.device)]) for name, i, t in first.outputs])
        real = mask.real[rows][:, :-cut] if mask.side == "right" else mask.real[rows][:, cut:]
        if rec is not None:
            result.fewer = cut
            leaks += _leak("fewer", rec, kept, real, cut if mask.side == "left" else 0, tolerance)
    result.passes, result.failed = passes, failed
    if leaks:
        result.status, result.leaks = "leak", leaks
    return result


def _twin_check(result: PaddingProbeResult, head: Tensor, twin: Recording, mask: PaddingMask,
                tolerance: float) -> None:
    """The determinism control (the same batch run twice) into ``result``."""
    twin_head = twin.head
    if twin_head is None or twin_head[1].shape != head.shape:
        result.status, result.noise = "nondeterministic", math.inf
        return
    noise = compare_at_real(head, twin_head[1], mask.real, tolerance=tolerance)
    if noise is None:
        result.status, result.shape = "unaligned", list(head.shape)
        return
    result.noise = noise.relative_diff
    if noise.moved:
        result.status = "nondeterministic"


def _leak(kind: Literal["content", "amount", "fewer"], base: Recording, other: Recording | None,
          real: Tensor, offset: int, tolerance: float) -> list[PaddingLeak]:
    """``[PaddingLeak]`` when the head output of ``other`` moved from ``base``'s at the real
    positions, else ``[]``."""
    a, b = base.head, other.head if other is not None else None
    if a is None or b is None or other is None:
        return []
    change = compare_at_real(a[1], b[1], real, offset=offset, tolerance=tolerance)
    if change is None or not change.moved:
        return []
    return [PaddingLeak(kind, change, a[0], first_moved(base, other, real, offset=offset,
                                                        tolerance=tolerance))]


__all__ = [
    "MAX_LENGTH_ATTRIBUTES",
    "PaddingLeak",
    "PaddingProbeResult",
    "PaddingStatus",
    "declared_max_length",
    "probe_padding",
]
