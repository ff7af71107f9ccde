"""Where the bundle's steady-state time goes: thread CPU time inside each per-step hook of
``Triage()`` and inside each check's part of it, per training step, plus the flushes.

The steady state only (after a warm-up epoch that closes the 20-step windows). Each check's
hook is timed around the function the bundle calls; the bundle's hook around its whole
forwarding (so the difference is the forwarding itself). Lightning's dispatch to the bundle is
not inside any of these (see the "empty ``Callback()``" row of ``step_cost.py``). The timers
add about a microsecond per timed call.

    PYTHONPATH=src python benchmarks/step_breakdown.py
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from ab_steps import synthetic_loader
from bench_models import BenchModule, tiny_mlp

from lightning_triage import Triage
from lightning_triage.callbacks.gradient_monitor import GradientMonitor
from lightning_triage.callbacks.loss_curve import LossCurveMonitor

HOOKS = ("on_train_batch_start", "on_before_backward", "on_before_optimizer_step",
         "on_train_batch_end")
NS: dict[str, int] = {}


def _timed(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(self: Any, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> Any:
        if trainer.current_epoch < 1:  # warm-up: windows and fit-start checks
            return fn(self, trainer, *args, **kwargs)
        t0 = time.thread_time_ns()
        try:
            return fn(self, trainer, *args, **kwargs)
        finally:
            NS[key] = NS.get(key, 0) + time.thread_time_ns() - t0
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps per epoch")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    bundle = Triage(window_epochs=0, window_steps=20, verbose=False, strict=True)
    for check in bundle.checks:  # the undecorated hooks the bundle calls
        for hook in HOOKS:
            raw = getattr(getattr(type(check), hook), "guarded_hook", None)
            if raw is not None:
                getattr(type(check), hook).guarded_hook = _timed(
                    f"  {type(check).__name__}.{hook}", raw)
    for cls in (LossCurveMonitor, GradientMonitor):
        cls._flush = _timed(f"  {cls.__name__} flushes (in on_train_batch_end)",  # type: ignore[method-assign]
                            cls._flush)
    each = Triage._each

    def per_hook(self: Triage, hook: str, trainer: pl.Trainer, *rest: Any) -> None:
        if hook in HOOKS and trainer.current_epoch >= 1:
            t0 = time.thread_time_ns()
            each(self, hook, trainer, *rest)
            NS[f"Triage.{hook}"] = NS.get(f"Triage.{hook}", 0) + time.thread_time_ns() - t0
        else:
            each(self, hook, trainer, *rest)

    Triage._each = per_hook  # type: ignore[method-assign, assignment]
    trainer = pl.Trainer(max_epochs=3, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, callbacks=[bundle],
                         default_root_dir="/tmp/lightning_triage_bench")
    trainer.fit(BenchModule(tiny_mlp()), synthetic_loader((64,), args.steps, 32))
    steps = 2 * args.steps
    print(f"tiny MLP, {steps} steady-state steps, thread CPU time per step (us):")
    for key, ns in sorted(NS.items(), key=lambda kv: kv[0].strip()):
        print(f"{key:60s} {ns / steps / 1e3:7.1f}")
    print(f"{'total inside the bundle':60s} "
          f"{sum(v for k, v in NS.items() if k.startswith('Triage.')) / steps / 1e3:7.1f}")


if __name__ == "__main__":
    main()
