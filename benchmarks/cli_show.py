"""Time of ``lightning-triage show`` (and ``html --no-plots``, ``diff``) on a typical report and
on a 200 MB one, each as a fresh process (start-up and imports included).

The large reports are generated under a temporary directory (``/tmp``) and removed at the end:
one of many findings with long messages, and one with a single 200 MB message (the console cuts
it; the files keep it whole). Time should grow linearly with the size.

Not a test: run it by hand and record the numbers in docs/benchmarks.md.

    PYTHONPATH=src python benchmarks/cli_show.py
    PYTHONPATH=src python benchmarks/cli_show.py --mb 50
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.report_samples import broken_report  # noqa: E402

from lightning_triage.report.files import write_report  # noqa: E402


def many_findings(megabytes: float) -> dict[str, Any]:
    """The broken sample with findings of 10 kB messages added up to ``megabytes``."""
    report = broken_report()
    template = dict(report["findings"][1])
    n = int(megabytes * 1e6 / 10_000)
    report["findings"] += [dict(template, message=f"finding {i}: " + "x" * 10_000,
                                global_step=100 + i) for i in range(n)]
    return report


def one_huge_message(megabytes: float) -> dict[str, Any]:
    report = broken_report()
    report["findings"][0]["message"] = "x" * int(megabytes * 1e6)
    return report


def timed(argv: list[str], repeats: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "lightning_triage", *argv, "--fail-on", "none"],
                       env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=3600)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200.0, help="size of the large reports")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="triage-cli-bench-"))
    try:
        cases = {"typical (broken sample)": broken_report(),
                 f"{args.mb / 10:g} MB of findings": many_findings(args.mb / 10),
                 f"{args.mb:g} MB of findings": many_findings(args.mb),
                 f"one {args.mb:g} MB message": one_huge_message(args.mb)}
        print(f"{'report':<28} {'size':>10} {'show':>8} {'html':>8} {'diff':>8}")
        for name, report in cases.items():
            directory = root / name.replace(" ", "_")
            write_report(report, directory, html=False)
            path = directory / "triage_report.json"
            size = path.stat().st_size / 1e6
            repeats = args.repeats if size < 10 else 1
            show = timed(["show", str(path)], repeats)
            html = timed(["html", str(path), "--no-plots", "-o", str(directory / "p.html")],
                         repeats)
            diff = timed(["diff", str(path), str(path)], repeats)
            print(f"{name:<28} {size:>8.1f}MB {show:>7.2f}s {html:>7.2f}s {diff:>7.2f}s",
                  flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
