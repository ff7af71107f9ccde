"""Report files are written atomically and together: a full disk, a kill between two files, two
writers at once and a planted symlink never leave a torn report or a silent mix of runs."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import lightning_triage.report.files as files
from lightning_triage.__main__ import main
from lightning_triage.report import (
    HTML_NAME,
    JSON_NAME,
    MARKDOWN_NAME,
    load_report,
    stale_files,
    write_report,
)
from lightning_triage.report.files import read_run_id
from tests.report_samples import broken_report, healthy_report

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _tables_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import lightning_triage.report.html as html_mod

    monkeypatch.setattr(html_mod, "_matplotlib", lambda: None)  # fast pages


def _ids(directory: Path) -> set[str | None]:
    json_id = json.loads((directory / JSON_NAME).read_text())["run"]["run_id"]
    return {json_id, read_run_id(directory / MARKDOWN_NAME), read_run_id(directory / HTML_NAME)}


def test_the_three_files_carry_one_run_id(tmp_path: Path) -> None:
    write_report(healthy_report(), tmp_path)
    ids = _ids(tmp_path)
    assert len(ids) == 1 and None not in ids
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        HTML_NAME, JSON_NAME, MARKDOWN_NAME]  # no temporary file left, no lock file either


def test_a_full_disk_keeps_the_previous_report(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    write_report(healthy_report(), tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real_write = os.write
    calls = {"n": 0}

    def full_disk(fd: int, data: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))  # half of the first file...
        raise OSError(errno.ENOSPC, "No space left on device")  # ...then the disk is full

    monkeypatch.setattr(files.os, "write", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_report(broken_report(), tmp_path)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert load_report(tmp_path)["start_here"] is None  # the healthy report, valid


def test_a_kill_between_two_files_is_told(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # long paths on one line
    write_report(healthy_report(), tmp_path)
    # a second run is killed (SIGKILL: no cleanup) right after moving its JSON into place
    code = (
        "import os, sys\n"
        "import lightning_triage.report.files as f\n"
        "from lightning_triage.report import write_report\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "from tests.report_samples import broken_report\n"
        "real = os.replace\n"
        "def replace(a, b):\n"
        "    real(a, b)\n"
        "    os.kill(os.getpid(), 9)\n"
        "f.os.replace = replace\n"
        "write_report(broken_report(), sys.argv[1], html=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path), str(ROOT)], env=env,
                          timeout=120, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    report = load_report(tmp_path)  # the JSON (written first) is the new run's, whole
    assert report["start_here"] is not None
    assert stale_files(tmp_path / JSON_NAME, report) == [tmp_path / MARKDOWN_NAME,
                                                         tmp_path / HTML_NAME]
    assert main(["show", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"{tmp_path / HTML_NAME} is from another run" in out
    assert f"full report: {tmp_path / JSON_NAME}" in out


def test_two_writers_never_mix_their_files(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    real_replace = os.replace

    def slow_replace(a: Any, b: Any) -> None:  # widen the window between two files
        real_replace(a, b)
        time.sleep(0.002)

    monkeypatch.setattr(files.os, "replace", slow_replace)
    errors: list[BaseException] = []
    torn: list[str] = []
    mixed: list[int] = []
    stop = threading.Event()

    def writer(make: Any) -> None:
        try:
            for _ in range(15):
                write_report(make(), tmp_path)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader() -> None:  # under the writers' lock: a writer is before or after its files
        while not stop.is_set():
            try:
                with files.directory_lock(tmp_path):
                    load_report(tmp_path)
                    if len(_ids(tmp_path)) != 1:
                        mixed.append(1)
            except FileNotFoundError:
                pass
            except ValueError as exc:
                torn.append(str(exc))
            time.sleep(0.001)

    threads = [threading.Thread(target=writer, args=(m,)) for m in (broken_report, healthy_report)]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    assert not errors and not torn and not mixed
    ids = _ids(tmp_path)
    assert len(ids) == 1 and None not in ids


def test_a_symlink_at_the_output_is_replaced_not_followed(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "run"
    out.mkdir()
    for name in (JSON_NAME, HTML_NAME):
        (out / name).symlink_to(victim)
    write_report(healthy_report(), out)
    assert victim.read_text() == "precious"
    assert not (out / JSON_NAME).is_symlink() and load_report(out)["start_here"] is None
    page = tmp_path / "page.html"
    page.symlink_to(victim)
    assert main(["html", str(out), "-o", str(page)]) == 0
    assert victim.read_text() == "precious" and not page.is_symlink()
    assert f"replaced the symlink {page}" in capsys.readouterr().err


def test_html_refuses_to_overwrite_its_input(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    write_report(healthy_report(), tmp_path, html=False)
    before = (tmp_path / JSON_NAME).read_bytes()
    for target in (tmp_path / JSON_NAME, tmp_path / ".." / tmp_path.name / JSON_NAME):
        with pytest.raises(SystemExit) as exc:
            main(["html", str(tmp_path), "-o", str(target)])
        assert exc.value.code == 2
        assert "refusing to write the HTML over its input" in capsys.readouterr().err
    assert (tmp_path / JSON_NAME).read_bytes() == before
    other = tmp_path / "page.html"
    other.write_text("old")
    assert main(["html", str(tmp_path), "-o", str(other)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(other) and f"replaced the file {other}" in captured.err
