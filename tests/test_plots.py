"""The HTML report's plots (lightning_triage.report.plots) write plain text on every axis, linear and
log: no math text shown raw, tick labels that read as the numbers at their positions, no axis
title cut at the image's edge."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lightning_triage.report import plots
from tests.helpers import drawn_plot, plot_text_problems
from tests.report_samples import broken_report, healthy_report

pytest.importorskip("matplotlib")

PLOTS = [plots.loss_plot, plots.grad_plot, plots.init_plot]


def _report_with(train: list[float], **details: Any) -> dict[str, Any]:
    report = healthy_report()
    report["series"] = {"train_loss": [[i, v] for i, v in enumerate(train)],
                        "grad_norm": [[i, abs(v) + 1e-3] for i, v in enumerate(train)]}
    report["details"] = dict(report.get("details") or {}, **details)
    return report


REPORTS = {
    "broken": broken_report,  # a loss over 35 decades: log axes
    "healthy": healthy_report,  # linear axes
    # a log axis within one decade: matplotlib labels minor ticks too
    "one-decade": lambda: _report_with([2.3 - 0.02 * i for i in range(100)],
                                       initial_loss={"loss": 300.0, "chance": 2.3}),
    # a linear axis with an offset (1e6 + small changes)
    "offset": lambda: _report_with([1e6 + 0.01 * i for i in range(50)]),
    "tiny": lambda: _report_with([1e-7 * (1 + i) for i in range(50)]),
}


@pytest.mark.parametrize("name", sorted(REPORTS))
@pytest.mark.parametrize("plot", PLOTS, ids=lambda p: p.__name__)
def test_plots_write_plain_tick_labels(plot: Callable[..., Any], name: str) -> None:
    drawn = drawn_plot(plot, REPORTS[name]())
    if drawn is None:
        pytest.skip(f"{plot.__name__} draws nothing for {name}")
    fig, size = drawn
    assert not plot_text_problems(fig, size)


def test_user_math_text_settings_do_not_reach_the_plots() -> None:
    import matplotlib

    with matplotlib.rc_context({"axes.formatter.use_mathtext": True}):
        fig, size = drawn_plot(plots.loss_plot, REPORTS["offset"]()) or (None, (0, 0))
    assert fig is not None and not plot_text_problems(fig, size)
