"""The triage report: build it, validate it, write it as JSON, Markdown and HTML, read it, print it.

Schema ``lightning-triage/report/1`` (see ``docs/schema.md``); :data:`REPORT_SCHEMA` is its JSON
Schema, and :func:`load_report` the one way to read a saved report (it validates). Pure
functions over findings and plain values: no Trainer needed.

One module per output, each importing only the modules below it:

- :mod:`~lightning_triage.report.build`: :func:`build_report`, :func:`minimal_report`, the gate
  (:func:`problems_at`, :class:`TriageGateError`);
- :mod:`~lightning_triage.report.text`: the phrases the outputs share (the remedy line, the
  measured hint, the baselines line, the run-id marker, :func:`plain`);
- :mod:`~lightning_triage.report.markdown`, :mod:`~lightning_triage.report.html` (with
  :mod:`~lightning_triage.report.plots`), :mod:`~lightning_triage.report.console`: the outputs;
- :mod:`~lightning_triage.report.files`: :func:`write_report`, atomic and one run's files
  together; :mod:`~lightning_triage.report.load`: :func:`load_report`;
- :mod:`~lightning_triage.report.schema` (the JSON Schema and its validator) and
  :mod:`~lightning_triage.report.safe` (every value made safe to write and to show).

Every string of a report is text in every output: the Markdown escapes Markdown and HTML
syntax, the console shows rich markup as typed and drops control characters (long texts are
cut there; the files hold them in full).
"""

from __future__ import annotations

from lightning_triage.report.build import (
    FailOn,
    ReportStatus,
    TriageGateError,
    build_report,
    describe_findings,
    minimal_report,
    problems_at,
)
from lightning_triage.report.console import CONSOLE_CHARS, print_report
from lightning_triage.report.files import (
    HTML_NAME,
    JSON_NAME,
    MARKDOWN_NAME,
    stale_files,
    with_run_id,
    write_report,
)
from lightning_triage.report.load import (
    MAX_REPORT_BYTES,
    find_report,
    load_report,
    parse_report,
    read_bounded,
)
from lightning_triage.report.markdown import render_markdown
from lightning_triage.report.schema import REPORT_SCHEMA, SCHEMA_ID, one_line, validate_report
from lightning_triage.report.text import baseline_line, lead_trial, plain, remedy_line, trial_hint

__all__ = [
    "CONSOLE_CHARS",
    "HTML_NAME",
    "JSON_NAME",
    "MARKDOWN_NAME",
    "MAX_REPORT_BYTES",
    "REPORT_SCHEMA",
    "SCHEMA_ID",
    "FailOn",
    "ReportStatus",
    "TriageGateError",
    "baseline_line",
    "build_report",
    "describe_findings",
    "find_report",
    "lead_trial",
    "load_report",
    "minimal_report",
    "one_line",
    "parse_report",
    "plain",
    "print_report",
    "problems_at",
    "read_bounded",
    "remedy_line",
    "render_markdown",
    "stale_files",
    "trial_hint",
    "validate_report",
    "with_run_id",
    "write_report",
]
