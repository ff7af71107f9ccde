"""Regenerate the code table of docs/findings.md from the registry: python docs/make_findings_table.py"""

from __future__ import annotations

from pathlib import Path

from lightning_triage.findings import CODES, stage_index

BEGIN, END = "<!-- codes:begin -->", "<!-- codes:end -->"


def table() -> str:
    rows = ["| code | severity | title | what to do |", "|---|---|---|---|"]
    for spec in sorted(CODES.values(), key=lambda s: (stage_index(s.stage), s.code)):
        rows.append(f"| `{spec.code}` | {spec.severity} | {spec.title} | "
                    f"{spec.hint.replace('|', '/')} |")
    return "\n".join(rows)


if __name__ == "__main__":
    path = Path(__file__).with_name("findings.md")
    text = path.read_text()
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    path.write_text(f"{head}{BEGIN}\n{table()}\n{END}{tail}")
