"""The console samples of the README and the docs are real runs' (docs/make_samples.py), and
the prose around them names what those runs report."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from lightning_triage.findings import CODES

ROOT = Path(__file__).resolve().parents[1]


def _make_samples() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_samples", ROOT / "docs" / "make_samples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make = _make_samples()


@pytest.fixture(scope="module")
def reports() -> dict[str, dict[str, Any]]:
    names = make.scenario_names()
    assert {"lr-50", "healthy"} <= set(names)
    return make.run(names)


def test_console_samples_are_up_to_date(reports: dict[str, dict[str, Any]]) -> None:
    stale = [page for name, report in reports.items() for page in make.stale(name, report)]
    assert not stale, f"run `PYTHONPATH=src python docs/make_samples.py`; stale: {stale}"


def test_a_stale_sample_is_noticed(reports: dict[str, dict[str, Any]]) -> None:
    """The check compares codes, counts and steps (decimals are masked)."""
    report = dict(reports["lr-50"], findings=reports["lr-50"]["findings"][1:])
    assert make.stale("lr-50", report)
    assert make.masked("loss 2.329, 4.157e+34 at step 12") == "loss #, # at step 12"


def _codes(text: str) -> set[str]:
    return {c for c in re.findall(r"`([\w]+\.[\w]+)`", text) if c in CODES}


def test_sample_report_page_names_only_what_the_run_reports(reports: dict[str, dict[str, Any]]) -> None:
    """docs/report_sample.md describes the lr-50 page in words."""
    named = _codes((ROOT / "docs" / "report_sample.md").read_text())
    lr50 = reports["lr-50"]
    assert named <= {f["code"] for f in lr50["findings"]}, named
    assert lr50["start_here"] == "curve.diverging"
    [overfit] = [f for f in lr50["findings"] if f["code"] == "overfit.failed"]
    assert {"curve.diverging", "numerics.nonfinite_forward"} <= set(overfit["explained_by"])



def test_the_diverging_demo_plots_read_plainly(reports: dict[str, dict[str, Any]]) -> None:
    """The lr-50 run's loss climbs over 35 decades (a log axis), the run the plot matters for
    most: every tick label of its plots is a plain number at its position (no raw TeX such as
    ``$\\mathdefault{10^{35}}$``) and no axis title is cut at the image's edge."""
    pytest.importorskip("matplotlib")
    from lightning_triage.report import plots
    from tests.helpers import drawn_plot, plot_text_problems

    lr50 = reports["lr-50"]
    drawn = {p.__name__: drawn_plot(p, lr50) for p in (plots.loss_plot, plots.grad_plot,
                                                        plots.init_plot)}
    fig = (drawn["loss_plot"] or (None,))[0]
    assert fig is not None and fig.axes[0].get_yscale() == "log"
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels() if t.get_text()]
    assert "1e+35" in labels or "1e+28" in labels, labels
    for name, found in drawn.items():
        assert found is not None, name
        assert not plot_text_problems(*found), name


def test_healthy_section_names_the_routine_findings(reports: dict[str, dict[str, Any]]) -> None:
    text = (ROOT / "docs" / "getting_started.md").read_text()
    prose = text.split("<!-- end sample -->")[-1].split("\n## ")[0]
    healthy = reports["healthy"]
    assert healthy["start_here"] is None
    assert {f["severity"] for f in healthy["findings"]} == {"info"}
    infos = {f["code"] for f in healthy["findings"]}
    assert infos == _codes(prose), "the prose under the healthy sample names its info codes"
    skipped = [c["check"] for c in healthy["checks"] if c["status"] == "skipped"]
    assert skipped == ["PaddingProbe"] and "padding probe" in prose


def test_configuration_reference_text_is_clean() -> None:
    """docs/make_config_reference.py: whole summaries, `...` in types, no backslash in code."""
    spec = importlib.util.spec_from_file_location("make_config_reference",
                                                  ROOT / "docs" / "make_config_reference.py")
    assert spec is not None and spec.loader is not None
    make_config = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_config)
    text = make_config.tables()
    summaries = re.findall(r"^### `\w+`\n\n(.+)$", text, flags=re.MULTILINE)
    assert summaries and all(s.endswith(".") for s in summaries), summaries
    assert "Ellipsis" not in text and "tuple[int, ...]" in text
    assert not [span for span in re.findall(r"`[^`]*`", text) if "\\" in span]
    assert make_config._markdown("max ``|x|``, a|b") == "max `|x|`, a\\|b"
