"""A crashed data-parallel run still gets one report: each rank other than 0 that ends by an
exception leaves its findings in a small file beside the report (no collective: the other ranks
may be stuck elsewhere), and rank 0 merges the files it finds into its crash report and names
the ranks whose findings are missing.

Used by :class:`~lightning_triage.TriageReport` on the exception path only; a fit that ends
normally gathers the findings with one collective and writes no rank file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_triage.findings import Finding
from lightning_triage.report.safe import describe

#: How long rank 0's crash report waits for the other ranks' files (seconds): a rank that ends
#: by the same exception writes its file at about the same time; a rank stuck in a collective
#: writes none until rank 0's process is gone, and is named missing.
RANK_FILE_WAIT_S = 2.0
_PREFIX = ".triage_rank"


def rank_file(directory: Path, rank: int) -> Path:
    """Where rank ``rank`` leaves its findings when it ends by an exception."""
    return directory / f"{_PREFIX}{rank}.json"


def remove_rank_files(directory: Path) -> None:
    """Remove the rank files of an earlier fit (rank 0, at setup, before any rank can write)."""
    for path in directory.glob(f"{_PREFIX}*.json"):
        with contextlib.suppress(OSError):
            path.unlink()


def write_rank_file(directory: Path, rank: int, status: str, step: int,
                    exception: BaseException | None, findings: Sequence[Finding]) -> None:
    """Write this rank's findings (atomically: rank 0 reads the old file or none, never a torn
    one)."""
    what = None if exception is None else f"{type(exception).__name__}: {describe(exception)}"
    data = {"rank": rank, "status": status, "global_step": step,
            "exception": None if what is None else what[:500],
            "findings": [f.to_dict() for f in findings]}
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f"{_PREFIX}{rank}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
        os.replace(tmp, rank_file(directory, rank))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("findings"), list) else None


def merge_rank_files(directory: Path, world_size: int, findings: list[Finding],
                     wait_s: float = RANK_FILE_WAIT_S) -> tuple[list[Finding], list[str]]:
    """Rank 0's findings with those of the other ranks' files (waiting up to ``wait_s`` for
    them), a ``run.ranks_missing`` finding naming the ranks that left none, and the report's
    notes (which rank ended how). The files read are removed."""
    found: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + wait_s
    while True:
        for rank in range(1, world_size):
            if rank not in found and (data := _read(rank_file(directory, rank))) is not None:
                found[rank] = data
        if len(found) == world_size - 1 or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    merged = list(findings)
    notes = []
    for rank, data in sorted(found.items()):
        for item in data["findings"]:
            with contextlib.suppress(Exception):  # one unreadable finding, not the report
                merged.append(Finding.from_dict(item))
        how = data.get("exception") or data.get("status")
        notes.append(f"rank {rank} ended by {how} at step {data.get('global_step')}: its "
                     "findings up to then are merged from its rank file")
        with contextlib.suppress(OSError):
            rank_file(directory, rank).unlink()
    missing = [r for r in range(1, world_size) if r not in found]
    if missing:
        merged.append(Finding.create(
            "run.ranks_missing",
            f"The fit ended by an exception before the ranks gathered their findings: ranks "
            f"{missing} of {world_size} left none (no rank file in `{directory}` within "
            f"{wait_s:g} s: a rank stuck in a collective, killed, or on another machine), so "
            f"this report holds the findings of ranks {[0, *sorted(found)]} only.",
            check="TriageReport",
            evidence={"missing": missing, "world_size": world_size, "merged": sorted(found)}))
    return merged, notes


__all__ = ["RANK_FILE_WAIT_S", "merge_rank_files", "rank_file", "remove_rank_files",
           "write_rank_file"]
