"""One rule for user-derived text in every output (issue 44): a report whose every user-derived
field holds markup, control characters, bidi overrides and a lone surrogate is written as JSON,
Markdown and HTML and shown on the console; no output carries a control or invisible format
character or a lone surrogate, neither HTML file holds the report's HTML as markup (not even in
a Markdown code span), and nothing fails. Beside it: the schema's patterns end where JSON Schema
ends them, custom run ids tie their files together, plots draw a bounded number of marks."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from lightning_triage.__main__ import main
from lightning_triage.errors import TriageReportError
from lightning_triage.report import (
    HTML_NAME,
    JSON_NAME,
    MARKDOWN_NAME,
    load_report,
    plots,
    print_report,
    stale_files,
    validate_report,
    write_report,
)
from tests.hostile import EVIL_ALL, hostile_report
from tests.report_samples import broken_report

#: C0 (but the newline and the tab) and C1 controls, bidi marks, embeddings, overrides and
#: isolates, zero-width characters, the BOM, lone surrogates.
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069"
                    "\ufeff\ud800-\udfff]")


def _console(report: dict[str, object]) -> str:
    buf = io.StringIO()
    print_report(report, console=Console(file=buf, width=200, color_system=None), path=None)
    return buf.getvalue()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    pytest.importorskip("matplotlib")
    out = tmp_path_factory.mktemp("hostile")
    report = hostile_report(EVIL_ALL)
    write_report(report, out)
    texts = {name: (out / name).read_bytes().decode("utf-8")  # strict: no lone surrogate
             for name in (JSON_NAME, MARKDOWN_NAME, HTML_NAME)}
    texts["console"] = _console(load_report(out))
    texts["dir"] = str(out)
    return texts


OUTPUTS = [JSON_NAME, MARKDOWN_NAME, HTML_NAME, "console"]


@pytest.mark.parametrize("output", OUTPUTS)
def test_no_output_carries_a_control_bidi_or_surrogate_character(written: dict[str, str],
                                                                 output: str) -> None:
    found = sorted(set(UNSAFE.findall(written[output])))
    assert not found, [hex(ord(c)) for c in found]


#: Markup of the report's own text (``tests.hostile.EVIL``) that must never be markup in a
#: file (in the Markdown, not even inside a code span).
RAW_HTML: dict[str, Callable[[str], list[str]]] = {
    name: lambda text: re.findall(r"<(?:script|img src=x|a )", text.lower())
    for name in (HTML_NAME, MARKDOWN_NAME)
}


@pytest.mark.parametrize("output", sorted(RAW_HTML))
def test_the_reports_html_is_text_in_both_html_files(written: dict[str, str], output: str) -> None:
    assert not RAW_HTML[output](written[output])
    assert "&lt;script&gt;" in written[output] or "&lt;script>" in written[output]


def test_the_files_of_one_write_agree_and_the_cli_reads_them(written: dict[str, str]) -> None:
    directory = Path(written["dir"])
    report = load_report(directory)
    assert not stale_files(directory / JSON_NAME, report)
    assert main(["html", str(directory), "-o", str(directory / "again.html")]) == 1  # findings
    assert not UNSAFE.search((directory / "again.html").read_text())


@pytest.mark.parametrize("run_id", ["my run/1", "x --> <img src=x> <!--", "caf\udce9",
                                    "\u202eid", "ok_id-1"])
def test_a_custom_run_id_ties_its_files_together(tmp_path: Path, run_id: str) -> None:
    report = broken_report()
    report["run"]["run_id"] = run_id
    write_report(report, tmp_path)
    assert not stale_files(tmp_path / JSON_NAME, load_report(tmp_path))
    write_report({**report, "run": {**report["run"], "run_id": run_id + "2"}}, tmp_path,
                 html=False)
    assert stale_files(tmp_path / JSON_NAME, load_report(tmp_path)) == [tmp_path / HTML_NAME]


@pytest.mark.parametrize("code", ["data.x\n", "data.x\r\n", " data.x"])
def test_a_code_ends_where_json_schema_ends_it(code: str) -> None:
    report = json.loads(json.dumps(broken_report()))
    report["findings"][0]["code"] = report["start_here"] = code  # the lead, consistent
    with pytest.raises(TriageReportError, match="does not match"):
        validate_report(report)
    report["findings"][0]["code"] = report["start_here"] = "data.x"
    validate_report(report)


def test_plots_draw_a_bounded_number_of_marks(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    from lightning_triage.report.html import render_html

    drawn: list[float] = []
    real = Axes.axvline

    def axvline(self: Axes, x: float = 0, *args: object, **kwargs: object) -> object:
        drawn.append(x)
        return real(self, x, *args, **kwargs)

    monkeypatch.setattr(Axes, "axvline", axvline)
    report = broken_report()
    base = report["findings"][0]
    report["findings"] = [*report["findings"],
                          *({**base, "code": "grad.spike", "severity": "warning",
                             "global_step": i} for i in range(400)),
                          *({**base, "code": f"data.code_{i}", "severity": "error",
                             "global_step": 5} for i in range(400))]
    render_html(report)
    assert drawn and len(drawn) <= plots.MAX_MARKS + 12  # the spikes, the loss plot's steps
