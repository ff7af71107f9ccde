"""Overhead of callbacks against a bare Trainer, step by step inside one fit.

A shared 2-core machine is noisy at the scale of seconds: two fits run one after the other can
differ by 10% with nothing changed, and so can two epochs of one fit. So the callbacks under
test are attached to the trainer on every other training step of one fit (after warm-up epochs
with them on, so that the first-epochs windows are closed and the steady state is measured):
"on" and "off" steps interleave at the millisecond scale and share the machine's state. The
overhead is the total time of the "on" steps over the total time of the "off" steps (totals, not
medians: a flush every hundred steps is a real cost and must be counted). Lightning's own cost
of dispatching the hooks is included (the callbacks really are in ``trainer.callbacks`` on the
"on" steps and really are not on the "off" ones).

A step is timed from one ``on_train_batch_start`` to the next, so it includes loading the batch;
the last step of each epoch (which would include the epoch's end) is left out of both sides and
the epoch-end hooks are not measured. CPU time of the training thread (robust to other
processes) and wall time are both reported, with the spread of the ratio over 10 blocks of the
run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from bench_models import BenchModule
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

HEADER = ("| configuration | bare ms/step (CPU) | CPU-time ratio [10 blocks: min-max] | "
          "wall ratio [min-max] | steps timed |\n|---|---|---|---|---|")


@dataclass
class Overhead:
    """Per-step CPU and wall times of the "on" and "off" steps, in order."""

    on: list[tuple[float, float]]
    off: list[tuple[float, float]]

    def ratio(self, k: int, blocks: int = 1) -> list[float]:
        """on/off ratio of the totals (``k`` = 0: CPU, 1: wall), per block of the run."""
        n = min(len(self.on), len(self.off)) // blocks
        return [sum(t[k] for t in self.on[i * n:(i + 1) * n])
                / sum(t[k] for t in self.off[i * n:(i + 1) * n]) for i in range(blocks)]

    def row(self, name: str) -> str:
        bare = 1e3 * statistics.fmean(t[0] for t in self.off)
        cells = [f"{self.ratio(k)[0]:.3f} [{min(self.ratio(k, 10)):.3f}-{max(self.ratio(k, 10)):.3f}]"
                 for k in (0, 1)]
        return f"| {name} | {bare:.3f} | {cells[0]} | {cells[1]} | {len(self.on) + len(self.off)} |"


class _Clock(Callback):
    """First in the list: reads the clocks at every step's start."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.last: tuple[float, float] | None = None

    def read(self) -> tuple[float, float]:
        if self.device == "cuda":
            torch.cuda.synchronize()
        return time.thread_time(), time.perf_counter()

    def on_train_batch_start(self, *args: Any) -> None:
        self.last = self.read()


class _Alternate(Callback):
    """Last in the list: attaches or detaches the callbacks under test for the next step
    (``trainer.callbacks`` is replaced, not mutated: Lightning's loop over the current list is
    not disturbed) and books the previous step's time to its side."""

    def __init__(self, clock: _Clock, subjects: Sequence[Callback], warmup: int,
                 toggle: Callable[[bool], None] | None) -> None:
        self.clock, self.subjects, self.warmup, self.toggle = clock, list(subjects), warmup, toggle
        self.on = True
        self.pending: tuple[bool, tuple[float, float]] | None = None
        self.result = Overhead([], [])

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.pending is not None:  # the previous step, from its start to this one's
            was_on, (c0, w0) = self.pending
            assert self.clock.last is not None
            c1, w1 = self.clock.last
            (self.result.on if was_on else self.result.off).append((c1 - c0, w1 - w0))
        self.pending = None
        if trainer.current_epoch >= self.warmup and not trainer.is_last_batch:
            assert self.clock.last is not None
            self.pending = (self.on, self.clock.last)

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        on = trainer.current_epoch < self.warmup or not self.on
        if on != self.on:
            rest = [cb for cb in trainer.callbacks if all(cb is not s for s in self.subjects)]
            where = rest.index(self.clock) + 1
            trainer.callbacks = rest[:where] + (self.subjects if on else []) + rest[where:]
            if self.toggle is not None:
                self.toggle(on)
        self.on = on

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.pending = None  # the step that ends an epoch is not timed


def synthetic_loader(shape: tuple[int, ...], steps: int, batch: int) -> DataLoader:
    """``steps`` batches of random inputs and 10-class labels, shuffled (a fixed seed)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps * batch, *shape, generator=g)
    y = torch.randint(0, 10, (steps * batch,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True, generator=g)


def measure(make_net: Callable[[], nn.Module], data: DataLoader, subjects: Sequence[Callback],
            *, epochs: int = 4, warmup: int = 1, device: str = "cpu",
            toggle: Callable[[bool], None] | None = None) -> Overhead:
    """Fit ``warmup + epochs`` epochs: ``subjects`` are attached during the warm-up epochs, then
    on every other step; ``toggle(on)`` switches anything else along (e.g. anomaly mode)."""
    pl.seed_everything(0, verbose=False)
    clock = _Clock(device)
    alternate = _Alternate(clock, subjects, warmup, toggle)
    if toggle is not None:
        toggle(True)
    trainer = pl.Trainer(max_epochs=warmup + epochs, accelerator=device, devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[clock, *subjects, alternate])
    try:
        trainer.fit(BenchModule(make_net()), data)
    finally:
        if toggle is not None:
            toggle(False)
    return alternate.result
