"""What the remedy trial costs per fit (docs/benchmarks.md, "Verified remedies").

On the digits MLP of the demo: a run whose lead is a learning rate too low (SGD at 1e-5, the
trial runs: a copy, the as-is replay and up to three remedied replays of 30 steps) and a healthy
run (lr 0.1, no lead: nothing runs). For each: the fit's wall time with ``verify_remedies`` on
and off, the trial's own seconds, the host bytes recorded, and whether the report's recorder
left the per-step dispatch after its 30 batches.

``--recording``: what every fit pays for a possible trial, on healthy runs of the digits MLP,
the small CNN and the transformer LM of the overhead benchmarks: the seconds spent in the
recorder (the starting state and the first 30 batches copied to the host, summed over its
calls) against the fit's, and the host bytes it keeps (state, batches).

    PYTHONPATH=src python benchmarks/remedy_cost.py [--rounds 3] [--recording]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_triage import Triage
from lightning_triage.callbacks._remedy import RemedyRecorder
from lightning_triage.demo.digits import DigitsMLP, digits_loaders


def one_fit(lr: float, verify: bool, root: Path) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    train, val = digits_loaders()
    triage = Triage(report_dir=root, verbose=False, overfit=False, verify_remedies=verify)
    trainer = pl.Trainer(max_epochs=2, callbacks=[triage], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=root)
    start = time.perf_counter()
    trainer.fit(DigitsMLP(lr=lr), train, val)
    rec = triage.report.remedies
    return {"fit_s": time.perf_counter() - start, "trial_s": rec.seconds, "trials": rec.trials,
            "recorded_bytes": rec._bytes, "idle": triage.report.idle}


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _healthy_builds() -> dict[str, Any]:
    from bench_models import BenchModule, small_cnn, tiny_lm
    from step_cost import MODELS

    def digits() -> tuple[pl.LightningModule, Any]:
        train, _ = digits_loaders()
        return DigitsMLP(lr=0.1), train

    return {
        "digits MLP (64-32-10 demo, batch 32)": digits,
        MODELS["small_cnn"][0]: lambda: (BenchModule(small_cnn()), MODELS["small_cnn"][2](60)),
        MODELS["tiny_lm"][0]: lambda: (BenchModule(tiny_lm()), MODELS["tiny_lm"][2](60)),
    }


def recording_fit(build: Any, verify: bool, root: Path) -> dict[str, Any]:
    """One healthy fit (60 steps, no validation), the recorder's calls timed."""
    spent = [0.0]
    original = RemedyRecorder.record

    def timed(self: RemedyRecorder, *args: Any) -> None:
        start = time.perf_counter()
        try:
            original(self, *args)
        finally:
            spent[0] += time.perf_counter() - start

    pl.seed_everything(0, verbose=False)
    model, train = build()
    triage = Triage(report_dir=root, verbose=False, overfit=False, html=False,
                    verify_remedies=verify)
    trainer = pl.Trainer(max_steps=60, limit_val_batches=0, callbacks=[triage], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=root)
    RemedyRecorder.record = timed  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        trainer.fit(model, train)
        fit_s = time.perf_counter() - start
    finally:
        RemedyRecorder.record = original  # type: ignore[method-assign]
    rec = triage.report.remedies
    return {"fit_s": fit_s, "record_s": spent[0], "trials": rec.trials,
            "state_bytes": _tensor_bytes(rec.model_state) + _tensor_bytes(rec.optimizer_state),
            "batch_bytes": rec._bytes, "batches": len(rec.batches),
            "start_here": triage.report.report["start_here"] if triage.report.report else None}


def recording(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in _healthy_builds().items():
            on, off = [], []
            for _ in range(rounds):  # interleaved: a shared machine drifts
                on.append(recording_fit(build, True, Path(tmp) / "on"))
                off.append(recording_fit(build, False, Path(tmp) / "off"))
            fit_on = statistics.median(r["fit_s"] for r in on)
            fit_off = statistics.median(r["fit_s"] for r in off)
            rec = statistics.median(r["record_s"] for r in on)
            r = on[0]
            print(f"{name}: fit {fit_off:.2f} s without, {fit_on:.2f} s with; recorder "
                  f"{1000 * rec:.1f} ms ({100 * rec / fit_on:.1f}% of the fit); host: state "
                  f"{r['state_bytes'] / 1024:.0f} KiB, {r['batches']} batches "
                  f"{r['batch_bytes'] / 1024:.0f} KiB; trials {r['trials']}, lead "
                  f"{r['start_here']}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--recording", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    if args.recording:
        recording(args.rounds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        for name, lr in (("lr 1e-5 (lead: curve.lr_too_low)", 1e-5), ("healthy, lr 0.1", 0.1)):
            on, off = [], []
            for _ in range(args.rounds):  # interleaved: a shared machine drifts
                on.append(one_fit(lr, True, Path(tmp) / "on"))
                off.append(one_fit(lr, False, Path(tmp) / "off"))
            fit_on = statistics.median(r["fit_s"] for r in on)
            fit_off = statistics.median(r["fit_s"] for r in off)
            trial = statistics.median(r["trial_s"] for r in on)
            print(f"{name}: fit {fit_off:.2f} s without, {fit_on:.2f} s with "
                  f"(median of {args.rounds}); trial {trial:.3f} s, trials per fit "
                  f"{on[0]['trials']}, recorded {on[0]['recorded_bytes'] / 1024:.0f} KiB, "
                  f"recorder idle after its batches: {on[0]['idle']}")


if __name__ == "__main__":
    main()
