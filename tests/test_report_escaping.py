"""Every output shows report text as text: HTML, Markdown, the console and the command line,
on a report whose every string holds markup, control characters, math text, `|` and newlines."""

from __future__ import annotations

import ast
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from lightning_triage.__main__ import main
from lightning_triage.report import print_report, render_markdown, validate_report, write_report
from lightning_triage.report.html import CSP, render_html
from tests.hostile import EVIL, hostile_report

SRC = Path(__file__).resolve().parents[1] / "src" / "lightning_triage"


def test_the_hostile_report_is_a_valid_report() -> None:
    validate_report(hostile_report())


def test_html_shows_every_string_as_text() -> None:
    pytest.importorskip("matplotlib")
    page = render_html(hostile_report())
    assert "<script" not in page.lower() and "<img src=x" not in page
    assert "&lt;script&gt;document.title=&#39;PWNED&#39;&lt;/script&gt;" in page
    assert "<a " not in page and "javascript:alert" in page  # as text, never a link
    assert f'<meta http-equiv="Content-Security-Policy" content="{CSP}">' in page
    assert "script-src" not in CSP and "default-src 'none'" in CSP
    # the math-text layer name is a plain label: every plot is drawn, none fell back
    assert len(re.findall(r'<img src="data:image/png;base64,', page)) == 4
    assert "could not be shown" not in page
    assert page.count("<h2>") == 6  # no heading came from the report's text


def test_a_plot_that_fails_falls_back_to_its_table(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    import lightning_triage.report.html as html_mod

    def broken(*args: object) -> str:
        raise RuntimeError("matplotlib broke")

    plots = list(html_mod._PLOTS)
    plots[0] = (broken, plots[0][1], plots[0][2])
    monkeypatch.setattr(html_mod, "_PLOTS", tuple(plots))
    page = render_html(hostile_report())
    assert "<h3>train_loss</h3>" in page  # the loss curve's table stands in
    assert len(re.findall(r'<img src="data:image/png;base64,', page)) == 3
    assert "numerics.nonfinite_forward" in page  # the rest of the page is there


def test_html_module_builds_markup_only_from_its_own_templates() -> None:
    """By construction: no f-string writes a tag, and `Markup(...)` wraps only literals of the
    module (a template, the CSS, a separator), so report text can only enter as an escaped
    argument."""
    tree = ast.parse((SRC / "report" / "html.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            literal = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
            assert "<" not in literal, f"line {node.lineno}: an f-string writes HTML"
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Markup":
            arg = node.args[0]
            assert isinstance(arg, ast.Constant) or (
                isinstance(arg, ast.Name) and arg.id in ("_CSS", "CSP", "sep")), f"line {node.lineno}"


def _cells(row: str) -> int:
    return len(re.findall(r"(?<!\\)\|", row)) - 1


def test_markdown_shows_every_string_as_text() -> None:
    md = render_markdown(hostile_report())
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", md)
    text = re.sub(r"`[^`]*`", "", md)  # code spans show their content verbatim
    assert "<script" not in text and "<img" not in text and "&lt;script>" in text
    assert [line for line in md.splitlines() if line.startswith("#")] == [
        "# lightning-triage report", "## Start here: `data.unnormalized_input`", "## Findings",
        "## Checks"]
    for line in md.splitlines():
        if line.startswith("| ") and not line.startswith("| severity") \
                and not line.startswith("| check"):
            assert _cells(line) in (5, 3), line
    markdown = pytest.importorskip("markdown")
    rendered = markdown.markdown(md, extensions=["tables"])
    assert "<script" not in rendered and "<a " not in rendered and "<img" not in rendered
    assert "<em>" not in rendered and "<del>" not in rendered and "<h1>" in rendered
    assert rendered.count("<h1>") == 1 and rendered.count("<h2>") == 3


def test_console_shows_markup_as_typed_without_control_characters() -> None:
    buf = io.StringIO()
    print_report(hostile_report(), console=Console(file=buf, width=200, color_system=None),
                 path=None)
    out = buf.getvalue()
    assert "[bold red]x[/bold]" in out  # rich markup shown, not applied (no MarkupError)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", out)


def test_cli_shows_a_hostile_report_safely(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    write_report(hostile_report(), tmp_path / "a", html=False)
    write_report(hostile_report(), tmp_path / "b", html=False)
    assert main(["show", str(tmp_path / "a")]) == 1
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    assert main(["html", str(tmp_path / "a"), "--no-plots"]) == 1
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "[bold red]x[/bold]" in out
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", out)
    page = (tmp_path / "a" / "triage_report.html").read_text()
    assert "<script" not in page.lower()


def test_a_huge_message_is_cut_on_the_console_and_whole_in_the_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = hostile_report()
    report["findings"][0]["message"] = "x" * (16 << 20)
    write_report(report, tmp_path, html=False)
    assert main(["show", str(tmp_path)]) == 1  # was 264 s: rich wrapped 16 MiB of text
    out = capsys.readouterr().out
    assert len(out) < 20_000 and f"{(16 << 20) - 600} more characters" in " ".join(out.split())
    saved = json.loads((tmp_path / "triage_report.json").read_text())
    assert len(saved["findings"][0]["message"]) == 16 << 20


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs headless chromium")
def test_no_script_runs_in_a_browser(tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    page.write_text(render_html(hostile_report(), plots=False), encoding="utf-8")
    dom = subprocess.run(["chromium", "--headless", "--disable-gpu", "--no-sandbox",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert "lightning-triage report" in dom
    assert "<title>PWNED</title>" not in dom and "PWNED" in dom  # shown, not run
    assert EVIL.split("<img")[0] not in dom  # no live <script> element came back
