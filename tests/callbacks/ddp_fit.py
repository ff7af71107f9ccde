"""A data-parallel fit under Lightning's ``ddp`` strategy (2 CPU processes, gloo), run as a
script: ``ddp`` starts the other rank by running this file again, so it cannot run inside
pytest's process (``tests/callbacks/test_ddp_script.py`` runs it with ``subprocess``).

Usage: ``python tests/callbacks/ddp_fit.py RUN REPORT_DIR`` with ``RUN`` one of ``healthy``,
``same_data`` (no distributed sampler: every rank reads the same batches) and ``crash`` (rank 1
raises at batch 2)."""

from __future__ import annotations

import sys
from typing import Any

import lightning.pytorch as pl

from lightning_triage import Triage
from tests.callbacks.rank_models import CrashingNet, RankNet


def main(run: str, report_dir: str) -> None:
    model: RankNet = CrashingNet(norm=False) if run == "crash" else RankNet(
        "unsharded" if run == "same_data" else "default", norm=False)
    extra: dict[str, Any] = {"use_distributed_sampler": False} if run == "same_data" else {}
    trainer = pl.Trainer(
        callbacks=[Triage(strict=True, verbose=False, overfit=False, report_dir=report_dir)],
        default_root_dir=report_dir, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, accelerator="cpu", devices=2,
        strategy="ddp", max_epochs=1, limit_val_batches=0, num_sanity_val_steps=0, **extra)
    trainer.fit(model)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
