"""Steady-state overhead of LossCurveMonitor + GradientMonitor (the long-run watch) against a
bare Trainer, side by side in one process.

The monitors' window is set short so that the timed epochs (after the first ``--skip`` epochs)
measure what stays on for a long run: per step one fused ``_foreach_norm`` + a stack + a norm
(gradients), a list append (loss), and a host read of the buffered values every
``log_every_n_steps`` steps. Runs alternate (bare, monitored, bare, ...) to spread machine noise
over both; the ratio is the median monitored epoch time over the median bare epoch time.

    PYTHONPATH=src python benchmarks/monitor_overhead.py                 # CPU, both models
    PYTHONPATH=src python benchmarks/monitor_overhead.py --device cuda   # on a GPU
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from bench_models import BenchModule, small_cnn, tiny_mlp
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage import GradientMonitor, LossCurveMonitor, NonFiniteTracer

MODELS = {
    "small_cnn": (small_cnn, (1, 28, 28), 64),
    "tiny_mlp": (tiny_mlp, (64,), 32),
}


class EpochTimer(pl.Callback):
    """Wall and process CPU time per epoch (CPU time is less sensitive to other processes)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.times: list[tuple[float, float]] = []
        self._t = (0.0, 0.0)

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._sync()
        self._t = (time.perf_counter(), time.process_time())

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._sync()
        self.times.append((time.perf_counter() - self._t[0], time.process_time() - self._t[1]))


class HookTimer(pl.Callback):
    """Forwards the per-step hooks to ``inner`` and adds up the CPU time spent in them."""

    HOOKS = ("on_train_batch_start", "on_train_batch_end", "on_before_backward",
             "on_before_optimizer_step",
             "on_train_epoch_end")

    def __init__(self, inner: list[pl.Callback], skip: int) -> None:
        self.inner = inner
        self.skip = skip
        self.seconds = 0.0
        for hook in self.HOOKS:
            setattr(self, hook, self._timed(hook))

    def _timed(self, hook: str) -> Any:
        def call(*args: Any) -> None:
            t = time.thread_time()  # CPU time of this thread: robust to other processes
            for cb in self.inner:
                getattr(cb, hook)(*args)
            self.seconds += time.thread_time() - t
        return call

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch == self.skip:
            self.seconds = 0.0  # count the steady state only (after the window)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for cb in self.inner:
            cb.setup(trainer, pl_module, stage)

    def on_train_end(self, *args: Any) -> None:
        for cb in self.inner:
            cb.on_train_end(*args)


def run(name: str, monitored: bool, args: argparse.Namespace
        ) -> tuple[list[tuple[float, float]], float]:
    build, shape, batch = MODELS[name]
    pl.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(0)
    n = batch * args.steps
    data = TensorDataset(torch.randn(n, *shape, generator=g), torch.randint(0, 10, (n,), generator=g))
    loader = DataLoader(data, batch_size=batch, shuffle=True, generator=g)
    timer = EpochTimer(args.device)
    callbacks: list[pl.Callback] = [timer]
    hooks = None
    if monitored:
        inner: list[pl.Callback] = [LossCurveMonitor(window_epochs=0, window_steps=20),
                                    GradientMonitor(window_epochs=0, window_steps=20)]
        if args.tracer:
            inner.append(NonFiniteTracer())
        hooks = HookTimer(inner, args.skip)
        callbacks.append(hooks)
    elif args.empty:
        callbacks += [pl.Callback(), pl.Callback()]  # Lightning's own cost of two callbacks
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator=args.device, devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=callbacks)
    trainer.fit(BenchModule(build()), loader)
    timed = sum(c for _, c in timer.times[args.skip:])
    return timer.times[args.skip:], (hooks.seconds / timed if hooks is not None else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--steps", type=int, default=100, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--skip", type=int, default=2, help="epochs not timed (warm-up, window)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tracer", action="store_true",
                        help="also run NonFiniteTracer: everything that stays on for a long run")
    parser.add_argument("--empty", action="store_true",
                        help="the baseline gets two empty callbacks (Lightning's dispatch cost)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    for name in args.models:
        bare: list[tuple[float, float]] = []
        mon: list[tuple[float, float]] = []
        fractions: list[float] = []
        run(name, False, args)  # warm-up (allocator, kernels, caches)
        for _ in range(args.repeats):
            bare += run(name, False, args)[0]
            times, fraction = run(name, True, args)
            mon += times
            fractions.append(fraction)
        for k, kind in ((0, "wall"), (1, "cpu")):
            b = statistics.median(t[k] for t in bare)
            m = statistics.median(t[k] for t in mon)
            print(f"{name:>10} [{args.device}, {kind}]: bare {1e3 * b / args.steps:.3f} ms/step, "
                  f"monitored {1e3 * m / args.steps:.3f} ms/step, ratio {m / b:.4f} "
                  f"({len(bare)} timed epochs of {args.steps} steps each)", flush=True)
        print(f"{name:>10} [{args.device}]: CPU time inside the monitors' hooks: "
              f"{100 * statistics.median(fractions):.2f}% of the training CPU time (median of "
              f"{len(fractions)} runs, timed epochs only)", flush=True)


if __name__ == "__main__":
    main()
