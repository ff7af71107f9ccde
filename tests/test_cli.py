"""The command line on saved reports: `show`, `html`, `diff`, with their exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_triage.__main__ import diff_reports, main
from lightning_triage.report import write_report
from tests.report_samples import broken_report, healthy_report


@pytest.fixture
def saved(tmp_path: Path) -> dict[str, Path]:
    """A broken and a healthy run saved as `write_report` leaves them (below a log dir)."""
    broken = tmp_path / "broken" / "lightning_logs" / "version_0"
    healthy = tmp_path / "healthy"
    write_report(broken_report(), broken, html=False)
    write_report(healthy_report(), healthy, html=False)
    return {"broken": broken / "triage_report.json", "healthy": healthy / "triage_report.json",
            "broken_root": tmp_path / "broken", "healthy_dir": healthy}


def test_show_exit_codes(saved: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(saved["healthy"])]) == 0
    assert "No problems found." in capsys.readouterr().out
    # a run directory: the report is found below it
    assert main(["show", str(saved["broken_root"])]) == 1
    out = capsys.readouterr().out
    assert "Start here: data.unnormalized_input" in out
    assert "numerics.nonfinite_forward" in out
    # the threshold: the healthy run has info findings only
    assert main(["show", str(saved["healthy_dir"]), "--fail-on", "info"]) == 1
    assert main(["show", str(saved["broken"]), "--fail-on", "none"]) == 0


def test_show_fail_on_warning_counts_warnings(tmp_path: Path) -> None:
    report = broken_report()
    report["findings"] = [f for f in report["findings"] if f["severity"] != "error"]
    write_report(report, tmp_path, html=False)
    assert main(["show", str(tmp_path)]) == 0  # default: errors only
    assert main(["show", str(tmp_path), "--fail-on", "warning"]) == 1


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["show", str(tmp_path / "missing")])
    assert exc.value.code == 2
    assert "No lightning-triage report" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "something-else"}))
    with pytest.raises(SystemExit) as exc:
        main(["html", str(other)])
    assert exc.value.code == 2
    broken_json = tmp_path / "bad.json"
    broken_json.write_text("{not json")
    with pytest.raises(SystemExit) as exc:
        main(["diff", str(broken_json), str(broken_json)])
    assert exc.value.code == 2
    for argv in (["show"], ["frobnicate"], ["show", "x", "--fail-on", "fatal"], []):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2


def test_html_rerenders_from_json(saved: dict[str, Path], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "page.html"
    assert main(["html", str(saved["broken"]), "-o", str(out), "--no-plots"]) == 1
    page = out.read_text()
    assert "numerics.nonfinite_forward" in page and "<img" not in page
    assert capsys.readouterr().out.strip() == str(out)
    assert main(["html", str(saved["healthy"])]) == 0  # beside the JSON by default
    assert (saved["healthy"].parent / "triage_report.html").exists()


def test_diff_shows_settings_and_findings(saved: dict[str, Path],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    # broken (lr 50) -> healthy (lr 0.1): the fix; exit code judges B
    assert main(["diff", str(saved["broken"]), str(saved["healthy"])]) == 0
    out = capsys.readouterr().out
    assert "hparams.lr: 50.0 -> 0.1" in out
    assert "optimizers.0.lr: 50.0 -> 0.1" in out
    assert "start here: data.unnormalized_input -> -" in out
    assert "gone: data.unnormalized_input, curve.diverging" in out
    assert "new: curve.healthy" in out
    assert "kept: overfit.passed" in out
    assert "global_step" not in out  # changes every run: not a setting
    assert main(["diff", str(saved["healthy"]), str(saved["broken"])]) == 1


def test_diff_reports_of_the_same_run_is_empty() -> None:
    d = diff_reports(broken_report(), broken_report())
    assert d["settings"] == {} and d["new"] == [] and d["gone"] == []
