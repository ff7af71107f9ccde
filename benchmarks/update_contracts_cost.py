"""Per-step cost of ``UpdateContractCheck``: nothing after its window, and what the window costs.

For the tiny MLP and the small CNN:

- **steady state** (after the window): the ``Triage()`` bundle with the check and the bundle
  without it (main's bundle) are each attached on every other training step of one fit after a
  warm-up epoch that closes every window (``ab_steps.py``), in interleaved rounds (alternating
  which goes first); printed as
  the CPU time each adds per step (mean of the "on" steps minus mean of the "off" steps) and the
  difference. The check goes idle after its window, so the bundle stops dispatching its hooks:
  the difference should be noise.
- **the window**: fits of ``window`` steps with the check alone (its window covering every
  step) and without it, in alternating pairs; the CPU time per step from each step's start to
  the next (the first step left out), median over the pairs of the added microseconds.

Not a test: run it by hand and record the numbers in docs/benchmarks.md.

    PYTHONPATH=src python benchmarks/update_contracts_cost.py
    PYTHONPATH=src python benchmarks/update_contracts_cost.py --models tiny_mlp --rounds 2
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from ab_steps import measure, synthetic_loader
from bench_models import BenchModule, small_cnn, tiny_mlp
from lightning.pytorch.callbacks import Callback
from step_cost import added_us
from torch import nn
from torch.utils.data import DataLoader

from lightning_triage import Triage, UpdateContractCheck

MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "tiny_mlp": (tiny_mlp, (64,)),
    "small_cnn": (small_cnn, (1, 28, 28)),
}
REPORTS = tempfile.mkdtemp(prefix="lightning_triage_bench_")


def bundle(with_contracts: bool) -> Triage:
    """``Triage()`` with short windows, with or without ``UpdateContractCheck``."""
    triage = Triage(window_epochs=0, window_steps=20, verbose=False, html=False,
                    report_dir=REPORTS)
    if not with_contracts:
        triage.checks = [c for c in triage.checks if not isinstance(c, UpdateContractCheck)]
    return triage


class _StepClock(Callback):
    """CPU time of the training thread at every step's start."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def on_train_batch_start(self, *args: Any) -> None:
        self.marks.append(time.thread_time())

    def on_train_end(self, *args: Any) -> None:
        self.marks.append(time.thread_time())


def window_fit(build: Callable[[], nn.Module], data: DataLoader, steps: int,
               with_check: bool) -> float:
    """Mean CPU microseconds per step over steps 1..steps-1 of one fit."""
    pl.seed_everything(0, verbose=False)
    clock = _StepClock()
    callbacks: list[Callback] = [clock]
    if with_check:
        callbacks.append(UpdateContractCheck(window=steps + 1))
    trainer = pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, callbacks=callbacks, default_root_dir=REPORTS)
    trainer.fit(BenchModule(build()), data)
    gaps = [b - a for a, b in zip(clock.marks[1:], clock.marks[2:], strict=False)]
    return 1e6 * statistics.fmean(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--steps", type=int, default=300, help="steps per epoch (steady state)")
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs (after 1 warm-up)")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved steady-state rounds")
    parser.add_argument("--window", type=int, default=40, help="steps of each window fit")
    parser.add_argument("--pairs", type=int, default=5, help="window fit pairs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    print(f"torch {torch.__version__}, lightning {pl.__version__}, CPU, 1 thread")
    for name in args.models:
        build, shape = MODELS[name]
        data = synthetic_loader(shape, args.steps, 32)
        added: dict[bool, list[float]] = {False: [], True: []}
        bare: list[float] = []
        for i in range(args.rounds):
            for with_contracts in ((True, False) if i % 2 else (False, True)):
                result = measure(build, data, [bundle(with_contracts)], epochs=args.epochs)
                added[with_contracts].append(added_us(result))
                bare.append(1e6 * statistics.fmean(t[0] for t in result.off))
        diff = [b - a for a, b in zip(added[False], added[True], strict=True)]
        print(f"\n#### {name}: steady state after the window (bare "
              f"{statistics.median(bare):.0f} us/step, CPU)\n")
        print("| bundle | added us/step: median [range] |\n|---|---|")
        for key, label in ((False, "Triage() without UpdateContractCheck (main)"),
                           (True, "Triage() with UpdateContractCheck")):
            v = added[key]
            print(f"| {label} | {statistics.median(v):+.1f} [{min(v):+.1f} to {max(v):+.1f}] |")
        print(f"| difference (with - without) | {statistics.median(diff):+.1f} "
              f"[{min(diff):+.1f} to {max(diff):+.1f}] |", flush=True)
        window_data = synthetic_loader(shape, args.window, 32)
        on, off = [], []
        for i in range(args.pairs):
            order = (True, False) if i % 2 else (False, True)
            for with_check in order:
                (on if with_check else off).append(
                    window_fit(build, window_data, args.window, with_check))
        added_window = [a - b for a, b in zip(on, off, strict=True)]
        print(f"\nthe window ({args.window} steps, {args.pairs} pairs): bare "
              f"{statistics.median(off):.0f} us/step, the check adds "
              f"{statistics.median(added_window):+.0f} us/step "
              f"[{min(added_window):+.0f} to {max(added_window):+.0f}] "
              f"(x{statistics.median(on) / statistics.median(off):.2f})", flush=True)


if __name__ == "__main__":
    main()
