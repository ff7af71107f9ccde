"""The ranking replayed on recorded runs: for every demo, cause and healthy scenario, the findings
its checks held after a real fit (recorded by `benchmarks/ranking_golden.py`) give the same
report order, severities, `explained_by` and start here as when they were recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lightning_triage.findings import Finding
from lightning_triage.report import build_report

RECORD = json.loads((Path(__file__).parent / "golden" / "ranking_scenarios.json").read_text())


def _summary(report: dict[str, Any]) -> dict[str, Any]:
    return {"start_here": report["start_here"],
            "findings": [[f["code"], f["severity"], f["global_step"], f["layer"],
                          list(f["explained_by"])] for f in report["findings"]]}


@pytest.mark.parametrize("name", sorted(RECORD))
def test_ranking_unchanged_on_recorded_runs(name: str) -> None:
    recorded = RECORD[name]
    findings = [Finding.from_dict(d) for d in recorded["raw"]]
    report = build_report(findings, status="completed", run={})
    assert _summary(report) == {"start_here": recorded["start_here"],
                                "findings": recorded["findings"]}


def test_the_record_holds_causes_symptoms_and_healthy_runs() -> None:
    leads = {r["start_here"] for r in RECORD.values()}
    assert None in leads and len(leads) >= 10
    explained = [f for r in RECORD.values() for f in r["findings"] if f[4]]
    assert explained  # symptoms explained by their cause: the ranking has work to do
    # the leads' remedy trials are recorded with the findings: the ranking reads them too
    assert any("remedy" in d for r in RECORD.values() for d in r["raw"])
