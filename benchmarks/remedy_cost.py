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

``--trial [CASE ...]``: the experiment's cost on the small CNN and the transformer LM of the
overhead benchmarks, on data with a signal, each trained with SGD at a learning rate whose lead
declares a replayed remedy (:data:`TRIAL_CASES`: too low for both, too high for the LM). Fits of
:data:`TRIAL_STEPS` steps with ``verify_remedies`` on and off, interleaved in one process: the
trial's wall time per fit and its ratio to the fit's, the recording's host bytes, and the
steady-state step (the median step time after step :data:`STEADY_FROM`, once the recorder has
left the per-step dispatch) with and without, paired round by round.

    PYTHONPATH=src python benchmarks/remedy_cost.py [--rounds 3] [--recording | --trial]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

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


def learnable_images(steps: int, batch: int = 64) -> DataLoader:
    """``steps`` batches of 1x28x28 images of 10 classes, each a fixed random template of its
    class under as much noise (a task with a signal: random labels make the data stage lead)."""
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 10, (steps * batch,), generator=g)
    x = torch.randn(10, 1, 28, 28, generator=g)[y] + torch.randn(steps * batch, 1, 28, 28,
                                                                  generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True, generator=g)


def learnable_tokens(steps: int, batch: int = 16, positions: int = 32,
                     vocab: int = 64) -> DataLoader:
    """``steps`` batches of next-token data whose every token is a fixed function of the one
    before it (from a random first token)."""
    g = torch.Generator().manual_seed(0)
    follow = torch.randperm(vocab, generator=g)
    seq = torch.empty(steps * batch, positions + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(0, vocab, (steps * batch,), generator=g)
    for t in range(positions):
        seq[:, t + 1] = follow[seq[:, t]]
    return DataLoader(TensorDataset(seq[:, :-1], seq[:, 1:]), batch_size=batch, shuffle=True,
                      generator=g)


@dataclass(frozen=True)
class TrialCase:
    """One ``--trial`` run: a model of the overhead benchmarks on data with a signal, trained with
    SGD (momentum 0.9) at a learning rate whose lead declares a replayed remedy."""

    title: str
    net: str  # the key of `step_cost.MODELS`
    data: Callable[[int], DataLoader]
    lr: float


TRIAL_CASES: dict[str, TrialCase] = {
    "cnn-lr-low": TrialCase("small CNN (2 conv + 2 linear), batch 64 of 1x28x28", "small_cnn",
                            learnable_images, 1e-4),
    "lm-lr-low": TrialCase("transformer LM (2 layers, width 64, 32 positions), batch 16",
                           "tiny_lm", learnable_tokens, 1e-4),
    "lm-lr-high": TrialCase("transformer LM (2 layers, width 64, 32 positions), batch 16",
                            "tiny_lm", learnable_tokens, 1.0),
}
#: Steps of a ``--trial`` fit, and the first one the steady-state step is measured from (the
#: recorder keeps the first 30 batches, then leaves the per-step dispatch).
TRIAL_STEPS = 90
STEADY_FROM = 40


class StepTimer(pl.Callback):
    """The wall time of every training step from ``STEADY_FROM`` on (batch start to batch start,
    so the callbacks' own hooks are inside)."""

    def __init__(self) -> None:
        self.last: float | None = None
        self.steps: list[float] = []

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        now = time.perf_counter()
        if self.last is not None and trainer.global_step > STEADY_FROM:
            self.steps.append(now - self.last)
        self.last = now


def trial_fit(case: TrialCase, verify: bool, root: Path) -> dict[str, Any]:
    """One fit of ``case``, the trial on or off."""
    from bench_models import BenchModule
    from step_cost import MODELS

    class AtLR(BenchModule):
        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=case.lr, momentum=0.9)

    pl.seed_everything(0, verbose=False)
    model, train = AtLR(MODELS[case.net][1]()), case.data(TRIAL_STEPS)
    triage = Triage(report_dir=root, verbose=False, overfit=False, html=False,
                    verify_remedies=verify)
    timer = StepTimer()
    trainer = pl.Trainer(max_steps=TRIAL_STEPS, limit_val_batches=0, callbacks=[triage, timer],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=root)
    start = time.perf_counter()
    trainer.fit(model, train)
    fit_s = time.perf_counter() - start
    rec, report = triage.report.remedies, triage.report.report or {}
    lead = next((f for f in report.get("findings", []) if f["code"] == report.get("start_here")),
                {})
    remedy = lead.get("remedy") or {}
    return {"fit_s": fit_s, "trial_s": rec.seconds, "trials": rec.trials,
            "steps": trainer.global_step,
            "step_s": statistics.median(timer.steps) if timer.steps else math.nan,
            "state_bytes": _tensor_bytes(rec.model_state) + _tensor_bytes(rec.optimizer_state),
            "batch_bytes": rec._bytes, "lead": report.get("start_here"),
            "verdict": remedy.get("verdict"), "tried": remedy.get("tried")}


def trial_cost(rounds: int, cases: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for key in cases:
            case = TRIAL_CASES[key]
            on, off = [], []
            for _ in range(rounds):  # interleaved, one process: a shared machine drifts
                on.append(trial_fit(case, True, Path(tmp) / "on"))
                off.append(trial_fit(case, False, Path(tmp) / "off"))
            fit_on, fit_off = (statistics.median(r["fit_s"] for r in runs) for runs in (on, off))
            trial = statistics.median(r["trial_s"] for r in on)
            ratio = statistics.median(a["trial_s"] / b["fit_s"] for a, b in zip(on, off, strict=True))
            r = on[0]
            print(f"{key}: {case.title}, SGD lr {case.lr:g} momentum 0.9, {r['steps']} of "
                  f"{TRIAL_STEPS} steps: lead {r['lead']}, trial {r['verdict']} (tried "
                  f"{r['tried']}), trials per fit {[a['trials'] for a in on]} with, "
                  f"{[b['trials'] for b in off]} without")
            print(f"  fit {fit_off:.2f} s without, {fit_on:.2f} s with (median of {rounds}); "
                  f"trial {trial:.2f} s per fit ({[round(a['trial_s'], 2) for a in on]}), "
                  f"{100 * ratio:.0f}% of the fit without; host: state "
                  f"{r['state_bytes'] / 1024:.0f} KiB, batches {r['batch_bytes'] / 1024:.0f} KiB")
            diffs = [a["step_s"] - b["step_s"] for a, b in zip(on, off, strict=True)]
            if all(math.isfinite(d) for d in diffs):
                step_on, step_off = (statistics.median(r["step_s"] for r in runs)
                                     for runs in (on, off))
                print(f"  steady-state step (steps {STEADY_FROM + 1}-{TRIAL_STEPS}, median per "
                      f"fit, median of {rounds}): {1000 * step_off:.2f} ms without, "
                      f"{1000 * step_on:.2f} ms with; paired difference "
                      f"{1000 * statistics.median(diffs):+.3f} ms "
                      f"({[round(1000 * d, 3) for d in diffs]})")
            else:
                print(f"  no steady state: the fit stops at its first non-finite loss (step "
                      f"{r['steps']})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--recording", action="store_true")
    parser.add_argument("--trial", nargs="*", choices=list(TRIAL_CASES), default=None,
                        help="the trial's cost on the small CNN and the transformer LM (cases)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    if args.recording:
        recording(args.rounds)
        return
    if args.trial is not None:
        trial_cost(args.rounds, args.trial or list(TRIAL_CASES))
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
