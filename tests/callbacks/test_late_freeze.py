"""Freezing that starts late (wiring.frozen_late, issue 35): parameters trainable for the first
steps and frozen afterwards, having moved, on real fits; freezing from the start, unfreezing
schedules (`BackboneFinetuning`) and a deliberate freeze schedule (info) as the twins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import BackboneFinetuning
from torch import nn
from torch.nn import functional as F

from lightning_triage import Triage, UpdateContractCheck
from lightning_triage.callbacks.base import collect_checks
from lightning_triage.demo.digits import digits_loaders
from lightning_triage.ranking import explain_findings, start_here
from tests.helpers import make_trainer, seeds

#: Validation at the end of each 15-batch epoch, no sanity check: Lightning's first `eval()`
#: (and so a `train()` override's first call) comes after 15 optimizer steps.
FIT = dict(max_epochs=3, limit_train_batches=15, limit_val_batches=1, num_sanity_val_steps=0)


class Staged(pl.LightningModule):
    """A stem (Linear + BatchNorm) meant to stay frozen and a head, as detection backbones freeze
    stages in a `train()` override (mmdetection's `frozen_stages`/`norm_eval`). ``where``:
    ``"train"`` freezes in `train()` only (the bug: Lightning first calls it at the first
    validation), ``"init"`` also in `__init__` (the fix), ``"hook"`` in `on_train_batch_start`
    at step 5, ``"never"`` does not freeze."""

    def __init__(self, where: str = "train", lr: float = 0.1) -> None:
        super().__init__()
        self.where, self.lr = where, lr
        self.backbone = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        if where == "init":
            self._freeze_stages()

    def _freeze_stages(self) -> None:
        self.backbone.eval()
        for p in self.backbone.parameters():
            p.requires_grad_(False)

    def train(self, mode: bool = True) -> Staged:
        super().train(mode)
        if self.where in ("train", "init"):
            self._freeze_stages()
        return self

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.where == "hook" and self.global_step == 5:
            self._freeze_stages()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class FreezeAtEpoch(pl.Callback):
    """A deliberate schedule: the backbone trains for two epochs, then is frozen."""

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if trainer.current_epoch == 2:
            pl_module.backbone.requires_grad_(False)


def _fit(tmp_path: Path, where: str, seed: int, callbacks: list[Any], **kwargs: Any) -> Staged:
    pl.seed_everything(seed, verbose=False)
    model = Staged(where)
    train, val = digits_loaders(seed=seed)
    make_trainer(tmp_path, callbacks, **{**FIT, **kwargs}).fit(model, train, val)
    return model


def _late(check: Any) -> list[Any]:
    return [f for f in check.findings if f.code == "wiring.frozen_late"]


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize(("where", "step"), [("train", 15), ("hook", 5)])
def test_late_freeze_is_caught(tmp_path: Path, where: str, step: int, seed: int) -> None:
    check = UpdateContractCheck(strict=True)
    _fit(tmp_path, where, seed, [check])
    found = _late(check)
    assert len(found) == 1, check.findings
    f = found[0]
    assert f.severity == "warning" and f.layer == "backbone"
    assert f.global_step == step and f.evidence["steps_trained"] == step
    assert f.evidence["exact"] is True and f.evidence["max_moved"] > 0.01
    assert set(f.evidence["params"]) >= {"backbone.0.weight", "backbone.1.weight"}
    assert "backbone.1" in f.evidence["running_stats_moved"]  # its BatchNorm statistics too


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("where", ["init", "never"])
def test_freezing_from_the_start_is_silent(tmp_path: Path, where: str, seed: int) -> None:
    check = UpdateContractCheck(strict=True)
    _fit(tmp_path, where, seed, [check])
    assert not _late(check)


def test_late_freeze_after_the_window_is_seen_at_the_validation_end(tmp_path: Path) -> None:
    # the per-batch window (10 batches) is over when the first validation calls `eval()`: the
    # flags are read again at the validation end and each epoch start
    check = UpdateContractCheck(window=10, strict=True)
    _fit(tmp_path, "train", 0, [check])
    found = _late(check)
    assert len(found) == 1 and found[0].global_step == 15 and found[0].severity == "warning"
    assert check.idle  # no per-step work after the window


def test_train_override_with_a_sanity_check_freezes_before_training(tmp_path: Path) -> None:
    # the sanity check calls `eval()` (so the override) before the first step: frozen from the
    # start, nothing moved (the BatchNorm Lightning puts back in training mode is another code)
    check = UpdateContractCheck(strict=True)
    _fit(tmp_path, "train", 0, [check], num_sanity_val_steps=1)
    assert not _late(check)


def test_unfreezing_schedule_is_silent(tmp_path: Path) -> None:
    check = UpdateContractCheck(strict=True)
    _fit(tmp_path, "never", 0, [check, BackboneFinetuning(unfreeze_backbone_at_epoch=1)])
    assert not _late(check)


def test_deliberate_freeze_schedule_is_info(tmp_path: Path) -> None:
    check = UpdateContractCheck(strict=True)
    _fit(tmp_path, "never", 0, [check, FreezeAtEpoch()])
    found = _late(check)
    assert len(found) == 1 and found[0].severity == "info"
    assert found[0].evidence["steps_trained"] == 30 and found[0].evidence["deliberate"]


def test_late_freeze_leads_and_explains_the_update_ratio(tmp_path: Path) -> None:
    triage = Triage(strict=True, verbose=False, html=False, report_dir=tmp_path / "report")
    _fit(tmp_path, "train", 0, [triage])
    findings = explain_findings([f for c in collect_checks([triage]) for f in c.findings])
    assert start_here(findings) == "wiring.frozen_late", \
        [(f.code, f.explained_by) for f in findings]
    for f in findings:
        if f.code == "grad.update_ratio" and f.is_problem:
            assert f.explained_by == ["wiring.frozen_late"]
