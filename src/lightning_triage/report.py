"""The triage report: build it, validate it, write it as JSON and Markdown, print it.

Schema ``lightning-triage/report/1`` (see ``docs/design.md``); :data:`REPORT_SCHEMA` is its JSON
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
    stage_line,
    start_here,
)
from lightning_triage.suspicions import settle_suspicions

SCHEMA_ID = "lightning-triage/report/1"
ReportStatus = Literal["completed", "interrupted", "crashed"]
JSON_NAME = "triage_report.json"
MARKDOWN_NAME = "triage_report.md"
HTML_NAME = "triage_report.html"
#: The lowest severity that fails a CI gate (``fail_on``), or ``None`` for never.
FailOn = Literal["error", "warning", "info"]

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
        "details": {
            "type": "object",
            "description": "optional, bounded extras for the HTML report (first batch, per-layer "
                           "gradient norms, step-0 loss and chance level)",
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


def _agree(check: Mapping[str, str], findings: Sequence[Finding]) -> dict[str, str]:
    """A check's entry, ``failed`` only while one of its findings is still a problem (a
    suspicion the run did not confirm is info)."""
    out = dict(check)
    if out.get("status") == "failed" and not any(
            f.is_problem for f in findings if f.check == out.get("check")):
        out["status"] = "passed"
    return out


def build_report(
    findings: Sequence[Finding],
    *,
    status: ReportStatus,
    run: Mapping[str, Any],
    checks: Sequence[Mapping[str, str]] = (),
    series: Mapping[str, Sequence[Sequence[float]]] | None = None,
    details: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble the report dict: each suspicion that the run does not confirm made info
    (:func:`~lightning_triage.suspicions.settle_suspicions`), findings sorted by stage then
    step, each symptom's ``explained_by`` set
    (:func:`~lightning_triage.findings.explain_findings`), ``start_here`` computed (cause
    before symptom, then protocol order), and a ``failed`` check whose findings all became info
    reported ``passed``.

    ``details`` (optional, JSON-ready, bounded) holds what the HTML report draws beyond the
    series: ``first_batch``, ``grad_layers``, ``initial_loss``, ``chance``.

    Example:
        >>> f = Finding.create("init.loss_above_chance", "loss 33.9", check="InitialLossCheck",
        ...                    global_step=0)
        >>> report = build_report([f], status="completed", run={})
        >>> report["start_here"], report["schema"]
        ('init.loss_above_chance', 'lightning-triage/report/1')
    """
    ordered = sort_findings(explain_findings(settle_suspicions(findings)))
    return {
        "schema": SCHEMA_ID,
        "status": status,
        "start_here": start_here(ordered),
        "run": dict(run),
        "findings": [f.to_dict() for f in ordered],
        "checks": [_agree(c, ordered) for c in checks],
        "series": {
            name: [[int(step), _finite_or_none(float(value))] for step, value in points]
            for name, points in (series or {}).items()
        },
        "details": dict(details or {}),
    }


def problems_at(report: Mapping[str, Any], severity: FailOn) -> list[dict[str, Any]]:
    """The findings of ``report`` at ``severity`` or worse (``"warning"``: warnings and errors).

    Example:
        >>> f = Finding.create("curve.lr_too_high", "noisy", check="LossCurveMonitor")
        >>> report = build_report([f], status="completed", run={})
        >>> [x["code"] for x in problems_at(report, "error")], len(problems_at(report, "warning"))
        ([], 1)
    """
    if severity not in SEVERITIES:
        raise ValueError(f"`severity` must be one of {SEVERITIES}, got {severity!r}.")
    worst = SEVERITIES.index(severity)
    return [dict(f) for f in report.get("findings", []) if SEVERITIES.index(f["severity"]) <= worst]


def describe_findings(findings: Sequence[Mapping[str, Any]]) -> str:
    """One line per finding: ``severity code (step N, layer L): title``."""
    lines = []
    for f in findings:
        where = ", ".join(x for x in (
            "" if f.get("global_step") is None else f"step {f['global_step']}",
            f"layer `{f['layer']}`" if f.get("layer") else "") if x)
        lines.append(f"- {f['severity']} {f['code']}" + (f" ({where})" if where else "")
                     + f": {f['title']}")
    return "\n".join(lines)


class TriageGateError(AssertionError):
    """Raised at the end of fit by ``Triage(fail_on=...)`` when the report holds findings at or
    above that severity (after the report is written), and by
    :func:`lightning_triage.testing.assert_no_findings`.

    Attributes:
        findings: the offending findings (report dicts).
        path: the written JSON report, when there is one.

    Example:
        >>> err = TriageGateError([{"code": "init.loss_above_chance", "severity": "warning",
        ...                         "title": "Step-0 loss is far above chance level"}], "warning")
        >>> len(err.findings), err.severity
        (1, 'warning')
    """

    def __init__(self, findings: Sequence[Mapping[str, Any]], severity: str,
                 path: str | Path | None = None) -> None:
        self.findings = [dict(f) for f in findings]
        self.severity = severity
        self.path = None if path is None else Path(path)
        where = f"; full report: {self.path}" if self.path is not None else ""
        super().__init__(
            f"lightning-triage found {len(self.findings)} finding(s) at severity "
            f"'{severity}' or worse{where}\n{describe_findings(self.findings)}")


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
        lines += [f"## Start here: `{first}`", "", f"*{stage_line(first)}*", "",
                  f"**{lead['title']}.** {lead['message']}", "", f"Next: {lead['hint']}", ""]
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


def write_report(report: Mapping[str, Any], directory: str | Path, *,
                 html: bool = True) -> list[Path]:
    """Write ``triage_report.json``, ``triage_report.md`` and (``html``) the self-contained
    ``triage_report.html`` into ``directory``; return their paths, the JSON first."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / JSON_NAME
    json_path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    md_path = directory / MARKDOWN_NAME
    md_path.write_text(render_markdown(report))
    paths = [json_path, md_path]
    if html:
        from lightning_triage.html import render_html

        html_path = directory / HTML_NAME
        html_path.write_text(render_html(report), encoding="utf-8")
        paths.append(html_path)
    return paths


def load_report(source: str | Path) -> dict[str, Any]:
    """Read a saved report: a JSON file, or a directory holding ``triage_report.json`` (directly
    or below it: the most recent one).

    Raises:
        FileNotFoundError: no report there.
        ValueError: the file is not a lightning-triage report.
    """
    path = find_report(source)
    try:
        report = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(report, dict) or report.get("schema") != SCHEMA_ID:
        raise ValueError(f"{path} is not a lightning-triage report (schema {SCHEMA_ID!r}).")
    return report


def find_report(source: str | Path) -> Path:
    """The JSON report ``source`` names: the file itself, ``source/triage_report.json``, or the
    most recently written one below the directory ``source``."""
    path = Path(source)
    if path.is_file():
        return path
    if path.is_dir():
        if (path / JSON_NAME).is_file():
            return path / JSON_NAME
        found = sorted(path.rglob(JSON_NAME), key=lambda p: p.stat().st_mtime)
        if found:
            return found[-1]
    raise FileNotFoundError(f"No lightning-triage report at {str(path)!r} (looked for {JSON_NAME}).")


_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}
_MARK = {"error": "x", "warning": "!", "info": "i"}


def _lead(report: Mapping[str, Any]) -> dict[str, Any] | None:
    first = report.get("start_here")
    return next((f for f in report.get("findings", []) if f["code"] == first), None) \
        if first else None


def _counts(report: Mapping[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = dict.fromkeys(SEVERITIES, 0)
    for f in report.get("findings", []):
        counts[f["severity"]] = counts.get(f["severity"], 0) + 1
    return counts


def print_report(report: Mapping[str, Any], console: Any | None = None,
                 path: Path | None = None) -> None:
    """Print a short summary with rich: "start here" (what, why, next), then one line per
    problem (severity, code, step, title) and the info codes on one line. The full messages
    are in the files (``path``: the JSON; the HTML and Markdown lie beside it).
    """
    from rich.console import Console
    from rich.padding import Padding
    from rich.text import Text

    console = console or Console()
    run = report.get("run", {})
    step = f", step {run['global_step']}" if "global_step" in run else ""
    console.rule(f"lightning-triage: {run.get('model', 'run')} ({report['status']}{step})")
    lead = _lead(report)
    if lead is not None:
        console.print(Text.assemble(("Start here: ", "bold"), (lead["code"], "bold red"),
                                    f" {lead['title']}"))
        console.print(Padding(Text(stage_line(lead["code"]), style="dim"), (0, 0, 0, 2)))
        console.print(Padding(Text(lead["message"]), (0, 0, 0, 2)))
        console.print(Padding(Text.assemble(("Next: ", "bold"), lead["hint"]), (0, 0, 0, 2)))
    else:
        console.print(Text("No problems found.", style="bold green"))
    counts = _counts(report)
    problems = [f for f in report.get("findings", []) if f["severity"] != "info"]
    if problems:
        console.print(Text(f"Findings: {counts['error']} error(s), {counts['warning']} "
                           f"warning(s), {counts['info']} info", style="bold"))
        width = max(len(f["code"]) for f in problems)
        for f in problems:
            sev = f["severity"]
            where = "" if f["global_step"] is None else f"step {f['global_step']}"
            if f.get("layer"):
                where += f" `{f['layer']}`"
            line = Text.assemble((f"  {_MARK[sev]} ", _STYLE[sev]), f"{f['code']:<{width}}  ",
                                 (f"{where}  " if where else "", "cyan"), f["title"])
            explained = f.get("explained_by") or []
            if explained:
                line.append(f" (explained by {', '.join(explained)})", style="dim")
            console.print(line, no_wrap=True, overflow="ellipsis", crop=True)
    infos = [f["code"] for f in report.get("findings", []) if f["severity"] == "info"]
    if infos:
        console.print(Text(f"  info: {', '.join(dict.fromkeys(infos))}", style="dim"),
                      no_wrap=True, overflow="ellipsis", crop=True)
    checks = report.get("checks", [])
    failed = sum(c["status"] in ("failed", "error") for c in checks)
    passed = sum(c["status"] == "passed" for c in checks)
    console.print(Text(f"checks: {passed} passed, {failed} failed, "
                       f"{len(checks) - passed - failed} skipped"))
    if path is not None:
        html = Path(path).with_name(HTML_NAME)
        console.print(Text(f"full report: {html if html.exists() else path}"))
