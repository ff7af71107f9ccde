"""Writing the report's files (:func:`write_report`: the JSON, the Markdown, the HTML) safely:
atomically, one run's files together, and telling when the files beside a report come from
another run.

- Each file is written to a temporary name in its directory, flushed to disk, then moved onto
  its name with :func:`os.replace`: a reader sees the old file or the new one, never a torn one;
  a failed write (a full disk) leaves the previous file as it was; a symlink at the name is
  replaced, not followed.
- The files of one report are moved into place together under a lock on the directory
  (``.triage_report.lock``, :func:`fcntl.flock` where the platform has it; a symlink planted at
  its name is not followed; the holder removes it as it leaves), so two writers to one directory
  never leave a mix; each file carries the report's ``run.run_id``.

Example:
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> write_files({d / "a.txt": "one", d / "b.txt": "two"})
    >>> (d / "a.txt").read_text(), sorted(p.name for p in d.iterdir())
    ('one', ['a.txt', 'b.txt'])
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from lightning_triage.report.markdown import render_markdown
from lightning_triage.report.safe import SafeNotes, describe, json_safe, terminal_text
from lightning_triage.report.text import marker_id

try:  # POSIX; elsewhere the files are still written atomically, one by one
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

JSON_NAME = "triage_report.json"
MARKDOWN_NAME = "triage_report.md"
HTML_NAME = "triage_report.html"
LOCK_NAME = ".triage_report.lock"
#: The run id in a file's marker (:func:`~lightning_triage.report.text.run_id_marker`).
_RUN_ID = re.compile(r'lightning-triage-run-id(?:: |" content=")([0-9A-Za-z_-]{1,64})')


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def stage(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to a new temporary file beside ``path`` and flush it to disk;
    return its name. The caller moves it into place (:func:`os.replace`) or removes it."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:  # O_EXCL: never opens an existing file or a symlink planted at the name
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:  # pragma: no cover - 48 random bits
            continue
        break
    try:
        try:
            _write_all(fd, text.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def _open_lock(path: Path) -> int:
    """Open (create) the lock file without following a symlink: one planted at its name is
    removed (the file it points to is left alone) and a plain file made instead."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(8):
        try:
            return os.open(path, flags, 0o666)
        except OSError as exc:
            if not path.is_symlink():
                raise
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            last = exc
    raise last  # pragma: no cover - a symlink planted again and again


@contextlib.contextmanager
def directory_lock(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` (its ``.triage_report.lock``) while inside."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    path = directory / LOCK_NAME
    while True:
        fd = _open_lock(path)
        fcntl.flock(fd, fcntl.LOCK_EX)
        # the holder before us removes the file as it leaves: a lock taken on a removed (or
        # replaced) file locks nothing, so take it again on the file now at the name
        try:
            named = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            named = None
        held = os.fstat(fd)
        if named is not None and (named.st_ino, named.st_dev) == (held.st_ino, held.st_dev):
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # no zero-byte lock file left in the user's folder
            os.unlink(path)
        os.close(fd)  # releases the lock


def write_files(files: Mapping[Path, str]) -> None:
    """Write every ``path: text`` of ``files`` (all in one directory) atomically, and move them
    into place together, in the given order, under the directory's lock.

    Raises:
        OSError: when a file cannot be written; the files already there are left as they were.
    """
    staged: dict[Path, Path] = {}
    try:
        for path, text in files.items():
            staged[path] = stage(path, text)
        directory = next(iter(files)).parent
        with directory_lock(directory):
            for path in list(staged):
                os.replace(staged.pop(path), path)
    finally:
        for tmp in staged.values():
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_file(path: Path, text: str) -> None:
    """Write one file atomically (a temporary file moved onto ``path``)."""
    tmp = stage(path, text)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_run_id(path: Path) -> str | None:
    """The run id a Markdown or HTML report carries in its first 4 KiB, or ``None``."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096).decode("utf-8", "replace")
    except OSError:
        return None
    match = _RUN_ID.search(head)
    return match.group(1) if match else None


def other_runs(json_path: Path, run_id: str | None, names: tuple[str, ...]) -> list[Path]:
    """The files ``names`` beside ``json_path`` that exist but were not written with the report
    of ``run_id`` (nothing to tell when the report has no run id: written before ids)."""
    if not run_id:
        return []
    out = []
    for name in names:
        path = json_path.with_name(name)
        if path.is_file() and read_run_id(path) != marker_id(run_id):
            out.append(path)
    return out


# ---------------------------------------------------------------------------- the report's files
def with_run_id(report: Mapping[str, Any]) -> dict[str, Any]:
    """``report`` with a ``run.run_id`` (a new random one if it has none)."""
    run = dict(report.get("run", {}))
    run.setdefault("run_id", uuid.uuid4().hex)
    return {**report, "run": run}


def write_report(report: Mapping[str, Any], directory: str | Path, *,
                 html: bool = True) -> list[Path]:
    """Write ``triage_report.json``, ``triage_report.md`` and (``html``) the self-contained
    ``triage_report.html`` into ``directory``; return the paths written, the JSON first.

    The JSON is the source of truth: the report is first made safe to write
    (:func:`~lightning_triage.report.safe.json_safe`: lone surrogates replaced, integers no JSON
    reader holds written as strings, each change counted in ``notes``), then the Markdown and
    the HTML are rendered from the JSON's own data, each on its own: a renderer that fails
    leaves the other files, says so on stderr and in the JSON's ``notes``, and removes its
    file of an earlier run. The files carry the report's ``run.run_id`` (one is added when the
    report has none) and are written atomically, the JSON first, under the directory's lock
    (:mod:`lightning_triage.report.files`): a failed write leaves the previous file as it was,
    and two writers to one directory do not mix files.

    Raises:
        OSError: when the JSON cannot be written (a Markdown or HTML file that cannot be
            written is told on stderr and left out).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    changes = SafeNotes()
    data = json_safe(with_run_id(report), changes)
    # the renderers read what a reader of the JSON reads
    data = json.loads(json.dumps(data, allow_nan=False))
    notes = [str(n) for n in data.get("notes", []) if isinstance(n, str)] \
        if isinstance(data.get("notes"), list) else []
    notes += changes.notes()
    renderers: list[tuple[str, Callable[[Mapping[str, Any]], str]]] = [
        (MARKDOWN_NAME, render_markdown)]
    if html:
        from lightning_triage.report.html import render_html

        renderers.append((HTML_NAME, render_html))
    staged: dict[Path, Path] = {}
    failed: list[Path] = []
    try:
        for name, render in renderers:
            try:
                text = render(data)
                staged[directory / name] = stage(directory / name, text)
            except Exception as exc:  # one renderer's failure costs only its own file
                problem = f"{name} was not written: {type(exc).__name__}: {describe(exc)[:300]}"
                notes.append(problem)
                failed.append(directory / name)
                print(f"lightning-triage: {terminal_text(problem)}", file=sys.stderr)
        if notes:
            data["notes"] = notes
        json_text = json.dumps(data, indent=2, allow_nan=False) + "\n"
        json_tmp = stage(directory / JSON_NAME, json_text)
        with directory_lock(directory):
            os.replace(json_tmp, directory / JSON_NAME)
            for path in list(staged):
                os.replace(staged.pop(path), path)
            for path in failed:  # never leave an earlier run's file beside this report
                with contextlib.suppress(OSError):
                    if path.is_file() and not path.is_symlink():
                        path.unlink()
    finally:
        for tmp in staged.values():
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    names = [MARKDOWN_NAME] + ([HTML_NAME] if html else [])
    return [directory / JSON_NAME] + [directory / n for n in names if directory / n not in failed]


def stale_files(json_path: Path, report: Mapping[str, Any]) -> list[Path]:
    """The Markdown and HTML files beside ``json_path`` written by another run than ``report``
    (a run killed between its files, or files copied together from different runs)."""
    return other_runs(Path(json_path), report.get("run", {}).get("run_id"),
                      (MARKDOWN_NAME, HTML_NAME))


__all__ = [
    "HTML_NAME",
    "JSON_NAME",
    "MARKDOWN_NAME",
    "directory_lock",
    "other_runs",
    "read_run_id",
    "stage",
    "stale_files",
    "with_run_id",
    "write_file",
    "write_files",
    "write_report",
]
