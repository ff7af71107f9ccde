"""The command line's promises under hostile input: a report larger than it reads is refused
with exit 2 and one line (never read whole); any unexpected error exits 2 with one line (never
1, which means "findings found"); the report of an interrupted run fails the gate."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_triage.__main__ import main
from lightning_triage.report import console as console_module
from lightning_triage.report import load as load_module
from lightning_triage.report import write_report
from tests.report_samples import healthy_report


def _exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lightning-triage: error:"), err
    return err


@pytest.mark.parametrize("command", ["show", "html"])
def test_a_report_larger_than_the_limit_is_refused(tmp_path: Path, command: str,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    write_report(healthy_report(), tmp_path, html=False)
    size = (tmp_path / "triage_report.json").stat().st_size
    monkeypatch.setattr(load_module, "MAX_REPORT_BYTES", size - 1)
    assert f"larger than {size - 1} bytes" in _exit_2([command, str(tmp_path)], capsys)
    monkeypatch.setattr(load_module, "MAX_REPORT_BYTES", size)
    assert main(["show", str(tmp_path)]) == 0


def test_the_documented_limit() -> None:
    import lightning_triage.__main__ as cli

    assert load_module.MAX_REPORT_BYTES == 64 * 2**20
    assert "64 MiB" in (cli.__doc__ or "")


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError("a bug\non two lines"),
                                   AssertionError()])
def test_an_unexpected_error_exits_2_with_one_line(tmp_path: Path, error: Exception,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    write_report(healthy_report(), tmp_path, html=False)

    def fails(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(console_module, "print_report", fails)
    assert type(error).__name__ in _exit_2(["show", str(tmp_path)], capsys)


def test_an_interrupted_report_fails_the_gate(tmp_path: Path) -> None:
    write_report({**healthy_report(), "status": "interrupted"}, tmp_path, html=False)
    assert main(["show", str(tmp_path)]) == 1  # whatever its findings: the run did not end
    assert main(["show", str(tmp_path), "--fail-on", "none"]) == 0
