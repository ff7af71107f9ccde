"""Rank files: a crashed data-parallel run's ranks leave their findings for rank 0's report
(no collective, no processes: the files are written and merged directly)."""

from __future__ import annotations

from pathlib import Path

from lightning_triage.callbacks._rank_files import (
    merge_rank_files,
    rank_file,
    remove_rank_files,
    write_rank_file,
)
from lightning_triage.findings import Finding


def _finding(rank: int) -> Finding:
    return Finding.create("init.loss_above_chance", f"seen on rank {rank}", check="InitialLossCheck",
                          rank=rank)


def test_rank_files_are_merged_and_the_ranks_without_one_named(tmp_path: Path) -> None:
    write_rank_file(tmp_path, 2, "crashed", 7, RuntimeError("out of memory"), [_finding(2)])
    merged, notes = merge_rank_files(tmp_path, 4, [_finding(0)], wait_s=0.0)
    assert [f.rank for f in merged if f.code == "init.loss_above_chance"] == [0, 2]
    missing = [f for f in merged if f.code == "run.ranks_missing"]
    assert len(missing) == 1 and missing[0].severity == "info"
    assert missing[0].evidence["missing"] == [1, 3] and missing[0].evidence["merged"] == [2]
    assert "ranks [1, 3] of 4" in missing[0].message
    assert notes == ["rank 2 ended by RuntimeError: out of memory at step 7: its findings up to "
                     "then are merged from its rank file"]
    assert not rank_file(tmp_path, 2).exists()  # read once


def test_every_rank_file_found_leaves_no_rank_missing(tmp_path: Path) -> None:
    write_rank_file(tmp_path, 1, "interrupted", 3, None, [])
    rank_file(tmp_path, 5).write_text("{not json")  # an unreadable file is not a rank's
    merged, notes = merge_rank_files(tmp_path, 2, [], wait_s=0.0)
    assert merged == [] and notes[0].startswith("rank 1 ended by interrupted at step 3")
    remove_rank_files(tmp_path)
    assert not list(tmp_path.glob(".triage_rank*"))
