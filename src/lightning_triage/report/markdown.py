"""The report as Markdown: start here, findings by stage, checks.

Every string of the report is text in the file: Markdown and HTML syntax escaped, table cells
kept on one line, no control, bidi or surrogate character.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from lightning_triage.findings import stage_line
from lightning_triage.report.safe import visible
from lightning_triage.report.text import lead_finding, lead_trial, run_id_marker, trial_hint

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def _md_text(text: Any) -> str:
    """Report text as Markdown text: on one line, Markdown and HTML syntax escaped (``>`` can
    only start a quote at the start of a line: it stays)."""
    text = _MD_SPECIAL.sub(r"\\\1", _CONTROL.sub(" ", str(text)))
    return text.replace("&", "&amp;").replace("<", "&lt;")


def _md_span(text: Any, table: bool = False) -> str:
    """A value as an inline code span (shown verbatim; backticks become quotes); a value that
    holds ``<`` (HTML, which some renderers read even in a code span) as an HTML ``<code>``
    element around escaped text instead, so no raw HTML of the report's reaches the file."""
    text = _CONTROL.sub(" ", str(text))
    if "<" in text:
        return f"<code>{_md_text(text)}</code>"
    span = "`" + text.replace("`", "'") + "`"
    return span.replace("|", "\\|") if table else span


def _md_code(text: Any, table: bool = False) -> str:
    """A message as Markdown: its `backtick` spans as code, the rest as escaped text."""
    parts = str(text).split("`")
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            out.append(_md_text(part))
        elif i == len(parts) - 1:  # an unmatched backtick: literal
            out.append("\\`" + _md_text(part))
        elif part.strip(" "):
            out.append(_md_span(part, table))
    return "".join(out)


def step_calls_line(run: Mapping[str, Any]) -> str | None:
    """How often the fit ran the user's ``training_step`` (``None``: not recorded).

    Example:
        >>> step_calls_line({"training_step_calls": {"fit": 12, "probes": 56, "trial": 30}})
        '`training_step` calls: 12 real steps, 56 by the probes, 30 by the remedy trial (on copies)'
    """
    calls = run.get("training_step_calls")
    if not isinstance(calls, Mapping):
        return None
    def n(key: str) -> Any:
        return calls.get(key, 0)
    return (f"`training_step` calls: {n('fit')} real steps, {n('probes')} by the probes, "
            f"{n('trial')} by the remedy trial (on copies)")


def render_markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown: start here, findings by stage, checks. Every string of the
    report is text (Markdown and HTML syntax escaped, table cells kept on one line)."""
    run_id = report.get("run", {}).get("run_id")
    lines = [run_id_marker(run_id, "md")] if isinstance(run_id, str) and run_id else []
    report = visible(report)  # no control, bidi or surrogate character reaches the file
    run = report.get("run", {})
    lines += ["# lightning-triage report", ""]
    lines.append(f"Status: **{_md_text(report['status'])}**"
                 + (f" at step {_md_text(run['global_step'])}" if "global_step" in run else "")
                 + (f", model {_md_span(run['model'])}" if run.get("model") else ""))
    calls = step_calls_line(run)
    if calls:
        lines += ["", _md_text(calls)]
    lines.append("")
    lead = lead_finding(report)
    if lead is not None:
        lines += [f"## Start here: {_md_span(lead['code'])}", "",
                  _md_text(stage_line(lead['code'])), "",
                  f"**{_md_text(lead['title'])}.** {_md_code(lead['message'])}", "",
                  f"Next: {_md_code(trial_hint(lead))}", ""]
        trial = lead_trial(report, lead)
        if trial is not None:  # the lead's fix tried on a copy (docs/remedies.md)
            lines += [f"Remedy: {_md_code(trial)}", ""]
    else:
        lines += ["## No problems found", ""]
    if report["findings"]:
        lines += ["## Findings", "", "| severity | code | step | layer | message |",
                  "|---|---|---|---|---|"]
        for f in report["findings"]:
            step = "" if f["global_step"] is None else _md_text(f["global_step"])
            layer = _md_span(f["layer"], table=True) if f["layer"] else ""
            lines.append(f"| {_md_text(f['severity'])} | {_md_span(f['code'], table=True)} | "
                         f"{step} | {layer} | {_md_code(f['message'], table=True)} |")
        lines.append("")
    if report["checks"]:
        lines += ["## Checks", "", "| check | status | detail |", "|---|---|---|"]
        for c in report["checks"]:
            lines.append(f"| {_md_text(c['check'])} | {_md_text(c['status'])} | "
                         f"{_md_code(c['detail'], table=True)} |")
        lines.append("")
    return "\n".join(lines)
