"""Memory of what stays on does not grow with the number of steps.

Two runs:

1. **A real fit**: ``Triage()`` on a very small model for ``--steps`` training steps (default
   20,000, one epoch); every tenth of the run it prints the process RSS, the Python heap traced
   by ``tracemalloc`` (started after the first-epochs windows) and the size of every structure
   the watches keep (the chunk buffers, the report series, the spike baselines, the recent
   context, the reported-event sets).
2. **A million steps through the flush path**: the watches' per-step structures (the row
   buffer the step path appends to, the spike watch and the bounded series the flushes feed)
   driven directly for 1,000,000 steps in chunks of 100, with the traced heap every 100,000
   steps (a Lightning fit of a million steps would take an hour here).

    PYTHONPATH=src python benchmarks/step_memory.py
"""

from __future__ import annotations

import argparse
import math
import tracemalloc
import warnings
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from ab_steps import synthetic_loader
from bench_models import BenchModule
from lightning.pytorch.callbacks import Callback
from torch import nn

from lightning_triage import Triage
from lightning_triage.callbacks._step import RowBuffer
from lightning_triage.functional.series import BoundedSeries
from lightning_triage.functional.spikes import SpikeWatch


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def sizes(bundle: Triage) -> dict[str, int]:
    gm = bundle.check("GradientMonitor")
    curve = bundle.check("LossCurveMonitor")
    return {
        "grad buffer rows": gm._buf.capacity if gm._buf is not None else 0,  # type: ignore[attr-defined]
        "loss buffer rows": curve._buf.capacity if curve._buf is not None else 0,  # type: ignore[attr-defined]
        "grad_norm series": len(gm.series_norm),  # type: ignore[attr-defined]
        "train_loss series": len(curve.train_series),  # type: ignore[attr-defined]
        "grad watch state": gm.watcher.state_size(),  # type: ignore[attr-defined]
        "loss watch state": curve.watcher.state_size() if curve.watcher else 0,  # type: ignore[attr-defined]
        "recent context rows": sum(c[0].size for c in gm._recent),  # type: ignore[attr-defined]
        "reported events": len(gm._reported) + len(curve._reported),  # type: ignore[attr-defined]
        "findings": sum(len(c.findings) for c in bundle.checks),
    }


class _Sampler(Callback):
    def __init__(self, bundle: Triage, every: int, start: int) -> None:
        self.bundle, self.every, self.start = bundle, every, start

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        step = trainer.global_step
        if step == self.start:
            tracemalloc.start()
        if step >= self.start and step % self.every == 0:
            traced = tracemalloc.get_traced_memory()[0] / 2**10
            cells = " | ".join(str(v) for v in sizes(self.bundle).values())
            print(f"| {step} | {rss_mb():.1f} | {traced:.0f} | {cells} |", flush=True)


def real_fit(steps: int) -> None:
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    bundle = Triage(verbose=False, window_epochs=0, window_steps=200, overfit=False)
    every = steps // 10
    names = " | ".join([
        "grad buffer rows", "loss buffer rows", "grad_norm series", "train_loss series",
        "grad watch state", "loss watch state", "recent context rows", "reported events",
        "findings"])
    print(f"\n#### A real fit: Triage() on an 8-16-10 MLP, {steps} steps\n")
    print(f"| step | RSS MiB | traced heap KiB | {names} |\n|{'---|' * 12}")
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, default_root_dir="/tmp/lightning_triage_bench",
                         callbacks=[bundle, _Sampler(bundle, every, start=every)])
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 10))
    trainer.fit(BenchModule(net), synthetic_loader((8,), steps, 4))
    tracemalloc.stop()


def million(steps: int = 1_000_000, chunk: int = 100) -> None:
    print(f"\n#### {steps} steps through the flush path (chunks of {chunk})\n")
    print("| step | traced heap KiB | buffer rows | series points | watch state |\n"
          "|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    buf = RowBuffer(6, chunk + 8)
    watch = SpikeWatch(window=128, warmup=16, patience=16)
    series = BoundedSeries(1000)
    tracemalloc.start()
    step = 0
    while step < steps:
        noise = rng.normal(1.0, 0.05, size=(chunk, 4))
        for i in range(chunk):
            norms = noise[i].tolist()
            buf.rows[buf.next_row(step)] = [math.hypot(*norms), *norms, 2.3]
            step += 1
        done, rows = buf.take()
        watch.update(rows[:, 0], start_step=done[0])
        series.extend(done, rows[:, 0].tolist())
        if step % (steps // 10) == 0:
            traced = tracemalloc.get_traced_memory()[0] / 2**10
            print(f"| {step} | {traced:.0f} | {buf.capacity} | {len(series)} | "
                  f"{watch.state_size()} |", flush=True)
    tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="steps of the real fit")
    parser.add_argument("--million", type=int, default=1_000_000)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    real_fit(args.steps)
    million(args.million)


if __name__ == "__main__":
    main()
