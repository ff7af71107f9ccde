"""`lightning-triage --help` and `demo --help` say what a newcomer needs."""

from __future__ import annotations

import pytest

from lightning_triage.__main__ import main
from lightning_triage.demo import SCENARIOS


def test_demo_help_lists_the_scenarios_and_where_reports_go(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for scenario in SCENARIOS:
        assert f"  {scenario.name}  " in out and (scenario.expect or "healthy") in out
    assert "--report-root" in out and "temporary directory" in out and "<scenario>" in out


def test_help_has_no_markup_lines(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    lines = capsys.readouterr().out.splitlines()
    assert "::" not in [line.strip() for line in lines]
    assert any(line.strip().startswith("lightning-triage demo") for line in lines)


def test_version_prints_the_version_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    from lightning_triage import __version__

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"lightning-triage {__version__}"
