"""Rank-sensitive behaviour of the report under DDP (2 CPU processes, gloo)."""

from __future__ import annotations

import json
from pathlib import Path

import torch.distributed as dist

from lightning_triage import Triage
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from tests.helpers import fit_ddp_spawn, make_trainer


def test_ddp_report_gathers_findings_from_every_rank(tmp_path: Path) -> None:
    train, _ = digits_loaders()
    fit_ddp_spawn(lambda: make_trainer(tmp_path, [Triage(strict=True, verbose=False)], devices=2,
                                       strategy="ddp_spawn", limit_train_batches=2),
                  DigitsMLP(logit_scale=100.0), train)
    report = json.loads((tmp_path / "triage_report.json").read_text())
    assert report["run"]["world_size"] == 2
    assert report["run"]["strategy"] == "ddp"
    ranks = sorted(f["rank"] for f in report["findings"] if f["code"] == "init.loss_above_chance")
    assert ranks == [0, 1]
    # the rank checks ran on a real dataset sharded by Lightning and stayed silent
    assert not [f["code"] for f in report["findings"]
                if f["code"].startswith(("data.ranks", "data.order", "wiring.replicas"))]
    statuses = {c["check"]: c["status"] for c in report["checks"]}
    assert statuses["RankDataCheck"] == statuses["ReplicaCheck"] == "passed"
    assert not dist.is_initialized()
