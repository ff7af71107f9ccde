"""Printed reports: golden files for the console summary and the Markdown report (regenerate
with ``pytest tests/test_report_output.py --update-golden``), and the 80-column promise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from lightning_triage.report import print_report, render_markdown
from tests.report_samples import broken_report, healthy_report

GOLDEN = Path(__file__).parent / "golden"
SAMPLES = {"broken": broken_report, "healthy": healthy_report}


def console_text(report: dict[str, Any], width: int = 80) -> str:
    console = Console(width=width, record=True, color_system=None, force_terminal=False,
                      file=open("/dev/null", "w"))  # noqa: SIM115
    print_report(report, console=console, path=Path("runs/triage/triage_report.json"))
    return console.export_text()


def check_golden(name: str, text: str, request: pytest.FixtureRequest) -> None:
    path = GOLDEN / name
    if request.config.getoption("--update-golden"):
        path.write_text(text)
    assert path.exists(), f"missing {path}: run pytest with --update-golden"
    assert text == path.read_text(), f"{name} changed: check it, then run with --update-golden"


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_console_golden(sample: str, request: pytest.FixtureRequest) -> None:
    check_golden(f"console_{sample}.txt", console_text(SAMPLES[sample]()), request)


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_markdown_golden(sample: str, request: pytest.FixtureRequest) -> None:
    check_golden(f"report_{sample}.md", render_markdown(SAMPLES[sample]()), request)


def test_console_fits_80_columns_without_word_columns() -> None:
    text = console_text(broken_report())
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    # one line per problem, cut with an ellipsis rather than wrapped into a column of words
    problems = [f for f in broken_report()["findings"] if f["severity"] != "info"]
    for f in problems:
        [line] = [ln for ln in lines if f" {f['code']} " in ln and not ln.startswith("Start")]
        assert len(line) <= 80
    short = [ln for ln in lines if ln.strip() and len(ln.strip().split()) == 1]
    assert not short, short
    assert len(lines) <= 20  # short: the full text is in the files
    assert "full report: runs/triage/triage_report.json" in text
    assert "(explained by curve.diverging)" in text or "explained by" in text


def test_console_of_a_healthy_run_says_so() -> None:
    text = console_text(healthy_report())
    assert "No problems found." in text
    assert "info: overfit.passed, curve.healthy" in text
