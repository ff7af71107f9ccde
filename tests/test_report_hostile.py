"""The report's files and readers against hostile input (issue 36): writing never loses data,
the reader bounds its work, and no text reaches a terminal or a Markdown viewer as control."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import markdown
import pytest

import lightning_triage.report.html as html_module
from lightning_triage.__main__ import main
from lightning_triage.errors import TriageReportError
from lightning_triage.report import (
    HTML_NAME,
    JSON_NAME,
    MARKDOWN_NAME,
    load_report,
    parse_report,
    plain,
    render_markdown,
    write_report,
)
from lightning_triage.report.files import LOCK_NAME
from tests.report_samples import broken_report, healthy_report

ROOT = Path(__file__).resolve().parents[1]


def test_a_surrogate_or_a_huge_integer_loses_nothing(tmp_path: Path) -> None:
    report = broken_report()
    report["findings"][0]["message"] = "cannot open caf\udce9.csv"
    report["run"]["hparams"] = {"n": 10 ** 5000, "path": "\udcff"}
    paths = write_report(report, tmp_path)
    assert [p.name for p in paths] == [JSON_NAME, MARKDOWN_NAME, HTML_NAME]
    saved = load_report(tmp_path)
    assert saved["findings"][0]["message"] == "cannot open caf\ufffd.csv"
    assert isinstance(saved["run"]["hparams"]["n"], str)
    assert any("surrogates" in n for n in saved["notes"])
    assert any("integer" in n for n in saved["notes"])
    assert "caf\ufffd.csv" in (tmp_path / MARKDOWN_NAME).read_text("utf-8")


def test_a_failing_renderer_costs_only_its_own_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    write_report(healthy_report(), tmp_path)  # an earlier run's HTML is there

    def broken(*args: object, **kwargs: object) -> str:
        raise RuntimeError("renderer broke")
    monkeypatch.setattr(html_module, "render_html", broken)
    paths = write_report(broken_report(), tmp_path)
    assert [p.name for p in paths] == [JSON_NAME, MARKDOWN_NAME]
    saved = load_report(tmp_path)
    assert saved["start_here"] == broken_report()["start_here"]
    assert any("triage_report.html was not written: RuntimeError" in n for n in saved["notes"])
    assert "renderer broke" in capsys.readouterr().err
    assert not (tmp_path / HTML_NAME).exists()  # no earlier run's page beside this report


HUGE = "1" + "0" * 4000  # an integer JSON can hold and no float can
PLACES = [("run", "global_step"), ("findings", "global_step"), ("findings", "evidence"),
          ("series", None), ("details", "chance"), ("run", "world_size")]


@pytest.mark.parametrize("value", [HUGE, "-" + HUGE, "1e400", "[" * 5000 + "]" * 5000,
                                   '"' + "a" * 900_000 + '"', "{" + '"k": {' * 200 + "}" * 201])
@pytest.mark.parametrize("place", PLACES, ids=lambda p: ".".join(filter(None, p)))
def test_the_reader_raises_only_its_own_error(place: tuple[str, str | None], value: str,
                                              tmp_path: Path) -> None:
    report = json.loads(json.dumps(broken_report()))
    section, key = place
    if section == "findings":
        report["findings"][0][key] = "@@"
    elif section == "series":
        report["series"]["train_loss"][0][1] = "@@"
    elif section == "details":
        report["details"]["chance"] = {"chance": "@@"}
    else:
        report[section][key] = "@@"
    text = json.dumps(report).replace('"@@"', value)
    try:
        parse_report(text, "r.json")
    except TriageReportError:
        return
    (tmp_path / JSON_NAME).write_text(text, "utf-8")  # valid: the commands can use it
    assert main(["show", str(tmp_path)]) in (0, 1)
    assert main(["html", str(tmp_path), "-o", str(tmp_path / "p.html")]) in (0, 1)


def _worst_report() -> dict[str, object]:
    """About 1 MB of the shapes that cost the most to draw and show."""
    report = broken_report()
    n = 3000
    details = report["details"]
    assert isinstance(details, dict)
    details["first_batch"] = {"kind": "image", "shape": [2, 1, 1, n], "dtype": "float32",
                              "tensor": "x", "global_step": 0, "targets": [0, 1],
                              "examples": [[[[0.5] * n]], [[[0.5]] * n]]}
    details["grad_layers"] = {"layers": [f"l{i}" for i in range(6000)], "steps": [0, 1],
                              "norms": [[1.0] * 6000, [2.0] * 6000]}
    findings = report["findings"]
    assert isinstance(findings, list)
    proto = findings[0]
    for step in range(1, 13):
        for j in range(60):
            findings.append({**proto, "code": f"grad.x{j:03d}_{'z' * 150}", "global_step": step,
                             "severity": "error", "evidence": {}, "message": "m", "hint": "h",
                             "title": "t", "layer": "l" * 100})
    report["series"] = {"train_loss": [[i, 1.0 + i % 7] for i in range(20000)]}
    return report


def test_show_and_html_bound_their_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / JSON_NAME).write_text(json.dumps(_worst_report()), "utf-8")
    size = (tmp_path / JSON_NAME).stat().st_size
    assert size <= 1 << 20
    for argv in (["html", str(tmp_path), "-o", str(tmp_path / "page.html")], ["show", str(tmp_path)]):
        tracemalloc.start()
        start = time.perf_counter()
        assert main(argv) == 1
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"{argv[0]}: {elapsed:.2f} s, peak {peak / 2**20:.0f} MiB for {size} bytes",
              file=sys.stderr)
        assert peak < 300 * 2**20, (argv[0], peak)
        assert elapsed < 60, (argv[0], elapsed)  # generous: 5 s on an idle core
    capsys.readouterr()


def test_a_lock_planted_as_a_symlink_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).symlink_to(outside / "created")
    write_report(healthy_report(), run)
    assert not (outside / "created").exists()
    assert not (run / LOCK_NAME).is_symlink()


def test_bidi_and_invisible_characters_never_reach_the_terminal() -> None:
    shown = plain("model\u202eevil\u2066x\u200by\ufeff\x1b[2J")
    assert not any(c in shown for c in "\u202e\u2066\u200b\ufeff\x1b")


def test_the_html_command_prints_its_path_clean(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "a\x1b[31m\u202eb"
    write_report(healthy_report(), run)
    assert main(["html", str(run), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and HTML_NAME in out


def test_markdown_carries_no_raw_html() -> None:
    report = broken_report()
    evil = "<img src=x onerror=alert(1)>"
    report["run"]["run_id"] = f"x --> {evil} <!--"
    report["run"]["model"] = evil
    for f in report["findings"]:
        f.update(check=evil, message=f"{evil} `{evil}`", title=evil, hint=evil, layer=evil)
    page = markdown.markdown(render_markdown(report), extensions=["tables"])
    assert "<img" not in page


def test_a_closed_stdout_keeps_the_exit_code(tmp_path: Path) -> None:
    report = broken_report()
    report["findings"] *= 200  # more output than a pipe holds
    write_report(report, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for fail_on, code in (("none", 0), ("error", 1)):
        proc = subprocess.Popen([sys.executable, "-m", "lightning_triage", "show", str(tmp_path),
                                 "--fail-on", fail_on], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader went away (`| head`)
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == code, err
        assert "Traceback" not in err


def test_a_directory_named_like_the_report_is_skipped(tmp_path: Path) -> None:
    write_report(broken_report(), tmp_path / "old")
    (tmp_path / "new" / JSON_NAME).mkdir(parents=True)  # newer, and not a report
    assert main(["show", str(tmp_path)]) == 1


def test_demo_rejects_unknown_names_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", "[/bold]nope"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("lightning-triage: error: unknown scenario") and err.count("\n") == 1
