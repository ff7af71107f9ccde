"""The triage report: build it, validate it, write it as JSON and Markdown, print it.

Schema ``lightning-triage/report/1`` (see ``DESIGN.md``); :data:`REPORT_SCHEMA` is its JSON
Schema. Pure functions over findings and plain values: no Trainer needed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from lightning_triage.findings import (
    SEVERITIES,
    Finding,
    explain_findings,
    sort_findings,
    start_here,
)

SCHEMA_ID = "lightning-triage/report/1"
ReportStatus = Literal["completed", "interrupted", "crashed"]
JSON_NAME = "triage_report.json"
MARKDOWN_NAME = "triage_report.md"

_FINDING_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["code", "severity", "title", "message", "hint", "global_step", "epoch", "rank",
                 "layer", "evidence", "check"],
    "additionalProperties": False,
    "properties": {
        "code": {"type": "string", "pattern": r"^[a-z_]+\.[a-z_0-9]+$"},
        "severity": {"enum": list(SEVERITIES)},
        "title": {"type": "string"},
        "message": {"type": "string"},
        "hint": {"type": "string"},
        "global_step": {"type": ["integer", "null"], "minimum": 0},
        "epoch": {"type": ["integer", "null"], "minimum": 0},
        "rank": {"type": "integer", "minimum": 0},
        "layer": {"type": ["string", "null"]},
        "evidence": {"type": "object"},
        "check": {"type": "string"},
        # codes of the findings that explain this one (a symptom); empty for a cause. Optional:
        # reports written before it was added stay valid.
        "explained_by": {"type": "array", "items": {"type": "string"}},
    },
}

#: JSON Schema of the report (draft 2020-12).
REPORT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": SCHEMA_ID,
    "type": "object",
    "required": ["schema", "status", "start_here", "run", "findings", "checks", "series"],
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "status": {"enum": ["completed", "interrupted", "crashed"]},
        "start_here": {"type": ["string", "null"]},
        "run": {
            "type": "object",
            "required": ["lightning", "torch", "precision", "strategy", "world_size",
                         "global_step", "epochs", "model", "trainable_params"],
            "properties": {
                "lightning": {"type": "string"},
                "torch": {"type": "string"},
                "precision": {"type": "string"},
                "strategy": {"type": "string"},
                "world_size": {"type": "integer", "minimum": 1},
                "global_step": {"type": "integer", "minimum": 0},
                "epochs": {"type": "integer", "minimum": 0},
                "model": {"type": "string"},
                "trainable_params": {"type": "integer", "minimum": 0},
            },
        },
        "findings": {"type": "array", "items": _FINDING_SCHEMA},
        "checks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["check", "status", "detail"],
                "properties": {
                    "check": {"type": "string"},
                    "status": {"enum": ["passed", "failed", "skipped", "error"]},
                    "detail": {"type": "string"},
                },
            },
        },
        "series": {
            "type": "object",
            "additionalProperties": {
                "type": "array",
                "items": {"type": "array", "prefixItems": [{"type": "integer"},
                                                           {"type": ["number", "null"]}],
                          "minItems": 2, "maxItems": 2},
            },
        },
    },
}


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def build_report(
    findings: Sequence[Finding],
    *,
    status: ReportStatus,
    run: Mapping[str, Any],
    checks: Sequence[Mapping[str, str]] = (),
    series: Mapping[str, Sequence[Sequence[float]]] | None = None,
) -> dict[str, Any]:
    """Assemble the report dict: findings sorted by stage then step, each symptom's
    ``explained_by`` set (:func:`~lightning_triage.findings.explain_findings`), ``start_here``
    computed (cause before symptom, then protocol order).

    Example:
        >>> f = Finding.create("init.loss_above_chance", "loss 33.9", check="InitialLossCheck",
        ...                    global_step=0)
        >>> report = build_report([f], status="completed", run={})
        >>> report["start_here"], report["schema"]
        ('init.loss_above_chance', 'lightning-triage/report/1')
    """
    ordered = sort_findings(explain_findings(findings))
    return {
        "schema": SCHEMA_ID,
        "status": status,
        "start_here": start_here(ordered),
        "run": dict(run),
        "findings": [f.to_dict() for f in ordered],
        "checks": [dict(c) for c in checks],
        "series": {
            name: [[int(step), _finite_or_none(float(value))] for step, value in points]
            for name, points in (series or {}).items()
        },
    }


def render_markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown: start here, findings by stage, checks."""
    lines = ["# lightning-triage report", ""]
    run = report.get("run", {})
    lines.append(f"Status: **{report['status']}**"
                 + (f" at step {run['global_step']}" if "global_step" in run else "")
                 + (f", model `{run['model']}`" if run.get("model") else ""))
    lines.append("")
    first = report.get("start_here")
    if first:
        lead = next(f for f in report["findings"] if f["code"] == first)
        lines += [f"## Start here: `{first}`", "", f"**{lead['title']}.** {lead['message']}", "",
                  f"Next: {lead['hint']}", ""]
    else:
        lines += ["## No problems found", ""]
    if report["findings"]:
        lines += ["## Findings", "", "| severity | code | step | layer | message |",
                  "|---|---|---|---|---|"]
        for f in report["findings"]:
            message = str(f["message"]).replace("|", "\\|").replace("\n", " ")
            step = "" if f["global_step"] is None else f["global_step"]
            layer = f"`{f['layer']}`" if f["layer"] else ""
            lines.append(f"| {f['severity']} | `{f['code']}` | {step} | {layer} | {message} |")
        lines.append("")
    if report["checks"]:
        lines += ["## Checks", "", "| check | status | detail |", "|---|---|---|"]
        for c in report["checks"]:
            lines.append(f"| {c['check']} | {c['status']} | {c['detail']} |")
        lines.append("")
    return "\n".join(lines)


def write_report(report: Mapping[str, Any], directory: str | Path) -> list[Path]:
    """Write ``triage_report.json`` and ``triage_report.md`` into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / JSON_NAME
    json_path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    md_path = directory / MARKDOWN_NAME
    md_path.write_text(render_markdown(report))
    return [json_path, md_path]


_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}


def print_report(report: Mapping[str, Any], console: Any | None = None,
                 path: Path | None = None) -> None:
    """Print a concise summary with rich, leading with "start here"."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    run = report.get("run", {})
    console.rule(f"lightning-triage: {run.get('model', 'run')} ({report['status']})")
    first = report.get("start_here")
    if first:
        lead = next(f for f in report["findings"] if f["code"] == first)
        console.print(f"[bold]Start here:[/bold] [bold red]{first}[/bold red] {lead['title']}",
                      highlight=False)
        console.print(f"  {lead['message']}", highlight=False)
        console.print(f"  [bold]Next:[/bold] {lead['hint']}", highlight=False)
    else:
        console.print("[bold green]No problems found.[/bold green]")
    if report["findings"]:
        table = Table(show_header=True, header_style="bold", expand=False)
        for column in ("severity", "code", "step", "layer", "message"):
            table.add_column(column, overflow="fold")
        for f in report["findings"]:
            sev = f["severity"]
            table.add_row(f"[{_STYLE[sev]}]{sev}[/]", f["code"],
                          "" if f["global_step"] is None else str(f["global_step"]),
                          f["layer"] or "", f["message"])
        console.print(table)
    failed = [c for c in report["checks"] if c["status"] in ("failed", "error")]
    passed = sum(c["status"] == "passed" for c in report["checks"])
    console.print(f"checks: {passed} passed, {len(failed)} failed, "
                  f"{len(report['checks']) - passed - len(failed)} skipped"
                  + (f"; report: {path}" if path else ""), highlight=False)
