"""What `Triage()` costs a long GPU run: one prepared script for a lent accelerator.

For a compiled GPT-2 (small config) and a ResNet with BatchNorm, under ``bf16-mixed``, fitted
with and without ``Triage()`` in the same process (interleaved, fresh dynamo caches per fit):

- the steady-state time per step (steps after ``--warmup``, the device synchronized once at
  each end of the window: the same two synchronizations in both arms);
- the host synchronizations per steady-state step, counted by
  ``torch.cuda.set_sync_debug_mode("warn")`` (each synchronizing CUDA call warns once);
- the graphs compiled and the calls of compiled code (``CountingBackend``: a recompilation
  caused by the callbacks would add a graph; the user's steps stay compiled when the calls match);
- the peak device memory (``torch.cuda.max_memory_allocated``);
- whether the final weights are bit-identical.

With two or more GPUs it repeats the GPT-2 fit under DDP (``strategy="ddp"``, 2 devices). On a
machine without CUDA, ``--device cpu`` runs the same measurements on the CPU (without the sync
count), so the script can be checked anywhere:

    PYTHONPATH=src:. python benchmarks/gpu_cost.py [--steps 60] [--warmup 40] [--rounds 2]
    PYTHONPATH=src:. python benchmarks/gpu_cost.py --device cpu --steps 8 --warmup 3 --no-compile

Prints one Markdown table (the rows docs/benchmarks.md takes, with the card's name).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from tests.realmodels.models import DigitsClassifier, ResNet, digits, gpt2_lm, token_loaders
from typing_extensions import override

from lightning_triage import Triage
from lightning_triage.testing import CountingBackend


class SteadyClock(pl.Callback):
    """Times the steps after ``warmup`` and counts the host synchronizations they make."""

    def __init__(self, warmup: int, cuda: bool) -> None:
        self.warmup, self.cuda = warmup, cuda
        self.start: float | None = None
        self.seconds = 0.0
        self.steps = 0
        self.syncs = 0
        self._record: Any = None

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.warmup and self.start is None:
            self._sync()
            self.start = time.perf_counter()
            if self.cuda:
                self._record = warnings.catch_warnings(record=True)
                caught = self._record.__enter__()
                warnings.simplefilter("always")
                self._caught = caught
                torch.cuda.set_sync_debug_mode("warn")

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.start is None:
            return
        if self.cuda:
            torch.cuda.set_sync_debug_mode(0)
            self.syncs = sum("synchronizing" in str(w.message) for w in self._caught)
            self._record.__exit__(None, None, None)
        self._sync()
        self.seconds = time.perf_counter() - self.start
        self.steps = trainer.global_step - self.warmup


def one_fit(build: Callable[[], pl.LightningModule], loaders: Callable[[], Any], *, with_triage: bool,
            args: argparse.Namespace, root: Path, network: str,
            **trainer_args: Any) -> dict[str, Any]:
    cuda = args.device == "cuda"
    torch._dynamo.reset()
    backend = CountingBackend("inductor")
    pl.seed_everything(0, verbose=False)
    model = build()
    if args.compile:
        setattr(model, network, torch.compile(getattr(model, network), backend=backend))
    clock = SteadyClock(args.warmup, cuda)
    callbacks: list[pl.Callback] = [clock]
    if with_triage:
        callbacks.insert(0, Triage(report_dir=root / "triage", verbose=False))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = pl.Trainer(accelerator=args.device, devices=trainer_args.pop("devices", 1),
                         precision=args.precision if cuda else "32-true",
                         max_steps=args.warmup + args.steps, limit_val_batches=0,
                         callbacks=callbacks, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=root, **trainer_args)
    trainer.fit(model, loaders()[0])  # a fresh loader: the same order in both arms
    weights = torch.cat([p.detach().float().flatten().cpu() for p in model.parameters()])
    return {"step_ms": 1000 * clock.seconds / max(clock.steps, 1),
            "syncs": clock.syncs / max(clock.steps, 1) if cuda else None,
            "graphs": backend.graphs, "calls": backend.calls,
            "peak_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
            "weights": weights}


def compare(name: str, build: Callable[[], pl.LightningModule], loaders: Callable[[], Any],
            args: argparse.Namespace, network: str, **trainer_args: Any) -> str:
    """One table row: ``build()`` fitted without and with ``Triage()``, its ``network``
    attribute compiled."""
    with tempfile.TemporaryDirectory() as tmp:
        off, on = [], []
        for _ in range(args.rounds):  # interleaved: a shared machine drifts
            off.append(one_fit(build, loaders, with_triage=False, args=args, root=Path(tmp),
                               network=network, **dict(trainer_args)))
            on.append(one_fit(build, loaders, with_triage=True, args=args, root=Path(tmp),
                              network=network, **dict(trainer_args)))
    ms_off = statistics.median(r["step_ms"] for r in off)
    ms_on = statistics.median(r["step_ms"] for r in on)
    same = all(torch.equal(a["weights"], b["weights"]) for a, b in zip(off, on, strict=True))

    def shown(key: str, fmt: str) -> str:
        a, b = off[0][key], on[0][key]
        return "n/a" if a is None else f"{a:{fmt}} / {b:{fmt}}"

    return (f"| {name} | {ms_off:.2f} / {ms_on:.2f} ({ms_on / ms_off:.2f}x) | "
            f"{shown('syncs', '.2f')} | {shown('graphs', 'd')} | {shown('calls', 'd')} | "
            f"{shown('peak_mib', '.0f')} | {'bit-identical' if same else 'DIFFER'} |")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=40)  # past the remedy recorder's 30 batches
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing measured (use --device cpu to check the script)")
        return 0
    card = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU"
    print(f"{card}, torch {torch.__version__}, lightning {pl.__version__}, "
          f"{args.precision if args.device == 'cuda' else '32-true'}, "
          f"{'compiled' if args.compile else 'eager'}, {args.steps} steps after {args.warmup}, "
          f"median of {args.rounds}\n")
    print("| model | ms per step (without / with) | host syncs per step | graphs | compiled calls "
          "| peak MiB | weights |")
    print("|---|---|---|---|---|---|---|")
    print(compare("GPT-2 LM (small config)", gpt2_lm, lambda: token_loaders("lm", 0), args, "model"),
          flush=True)
    print(compare("ResNet + BatchNorm (digits)", lambda: DigitsClassifier(ResNet()), lambda: digits(0),
                  args, "net"), flush=True)
    if args.device == "cuda" and torch.cuda.device_count() >= 2:
        print(compare("GPT-2 LM, DDP x2", gpt2_lm, lambda: token_loaders("lm", 0), args, "model",
                      devices=2, strategy="ddp"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
