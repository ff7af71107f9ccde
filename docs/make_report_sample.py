"""Regenerate docs/samples/report_lr50.html: the HTML report of a real demo run.

Run: ``PYTHONPATH=src python docs/make_report_sample.py`` (needs the ``demo`` extra; about 10 s
on 2 CPU cores). It trains the demo's ``lr-50`` scenario (the digits MLP with SGD at lr 50) with
``Triage()`` attached, seeded, and copies the run's self-contained ``triage_report.html`` into
``docs/samples/``. The page is embedded by docs/report_sample.md.
"""

from __future__ import annotations

import io
import logging
import shutil
import tempfile
import warnings
from pathlib import Path

from rich.console import Console

from lightning_triage.demo import SCENARIOS, run_scenario
from lightning_triage.report.files import HTML_NAME

SCENARIO = "lr-50"
OUT = Path(__file__).resolve().parent / "samples"
#: The committed sample must stay small (the test suite checks it too).
MAX_BYTES = 300_000


def main() -> Path:
    """Run the scenario and copy its HTML report into ``docs/samples/``; return the path."""
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    scenario = next(s for s in SCENARIOS if s.name == SCENARIO)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = run_scenario(scenario, Path(tmp), Console(file=io.StringIO()))
        if report is None or report["start_here"] != scenario.expect:
            raise RuntimeError(f"{SCENARIO}: expected {scenario.expect} to lead, got {report}")
        OUT.mkdir(exist_ok=True)
        target = OUT / f"report_{SCENARIO.replace('-', '')}.html"
        shutil.copyfile(Path(tmp) / scenario.name / HTML_NAME, target)
    size = target.stat().st_size
    assert size < MAX_BYTES, f"{target} is {size} bytes (limit {MAX_BYTES})"
    print(f"wrote {target} ({size} bytes); start here: {report['start_here']}")
    return target


if __name__ == "__main__":
    main()
