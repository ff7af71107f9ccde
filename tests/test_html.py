"""The HTML report: self-contained (no URL, no external file), holds every finding, embeds the
plots with matplotlib and degrades to tables without it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from markupsafe import escape

from lightning_triage.report import write_report
from lightning_triage.report.html import render_html
from tests.report_samples import broken_report, healthy_report


def external_references(page: str) -> list[str]:
    """Every ``src``/``href``/``url(...)`` that is not an embedded ``data:`` URI, and any
    ``http(s)://`` text."""
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)["']""", page, flags=re.I)
    refs += re.findall(r"url\(([^)]*)\)", page, flags=re.I)
    bad = [r for r in refs if not r.startswith("data:image/png;base64,")]
    return bad + re.findall(r"https?://", page)


def test_html_is_self_contained_and_holds_every_finding() -> None:
    report = broken_report()
    page = render_html(report)
    assert page.startswith("<!DOCTYPE html>")
    assert not external_references(page)
    assert "<script" not in page.lower()
    for f in report["findings"]:
        assert f["code"] in page
        assert escape(f["title"]) in page
        assert escape(f["message"]).split("`")[0] in page
    assert "Start here: <span class=\"code\">data.unnormalized_input</span>" in page
    # the checklist lists the protocol in order
    positions = [page.index(f"<b>{stage}</b>") for stage in
                 ("data", "init", "wiring", "overfit", "structure", "mode", "curve", "grad",
                  "numerics")]
    assert positions == sorted(positions)
    assert "explained by curve.diverging" in page.lower()
    assert "Frames leading to the first non-finite value" in page
    assert "net.1" in page  # a frame before the first bad module


def test_html_embeds_the_plots() -> None:
    pytest.importorskip("matplotlib")
    page = render_html(broken_report())
    images = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    # loss curve, per-layer gradient heatmap, step-0 vs chance, first batch
    assert len(images) == 4
    assert all(len(i) > 1000 for i in images)
    assert len(page) < 2_000_000


def test_html_without_matplotlib_degrades_to_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    report = broken_report()
    page = render_html(report)
    assert "<img" not in page
    assert "Plots need matplotlib" in page
    assert "<h3>train_loss</h3>" in page and "<h3>grad_norm</h3>" in page
    assert "nan/inf" in page  # the non-finite point of the diverging loss
    for f in report["findings"]:
        assert f["code"] in page
    assert not external_references(page)


def test_plots_false_gives_tables_too() -> None:
    page = render_html(healthy_report(), plots=False)
    assert "<img" not in page and "Verdict: no problems found." in page


def test_write_report_writes_the_html_beside_the_json(tmp_path: Path) -> None:
    paths = write_report(healthy_report(), tmp_path)
    assert [p.name for p in paths] == ["triage_report.json", "triage_report.md",
                                      "triage_report.html"]
    assert "lightning-triage report" in paths[2].read_text()
    assert [p.name for p in write_report(healthy_report(), tmp_path / "x", html=False)] == [
        "triage_report.json", "triage_report.md"]


def test_html_escapes_user_text() -> None:
    report = healthy_report()
    report["run"]["model"] = "<script>alert(1)</script>"
    page = render_html(report, plots=False)
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_checklist_rows_place_every_check_by_its_declared_stage() -> None:
    """The stage rows read each check entry's `stage` (declared on the class, callbacks.CHECKS),
    so every check's detail is in its stage's row, PaddingProbe and WorstErrors included, with
    the stage's one question."""
    from lightning_triage.callbacks import CHECKS
    from lightning_triage.findings import STAGE_QUESTIONS, STAGES
    from lightning_triage.report import build_report

    checks = [{"check": cls.__name__, "stage": cls.stage, "status": "passed",
               "detail": f"detail-of-{cls.__name__}"} for cls in CHECKS]
    page = render_html(build_report([], status="completed", run={}, checks=checks))
    rows = page.split("<b>")
    for cls in CHECKS:
        row = next(r for r in rows if r.startswith(f"{cls.stage}</b>"))
        assert f"detail-of-{cls.__name__}" in row, cls.__name__
    for stage in STAGES:
        assert str(escape(STAGE_QUESTIONS[stage])) in page


def test_a_check_entry_without_a_stage_takes_the_stage_of_its_findings() -> None:
    """Reports written before check entries carried their stage still place their checks."""
    from lightning_triage.report import build_report

    report = build_report([], status="completed", run={},
                          checks=[{"check": "MyCheck", "status": "passed", "detail": "detail-of-mine"}])
    report["findings"] = [{"code": "grad.spike", "severity": "info", "title": "t", "message": "m",
                           "hint": "h", "check": "MyCheck", "evidence": {}, "explained_by": []}]
    grad_row = next(r for r in render_html(report, plots=False).split("<b>") if r.startswith("grad</b>"))
    assert "passed" in grad_row


def test_frames_of_no_named_layer_and_of_the_root_module_read_as_words() -> None:
    """A NaN frames heading of a finding with no layer says no "layer `None`"; the root module
    (`named_modules()` names it "") is named, in the frames and as a finding's layer."""
    report = broken_report()
    [nan] = [f for f in report["findings"] if f["code"] == "numerics.nonfinite_forward"]
    nan["layer"] = None
    nan["evidence"]["frames"].append({"module": "", "max_abs": 0.0, "nan": 0, "inf": 320,
                                      "numel": 320, "dtype": "float32", "inputs_finite": False})
    page = render_html(report)
    heading = page[page.index("Frames leading to the first non-finite value"):]
    heading = heading[:heading.index("</h2>")]
    assert "None" not in heading and "step 12" in heading
    assert "<td>(the model itself)</td>" in page
    nan["layer"] = ""
    page = render_html(report)
    assert "layer <code>(the model itself)</code>" in page and "layer <code></code>" not in page


def test_a_long_check_detail_is_cut_at_a_word_with_an_ellipsis() -> None:
    report = healthy_report()
    words = " ".join(f"probe{i} ran" for i in range(80))  # ~700 characters
    report["checks"] = [{"check": "StructureProbe", "stage": "structure", "status": "passed",
                         "detail": words}]
    page = render_html(report)
    row = page[page.index("<b>structure</b>"):]
    row = row[:row.index("</tr>")]
    shown = re.search(r'<span class="muted">(probe0 ran[^<]*)</span>', row)
    assert shown is not None and shown[1].endswith("…"), row[-300:]
    assert shown[1][:-1].split()[-1] in words.split() and len(shown[1]) <= 300
