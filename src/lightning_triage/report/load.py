"""Read a saved report: the one way in (:func:`load_report`), validated against
:data:`~lightning_triage.report.schema.REPORT_SCHEMA`, bounded in size.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightning_triage.errors import TriageReportError
from lightning_triage.report.files import JSON_NAME
from lightning_triage.report.schema import one_line, validate_report


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_report(text: str | bytes, source: Any = None) -> dict[str, Any]:
    """Parse and validate the text of a report (:func:`validate_report`).

    Raises:
        TriageReportError: not JSON (NaN and Infinity are not), nested too deeply, or not valid.
    """
    where = f"{one_line(str(source))}: " if source is not None else ""
    try:
        report = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise TriageReportError(f"{where}not a valid lightning-triage report: nested too "
                                "deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise TriageReportError(f"{where}not valid JSON: {one_line(str(exc))[:200]}") from None
    validate_report(report, source)
    return dict(report)


def load_report(source: str | Path) -> dict[str, Any]:
    """Read a saved report: a JSON file, or a directory holding ``triage_report.json`` (directly
    or below it: the most recent one); validated against :data:`REPORT_SCHEMA`. At most
    :data:`MAX_REPORT_BYTES` (64 MiB) are read.

    Raises:
        FileNotFoundError: no report there.
        TriageReportError: the file is not a valid lightning-triage report, or larger than
            :data:`MAX_REPORT_BYTES` (a ``ValueError``; the message is one line).
    """
    path = find_report(source)
    return parse_report(read_bounded(path), path)


#: The most bytes :func:`load_report` reads: a report's series and lists are bounded, so a
#: real one is a few MiB at most; a larger file is refused, never read whole.
MAX_REPORT_BYTES = 64 * 2**20


def read_bounded(path: Path, limit: int | None = None) -> bytes:
    """The bytes of ``path``, at most ``limit`` of them (default :data:`MAX_REPORT_BYTES`).

    Raises:
        TriageReportError: the file holds more than ``limit`` bytes (one line).
    """
    limit = MAX_REPORT_BYTES if limit is None else limit
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise TriageReportError(f"{one_line(str(path))}: larger than {limit} bytes, the most "
                                "lightning-triage reads of a report (not a report of this "
                                "tool?)")
    return data


def find_report(source: str | Path) -> Path:
    """The JSON report ``source`` names: the file itself, ``source/triage_report.json``, or the
    most recently written one below the directory ``source``."""
    path = Path(source)
    if path.is_file():
        return path
    if path.is_dir():
        if (path / JSON_NAME).is_file():
            return path / JSON_NAME
        # a directory named like the report is not one (nor what cannot be read)
        found = sorted((p for p in path.rglob(JSON_NAME) if _is_file(p)),
                       key=lambda p: p.stat().st_mtime)
        if found:
            return found[-1]
    raise FileNotFoundError(f"No lightning-triage report at {one_line(str(path))!r} "
                            f"(looked for {JSON_NAME}).")


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False
