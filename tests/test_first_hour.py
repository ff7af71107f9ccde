"""Details a new user meets in the first hour (issue 45): what `diff` calls a changed setting,
what a report leaves in the user's log folder, and the lock that stays exclusive while its file
is removed."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from lightning_triage.__main__ import diff_reports
from lightning_triage.report.files import LOCK_NAME, directory_lock
from tests.report_samples import healthy_report


def test_diff_does_not_list_the_run_id_as_a_setting() -> None:
    a, b = healthy_report(), healthy_report()
    a["run"]["run_id"], b["run"]["run_id"] = "a" * 32, "b" * 32
    assert diff_reports(a, b)["settings"] == {}


def test_the_directory_lock_leaves_no_file_and_stays_exclusive(tmp_path: Path) -> None:
    """The lock file is removed by its holder; writers that waited on the removed file take the
    lock again on the file now at the name, so two of them are never inside at once."""
    inside, overlaps = [0], []

    def writer() -> None:
        for _ in range(20):
            with directory_lock(tmp_path):
                inside[0] += 1
                overlaps.append(inside[0])
                time.sleep(0.0005)
                inside[0] -= 1

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(overlaps) == 80 and max(overlaps) == 1
    assert not (tmp_path / LOCK_NAME).exists()
