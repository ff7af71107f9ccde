"""Cost of `StructureProbe` as a ratio against a bare Trainer, in the same process.

Run: ``PYTHONPATH=src python benchmarks/bench_structure_probe.py``. Prints, per demo model, the
fit time with and without the probe (best of ``--repeats``), their ratio and the probe's own
time (``checks[].detail``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_triage import StructureProbe
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from lightning_triage.demo.sequences import TinyLM, random_token_loaders

MODELS: dict[str, Callable[[], tuple[pl.LightningModule, Any]]] = {
    "digits-mlp": lambda: (DigitsMLP(lr=0.1), digits_loaders()[0]),
    "tiny-lm": lambda: (TinyLM(), random_token_loaders()[0]),
}


def fit_seconds(build: Callable[[], tuple[pl.LightningModule, Any]], probe: bool,
                steps: int) -> tuple[float, float | None]:
    pl.seed_everything(0, verbose=False)
    model, train = build()
    callbacks = [StructureProbe()] if probe else []
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=steps, callbacks=callbacks,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu",
                         default_root_dir=tempfile.mkdtemp())
    start = time.perf_counter()
    trainer.fit(model, train)
    elapsed = time.perf_counter() - start
    return elapsed, callbacks[0].probe_seconds if probe else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    for name, build in MODELS.items():
        fit_seconds(build, True, 2)  # warm-up
        bare = min(fit_seconds(build, False, args.steps)[0] for _ in range(args.repeats))
        runs = [fit_seconds(build, True, args.steps) for _ in range(args.repeats)]
        with_probe = min(r[0] for r in runs)
        probe = min(r[1] or 0.0 for r in runs)
        print(f"{name:>12}: bare {bare:.3f}s, with StructureProbe {with_probe:.3f}s "
              f"(ratio {with_probe / bare:.2f}) over {args.steps} steps; probe {1000 * probe:.0f} ms")


if __name__ == "__main__":
    main()
