"""Data-parallel runs checked as one run (2 CPU processes, gloo, ``ddp_spawn``): the ranks'
data partition and reshuffling (``RankDataCheck``), the replicas' weights (``ReplicaCheck``).

DDP fits are expensive on CPU: each fit here checks several things at once, and all but the
first are marked ``slow`` (the quick suite's healthy twin is `test_report_ddp.py`'s digits fit,
where the rank checks must pass silently)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_triage import Triage
from tests.callbacks.rank_models import RankNet
from tests.helpers import fit_ddp_spawn, make_trainer

RANK_CODES = {"data.ranks_same_data", "data.ranks_overlap", "data.order_not_reshuffled",
              "data.ranks_uneven_batches", "wiring.replicas_differ", "wiring.buffers_differ",
              "mode.unsynced_metric"}


def _fit(tmp_path: Path, model: RankNet, *, triage: bool = True, epochs: int = 2,
         monitor: bool = False, **kwargs: Any) -> tuple[dict[str, Any] | None, RankNet]:
    callbacks: list[Any] = [Triage(strict=True, verbose=False, overfit=False)] if triage else []
    if monitor:  # a checkpoint that monitors `val_loss` (validation runs once, at the end)
        callbacks.append(ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val_loss"))
        kwargs.update(limit_val_batches=2, enable_checkpointing=True)
    fit_ddp_spawn(lambda: make_trainer(tmp_path, callbacks, devices=2, strategy="ddp_spawn",
                                       max_epochs=epochs, limit_train_batches=None,
                                       **{"limit_val_batches": 0, **kwargs}), model)
    path = tmp_path / "triage_report.json"
    return (json.loads(path.read_text()) if triage else None), model


def _found(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["code"]: f for f in report["findings"] if f["code"] in RANK_CODES}


def _problems(report: dict[str, Any]) -> set[str]:
    return {f["code"] for f in report["findings"] if f["severity"] != "info"}


def _status(report: dict[str, Any], check: str) -> str:
    return next(c["status"] for c in report["checks"] if c["check"] == check)


def test_same_data_on_every_rank_and_a_replica_edited_on_one_rank(tmp_path: Path) -> None:
    """No distributed sampler: both ranks read the same shuffled batches (the cause leads);
    rank 1 moves a bias after step 2: the replicas differ, named at the end of training; the
    checkpoint monitors a `val_loss` logged without `sync_dist`."""
    report, _ = _fit(tmp_path, RankNet("unsharded", perturb_at=2, sync_dist=False), epochs=1,
                     use_distributed_sampler=False, monitor=True)
    assert report is not None
    found = _found(report)
    same = found["data.ranks_same_data"]
    assert same["severity"] == "error" and same["rank"] == 0
    assert same["evidence"]["ranks"] == [0, 1] and same["evidence"]["same_order"]
    assert "RandomSampler" in same["message"] and "use_distributed_sampler" in same["message"]
    assert report["start_here"] == "data.ranks_same_data"
    drift = found["wiring.replicas_differ"]
    assert drift["layer"] == "net.0.bias" and drift["evidence"]["ranks_apart"] == [1]
    assert drift["evidence"]["agreed_at"] == 1  # after the first step the replicas agreed
    assert drift["evidence"]["checked_at"] == 8  # one epoch of 8 batches: the final check
    assert "data.ranks_overlap" not in found and "data.order_not_reshuffled" not in found
    # one finding per fit, from rank 0, though both ranks judged
    assert sum(f["code"] == "data.ranks_same_data" for f in report["findings"]) == 1
    metrics = {f["evidence"]["metric"]: f for f in report["findings"]
               if f["code"] == "mode.unsynced_metric"}
    assert set(metrics) == {"val_loss", "val_confidence"}
    metric = metrics["val_loss"]  # monitored: a warning
    assert metric["severity"] == "warning"
    assert metric["evidence"]["monitored_by"] == ["ModelCheckpoint"]
    assert len(set(metric["evidence"]["values"])) == 2
    unmonitored = metrics["val_confidence"]  # nothing reads it: info
    assert unmonitored["severity"] == "info" and unmonitored["evidence"]["monitored_by"] == []
    assert "Nothing monitors it" in unmonitored["message"]


@pytest.mark.slow
def test_sampler_seeded_by_rank_and_never_reshuffled(tmp_path: Path) -> None:
    """A custom batch sampler over a `DistributedSampler(seed=rank)` kept where Lightning does
    not call `set_epoch`: the shards overlap and the order repeats in the second epoch."""
    report, _ = _fit(tmp_path, RankNet("seeded_by_rank", exposed=False),
                     use_distributed_sampler=False)
    assert report is not None
    found = _found(report)
    overlap = found["data.ranks_overlap"]
    assert overlap["evidence"]["seeds"] == [0, 1]
    assert overlap["evidence"]["fraction"] >= 0.2  # two random halves of 64 examples
    order = found["data.order_not_reshuffled"]
    assert order["evidence"]["sampler"] == "batch_sampler.base"
    assert "set_epoch" in order["message"] and order["evidence"]["epoch"] == 1
    assert "data.ranks_same_data" not in found and "wiring.replicas_differ" not in found


@pytest.mark.slow
def test_healthy_ddp_is_silent_and_unchanged(tmp_path: Path) -> None:
    """Lightning's distributed sampler, two epochs, gradients accumulated over two batches, a
    batch norm without `SyncBatchNorm`, a checkpoint monitoring a synced `val_loss`: no problem
    from the rank checks (the batch-norm statistics differ: info), each ran, and the weights are
    those of the same fit without `Triage()`."""
    torch.manual_seed(0)
    report, with_triage = _fit(tmp_path / "with", RankNet(), monitor=True,
                               accumulate_grad_batches=2)
    torch.manual_seed(0)
    _, without = _fit(tmp_path / "without", RankNet(), triage=False, monitor=True,
                      accumulate_grad_batches=2)
    assert report is not None
    found = _found(report)
    assert not _problems(report) & RANK_CODES
    assert found["wiring.buffers_differ"]["severity"] == "info"
    assert found["wiring.buffers_differ"]["evidence"]["batchnorm_only"]
    assert _status(report, "RankDataCheck") == "passed"
    assert _status(report, "ReplicaCheck") == "passed"
    assert _status(report, "MetricSyncCheck") == "passed"
    mine, theirs = with_triage.state_dict(), without.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.slow
def test_fixed_sampler_is_silent(tmp_path: Path) -> None:
    """The twin of the seeded-by-rank run: one seed, the sampler where Lightning reaches it
    (no batch norm: `SyncBatchNorm` needs a GPU, and without it the statistics differ)."""
    report, _ = _fit(tmp_path, RankNet("seeded", exposed=True, norm=False),
                     use_distributed_sampler=False)
    assert report is not None
    assert not _found(report)
    assert _status(report, "RankDataCheck") == "passed"
    assert _status(report, "ReplicaCheck") == "passed"


@pytest.mark.slow
def test_uneven_shards_are_named_before_the_short_rank_runs_out(tmp_path: Path) -> None:
    """Shards cut by hand, 5 batches on rank 0 and 4 on rank 1: named at the start of training
    (`max_steps=4` ends the fit before the rank with more would wait forever)."""
    report, _ = _fit(tmp_path, RankNet("uneven", norm=False), epochs=1, max_steps=4,
                     use_distributed_sampler=False)
    assert report is not None
    uneven = _found(report)["data.ranks_uneven_batches"]
    assert uneven["evidence"]["batches"] == [5, 4] and uneven["global_step"] == 0
    assert "data.ranks_same_data" not in _found(report)


@pytest.mark.slow
def test_a_step_skipped_on_rank_0_only_is_named(tmp_path: Path) -> None:
    """Rank 0 skips `optimizer.step()` when its own loss spikes (an outlier batch on rank 0):
    the replicas drift from that step, and the finding names the ranks' step counts as the
    cause (the checks are scheduled by batches, so the ranks still meet at every collective)."""
    report, _ = _fit(tmp_path, RankNet(norm=False, skip_spikes="rank"), epochs=1)
    assert report is not None
    drift = _found(report)["wiring.replicas_differ"]
    assert drift["evidence"]["optimizer_steps"] == [3, 4]  # 4 batches, one skipped on rank 0
    assert drift["evidence"]["checked_at"] == 4  # the final check (`global_step` counts hooks)
    assert "skipped a step" in drift["message"] and "reduce_boolean_decision" in drift["message"]
    assert report["start_here"] == "wiring.replicas_differ"


@pytest.mark.slow
def test_a_skip_decided_on_every_rank_is_silent(tmp_path: Path) -> None:
    """The twin: the same spike, the skip decided through `reduce_boolean_decision`."""
    report, _ = _fit(tmp_path, RankNet(norm=False, skip_spikes="all"), epochs=1)
    assert report is not None
    assert not _found(report)
    assert _status(report, "ReplicaCheck") == "passed"

