"""Time added per training step by what stays on, side by side with the alternatives.

For each model (the tiny MLP, the small CNN, a small transformer LM), in one run:

- **steady state**: each configuration is attached on every other training step of one fit,
  after a warm-up epoch that closes the first-epochs windows (``ab_steps.py``); printed as the
  CPU time added per step in microseconds (mean of the "on" steps minus mean of the "off"
  steps) and as the ratio of the totals, with its range over 10 blocks of the run.
  Configurations: an empty ``Callback()`` (Lightning's price for any callback), the
  ``Triage()`` bundle, ``Trainer(detect_anomaly=True)``'s anomaly mode, naive per-module
  finiteness hooks (a host read after every module), and Lightning's ``SpikeDetection``
  callback (a loss-spike watch; it applies to every model here).
- **the work itself**: the operations the step path must run, in a tight loop on the model's
  real gradients (the RNG snapshot the replay needs, the loss read, one ``torch._foreach_norm``
  over the gradients, their total and its finiteness, on the host), and the ratio of the
  bundle's added time to it.
- **whole fit**: ``Trainer.fit`` with ``Triage()`` (default windows, fit-start probes
  included) against a bare fit, several pairs in alternating order; the added time per step and
  the ratio (median over the pairs, with the range), and the wall time the bundle adds from
  ``setup`` to the end of the first training step (the fit-start probes).

Not a test: run it by hand and record the numbers in docs/long_run.md ("Performance").

    PYTHONPATH=src python benchmarks/step_cost.py
    PYTHONPATH=src python benchmarks/step_cost.py --models tiny_mlp --skip-fit
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from ab_steps import Overhead, measure, synthetic_loader
from bench_models import BenchModule, small_cnn, tiny_lm, tiny_mlp
from lightning.pytorch.callbacks import Callback
from numerics_overhead import naive
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage import Triage


def lm_loader(steps: int, batch: int, positions: int = 32, vocab: int = 64) -> DataLoader:
    """``steps`` batches of random token sequences for next-token prediction (a fixed seed)."""
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, vocab, (steps * batch, positions + 1), generator=g)
    return DataLoader(TensorDataset(seq[:, :-1], seq[:, 1:]), batch_size=batch, shuffle=True,
                      generator=g)


MODELS: dict[str, tuple[str, Callable[[], nn.Module], Callable[[int], DataLoader]]] = {
    "tiny_mlp": ("tiny MLP 64-32-10, batch 32", tiny_mlp,
                 lambda steps: synthetic_loader((64,), steps, 32)),
    "small_cnn": ("small CNN (2 conv + 2 linear), batch 64 of 1x28x28", small_cnn,
                  lambda steps: synthetic_loader((1, 28, 28), steps, 64)),
    "tiny_lm": ("transformer LM (2 layers, width 64, 32 positions), batch 16", tiny_lm,
                lambda steps: lm_loader(steps, 16)),
}


def _spike_detection() -> list[Callback]:
    from lightning.pytorch.callbacks import SpikeDetection

    return [SpikeDetection()]


class WorkOnly(Callback):
    """The step path's work alone in one callback, no bookkeeping: the RNG snapshot a replay
    needs, the loss read, one ``torch._foreach_norm`` over the gradients, their total and its
    finiteness on the host, a row written to a preallocated slot. Lightning dispatches every
    per-step hook to it (as to any callback): the floor of a callback doing this work."""

    def __init__(self) -> None:
        self.rows: list[list[float]] = [[]] * 128
        self.n = 0
        self.finite = True

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self.rng = torch.default_generator.get_state()

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           loss: torch.Tensor) -> None:
        self.loss = loss.detach().item()

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]
                 if p.grad is not None]
        norms = torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)).tolist()
        total = math.hypot(*norms)
        self.finite = math.isfinite(total) and math.isfinite(self.loss)
        self.rows[self.n] = [total, *norms, self.loss]
        self.n = (self.n + 1) % len(self.rows)


Config = Callable[[], tuple[list[Callback], Callable[[bool], None] | None]]
CONFIGS: dict[str, Config] = {
    "empty Callback()": lambda: ([Callback()], None),
    "work only (one callback)": lambda: ([WorkOnly()], None),
    "Triage()": lambda: ([Triage(window_epochs=0, window_steps=20, verbose=False)], None),
    "detect_anomaly=True": lambda: ([], torch.autograd.set_detect_anomaly),
    "naive per-module hooks": naive,
    "SpikeDetection": lambda: (_spike_detection(), None),
}


def added_us(result: Overhead) -> float:
    """CPU time added per step: mean of the "on" steps minus mean of the "off" steps (us)."""
    return 1e6 * (statistics.fmean(t[0] for t in result.on)
                  - statistics.fmean(t[0] for t in result.off))


def work_floor_us(build: Callable[[], nn.Module], data: DataLoader, n: int = 2000) -> float:
    """The per-step work of the step path in a tight loop, on the model's real gradients."""
    pl.seed_everything(0, verbose=False)
    module = BenchModule(build())
    loss = module.training_step(next(iter(data)), 0)
    loss.backward()
    grads = [p.grad for p in module.parameters() if p.grad is not None]

    def work() -> bool:
        torch.default_generator.get_state()
        value = loss.item()
        norms = torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)).tolist()
        return math.isfinite(math.hypot(*norms)) and math.isfinite(value)

    for _ in range(200):
        work()
    t0 = time.thread_time()
    for _ in range(n):
        work()
    return 1e6 * (time.thread_time() - t0) / n


class _FirstStep(Callback):
    """Wall time from ``setup`` to the end of the first training step (the fit-start probes
    run in between)."""

    def __init__(self) -> None:
        self.t0 = 0.0
        self.seconds = math.nan

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == 1:
            self.seconds = time.perf_counter() - self.t0


def whole_fit(build: Callable[[], nn.Module], data: DataLoader, epochs: int,
              pairs: int) -> tuple[list[float], list[float], list[float], int]:
    """``pairs`` fits with and without ``Triage()`` (alternating which goes first): the ratios,
    the added microseconds per step, the fit-start seconds added (setup to the end of the first
    step: the probes), the steps."""
    ratios, added, probes = [], [], []
    steps = 0
    first: dict[bool, float] = {}

    def fit(with_triage: bool) -> float:
        nonlocal steps
        pl.seed_everything(0, verbose=False)
        clock = _FirstStep()
        callbacks: list[Callback] = [clock, *([Triage(verbose=False)] if with_triage else [])]
        trainer = pl.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             num_sanity_val_steps=0, callbacks=callbacks,
                             default_root_dir="/tmp/lightning_triage_bench")
        t0 = time.perf_counter()
        trainer.fit(BenchModule(build()), data)
        seconds = time.perf_counter() - t0
        steps = trainer.global_step
        first[with_triage] = clock.seconds
        return seconds

    for i in range(pairs):
        if i % 2:
            on = fit(True)
            off = fit(False)
        else:
            off = fit(False)
            on = fit(True)
        ratios.append(on / off)
        added.append(1e6 * (on - off) / max(1, steps))
        probes.append(first[True] - first[False])
    return ratios, added, probes, steps


def steady_state(build: Callable[[], nn.Module], data: DataLoader, configs: list[str],
                 epochs: int, repeats: int) -> dict[str, list[tuple[float, float, list[float], float]]]:
    """``repeats`` rounds over ``configs`` (interleaved: one fit of each per round, the same
    process): per configuration and round ``(added us, ratio, 10-block ratios, bare us)``."""
    out: dict[str, list[tuple[float, float, list[float], float]]] = {c: [] for c in configs}
    for _ in range(repeats):
        for config in configs:
            subjects, toggle = CONFIGS[config]()
            result = measure(build, data, subjects, epochs=epochs, toggle=toggle)
            bare = 1e6 * statistics.fmean(t[0] for t in result.off)
            out[config].append((added_us(result), result.ratio(0)[0], result.ratio(0, 10), bare))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--steps", type=int, default=300, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs (after 1 warm-up)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="steady-state rounds over the configurations (best and range printed)")
    parser.add_argument("--fit-epochs", type=int, default=3, help="epochs of each whole fit")
    parser.add_argument("--pairs", type=int, default=3, help="whole-fit pairs")
    parser.add_argument("--skip-fit", action="store_true", help="steady state only")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    print(f"torch {torch.__version__}, lightning {pl.__version__}, CPU, {args.threads} "
          f"thread(s); steady state: {args.repeats} interleaved rounds of {args.epochs} timed "
          f"epochs of {args.steps} steps")
    for name in args.models:
        title, build, make_data = MODELS[name]
        data = make_data(args.steps)
        print(f"\n#### {title}\n")
        print("| configuration | bare us/step (CPU) | added us/step: best [range] | ratio: best "
              "[range] | x work |\n|---|---|---|---|---|", flush=True)
        rounds = steady_state(build, data, args.configs, args.epochs, args.repeats)
        work = work_floor_us(build, data)
        for config, runs in rounds.items():
            added = [r[0] for r in runs]
            ratios = [r[1] for r in runs]
            bare = statistics.median(r[3] for r in runs)
            print(f"| {config} | {bare:.0f} | {min(added):+.1f} [{min(added):+.1f} to "
                  f"{max(added):+.1f}] | {min(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] "
                  f"| {min(added) / work:.1f} |", flush=True)
        print(f"\nthe work itself in a tight loop: {work:.1f} us/step", flush=True)
        if args.skip_fit:
            continue
        ratios, added, probes, steps = whole_fit(build, make_data(args.steps), args.fit_epochs,
                                                 args.pairs)
        print(f"whole fit ({args.fit_epochs} epochs, {steps} steps, {args.pairs} pairs, wall): "
              f"ratio {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}], "
              f"added {statistics.median(added):+.0f} us/step [{min(added):+.0f}-{max(added):+.0f}]"
              f"; fit-start probes (setup to the end of step 1, added): "
              f"{statistics.median(probes):.2f} s [{min(probes):.2f}-{max(probes):.2f}]",
              flush=True)


if __name__ == "__main__":
    main()
