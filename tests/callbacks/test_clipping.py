"""Gradient clipping that eats the update (grad.clipping_eats_update, issue 35): Lightning's
`gradient_clip_val` orders of magnitude below the gradient norm, and manual clipping of gradients
still multiplied by the scaler's scale, on real fits; their fixed twins stay silent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.nn import functional as F

from lightning_triage import GradientMonitor, Triage
from lightning_triage.callbacks.base import collect_checks
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from lightning_triage.ranking import explain_findings, start_here
from tests.helpers import make_trainer, seeds

FIT = dict(max_epochs=1, limit_train_batches=20, limit_val_batches=1)


class ScaledManualClip(DigitsMLP):
    """Manual optimization with the user's own gradient scaler (pytorch's AMP recipe); the bug
    clips before `scaler.unscale_`: the threshold meets gradients multiplied by 2**16."""

    def __init__(self, unscale_first: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.automatic_optimization = False
        self.unscale_first = unscale_first
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        opt = self.optimizers()
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        opt.zero_grad()
        self.manual_backward(self.scaler.scale(loss))
        if self.unscale_first:
            self.scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)
        self.scaler.step(opt)
        self.scaler.update()
        return loss.detach()


def _build(kind: str) -> tuple[pl.LightningModule, dict[str, Any]]:
    if kind == "clip_tiny":
        return DigitsMLP(lr=0.1), {"gradient_clip_val": 1e-4}
    if kind == "clip_ok":
        return DigitsMLP(lr=0.1), {"gradient_clip_val": 1.0}
    if kind == "clip_tiny_adam":
        return DigitsMLP(lr=1e-3, optimizer="adam"), {"gradient_clip_val": 1e-4}
    return ScaledManualClip(kind == "manual_unscaled_first", lr=0.1), {}


def _fit(tmp_path: Path, kind: str, seed: int, callbacks: list[Any], **kwargs: Any) -> None:
    pl.seed_everything(seed, verbose=False)
    model, extra = _build(kind)
    train, val = digits_loaders(seed=seed)
    make_trainer(tmp_path, callbacks, **{**FIT, **extra, **kwargs}).fit(model, train, val)


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize(("kind", "how"), [("clip_tiny", "gradient_clip_val"),
                                           ("manual_clipped_scaled", "manual")])
def test_clipping_that_eats_the_update_is_caught(tmp_path: Path, kind: str, how: str,
                                                 seed: int) -> None:
    monitor = GradientMonitor(strict=True)
    _fit(tmp_path, kind, seed, [monitor])
    found = [f for f in monitor.findings if f.code == "grad.clipping_eats_update"]
    assert len(found) == 1, monitor.findings
    f = found[0]
    assert f.severity == "warning" and f.evidence["how"] == how
    assert f.evidence["optimizer"] == "SGD"
    # norms ~1 against 1e-4; scaled norms ~1e4-1e5 against 1: three orders of margin or more
    assert f.evidence["median_kept"] < 1e-3 and f.evidence["share_below"] == 1.0


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("kind", ["clip_ok", "manual_unscaled_first"])
def test_clipping_that_keeps_the_update_is_silent(tmp_path: Path, kind: str, seed: int) -> None:
    monitor = GradientMonitor(strict=True)
    _fit(tmp_path, kind, seed, [monitor])
    assert not [f for f in monitor.findings if f.code == "grad.clipping_eats_update"]
    if kind == "manual_unscaled_first":  # measured, and clipping at 1 keeps most of it
        assert len(monitor.clip_kept) == 20 and min(monitor.clip_kept) > 0.1


def test_clipping_under_adam_is_info(tmp_path: Path) -> None:
    # Adam normalizes its update per coordinate: the clipped gradient's scale does not reach it
    monitor = GradientMonitor(strict=True)
    _fit(tmp_path, "clip_tiny_adam", 0, [monitor])
    found = [f for f in monitor.findings if f.code == "grad.clipping_eats_update"]
    assert len(found) == 1 and found[0].severity == "info"
    assert "update survives" in found[0].message


@pytest.mark.parametrize("kind", ["clip_tiny", "manual_clipped_scaled"])
def test_clipping_leads_and_explains_the_slow_curve(tmp_path: Path, kind: str) -> None:
    triage = Triage(strict=True, verbose=False, html=False, overfit=False,
                    report_dir=tmp_path / "report")
    _fit(tmp_path, kind, 0, [triage], max_epochs=3, limit_train_batches=None,
         limit_val_batches=None)
    findings = explain_findings([f for c in collect_checks([triage]) for f in c.findings])
    assert start_here(findings) == "grad.clipping_eats_update", \
        [(f.code, f.explained_by) for f in findings]
    symptoms = [f for f in findings if f.code in ("curve.lr_too_low", "curve.not_learning",
                                                  "grad.update_ratio") and f.is_problem]
    assert symptoms  # the run shows the trouble
    for f in symptoms:
        assert "grad.clipping_eats_update" in f.explained_by, f
