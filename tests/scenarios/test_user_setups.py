"""What the user configured is respected, and a suspicion is a warning only with its symptom
(real fits)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage import (
    GradientMonitor,
    InitialLossCheck,
    LossCurveMonitor,
    Triage,
    TriageReport,
)
from tests.helpers import make_trainer
from tests.probe_models import Classifier, _digits, digits, mlp


def findings_of(report: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["code"] == code]


def status_of(report: dict[str, Any], check: str) -> str:
    return next(c["status"] for c in report["checks"] if c["check"] == check)


class GradientKick(Classifier):
    """At step ``at`` the gradient is ``factor`` times larger; the loss value is unchanged."""

    def __init__(self, at: int, factor: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.at, self.factor = at, factor

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        if self.global_step == self.at:
            loss = loss + (self.factor - 1) * (loss - loss.detach())
        return loss


def spike_report(tmp_path: Path, factor: float, **kwargs: Any) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    triage = Triage(report_dir=tmp_path, verbose=False, strict=True, overfit=False)
    train, val = digits()
    trainer = make_trainer(tmp_path, [triage], limit_train_batches=16, max_epochs=4, **kwargs)
    trainer.fit(GradientKick(at=40, factor=factor), train, val)
    assert triage.report.report is not None
    return triage.report.report


def test_a_clipped_isolated_gradient_spike_is_info(tmp_path: Path) -> None:
    report = spike_report(tmp_path, 300.0, gradient_clip_val=1.0)
    [spike] = findings_of(report, "grad.spike")
    assert spike["global_step"] == 40 and spike["severity"] == "info"
    assert "gradient_clip_val=1` clipped" in spike["message"]
    assert spike["evidence"]["clipped_to"] == 1.0
    # never a clip looser than the user's
    assert spike["evidence"]["suggested_clip"] is None or spike["evidence"]["suggested_clip"] < 1
    assert status_of(report, "GradientMonitor") == "passed"
    assert report["start_here"] is None, [(f["code"], f["message"]) for f in report["findings"]]


def test_a_spike_followed_by_a_loss_spike_stays_a_warning(tmp_path: Path) -> None:
    report = spike_report(tmp_path, 3000.0)
    [spike] = findings_of(report, "grad.spike")
    assert spike["global_step"] == 40 and spike["severity"] == "warning"
    assert spike["evidence"]["loss_spike_followed"]
    assert status_of(report, "GradientMonitor") == "failed"


def raw_pixels(scale: float) -> tuple[DataLoader, DataLoader]:
    from lightning_triage.demo.digits import load_digits_tensors

    x, y, xv, yv = load_digits_tensors(standardize=False)
    train = DataLoader(TensorDataset(x[:512] * scale, y[:512]), batch_size=32, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    return train, DataLoader(TensorDataset(xv[:128] * scale, yv[:128]), batch_size=64)


def cnn_bn() -> nn.Sequential:
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 8, 3, padding=1),
                         nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 10))


@pytest.mark.parametrize(("net", "lr", "severity"), [
    (cnn_bn, 3e-3, "info"),  # BatchNorm right after the first convolution: trains well
    (mlp, 0.05, "warning"),  # an MLP on 0-255 pixels with SGD: the overfit probe fails
], ids=["cnn-batchnorm", "mlp-sgd"])
def test_raw_pixels_are_a_warning_only_when_training_suffers(tmp_path: Path, net: Any, lr: float,
                                                             severity: str) -> None:
    pl.seed_everything(0, verbose=False)
    triage = Triage(report_dir=tmp_path, verbose=False, strict=True)
    trainer = make_trainer(tmp_path, [triage], limit_train_batches=16, max_epochs=1)
    model = Classifier(net(), lr=lr, optimizer="adam" if severity == "info" else "sgd")
    trainer.fit(model, *raw_pixels(255 / 16))
    report = triage.report.report
    [scale] = findings_of(report, "data.unnormalized_input")
    assert scale["severity"] == severity
    if severity == "info":
        assert findings_of(report, "overfit.passed")
        assert status_of(report, "BatchInspector") == "passed"
        assert report["start_here"] is None, [(f["code"], f["message"]) for f in report["findings"]]
    else:
        assert findings_of(report, "overfit.failed")
        assert report["start_here"] == "data.unnormalized_input"


def noisy_digits() -> tuple[DataLoader, DataLoader]:
    """64 training examples with a quarter of their labels wrong: memorizing them hurts
    validation (the validation loss rises while the training loss falls)."""
    x, y, xv, yv = _digits()
    yt = y[:64].clone()
    yt[::4] = (yt[::4] + 3) % 10
    train = DataLoader(TensorDataset(x[:64], yt), batch_size=16, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    return train, DataLoader(TensorDataset(xv[:300], yv[:300]), batch_size=300)


def overfit_fit(tmp_path: Path, callbacks: list[Any], **kwargs: Any) -> LossCurveMonitor:
    pl.seed_everything(0, verbose=False)
    monitor = LossCurveMonitor(window_epochs=40, window_steps=160, strict=True)
    trainer = make_trainer(tmp_path, [monitor, *callbacks], max_epochs=40,
                           limit_train_batches=None, limit_val_batches=None, **kwargs)
    trainer.fit(Classifier(mlp(256), lr=1e-2, optimizer="adam"), *noisy_digits())
    return monitor


def test_overfitting_the_users_checkpoint_handles_is_info(tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    report_cb = TriageReport(report_dir=tmp_path, verbose=False, strict=True)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val_loss", save_top_k=1)
    monitor = overfit_fit(tmp_path, [report_cb, checkpoint], enable_checkpointing=True)
    [over] = findings_of(report_cb.report, "curve.overfitting")
    assert over["evidence"]["handled_by"] == ["ModelCheckpoint(monitor='val_loss')"]
    assert over["severity"] == "info"
    assert monitor.check_status()["status"] == "failed"  # the callback's own view
    assert status_of(report_cb.report, "LossCurveMonitor") == "passed"  # the report's


def test_unhandled_overfitting_stays_a_warning_and_overfit_batches_is_silent(
        tmp_path: Path) -> None:
    report_cb = TriageReport(report_dir=tmp_path / "a", verbose=False, strict=True)
    overfit_fit(tmp_path / "a", [report_cb])
    [over] = findings_of(report_cb.report, "curve.overfitting")
    assert over["severity"] == "warning" and over["evidence"]["handled_by"] == []
    chosen = overfit_fit(tmp_path / "b", [], overfit_batches=2)
    assert len(chosen.val_series) >= 3  # validation ran: the curve could have been judged
    assert "curve.overfitting" not in {f.code for f in chosen.findings}


class LBFGSClassifier(Classifier):
    def __init__(self) -> None:
        super().__init__(net=nn.Linear(64, 10))
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.losses.append(float(loss))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.LBFGS(self.parameters(), max_iter=20, line_search_fn="strong_wolfe")


def test_lbfgs_step_zero_loss_is_the_first_closure_evaluation(tmp_path: Path) -> None:
    pl.seed_everything(0, verbose=False)
    check = InitialLossCheck(task="multiclass", num_classes=10, strict=True)
    model = LBFGSClassifier()
    train, _ = digits(batch_size=512)
    make_trainer(tmp_path, [check], limit_train_batches=1, max_epochs=1).fit(model, train)
    assert len(model.losses) > 2  # several closure evaluations in step 0
    assert model.losses[-1] < 0.5 * math.log(10) < model.losses[0]
    assert check.initial_loss == pytest.approx(model.losses[0], rel=1e-5)
    assert check.findings == []  # not "far below chance"


def test_a_blow_up_inside_a_short_window_fails_the_gradient_stage(tmp_path: Path) -> None:
    """The `lr-50` demo: the norm grows by orders of magnitude and the run ends in a NaN after
    13 steps, before the 20 steps the window's growth rule needs."""
    pl.seed_everything(0, verbose=False)
    cb = GradientMonitor(strict=True)
    train, _ = digits()
    trainer = make_trainer(tmp_path, [cb], limit_train_batches=16, max_epochs=1)
    trainer.fit(Classifier(lr=50.0, optimizer="sgd"), train)
    norms = [v for _, v in cb.series()["grad_norm"]]
    assert len(norms) < 20 and max(norms) > 1e6 * norms[0]
    assert [f.code for f in cb.findings] == ["grad.exploding"]
    assert cb.check_status()["status"] == "failed"


def test_validation_once_per_epoch_gets_no_sparse_validation_note(tmp_path: Path) -> None:
    pl.seed_everything(0, verbose=False)
    cb = LossCurveMonitor(window_epochs=2, window_steps=20, strict=True)
    train, val = digits()
    trainer = make_trainer(tmp_path, [cb], limit_train_batches=16, max_epochs=4)
    trainer.fit(Classifier(), train, val)
    assert len(cb.val_series) == 4
    assert "curve.sparse_validation" not in {f.code for f in cb.findings}


def test_a_check_whose_detail_says_skipped_is_skipped() -> None:
    from lightning_triage import TriageCallback

    check = TriageCallback(strict=True)
    check.mark_ran("skipped: the model raised on the longer input")
    assert check.check_status()["status"] == "skipped"
    check.add_finding(None, "structure.padding_leak", "leak found before the failing pass")
    assert check.check_status()["status"] == "failed"  # a problem found is never hidden
