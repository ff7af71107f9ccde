"""False alarms of `Triage()` on the healthy labeled set, over several seeds.

    PYTHONPATH=src python benchmarks/calibrate_false_alarms.py [--seeds 0,1,2] [--only NAME,...]

Runs every healthy run of `tests/scenarios/healthy.py` with `Triage()` at its defaults (a long
overfit budget, so a loaded machine does not skip the probe) and prints, per run, the warnings
and errors raised, then the false-alarm rate per code: runs with that code / runs. The numbers
in docs/findings.md come from this script.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import lightning.pytorch as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.scenarios.healthy import HEALTHY

from lightning_triage import Triage


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    names = [n for n in HEALTHY if not args.only or n in args.only.split(",")]
    warnings.simplefilter("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    per_code: Counter[str] = Counter()
    runs = 0
    for name in names:
        for seed in seeds:
            pl.seed_everything(seed, verbose=False)
            model, train, val, kwargs = HEALTHY[name](seed)
            root = Path(tempfile.mkdtemp(prefix="triage-calib-"))
            triage = Triage(report_dir=root, verbose=False, overfit_time_budget=60.0)
            trainer = pl.Trainer(callbacks=[triage], logger=False, enable_checkpointing=False,
                                 enable_progress_bar=False, enable_model_summary=False,
                                 default_root_dir=root, accelerator="cpu", **kwargs)
            trainer.fit(model, train, val)
            report = triage.report.report
            assert report is not None
            problems = sorted({f["code"] for f in report["findings"] if f["severity"] != "info"})
            per_code.update(problems)
            runs += 1
            print(f"{name:20s} seed {seed}: {', '.join(problems) or '-'}", flush=True)
    print(f"\n{runs} healthy runs ({len(names)} configurations x {len(seeds)} seeds)")
    print("| code | false alarms | rate |\n|---|---|---|")
    for code, count in sorted(per_code.items()):
        print(f"| `{code}` | {count} / {runs} | {count / runs:.1%} |")
    if not per_code:
        print(f"| (any) | 0 / {runs} | 0% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
