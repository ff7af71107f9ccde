"""False alarms of `Triage()` on the healthy-recipe corpus (issue 41), over several seeds.

    PYTHONPATH=src python benchmarks/recipes.py [--seeds 0,1,2] [--only NAME,...]

Fits every recipe of `lightning_triage.demo.recipes.HEALTHY_RECIPES` with `Triage()` at its
defaults (a long overfit budget, so a loaded machine does not skip the probe) and prints, per
recipe, the warnings and errors raised on each seed and the seconds each fit took (wall and CPU), then a
Markdown table: recipe, family, false-alarm rate (runs with a warning or error / runs), codes.
The table in docs/benchmarks.md ("Healthy recipes") comes from this script.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.scenarios.test_recipes import problems

from lightning_triage.demo.recipes import HEALTHY_RECIPES


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    only = set(args.only.split(",")) - {""}
    torch.set_num_threads(1)  # as the tests do (tests/conftest.py)
    warnings.simplefilter("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    rows = []
    for recipe in HEALTHY_RECIPES:
        if only and recipe.name not in only:
            continue
        alarmed, codes = 0, Counter[str]()
        for seed in seeds:
            root = Path(tempfile.mkdtemp(prefix="triage-recipes-"))
            start, cpu = time.perf_counter(), time.process_time()
            loud, _ = problems(recipe, seed, root, strict=False)
            found = sorted({f"{code} ({severity})" for code, severity, _ in loud})
            codes.update(found)
            alarmed += bool(found)
            print(f"{recipe.name:22s} seed {seed}: {time.perf_counter() - start:5.1f} s "
                  f"(cpu {time.process_time() - cpu:5.1f} s)  "
                  f"{', '.join(found) or '-'}", flush=True)
        listed = ", ".join(f"`{c}` {n}/{len(seeds)}" for c, n in sorted(codes.items()))
        rows.append(f"| {recipe.name} | {recipe.family} | {alarmed}/{len(seeds)} | "
                    f"{listed or '-'} |")
    print("\n| recipe | family | false alarms | codes (warning or error: runs) |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
