"""Overhead of `NonFiniteTracer` against a bare Trainer, in the same process.

Side by side: the tracer (sync mode: host reads every step; on CPU that is the default), the
tracer in deferred mode, `Trainer(detect_anomaly=True)` and a naive design that checks every
module's output for NaN/Inf with a host read after each module. Two healthy models: a small CNN
(28x28 images) and a tiny MLP (64-32-10). Configurations are interleaved and repeated; the
median per configuration is reported as a ratio to the bare Trainer's median (CPU time of the
process, less sensitive to other processes on a shared machine than wall time; wall time too).

Not a test: run it by hand and record the numbers in docs/numerics.md.

    PYTHONPATH=src python benchmarks/numerics_overhead.py --steps 200 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from bench_models import BenchModule, small_cnn, tiny_mlp
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage import NonFiniteTracer


def loader(shape: tuple[int, ...], steps: int, batch: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps * batch, *shape, generator=g)
    y = torch.randint(0, 10, (steps * batch,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch)


class NaiveFiniteHooks(Callback):
    """The naive design: a forward hook on every module that reads `isfinite(out).all()`."""

    def __init__(self) -> None:
        self.handles: list[Any] = []

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        def hook(mod: nn.Module, args: Any, out: Any) -> None:
            if isinstance(out, Tensor) and not bool(torch.isfinite(out).all()):
                raise FloatingPointError(f"non-finite output in {type(mod).__name__}")

        self.handles = [m.register_forward_hook(hook) for m in pl_module.modules()]

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for h in self.handles:
            h.remove()


class TimedTracer(NonFiniteTracer):
    """The tracer with the time spent inside its per-step hooks recorded per step: a view of its
    own cost that is robust to other processes (medians of the same moments in one process)."""

    per_step: ClassVar[list[float]] = []

    def _timed(self, name: str, *args: Any) -> None:
        start = time.perf_counter()
        getattr(super(), name)(*args)
        spent = time.perf_counter() - start
        if name == "on_train_batch_start":
            TimedTracer.per_step.append(spent)
        else:
            TimedTracer.per_step[-1] += spent

    def on_train_batch_start(self, *args: Any) -> None:
        self._timed("on_train_batch_start", *args)

    def on_before_backward(self, *args: Any) -> None:
        self._timed("on_before_backward", *args)

    def on_before_optimizer_step(self, *args: Any) -> None:
        self._timed("on_before_optimizer_step", *args)

    def on_train_batch_end(self, *args: Any) -> None:
        self._timed("on_train_batch_end", *args)


def hook_share(make_net: Callable[[], nn.Module], data: DataLoader, bare_step: float) -> None:
    """Median time spent inside the tracer's hooks per step, against the bare step time."""
    TimedTracer.per_step = []
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False,
                         num_sanity_val_steps=0, callbacks=[TimedTracer(mode="sync")])
    trainer.fit(BenchModule(make_net()), data)
    median = statistics.median(TimedTracer.per_step)
    print(f"\ninside the tracer's hooks (sync): median {1e6 * median:.0f} us/step = "
          f"{100 * median / bare_step:.2f}% of the bare step ({1e3 * bare_step:.2f} ms CPU)")


CONFIGS: dict[str, Callable[[], tuple[list[Callback], dict[str, Any]]]] = {
    "bare": lambda: ([], {}),
    # the floor: Lightning dispatches every hook of every callback (with a profiler context)
    "empty Callback()": lambda: ([Callback()], {}),
    "tracer (sync)": lambda: ([NonFiniteTracer(mode="sync")], {}),
    "tracer (deferred)": lambda: ([NonFiniteTracer(mode="deferred")], {}),
    "naive per-module hooks": lambda: ([NaiveFiniteHooks()], {}),
    "detect_anomaly=True": lambda: ([], {"detect_anomaly": True}),
}


def run_once(make_net: Callable[[], nn.Module], data: DataLoader, config: str) -> tuple[float, float]:
    callbacks, kwargs = CONFIGS[config]()
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False,
                         num_sanity_val_steps=0, callbacks=callbacks, **kwargs)
    model = BenchModule(make_net())
    cpu, wall = time.process_time(), time.perf_counter()
    trainer.fit(model, data)
    return time.process_time() - cpu, time.perf_counter() - wall


def bench(name: str, make_net: Callable[[], nn.Module], data: DataLoader, repeats: int) -> None:
    run_once(make_net, data, "bare")  # warm-up
    cpu: dict[str, list[float]] = {c: [] for c in CONFIGS}
    wall: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for r in range(repeats):
        order = list(CONFIGS) if r % 2 == 0 else list(reversed(CONFIGS))
        for config in order:
            c, w = run_once(make_net, data, config)
            cpu[config].append(c)
            wall[config].append(w)
    base_c, base_w = statistics.median(cpu["bare"]), statistics.median(wall["bare"])
    steps = len(data)
    print(f"\n### {name} ({steps} steps, {repeats} repeats, medians)\n")
    print("| configuration | CPU s | CPU ratio | wall s | wall ratio | ms/step (CPU) |")
    print("|---|---|---|---|---|---|")
    for config in CONFIGS:
        c, w = statistics.median(cpu[config]), statistics.median(wall[config])
        print(f"| {config} | {c:.3f} | {c / base_c:.3f} | {w:.3f} | {w / base_w:.3f} | "
              f"{1000 * c / steps:.2f} |")
    hook_share(make_net, data, base_c / steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    print(f"torch {torch.__version__}, lightning {pl.__version__}, {args.threads} thread(s), CPU")
    bench("small CNN, batch 64 of 1x28x28", small_cnn, loader((1, 28, 28), args.steps, 64),
          args.repeats)
    bench("tiny MLP, batch 32 of 64 features", tiny_mlp, loader((64,), args.steps, 32),
          args.repeats)


if __name__ == "__main__":
    main()
