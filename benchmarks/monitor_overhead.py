"""Steady-state overhead of what stays on for a long run, against a bare Trainer in one fit.

Everything that stays on after the first-epochs window: the long-run watch (`LossCurveMonitor`
+ `GradientMonitor`) and the NaN tracer, as three callbacks and inside the whole `Triage`
bundle (every check attached; the one-time checks of fit start are done by then), and one empty
`Callback()` for Lightning's own cost of dispatching every hook to one more callback, and the
"ops floor": the torch operations that must run every step, alone in one callback. Each is
attached on every other step of one fit (see `ab_steps.py`); the windows are short (20 steps)
so that the warm-up epoch closes them.

    PYTHONPATH=src python benchmarks/monitor_overhead.py                 # CPU, both models
    PYTHONPATH=src python benchmarks/monitor_overhead.py --device cuda   # on a GPU
"""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from ab_steps import HEADER, measure, synthetic_loader
from bench_models import small_cnn, tiny_mlp
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from torch.optim import Optimizer

from lightning_triage import GradientMonitor, LossCurveMonitor, NonFiniteTracer, Triage

MODELS = {
    "small_cnn": (small_cnn, (1, 28, 28), 64),
    "tiny_mlp": (tiny_mlp, (64,), 32),
}

class OpsFloor(Callback):
    """The torch operations that what stays on needs every step, alone in one callback (no
    bookkeeping, no flushes): the RNG snapshot for a replay, the loss read, the per-parameter
    gradient norms (the watch), the fused non-finite check of the gradients and its read (the
    tracer). What the real callbacks cost above it is their Python."""

    def __init__(self) -> None:
        self.norms: list[list[Tensor]] = []
        self.found = torch.zeros(1)
        self.one = torch.ones(1)

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self.rng = torch.get_rng_state()

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           loss: Tensor) -> None:
        self.loss_finite = math.isfinite(loss.item())

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: Optimizer) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]
                 if p.grad is not None]
        self.norms = [*self.norms[-99:], torch._foreach_norm(grads)]
        torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found, self.one)
        self.grads_finite = self.found.item() == 0.0


CONFIGS: dict[str, Callable[[], list[Callback]]] = {
    "empty Callback()": lambda: [Callback()],
    "ops floor (one callback)": lambda: [OpsFloor()],
    "watch + tracer": lambda: [LossCurveMonitor(window_epochs=0, window_steps=20),
                               GradientMonitor(window_epochs=0, window_steps=20),
                               NonFiniteTracer()],
    "Triage() bundle": lambda: [Triage(window_epochs=0, window_steps=20, verbose=False)],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--steps", type=int, default=500, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=4, help="timed epochs (after 1 warm-up)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    print(f"torch {torch.__version__}, lightning {pl.__version__}, {args.device}, "
          f"{args.threads} thread(s); {args.epochs} timed epochs of {args.steps} steps")
    for name in args.models:
        build, shape, batch = MODELS[name]
        data = synthetic_loader(shape, args.steps, batch)
        print(f"\n#### {name} (batch {batch})\n\n{HEADER}")
        for config in args.configs:
            result = measure(build, data, CONFIGS[config](), epochs=args.epochs,
                             device=args.device)
            print(result.row(config), flush=True)


if __name__ == "__main__":
    main()
