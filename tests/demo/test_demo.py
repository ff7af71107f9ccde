"""The demo: every scenario's report shows what it demonstrates; healthy runs have nothing."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from rich.console import Console

from lightning_triage.__main__ import main
from lightning_triage.demo import SCENARIOS, Scenario, caught, next_steps, run_scenario, verdict
from tests.helpers import other_seeds


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario_report_shows_what_it_demonstrates(tmp_path: Path, scenario: Scenario) -> None:
    report = run_scenario(scenario, tmp_path, Console(quiet=True))
    assert report is not None
    assert caught(scenario, report), (report["start_here"], [f["code"] for f in report["findings"]])
    # cause before symptom: what the scenario demonstrates is also where the report starts
    assert report["start_here"] == scenario.expect, [f["code"] for f in report["findings"]]
    if scenario.expect is None:
        assert not [f for f in report["findings"] if f["severity"] != "info"]


# the scenarios whose claim rests on a free-running trajectory, checked on more seeds
TRAJECTORY = [s for s in SCENARIOS if s.name in {"healthy", "lr-good", "lr-50", "log-softmax-loss"}]


@pytest.mark.slow
@pytest.mark.parametrize("seed", other_seeds(4))
@pytest.mark.parametrize("scenario", TRAJECTORY, ids=[s.name for s in TRAJECTORY])
def test_trajectory_scenarios_hold_on_other_seeds(tmp_path: Path, scenario: Scenario,
                                                  seed: int) -> None:
    report = run_scenario(scenario, tmp_path, Console(quiet=True), seed=seed)
    assert report is not None
    assert caught(scenario, report), (report["start_here"], [f["code"] for f in report["findings"]])
    if scenario.expect is None:
        assert not [f for f in report["findings"] if f["severity"] != "info"]


def test_the_detached_encoder_is_named_and_leads_the_report(tmp_path: Path) -> None:
    scenario = next(s for s in SCENARIOS if s.name == "detached-encoder")
    report = run_scenario(scenario, tmp_path, Console(quiet=True))
    assert report is not None
    assert report["start_here"] == "wiring.no_grad_params"
    finding = next(f for f in report["findings"] if f["code"] == "wiring.no_grad_params")
    assert finding["evidence"]["params"] == ["encoder.0.weight", "encoder.0.bias"]


def test_command_line_runs_named_scenarios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "scaled-logits", "--report-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "init.loss_above_chance" in out
    report = json.loads((tmp_path / "scaled-logits" / "triage_report.json").read_text())
    assert report["start_here"] == "init.loss_above_chance"
    # it ends with the next two commands, which work as printed
    steps = out[out.rindex("\nNext:\n") + 1:].splitlines()
    browser, show = shlex.split(steps[2]), shlex.split(steps[4])
    python = os.path.abspath(sys.executable)  # printed relative to the working directory
    assert os.path.abspath(browser[0]) == python and browser[1:3] == ["-m", "webbrowser"]
    html = Path(urlparse(browser[3]).path)
    assert html == tmp_path / "scaled-logits" / "triage_report.html" and html.exists()
    assert [os.path.abspath(show[0]), *show[1:3]] == [python, "-m", "lightning_triage"] or show[0].endswith(
        "/lightning-triage"), show
    capsys.readouterr()
    assert main(show[show.index("show"):]) == 1  # it holds an error: exit 1 (--fail-on error)
    assert "init.loss_above_chance" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:  # a usage error, as argparse's own
        main(["demo", "no-such-scenario"])
    assert exited.value.code == 2


def test_next_steps_run_through_the_demos_environment(tmp_path: Path) -> None:
    """`make demo` leaves its virtual environment inactive: the commands name its interpreter
    and console script, relative to the working directory, and the example where there is one."""
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "lightning-triage").touch()
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "train.py").touch()
    text = next_steps("runs/demo", [s.name for s in SCENARIOS], venv / "python", cwd=tmp_path)
    html = tmp_path / "runs" / "demo" / "lr-50" / "triage_report.html"
    assert f".venv/bin/python -m webbrowser {html.as_uri()}" in text
    assert ".venv/bin/lightning-triage show runs/demo/lr-50" in text
    assert ".venv/bin/python -m examples.train --lr 50" in text
    text = next_steps(tmp_path / "out", ["healthy", "scaled-logits"], "/opt/py/bin/python3",
                      cwd=tmp_path / "elsewhere")
    assert f"/opt/py/bin/python3 -m lightning_triage show {tmp_path}/out/scaled-logits" in text
    assert "examples.train" not in text


def test_verdict_tells_a_lead_from_a_finding_shown_further_down() -> None:
    scenario = next(s for s in SCENARIOS if s.expect is not None)
    finding = {"code": scenario.expect}
    assert verdict(scenario, {"start_here": scenario.expect, "findings": [finding]}) == "leads"
    assert verdict(scenario, {"start_here": "data.constant_input", "findings": [finding]}) == "shown"
    assert verdict(scenario, {"start_here": None, "findings": []}) == "missed"
    assert verdict(scenario, None) == "missed"
