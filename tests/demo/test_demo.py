"""The demo: every scenario's report shows what it demonstrates; healthy runs have nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from lightning_triage.__main__ import main
from lightning_triage.demo import SCENARIOS, Scenario, caught, run_scenario, verdict


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
@pytest.mark.parametrize("seed", [1, 2, 3])
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
    assert main(["demo", "no-such-scenario"]) == 2


def test_verdict_tells_a_lead_from_a_finding_shown_further_down() -> None:
    scenario = next(s for s in SCENARIOS if s.expect is not None)
    finding = {"code": scenario.expect}
    assert verdict(scenario, {"start_here": scenario.expect, "findings": [finding]}) == "leads"
    assert verdict(scenario, {"start_here": "data.constant_input", "findings": [finding]}) == "shown"
    assert verdict(scenario, {"start_here": None, "findings": []}) == "missed"
    assert verdict(scenario, None) == "missed"
