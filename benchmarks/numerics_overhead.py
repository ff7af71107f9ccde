"""Overhead of `NonFiniteTracer` against a bare Trainer, in the same process.

Side by side: the tracer (sync mode: host reads every step; on CPU that is the default), the
tracer in deferred mode, `Trainer(detect_anomaly=True)`'s anomaly mode and a naive design that
checks every module's output for NaN/Inf with a host read after each module, and an empty
`Callback()` (Lightning's own dispatch cost). Two healthy models: a small CNN (28x28 images) and
a tiny MLP (64-32-10). Each configuration is switched on for every other step of one fit and
compared with the steps between (see `ab_steps.py`).

Not a test: run it by hand and record the numbers in docs/numerics.md.

    PYTHONPATH=src python benchmarks/numerics_overhead.py
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from ab_steps import HEADER, measure, synthetic_loader
from bench_models import small_cnn, tiny_mlp
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn

from lightning_triage import NonFiniteTracer


class NaiveFiniteHooks(Callback):
    """The naive design: a forward hook on every module that reads `isfinite(out).all()`.

    `switch(on)` registers or removes the hooks (the benchmark switches them with the steps).
    """

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.model: nn.Module | None = None

    @staticmethod
    def check(mod: nn.Module, args: Any, out: Any) -> None:
        if isinstance(out, Tensor) and not bool(torch.isfinite(out).all()):
            raise FloatingPointError(f"non-finite output in {type(mod).__name__}")

    def switch(self, on: bool) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = [] if not on or self.model is None else [
            m.register_forward_hook(self.check) for m in self.model.modules()]

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.model = pl_module
        self.switch(True)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.switch(False)


def naive() -> tuple[list[Callback], Callable[[bool], None]]:
    hooks = NaiveFiniteHooks()
    return [hooks], hooks.switch


CONFIGS: dict[str, Callable[[], tuple[list[Callback], Callable[[bool], None] | None]]] = {
    # the floor: Lightning dispatches every hook of every callback (with a profiler context)
    "empty Callback()": lambda: ([Callback()], None),
    "tracer (sync)": lambda: ([NonFiniteTracer(mode="sync")], None),
    "tracer (deferred)": lambda: ([NonFiniteTracer(mode="deferred")], None),
    "naive per-module hooks": naive,
    # what `Trainer(detect_anomaly=True)` switches on, switched with the other side's steps
    "detect_anomaly=True": lambda: ([], torch.autograd.set_detect_anomaly),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=4, help="timed epochs (after 1 warm-up)")
    parser.add_argument("--models", nargs="*", default=["small_cnn", "tiny_mlp"],
                        choices=["small_cnn", "tiny_mlp"])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    print(f"torch {torch.__version__}, lightning {pl.__version__}, {args.threads} thread(s), CPU; "
          f"{args.epochs} timed epochs of {args.steps} steps")
    models = {"small_cnn": ("small CNN, batch 64 of 1x28x28", small_cnn, (1, 28, 28), 64),
              "tiny_mlp": ("tiny MLP, batch 32 of 64 features", tiny_mlp, (64,), 32)}
    for name in args.models:
        title, build, shape, batch = models[name]
        data = synthetic_loader(shape, args.steps, batch)
        print(f"\n#### {title}\n\n{HEADER}")
        for config, make in CONFIGS.items():
            subjects, toggle = make()
            result = measure(build, data, subjects, epochs=args.epochs, toggle=toggle)
            print(result.row(config), flush=True)


if __name__ == "__main__":
    main()
