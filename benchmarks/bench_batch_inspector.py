"""Overhead of BatchInspector: wall time of a digits fit with and without it, as a ratio.

Run: PYTHONPATH=src python benchmarks/bench_batch_inspector.py [epochs]
The first epoch holds the inspection window (32 training batches, the label probe, 256
fingerprinted batches); later epochs cost nothing per step.
"""

from __future__ import annotations

import sys
import time
import warnings

import lightning.pytorch as pl
import torch

from lightning_triage import BatchInspector
from lightning_triage.demo.digits import DigitsMLP, digits_loaders


def run(callbacks: list[pl.Callback], epochs: int) -> float:
    pl.seed_everything(0, verbose=False)
    train, val = digits_loaders()
    trainer = pl.Trainer(max_epochs=epochs, callbacks=callbacks, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    start = time.perf_counter()
    trainer.fit(DigitsMLP(), train, val)
    return time.perf_counter() - start


def main() -> None:
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    run([], 1)  # warm-up
    bare = min(run([], epochs) for _ in range(3))
    watched = min(run([BatchInspector()], epochs) for _ in range(3))
    print(f"digits MLP, {epochs} epochs of 45 batches: bare {bare:.3f}s, with BatchInspector "
          f"{watched:.3f}s, ratio {watched / bare:.2f} (one-time overhead "
          f"{watched - bare:+.3f}s: the inspection window and the label probe)")


if __name__ == "__main__":
    main()
