"""Writing report files safely: atomically, one run's files together, and telling when the files
beside a report come from another run.

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
import hashlib
import os
import re
import secrets
from collections.abc import Iterator, Mapping
from pathlib import Path

try:  # POSIX; elsewhere the files are still written atomically, one by one
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".triage_report.lock"
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


_SAFE_ID = re.compile(r"[0-9A-Za-z_-]{1,64}\Z")


def marker_id(run_id: str) -> str:
    """``run_id`` as the files carry it: as it is when it is 1-64 characters of
    ``[0-9A-Za-z_-]``, else ``sha256-`` and 40 hex digits of its SHA-256 (a custom id with any
    other character still ties the files of one write together).

    Example:
        >>> marker_id("3f2a"), marker_id("my run/1")[:14]
        ('3f2a', 'sha256-7e01178')
    """
    if _SAFE_ID.match(run_id):
        return run_id
    digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"sha256-{digest[:40]}"


def run_id_marker(run_id: str, kind: str) -> str:
    """The line that carries ``run_id`` (:func:`marker_id`) in a Markdown (``kind="md"``) or
    HTML file."""
    shown = marker_id(run_id)
    if kind == "md":
        return f"<!-- lightning-triage-run-id: {shown} -->"
    return f'<meta name="lightning-triage-run-id" content="{shown}">'


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


__all__ = ["directory_lock", "marker_id", "other_runs", "read_run_id", "run_id_marker", "stage",
           "write_file", "write_files"]
