"""Triage() on a CUDA GPU: healthy real models stay silent under 32, bf16-mixed and fp16
16-mixed (a real GradScaler), and the precision bugs only a GPU shows are caught.

Run on a machine with CUDA, from the repository root (the test helpers are imported):
``PYTHONPATH=src:. python benchmarks/gpu_check.py``. Prints one line per run and exits 1 when
a healthy run raises a warning or an error, or a broken run is not caught. Not part of the
test suite (CI has no GPU); the results of the last run are in docs/benchmarks.md.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from tests.realmodels.models import (
    DigitsClassifier,
    ResNet,
    bert_classifier,
    digits,
    gpt2_lm,
    problems,
    quiet_trainer,
    token_loaders,
    triage,
)
from torch import Tensor, nn


class Float32Block(nn.Module):
    """The bulk of the network run with autocast turned off (numerics.autocast_bypassed)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU())
        self.head = nn.Linear(512, 10)

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast("cuda", enabled=False):
            h = self.body(x.float())
        return self.head(h)


class Overflow(nn.Module):
    """Squares activations that fit float32 but not float16 (numerics.precision_overflow)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x * 3000.0) ** 2 / 1e6  # outputs ~500: their squares pass 65504


def run(name: str, build: Callable[[], pl.LightningModule], loaders: Any, precision: str,
        expect: str | None, seed: int, **options: Any) -> bool:
    pl.seed_everything(seed, verbose=False)
    model = build()
    with tempfile.TemporaryDirectory() as tmp:
        check = triage(Path(tmp), **options)  # strict: an internal error of a check raises
        start = time.perf_counter()
        quiet_trainer(Path(tmp), [check], accelerator="cuda", devices=1, precision=precision,
                      max_epochs=2).fit(model, *loaders)
        seconds = time.perf_counter() - start
        report = check.report.report
    assert report is not None
    found = problems(report)
    codes = sorted({code for code, _ in found})
    ok = codes == [] if expect is None else expect in codes
    leads = "" if expect is None else ("  (leads)" if report["start_here"] == expect else "  (NOT LEADING)")
    print(f"{'ok ' if ok else 'BAD'} {name:<34} {precision:<11} seed {seed}  {seconds:5.1f} s  "
          f"start_here={report['start_here']}{leads}  problems={codes}", flush=True)
    if not ok:
        for code, message in found:
            print(f"      {code}: {message[:300]}", flush=True)
    return ok


def guarded_run(*args: Any, **options: Any) -> bool:
    try:
        return run(*args, **options)
    except Exception as exc:  # a crash is a failed check of this script, reported, not fatal
        print(f"BAD {args[0]} {args[3]}: {type(exc).__name__}: {exc}"[:500], flush=True)
        return False


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    print(torch.__version__, pl.__version__, torch.cuda.get_device_name(0), flush=True)
    results = []
    healthy = () if "--broken-only" in sys.argv else ("32-true", "bf16-mixed", "16-mixed")
    for precision in healthy:
        for seed in (0, 1):
            results += [
                guarded_run("ResNet + BatchNorm (digits)", lambda: DigitsClassifier(ResNet()),
                    digits(seed), precision, None, seed),
                guarded_run("BERT classifier (small config)", bert_classifier,
                    token_loaders("classify", seed), precision, None, seed),
                guarded_run("GPT-2 LM (small config)", gpt2_lm, token_loaders("lm", seed), precision,
                    None, seed),
            ]
    for seed in (0, 1, 2):
        results += [
            guarded_run("a forward outside autocast", lambda: DigitsClassifier(Float32Block()),
                digits(seed), "16-mixed", "numerics.autocast_bypassed", seed),
            # on a GPU the tracer defers its checks (numerics_mode="auto"): a 32-step run ends
            # before it localizes; "sync" checks and replays every step
            guarded_run("squares overflowing float16", lambda: DigitsClassifier(Overflow()),
                digits(seed), "16-mixed", "numerics.nonfinite_detected", seed),
            guarded_run("squares overflowing float16 (sync)", lambda: DigitsClassifier(Overflow()),
                digits(seed), "16-mixed", "numerics.precision_overflow", seed,
                numerics_mode="sync"),
        ]
    print(f"{sum(results)} of {len(results)} runs as expected", flush=True)
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
