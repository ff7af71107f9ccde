"""False alarms and misses of `classify_curve` on labeled curve files, over seeds.

    PYTHONPATH=src python tests/data/make_curves.py --seeds 3 4 5 --out /tmp/curves_345.json
    PYTHONPATH=src python benchmarks/curve_false_alarms.py tests/data/curves.json \
        tests/data/curves_seeds.json /tmp/curves_345.json

For every case of the files (built by tests/data/make_curves.py): a broken run whose label is
not among its verdicts is a miss; a healthy run with any verdict other than `healthy` at the end
of the window is a final false alarm; each healthy run is also replayed every 20 steps
mid-window (`final=False`) and every verdict there is a mid-window false alarm. The numbers in
docs/curves.md come from this script.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from lightning_triage.functional.curve import classify_curve


def classify(case: dict[str, Any], final: bool = True, upto: int | None = None) -> list[str]:
    train = [float(v) for v in case["train"]][:upto]
    val = [(s, float(v)) for s, v in case["val"] if upto is None or s < upto]
    return [v.code.split(".", 1)[1]
            for v in classify_curve(train, val=val, chance=case["chance"], final=final)]


def main(paths: list[str]) -> int:
    cases = [c for p in paths for c in json.loads(Path(p).read_text())["cases"]]
    misses, final_fa, mid_fa = [], Counter(), Counter()
    healthy = replays = 0
    for c in cases:
        seed = c.get("seed", 0)
        got = classify(c)
        if c["label"] != "healthy":
            if c["label"] not in got:
                misses.append(f"{c['name']} seed {seed} ({c['label']}): {got}")
            continue
        healthy += 1
        for code in sorted(set(got) - {"healthy"}):
            final_fa[code] += 1
            print(f"final false alarm: {c['name']} seed {seed}: {got}")
        for upto in range(20, len(c["train"]), 20):
            replays += 1
            for code in set(classify(c, final=False, upto=upto)):
                mid_fa[code] += 1
    print(f"\n{len(cases)} runs, {healthy} healthy, {replays} mid-window replays")
    print(f"misses ({len(misses)}):", *misses, sep="\n  ")
    for code in sorted(set(final_fa) | set(mid_fa)):
        print(f"`curve.{code}`: {final_fa[code]} / {healthy} healthy runs at the end, "
              f"{mid_fa[code]} / {replays} mid-window replays")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:] or ["tests/data/curves.json",
                                           "tests/data/curves_seeds.json"]))
