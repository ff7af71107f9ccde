"""Regenerate the console samples shown in the README and the docs from real demo runs.

Run: ``PYTHONPATH=src python docs/make_samples.py`` (needs the ``demo`` extra; seconds) after a
change to what a demo scenario reports, or to the console summary. ``--check`` writes nothing
and exits 1 when a sample is stale.

A sample is the region of a Markdown page between ``<!-- begin sample: SCENARIO WIDTH -->`` and
``<!-- end sample -->``: the console summary of the demo scenario ``SCENARIO`` (run as
``python -m lightning_triage demo SCENARIO --report-root runs/demo``) printed at ``WIDTH``
columns, and for a healthy scenario the routine findings and skipped checks it had. The test
suite compares every sample with the report of the same scenario's run (``tests/demo``), with
decimal numbers masked: a different CPU may round the last digits of a loss differently.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import re
import sys
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The pages that hold samples (README and docs pages).
PAGES = [ROOT / "README.md", ROOT / "docs" / "getting_started.md", ROOT / "docs" / "report.md"]
#: Where the samples say the demo wrote its reports (``--report-root``).
REPORT_ROOT = "runs/demo"
SAMPLE = re.compile(r"(<!-- begin sample: (?P<name>[\w-]+) (?P<width>\d+) -->\n)(?P<body>.*?)"
                    r"(<!-- end sample -->)", flags=re.DOTALL)
_FLOAT = re.compile(r"\d+\.\d+(e[+-]?\d+)?|\d+e[+-]?\d+")


def render(name: str, report: Mapping[str, Any], width: int) -> str:
    """The Markdown of one sample: the console summary of ``report`` (scenario ``name``) at
    ``width`` columns in a ``text`` block; for a run with nothing to fix, also its routine info
    findings and the checks it skipped."""
    from rich.console import Console

    from lightning_triage.report.console import print_report
    from lightning_triage.report.files import HTML_NAME

    out = io.StringIO()
    print_report(report, console=Console(file=out, width=width, color_system=None, soft_wrap=False))
    lines = [line.rstrip() for line in out.getvalue().rstrip("\n").split("\n")]
    console = "\n".join(lines) + f"\nfull report: {REPORT_ROOT}/{name}/{HTML_NAME}\n"
    text = f"```text\n{console}```\n"
    if report["start_here"] is None:
        infos = {f["code"]: f["title"] for f in report["findings"] if f["severity"] == "info"}
        skipped = [c for c in report["checks"] if c["status"] not in ("passed", "failed", "error")]
        text += "\nIts info findings:\n\n" + "".join(f"- `{c}`: {m}\n" for c, m in infos.items())
        text += "\nIts skipped checks:\n\n" + "".join(
            f"- `{c['check']}` ({c['status']}): {c['detail']}\n" for c in skipped)
    return text


def samples(text: str) -> list[tuple[str, int, str]]:
    """``(scenario, width, body)`` of each sample region of a page."""
    return [(m["name"], int(m["width"]), m["body"]) for m in SAMPLE.finditer(text)]


def masked(text: str) -> str:
    """``text`` with decimal numbers replaced by ``#`` (integers such as steps and counts stay)."""
    return _FLOAT.sub("#", text)


def stale(name: str, report: Mapping[str, Any]) -> list[str]:
    """The pages whose samples of scenario ``name`` disagree with ``report`` (decimals masked)."""
    out = []
    for page in PAGES:
        for sample, width, body in samples(page.read_text()):
            if sample == name and masked(body) != masked(render(name, report, width)):
                out.append(f"{page.relative_to(ROOT)} ({name}, {width} columns)")
    return out


def scenario_names() -> list[str]:
    """Every scenario shown in a sample."""
    return sorted({name for page in PAGES for name, _, _ in samples(page.read_text())})


def run(names: list[str]) -> dict[str, dict[str, Any]]:
    """Train the demo scenarios ``names`` (seeded, as ``demo`` does); their reports."""
    from rich.console import Console

    from lightning_triage.demo import SCENARIOS, run_scenario

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    reports = {}
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(), \
            contextlib.redirect_stdout(io.StringIO()):  # the reports print themselves
        warnings.simplefilter("ignore")
        for scenario in (s for s in SCENARIOS if s.name in names):
            report = run_scenario(scenario, Path(tmp), Console(file=io.StringIO()))
            assert report is not None, scenario.name
            reports[scenario.name] = report
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when stale")
    args = parser.parse_args(argv)
    reports = run(scenario_names())
    if args.check:
        bad = [page for name, report in reports.items() for page in stale(name, report)]
        print("stale: " + ", ".join(bad) if bad else "samples up to date")
        return 1 if bad else 0
    for page in PAGES:
        text = page.read_text()
        new = SAMPLE.sub(lambda m: m[1] + render(m["name"], reports[m["name"]], int(m["width"]))
                         + m[5], text)
        if new != text:
            page.write_text(new)
            print(f"wrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
