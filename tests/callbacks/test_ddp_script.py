"""Lightning's ``ddp`` strategy (not ``ddp_spawn``): 2 CPU processes with gloo, the second
started by Lightning running the script again (``tests/callbacks/ddp_fit.py``, run here with
``subprocess``). One fit per run kind, shared by the module's tests; each costs a Python start
and a fit per rank, so the module is ``slow``.

Under ``ddp`` every rank calls ``on_exception`` itself (under ``ddp_spawn`` Lightning calls it in
the launching process only), so the crash run shows a rank's findings reaching rank 0's crash
report through its rank file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RANK_CODES = ("data.ranks", "data.order", "wiring.replicas", "wiring.buffers", "mode.unsynced")

pytestmark = pytest.mark.slow


def _run(kind: str, directory: Path) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    for var in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE"):
        env.pop(var, None)  # a fresh process group
    done = subprocess.run([sys.executable, str(ROOT / "tests/callbacks/ddp_fit.py"), kind,
                           str(directory)], env=env, cwd=directory, capture_output=True,
                          text=True, timeout=300, check=False)
    report = json.loads((directory / "triage_report.json").read_text())
    return done.returncode, report, done.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, dict[str, Any], str]]:
    return {kind: _run(kind, tmp_path_factory.mktemp(kind))
            for kind in ("healthy", "same_data", "crash")}


def test_a_healthy_ddp_fit_is_silent(runs: dict[str, Any]) -> None:
    code, report, err = runs["healthy"]
    assert code == 0, err[-3000:]
    assert report["status"] == "completed" and report["run"]["world_size"] == 2
    assert report["run"]["strategy"] == "ddp"
    assert not [f["code"] for f in report["findings"] if f["severity"] != "info"]
    statuses = {c["check"]: c["status"] for c in report["checks"]}
    assert statuses["RankDataCheck"] == statuses["ReplicaCheck"] == "passed"


def test_the_same_data_on_every_rank_is_caught_under_ddp(runs: dict[str, Any]) -> None:
    code, report, err = runs["same_data"]
    assert code == 0, err[-3000:]
    assert report["start_here"] == "data.ranks_same_data"
    same = next(f for f in report["findings"] if f["code"] == "data.ranks_same_data")
    assert same["evidence"]["ranks"] == [0, 1] and "use_distributed_sampler" in same["message"]


def test_a_crashed_rank_leaves_its_findings_in_rank_0s_report(runs: dict[str, Any]) -> None:
    """Rank 1 raises at batch 2: its findings (`init.loss_above_chance`, seen only there) reach
    rank 0's crash report through its rank file, and the report says how rank 1 ended."""
    code, report, err = runs["crash"]
    assert code != 0 and "rank 1 fails here" in err
    assert report["status"] == "crashed"
    assert [f["rank"] for f in report["findings"] if f["code"] == "init.loss_above_chance"] == [1]
    assert any(n.startswith("rank 1 ended by RuntimeError: rank 1 fails here at step 2")
               for n in report.get("notes", [])), report.get("notes")
    assert "run.ranks_missing" not in {f["code"] for f in report["findings"]}
