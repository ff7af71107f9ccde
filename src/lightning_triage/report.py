"""The triage report: build it, validate it, write it as JSON and Markdown, print it.

Schema ``lightning-triage/report/1`` (see ``docs/schema.md``); :data:`REPORT_SCHEMA` is its JSON
Schema, and :func:`load_report` the one way to read a saved report (it validates). Pure
functions over findings and plain values: no Trainer needed.

Every string of a report is text in every output: the Markdown escapes Markdown and HTML
syntax, the console shows rich markup as typed and drops control characters (long texts are
cut there; the files hold them in full).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from lightning_triage.codes.remedies import REMEDIES, remedy_spec
from lightning_triage.errors import TriageReportError
from lightning_triage.findings import (
    CODES,
    SEVERITIES,
    Finding,
    stage_line,
)
from lightning_triage.ranking import rank
from lightning_triage.report_files import directory_lock, other_runs, run_id_marker, stage
from lightning_triage.report_safe import SafeNotes, describe, json_safe, terminal_text, visible
from lightning_triage.schema import REPORT_SCHEMA as REPORT_SCHEMA
from lightning_triage.schema import SCHEMA_ID, one_line, validate_report

ReportStatus = Literal["completed", "interrupted", "crashed"]
JSON_NAME = "triage_report.json"
MARKDOWN_NAME = "triage_report.md"
HTML_NAME = "triage_report.html"
#: The lowest severity that fails a CI gate (``fail_on``), or ``None`` for never.
FailOn = Literal["error", "warning", "info"]

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
    (:func:`~lightning_triage.ranking.settle_suspicions`), findings sorted by stage then
    step, each symptom's ``explained_by`` set
    (:func:`~lightning_triage.ranking.explain_findings`), ``start_here`` computed (cause
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
    ordered, lead = rank(findings)
    return {
        "schema": SCHEMA_ID,
        "status": status,
        "start_here": lead,
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
            f"layer `{plain(f['layer'])}`" if f.get("layer") else "") if x)
        lines.append(f"- {f['severity']} {f['code']}" + (f" ({where})" if where else "")
                     + f": {plain(f['title'])}")
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


# ---------------------------------------------------------------------------- remedy
def _loss_text(entry: Any) -> str:
    if not isinstance(entry, dict):
        return "?"
    if entry.get("finite") is False or entry.get("loss") is None:
        at = entry.get("nonfinite_at_step")
        return "non-finite" + ("" if at is None else f" (step {at})")
    return f"{float(entry['loss']):.4g}"


def _outputs_text(entry: dict[str, Any]) -> str:
    if entry.get("deterministic"):
        return "identical"
    diff = entry.get("difference")
    return (f"differ (largest difference {diff:.3g} of the output's magnitude)"
            if isinstance(diff, (int, float)) else "differ")


def _eval_trial_text(remedy: dict[str, Any], before: dict[str, Any],
                     after: dict[str, Any]) -> str:
    """A mode-stage trial (two validation passes from two random states, each way)."""
    text = (f"{remedy_spec(remedy.get('kind')).short or remedy.get('change', '')}, "
            f"validation outputs from two random states {_outputs_text(before)} -> "
            f"{_outputs_text(after)}")
    if before.get("buffers_changed"):
        text += (f", running statistics updated ({before['buffers_changed']}) -> "
                 f"{after.get('buffers_changed') or 'none'}")
    if isinstance(before.get("loss"), (int, float)) and isinstance(after.get("loss"), (int, float)):
        text += f", validation loss {before['loss']:.4g} -> {after['loss']:.4g}"
    return text


def remedy_line(code: str, remedy: dict[str, Any] | None) -> str | None:
    """One line on the remedy trial of a finding, for the console, the Markdown and the HTML
    (``None``: nothing to say). Codes whose evidence is causal say so without a trial.

    Example:
        >>> remedy_line("curve.lr_too_high", {"kind": "lr_down", "verdict": "confirmed",
        ...     "change": "every param group's learning rate / 10 (lr 0.1 -> 0.01)",
        ...     "before": {"lr": 0.1, "loss": 4.1, "finite": True, "steps": 30},
        ...     "after": {"lr": 0.01, "loss": 0.62, "finite": True, "steps": 30}, "reason": ""})
        ... # doctest: +NORMALIZE_WHITESPACE
        "confirmed on a copy: lr 0.1 -> 0.01, loss after replaying the fit's first 30 steps from
        its start: 4.1 -> 0.62"
        >>> remedy_line("mode.nondeterministic_eval", {"kind": "gate_dropout",
        ...     "verdict": "confirmed", "change": "...", "reason": "",
        ...     "before": {"deterministic": False, "difference": 0.7, "loss": 2.47},
        ...     "after": {"deterministic": True, "difference": 0.0, "loss": 2.41}})[58:]
        ... # doctest: +NORMALIZE_WHITESPACE
        "validation outputs from two random states differ (largest difference 0.7 of the
        output's magnitude) -> identical, validation loss 2.47 -> 2.41"
        >>> remedy_line("structure.causal_leak", None)[:55]
        'no remedy trial needed: the evidence is already causal '
    """
    if remedy is None:
        spec = CODES.get(code)
        if spec is not None and REMEDIES[spec.remedy].family == "causal":
            return ("no remedy trial needed: the evidence is already causal (a probe on a copy "
                    "changed one input and watched the outputs)")
        return None
    verdict = remedy.get("verdict")
    if verdict == "skipped":
        return f"remedy not tried: {remedy.get('reason', '')}"
    before, after = remedy.get("before") or {}, remedy.get("after") or {}
    replayed = (f"replaying the fit's first {before['steps']} steps from its start"
                if isinstance(before.get("steps"), int) else "")
    if verdict == "inconclusive":
        where = f" ({replayed})" if replayed and "deterministic" not in before else ""
        return f"remedy inconclusive on a copy{where}: {remedy.get('reason', '')}"
    if remedy_spec(remedy.get("kind")).family == "float32":
        return f"{verdict} on a copy: the failing step is finite when replayed in float32"
    if "deterministic" in before:
        return f"{verdict} on a copy: " + _eval_trial_text(remedy, before, after)
    text = f"{verdict} on a copy: "
    if isinstance(before.get("lr"), (int, float)) and isinstance(after.get("lr"), (int, float)) \
            and before["lr"] != after["lr"]:
        text += f"lr {before['lr']:.3g} -> {after['lr']:.3g}, "
        if isinstance(after.get("clip"), (int, float)):
            text += f"gradients clipped at norm {after['clip']:.3g}, "
    else:
        text += f"{remedy.get('change', '')}, "
    text += (f"loss after {replayed or 'the replay'}: {_loss_text(before)} -> {_loss_text(after)}")
    if verdict == "not confirmed":
        tried = remedy.get("tried") or []
        if tried:
            text += f" (tried {', '.join(str(t) for t in tried)})"
        nxt = remedy.get("next_candidate")
        text += (f"; next candidate: `{nxt}`" if nxt else
                 "; no other candidate in this report")
    return text


_HINT_FACTOR = re.compile(r" \((?:\d+-)?\d+x\)| by (?:\d+-)?\d+x")


def trial_hint(lead: Mapping[str, Any]) -> str:
    """A finding's hint as the report shows it: where its learning-rate remedy was confirmed on
    a copy, the factor the trial measured replaces the registry's generic one, so that the hint
    and the remedy line agree.

    Example:
        >>> trial_hint({"hint": "Lower the learning rate (3-10x), add warmup.", "remedy": {
        ...     "verdict": "confirmed", "before": {"lr": 50.0}, "after": {"lr": 0.5}}})
        'Lower the learning rate (100x: lr 50 -> 0.5 worked on a copy), add warmup.'
        >>> trial_hint({"hint": "Raise the learning rate by 10x.", "remedy": None})
        'Raise the learning rate by 10x.'
    """
    hint = str(lead.get("hint", ""))
    remedy = lead.get("remedy")
    if not isinstance(remedy, Mapping) or remedy.get("verdict") != "confirmed":
        return hint
    given = [(remedy.get(side) or {}).get("lr") for side in ("before", "after")]
    lrs = [float(v) for v in given if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(lrs) != 2 or not all(math.isfinite(v) and v > 0 for v in lrs) or lrs[0] == lrs[1]:
        return hint
    old, new = lrs
    factor = max(old, new) / min(old, new)
    times = f"{round(factor):,}x" if abs(factor - round(factor)) < 1e-3 * factor else f"{factor:.3g}x"
    measured = f"{times}: lr {old:.3g} -> {new:.3g} worked on a copy"
    shown, n = _HINT_FACTOR.subn(f" ({measured})", hint, count=1)
    return shown if n else f"{hint} (Measured on a copy: lr {old:.3g} -> {new:.3g}.)"


def lead_trial(report: Mapping[str, Any], lead: Mapping[str, Any]) -> str | None:
    """The remedy line shown under the report's lead: its own trial (:func:`remedy_line`), or,
    for a lead that became the lead because another finding's remedy was not confirmed on a
    copy (it names the lead as its next candidate), that trial with the finding's code.

    Example:
        >>> low = {"code": "curve.lr_too_low", "remedy": {"kind": "lr_up", "verdict":
        ...        "not confirmed", "change": "lr x 10", "next_candidate": "overfit.loss_floor",
        ...        "before": {"steps": 30, "loss": 2.31}, "after": {"steps": 30, "loss": 2.28},
        ...        "tried": ["x10"]}}
        >>> floor = {"code": "overfit.loss_floor"}
        >>> lead_trial({"findings": [floor, low]}, floor)[:61]
        'on `curve.lr_too_low`: not confirmed on a copy: lr x 10, loss'
    """
    own = remedy_line(lead["code"], lead.get("remedy"))
    if own is not None:
        return own
    for f in report.get("findings", []):
        remedy = f.get("remedy")
        if isinstance(remedy, Mapping) and remedy.get("verdict") == "not confirmed" \
                and remedy.get("next_candidate") == lead["code"]:
            line = remedy_line(f["code"], dict(remedy))
            return None if line is None else f"on `{f['code']}`: {line}"
    return None


# ---------------------------------------------------------------------------- Markdown
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
    lead = _lead(report)
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


# ---------------------------------------------------------------------------- files
def with_run_id(report: Mapping[str, Any]) -> dict[str, Any]:
    """``report`` with a ``run.run_id`` (a new random one if it has none)."""
    run = dict(report.get("run", {}))
    run.setdefault("run_id", uuid.uuid4().hex)
    return {**report, "run": run}


def write_report(report: Mapping[str, Any], directory: str | Path, *,
                 html: bool = True) -> list[Path]:
    """Write ``triage_report.json``, ``triage_report.md`` and (``html``) the self-contained
    ``triage_report.html`` into ``directory``; return the paths written, the JSON first.

    The JSON is the source of truth: the report is first made safe to write
    (:func:`~lightning_triage.report_safe.json_safe`: lone surrogates replaced, integers no JSON
    reader holds written as strings, each change counted in ``notes``), then the Markdown and
    the HTML are rendered from the JSON's own data, each on its own: a renderer that fails
    leaves the other files, says so on stderr and in the JSON's ``notes``, and removes its
    file of an earlier run. The files carry the report's ``run.run_id`` (one is added when the
    report has none) and are written atomically, the JSON first, under the directory's lock
    (:mod:`lightning_triage.report_files`): a failed write leaves the previous file as it was,
    and two writers to one directory do not mix files.

    Raises:
        OSError: when the JSON cannot be written (a Markdown or HTML file that cannot be
            written is told on stderr and left out).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    changes = SafeNotes()
    data = json_safe(with_run_id(report), changes)
    # the renderers read what a reader of the JSON reads
    data = json.loads(json.dumps(data, allow_nan=False))
    notes = [str(n) for n in data.get("notes", []) if isinstance(n, str)] \
        if isinstance(data.get("notes"), list) else []
    notes += changes.notes()
    renderers: list[tuple[str, Callable[[Mapping[str, Any]], str]]] = [
        (MARKDOWN_NAME, render_markdown)]
    if html:
        from lightning_triage.html import render_html

        renderers.append((HTML_NAME, render_html))
    staged: dict[Path, Path] = {}
    failed: list[Path] = []
    try:
        for name, render in renderers:
            try:
                text = render(data)
                staged[directory / name] = stage(directory / name, text)
            except Exception as exc:  # one renderer's failure costs only its own file
                problem = f"{name} was not written: {type(exc).__name__}: {describe(exc)[:300]}"
                notes.append(problem)
                failed.append(directory / name)
                print(f"lightning-triage: {terminal_text(problem)}", file=sys.stderr)
        if notes:
            data["notes"] = notes
        json_text = json.dumps(data, indent=2, allow_nan=False) + "\n"
        json_tmp = stage(directory / JSON_NAME, json_text)
        with directory_lock(directory):
            os.replace(json_tmp, directory / JSON_NAME)
            for path in list(staged):
                os.replace(staged.pop(path), path)
            for path in failed:  # never leave an earlier run's file beside this report
                with contextlib.suppress(OSError):
                    if path.is_file() and not path.is_symlink():
                        path.unlink()
    finally:
        for tmp in staged.values():
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    names = [MARKDOWN_NAME] + ([HTML_NAME] if html else [])
    return [directory / JSON_NAME] + [directory / n for n in names if directory / n not in failed]


def minimal_report(findings: Sequence[Finding | Mapping[str, Any]], *, status: ReportStatus,
                   run: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The smallest valid report holding ``findings`` as they are (not settled, not explained):
    what is written when the full report cannot be built. ``run`` values of the wrong type are
    replaced by placeholders.

    Example:
        >>> f = Finding.create("grad.exploding", "norm 1e9", check="GradientMonitor")
        >>> r = minimal_report([f], status="crashed")
        >>> r["start_here"], r["run"]["model"]
        ('grad.exploding', 'unknown')
    """
    run_in = dict(run or {})
    placeholders: dict[str, Any] = {"lightning": "unknown", "torch": "unknown",
                                    "precision": "unknown", "strategy": "unknown",
                                    "world_size": 1, "global_step": 0, "epochs": 0,
                                    "model": "unknown", "trainable_params": 0}
    out_run: dict[str, Any] = {}
    for key, default in placeholders.items():
        value = run_in.get(key, default)
        ok = isinstance(value, type(default)) and not isinstance(value, bool) and (
            not isinstance(value, int) or value >= (1 if key == "world_size" else 0))
        out_run[key] = value if ok else default
    for key, value in run_in.items():
        out_run.setdefault(key, value)
    items: list[dict[str, Any]] = []
    for f in findings:
        item = f.to_dict() if isinstance(f, Finding) else dict(f)
        items.append(item)
    items = [f for f in items if isinstance(f.get("code"), str)]
    order = {sev: i for i, sev in enumerate(SEVERITIES)}
    problems = sorted((f for f in items if f.get("severity") in ("error", "warning")),
                      key=lambda f: order[f["severity"]])
    return {"schema": SCHEMA_ID, "status": status,
            "start_here": problems[0]["code"] if problems else None,
            "run": out_run, "findings": items, "checks": [], "series": {}, "details": {}}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_report(text: str | bytes, source: Any = None) -> dict[str, Any]:
    """Parse and validate the text of a report (:func:`validate_report`).

    Raises:
        TriageReportError: not JSON (NaN and Infinity are not), nested too deeply, or not valid.
    """
    where = f"{one_line(str(source))}: " if source is not None else ""
    try:
        report = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise TriageReportError(f"{where}not a valid lightning-triage report: nested too "
                                "deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise TriageReportError(f"{where}not valid JSON: {one_line(str(exc))[:200]}") from None
    validate_report(report, source)
    return dict(report)


def load_report(source: str | Path) -> dict[str, Any]:
    """Read a saved report: a JSON file, or a directory holding ``triage_report.json`` (directly
    or below it: the most recent one); validated against :data:`REPORT_SCHEMA`. At most
    :data:`MAX_REPORT_BYTES` (64 MiB) are read.

    Raises:
        FileNotFoundError: no report there.
        TriageReportError: the file is not a valid lightning-triage report, or larger than
            :data:`MAX_REPORT_BYTES` (a ``ValueError``; the message is one line).
    """
    path = find_report(source)
    return parse_report(read_bounded(path), path)


#: The most bytes :func:`load_report` reads: a report's series and lists are bounded, so a
#: real one is a few MiB at most; a larger file is refused, never read whole.
MAX_REPORT_BYTES = 64 * 2**20


def read_bounded(path: Path, limit: int | None = None) -> bytes:
    """The bytes of ``path``, at most ``limit`` of them (default :data:`MAX_REPORT_BYTES`).

    Raises:
        TriageReportError: the file holds more than ``limit`` bytes (one line).
    """
    limit = MAX_REPORT_BYTES if limit is None else limit
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise TriageReportError(f"{one_line(str(path))}: larger than {limit} bytes, the most "
                                "lightning-triage reads of a report (not a report of this "
                                "tool?)")
    return data


def find_report(source: str | Path) -> Path:
    """The JSON report ``source`` names: the file itself, ``source/triage_report.json``, or the
    most recently written one below the directory ``source``."""
    path = Path(source)
    if path.is_file():
        return path
    if path.is_dir():
        if (path / JSON_NAME).is_file():
            return path / JSON_NAME
        # a directory named like the report is not one (nor what cannot be read)
        found = sorted((p for p in path.rglob(JSON_NAME) if _is_file(p)),
                       key=lambda p: p.stat().st_mtime)
        if found:
            return found[-1]
    raise FileNotFoundError(f"No lightning-triage report at {one_line(str(path))!r} "
                            f"(looked for {JSON_NAME}).")


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False


def stale_files(json_path: Path, report: Mapping[str, Any]) -> list[Path]:
    """The Markdown and HTML files beside ``json_path`` written by another run than ``report``
    (a run killed between its files, or files copied together from different runs)."""
    return other_runs(Path(json_path), report.get("run", {}).get("run_id"),
                      (MARKDOWN_NAME, HTML_NAME))


# ---------------------------------------------------------------------------- console
_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}
_MARK = {"error": "x", "warning": "!", "info": "i"}
#: The console shows at most this many characters of a message (the files hold it in full).
CONSOLE_CHARS = 600


def plain(text: Any, limit: int = 200) -> str:
    """Report text for a terminal: control characters (escape sequences, newlines) and invisible
    format characters (bidi overrides, zero-width characters) replaced by a space, cut to
    ``limit`` characters. Print it as :class:`rich.text.Text` (no markup). Never raises."""
    text = describe(text) if not isinstance(text, str) else text
    more = len(text) - limit
    text = terminal_text(text[:limit])
    return text + (f"… ({more} more characters in the files)" if more > 0 else "")


def _lead(report: Mapping[str, Any]) -> dict[str, Any] | None:
    first = report.get("start_here")
    return next((f for f in report.get("findings", []) if f["code"] == first), None) \
        if first else None


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


def baseline_line(report: Mapping[str, Any]) -> str | None:
    """The simple baselines beside the model's validation metric, in one line (``None`` when
    the report has none: ``details.baselines``, written by ``BaselineCheck``).

    Example:
        >>> details = {"baselines": {"values": {
        ...     "task": "classification", "metric": "accuracy", "val_examples": 256,
        ...     "scores": {"majority": 0.1, "nearest_centroid": 0.87, "linear": 0.88}},
        ...     "model": {"step": 180, "value": 0.92}}}
        >>> print(baseline_line({"details": details}))  # doctest: +NORMALIZE_WHITESPACE
        baselines (accuracy on 256 validation examples): majority 0.1, nearest-centroid 0.87,
        linear 0.88; model 0.92 at step 180
    """
    info = (report.get("details") or {}).get("baselines")
    if not isinstance(info, Mapping) or not isinstance(info.get("values"), Mapping):
        return None
    values = info["values"]
    scores = values.get("scores") or {}
    shown = ", ".join(f"{str(k).replace('_', '-')} {_number(v)}" for k, v in scores.items())
    line = (f"baselines ({values.get('metric', '?')} on {values.get('val_examples', '?')} "
            f"validation examples): {shown}")
    model = info.get("model")
    if isinstance(model, Mapping):
        line += f"; model {_number(model.get('value'))} at step {model.get('step')}"
    return line


def _number(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else str(value)


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
    lead = _lead(report)
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
