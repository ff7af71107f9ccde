"""The report in the terminal: a short summary printed with rich (start here, one line per
problem, the info codes, the checks, where the files are).

Report text is shown as typed (no rich markup), without control characters; long texts are cut
(the files hold them in full).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_triage.findings import SEVERITIES, stage_line
from lightning_triage.report.files import HTML_NAME, stale_files
from lightning_triage.report.text import baseline_line, lead_finding, lead_trial, plain, trial_hint

_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}
_MARK = {"error": "x", "warning": "!", "info": "i"}
#: The console shows at most this many characters of a message (the files hold it in full).
CONSOLE_CHARS = 600


def _counts(report: Mapping[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = dict.fromkeys(SEVERITIES, 0)
    for f in report.get("findings", []):
        counts[f["severity"]] = counts.get(f["severity"], 0) + 1
    return counts


def _problem_line(f: Mapping[str, Any], width: int) -> Any:
    from rich.text import Text

    sev = f["severity"]
    where = "" if f["global_step"] is None else f"step {f['global_step']}"
    if f.get("layer"):
        where += f" `{plain(f['layer'])}`"
    line = Text.assemble((f"  {_MARK[sev]} ", _STYLE[sev]), f"{plain(f['code']):<{width}}  ",
                         (f"{where}  " if where else "", "cyan"), plain(f["title"]))
    explained = f.get("explained_by") or []
    if explained:
        line.append(plain(f" (explained by {', '.join(explained)})"), style="dim")
    return line


def print_report(report: Mapping[str, Any], console: Any | None = None,
                 path: Path | None = None) -> None:
    """Print a short summary with rich: "start here" (what, why, next), then one line per
    problem (severity, code, step, title) and the info codes on one line. The full messages
    are in the files (``path``: the JSON; the HTML and Markdown lie beside it). Report text is
    shown as typed (no rich markup), without control characters, long texts cut.
    """
    from rich.console import Console
    from rich.padding import Padding
    from rich.text import Text

    console = console or Console()
    run = report.get("run", {})
    step = f", step {run['global_step']}" if "global_step" in run else ""
    console.rule(Text(f"lightning-triage: {plain(run.get('model', 'run'), 80)} "
                      f"({report['status']}{step})"))
    lead = lead_finding(report)
    if lead is not None:
        console.print(Text.assemble(("Start here: ", "bold"), (lead["code"], "bold red"),
                                    f" {plain(lead['title'])}"))
        console.print(Padding(Text(stage_line(lead["code"]), style="dim"), (0, 0, 0, 2)))
        console.print(Padding(Text(plain(lead["message"], CONSOLE_CHARS)), (0, 0, 0, 2)))
        console.print(Padding(Text.assemble(("Next: ", "bold"), plain(trial_hint(lead), CONSOLE_CHARS)),
                              (0, 0, 0, 2)))
        trial = lead_trial(report, lead)
        if trial is not None:  # the lead's fix tried on a copy (docs/remedies.md)
            console.print(Padding(Text.assemble(("Remedy: ", "bold"), plain(trial, CONSOLE_CHARS)),
                                  (0, 0, 0, 2)))
    else:
        console.print(Text("No problems found.", style="bold green"))
    counts = _counts(report)
    problems = [f for f in report.get("findings", []) if f["severity"] != "info"]
    if problems:
        console.print(Text(f"Findings: {counts['error']} error(s), {counts['warning']} "
                           f"warning(s), {counts['info']} info", style="bold"))
        width = max(len(f["code"]) for f in problems)
        for f in problems:
            console.print(_problem_line(f, width), no_wrap=True, overflow="ellipsis", crop=True)
    infos = [f["code"] for f in report.get("findings", []) if f["severity"] == "info"]
    if infos:
        console.print(Text(plain(f"  info: {', '.join(dict.fromkeys(infos))}", 2000), style="dim"),
                      no_wrap=True, overflow="ellipsis", crop=True)
    baselines = baseline_line(report)
    if baselines is not None:
        console.print(Text(plain(baselines, 400)))
    checks = report.get("checks", [])
    failed = sum(c["status"] in ("failed", "error") for c in checks)
    passed = sum(c["status"] == "passed" for c in checks)
    console.print(Text(f"checks: {passed} passed, {failed} failed, "
                       f"{len(checks) - passed - failed} skipped"))
    if path is not None:
        _print_where(console, Path(path), report)


def _print_where(console: Any, path: Path, report: Mapping[str, Any]) -> None:
    from rich.text import Text

    html = path.with_name(HTML_NAME)
    stale = stale_files(path, report)
    for other in stale:
        console.print(Text(f"note: {plain(other, 400)} is from another run than {plain(path, 400)}"
                           " (a run stopped while writing, or files of different runs)",
                           style="yellow"))
    shown_path = html if html.exists() and html not in stale else path
    console.print(Text(f"full report: {plain(shown_path, 400)}"))
