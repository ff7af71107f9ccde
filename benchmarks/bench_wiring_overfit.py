"""Cost of the fit-start checks (wiring, overfit, mode, the loader, evaluation and autocast
contracts), as ratios against a bare Trainer.

Run: ``PYTHONPATH=src:. python benchmarks/bench_wiring_overfit.py [--repeats 3]``

Trains the digits MLP (and a CNN with BatchNorm) for a few epochs with and without the checks
in the same process, alternating runs, and prints the median fit time of each configuration
divided by the bare one's. ``GradientWiringCheck`` and ``EvalModeCheck`` only work on the first
batch / first validation batch, so their ratio should stay close to 1; ``OverfitBatchCheck``
adds a fixed cost (its probe), reported in seconds too; so do ``DataLoaderCheck`` (the first
batches), ``EvalContractCheck`` (probes at the first validation runs) and ``AutocastCheck``
(one step on a copy, under ``bf16-mixed``, against a bare ``bf16-mixed`` fit).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from tests.probe_models import Classifier, cnn, digits, mlp

from lightning_triage import (
    AutocastCheck,
    DataLoaderCheck,
    EvalContractCheck,
    EvalModeCheck,
    GradientWiringCheck,
    OverfitBatchCheck,
)


def fit_seconds(make_model: Callable[[], Any], callbacks: list[Any], epochs: int,
                precision: str = "32-true") -> float:
    pl.seed_everything(0, verbose=False)
    model = make_model()
    train, val = digits(n_train=1024)
    trainer = pl.Trainer(max_epochs=epochs, callbacks=callbacks, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, accelerator="cpu",
                         default_root_dir=tempfile.mkdtemp(), num_sanity_val_steps=0,
                         precision=precision)
    start = time.perf_counter()
    trainer.fit(model, train, val)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    configs: dict[str, tuple[Callable[[], list[Any]], str]] = {
        "bare": (list, "32-true"),
        "wiring+mode": (lambda: [GradientWiringCheck(), EvalModeCheck()], "32-true"),
        "overfit": (lambda: [OverfitBatchCheck()], "32-true"),
        "loader": (lambda: [DataLoaderCheck()], "32-true"),
        "eval-contract": (lambda: [EvalContractCheck()], "32-true"),
        "bare-bf16": (list, "bf16-mixed"),
        "autocast-bf16": (lambda: [AutocastCheck()], "bf16-mixed"),
    }
    for model_name, make in (("mlp", lambda: Classifier(mlp(dropout=0.1))),
                             ("cnn-bn", lambda: Classifier(cnn()))):
        times: dict[str, list[float]] = {name: [] for name in configs}
        for _ in range(args.repeats):
            for name, (callbacks, precision) in configs.items():
                times[name].append(fit_seconds(make, callbacks(), args.epochs, precision))
        for name, values in times.items():
            bare = statistics.median(times["bare-bf16" if name.endswith("bf16") else "bare"])
            med = statistics.median(values)
            print(f"{model_name:7s} {name:12s} {med:7.3f} s  ratio {med / bare:5.2f}  "
                  f"({med - bare:+.3f} s)")


if __name__ == "__main__":
    main()
