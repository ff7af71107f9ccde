"""The wiring demo scenario leads its report with the wiring bug."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from lightning_triage.demo import SCENARIOS, run_scenario


def test_detached_encoder_scenario(tmp_path: Path) -> None:
    scenario = next(s for s in SCENARIOS if s.name == "detached-encoder")
    report = run_scenario(scenario, tmp_path, Console(quiet=True))
    assert report is not None
    assert report["start_here"] == scenario.expect == "wiring.no_grad_params"
    finding = next(f for f in report["findings"] if f["code"] == "wiring.no_grad_params")
    assert finding["evidence"]["params"] == ["encoder.0.weight", "encoder.0.bias"]
