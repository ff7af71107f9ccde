from __future__ import annotations

from pathlib import Path

from lightning_triage.findings import CODES

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_every_finding_code_is_documented() -> None:
    text = (DOCS / "findings.md").read_text()
    missing = [code for code in CODES if f"`{code}`" not in text]
    assert not missing, f"run `python docs/make_findings_table.py`; missing: {missing}"
