"""What the remedy trial costs per fit (docs/benchmarks.md, "Verified remedies").

On the digits MLP of the demo: a run whose lead is a learning rate too low (SGD at 1e-5, the
trial runs: a copy, the as-is replay and up to three remedied replays of 30 steps) and a healthy
run (lr 0.1, no lead: nothing runs). For each: the fit's wall time with ``verify_remedies`` on
and off, the trial's own seconds, the host bytes recorded, and whether the report's recorder
left the per-step dispatch after its 30 batches.

    PYTHONPATH=src python benchmarks/remedy_cost.py [--rounds 3]
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
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
