"""Stage 3 (wiring), data-parallel runs: do the replicas on every rank hold the same weights?"""

from __future__ import annotations

from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from typing_extensions import override

from lightning_triage.callbacks._args import check_int
from lightning_triage.callbacks._shared import sharded_strategy
from lightning_triage.callbacks.base import TriageCallback
from lightning_triage.functional.replicas import (
    ReplicaEntry,
    checksums,
    differing,
    replica_entries,
    replicas_rule,
)


class ReplicaCheck(TriageCallback):
    """Check that every rank of a data-parallel run holds the same parameters and buffers.

    Each rank reduces every parameter and buffer to a few numbers (its sum and its norm, on its
    device), and the ranks gather them in one collective (a few KB): at the start of
    training, after the first optimizer step, every ``check_every_n_steps`` optimizer steps
    and at the end of training. Between two checks nothing runs: no collective, no host read.
    The checks are scheduled by the training batches every rank counts (a step skipped on one
    rank must not make the ranks call the collective at different batches), and each rank adds
    the number of ``optimizer.step()`` calls it made (counted by a step post-hook on each
    optimizer; ``trainer.global_step`` counts Lightning's ``optimizer_step`` hook, which a
    user's override may call without stepping) to its row: ranks that took different numbers
    of steps are named as the cause. A parameter that differs is named with the step
    (the first check that saw it: the change happened after the previous check); later checks
    stop. Buffers are compared too: batch-norm
    running statistics differ by design without ``SyncBatchNorm`` (info), and so do buffers
    that DDP overwrites with rank 0's at each forward (``broadcast_buffers=True``, the default:
    info); other buffers warn.

    Does nothing in a single process, nor under strategies that shard parameters (FSDP,
    DeepSpeed, model parallel: each rank holds other tensors).

    Findings: ``wiring.replicas_differ``, ``wiring.buffers_differ``. See ``docs/distributed.md``.

    Args:
        check_every_n_steps: optimizer steps between two periodic checks.
        strict: raise internal errors instead of disabling the check.

    Raises:
        TriageConfigError: for ``check_every_n_steps`` below 1.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[ReplicaCheck(check_every_n_steps=200)])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.ReplicaCheck
                  init_args: {check_every_n_steps: 200}
    """

    stage: ClassVar[str] = "wiring"
    codes: ClassVar[tuple[str, ...]] = ("wiring.replicas_differ", "wiring.buffers_differ")

    def __init__(self, *, check_every_n_steps: int = 100, strict: bool = False) -> None:
        super().__init__(strict=strict)
        check_int("check_every_n_steps", check_every_n_steps, 1)
        self.check_every_n_steps = check_every_n_steps
        self._entries: list[ReplicaEntry] = []
        self._active = False
        self._last = -1  # the step of the last check (this rank's)
        self._batches = 0  # training batches started: the same count on every rank
        self._checked_at = -1  # the batches finished at the last check
        self._checks = 0
        self._steps = 0  # `optimizer.step()` calls on this rank
        self._reported: set[str] = set()

    @override
    def needs_hook(self, hook: str) -> bool:
        return hook == "on_train_batch_start" and self._active and not self.disabled

    # ------------------------------------------------------------------ hooks
    # not `guarded`: an error on one rank must never make it skip the collective the others take
    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._active, self._entries, self._last, self._checks = False, [], -1, 0
        self._batches, self._checked_at, self._steps = 0, -1, 0
        self._reported = set()
        if self.disabled:
            return
        sharded = sharded_strategy(trainer)
        if trainer.world_size < 2:
            self.mark_ran("a single process: no replicas to compare")  # as autocast under 32-true
            self.idle = True
            return
        if sharded is not None:
            self.mark_ran(f"skipped: `{sharded}` shards the parameters (no replicas to compare)")
            self.idle = True
            return
        self._entries = replica_entries(pl_module)
        for optimizer in trainer.optimizers:  # counts real steps (reads nothing, changes nothing)
            self.add_handle(optimizer.register_step_post_hook(self._count_step))
        self._active = True
        self.idle = False
        self._check(trainer, "at the start of training", 0)

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        # scheduled by batches, never by `global_step`: a rank that skipped a step would call
        # the collective at another batch than the others (a hang, or a mismatched collective)
        if not self._active:
            return
        accumulate = max(1, int(trainer.accumulate_grad_batches))
        self._batches += 1
        done = self._batches - 1  # batches finished before this one
        if done == accumulate:
            self._check(trainer, "after the first optimizer step", done)
        elif done > 0 and done % (self.check_every_n_steps * accumulate) == 0:
            self._check(trainer, f"at step {trainer.global_step}", done)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._active and self._batches != self._checked_at:
            self._check(trainer, "at the end of training", self._batches)
        self.remove_handles()

    # ------------------------------------------------------------------ work
    def _count_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._steps += 1

    def _check(self, trainer: pl.Trainer, when: str, done: int) -> None:
        """One collective and one host read (``done``: the training batches finished, the
        same on every rank); every rank takes it and decides alike."""
        try:
            local = checksums(self._entries)
        except Exception as exc:
            if self.strict:
                raise
            self.detail = f"could not compute a checksum: {type(exc).__name__}: {exc}"
            local = torch.full((len(self._entries), 3), float("nan"), dtype=torch.float64,
                               device=self._entries[0].tensor.device if self._entries else None)
        # one more row: this rank's `optimizer.step()` count (the same collective)
        count = torch.full((1, 3), float(self._steps), dtype=local.dtype,
                           device=local.device)
        rows = trainer.strategy.all_gather(torch.cat([local, count]))
        step, previous = trainer.global_step, self._last
        self._last, self._checks = step, self._checks + 1
        self._checked_at = done
        try:
            self._judge(trainer, rows, step, when, previous)
        except Exception as exc:
            self._active = False
            self.idle = True
            self.hook_failed(trainer, "on_train_batch_start", exc)

    def _judge(self, trainer: pl.Trainer, rows: torch.Tensor, step: int, when: str,
               previous: int) -> None:
        if rows.ndim == 2:  # a single process answered (not gathered)
            rows = rows.unsqueeze(0)
        steps = [int(s) for s in rows[:, -1, 0].tolist()]
        rows = rows[:, :-1]
        indices = differing(rows)
        self.mark_ran(f"{rows.shape[1]} tensors compared across {rows.shape[0]} ranks at "
                      f"{self._checks} point(s), the last at step {step}")
        if not indices:
            return
        since = f" (they agreed at step {previous})" if previous >= 0 else ""
        wrapper = getattr(trainer.strategy, "model", None)  # DDP's public flag, when wrapped
        rebroadcast = getattr(wrapper, "broadcast_buffers", False) is True
        verdicts = replicas_rule(self._entries, rows.cpu(), indices, step=step,
                                 when=f"{when} (step {step}){since}", rebroadcast=rebroadcast,
                                 steps=steps)
        for verdict in verdicts:
            if verdict.code in self._reported:
                continue
            self._reported.add(verdict.code)  # on every rank: each decides alike
            if trainer.is_global_zero:
                self.add_verdict(trainer, verdict, checked_at=step, agreed_at=previous)
            if verdict.code == "wiring.replicas_differ":
                self._active = False  # named once: later checks would only repeat it
                self.idle = True

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(_entries=[])
        return state


__all__ = ["ReplicaCheck"]
