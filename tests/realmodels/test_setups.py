"""Real Lightning set-ups with `Triage()` at its defaults: resume from a checkpoint, the Tuner's
`lr_find`, StochasticWeightAveraging, EarlyStopping with ModelCheckpoint, dict/dataclass/
namedtuple batches, an IterableDataset, a manual-optimization GAN and a ResNet-style CNN with
BatchNorm: healthy runs raise no warning and no error (seed 0 here, seeds 1-4 in the slow
lane), and the double softmax written in the loss code is caught and leads (seed 0 here, 1-2 in
the slow lane; seeds 0-2 of the overfit check alone in tests/callbacks/test_overfit_batch.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, StochasticWeightAveraging
from lightning.pytorch.tuner import Tuner

from tests.helpers import seeds
from tests.realmodels.models import DigitsClassifier, ResNet, digits, problems, quiet_trainer, triage
from tests.realmodels.setups import (
    RingGAN,
    StructuredClassifier,
    ring_points,
    streamed_loaders,
    structured_loaders,
)

SEEDS = seeds(5)


def fit_report(tmp_path: Path, model: pl.LightningModule, loaders: Any,
               callbacks: list[Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    check = triage(tmp_path)
    trainer = quiet_trainer(tmp_path, [check, *(callbacks or [])], **kwargs)
    trainer.fit(model, *loaders)
    report = check.report.report
    assert report is not None
    return report


def assert_healthy(report: dict[str, Any]) -> None:
    assert problems(report) == []
    assert report["start_here"] is None
    failed = [c for c in report["checks"] if c["status"] in ("failed", "error")]
    assert failed == []


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", ["dict", "dataclass", "namedtuple"])
def test_structured_batches(tmp_path: Path, kind: str, seed: int) -> None:
    pl.seed_everything(seed, verbose=False)
    report = fit_report(tmp_path, StructuredClassifier(), structured_loaders(kind, seed))
    assert_healthy(report)
    assert "overfit.passed" in {f["code"] for f in report["findings"]}  # the batch was understood


@pytest.mark.parametrize("seed", SEEDS)
def test_iterable_dataset(tmp_path: Path, seed: int) -> None:
    pl.seed_everything(seed, verbose=False)
    assert_healthy(fit_report(tmp_path, DigitsClassifier(), streamed_loaders(seed),
                              limit_train_batches=16))


@pytest.mark.parametrize("seed", SEEDS)
def test_resnet_with_batchnorm(tmp_path: Path, seed: int) -> None:
    pl.seed_everything(seed, verbose=False)
    assert_healthy(fit_report(tmp_path, DigitsClassifier(ResNet()), digits(seed)))


@pytest.mark.parametrize("seed", SEEDS)
def test_resnet_with_batchnorm_on_raw_pixels(tmp_path: Path, seed: int) -> None:
    """Raw 0-16 pixels into a CNN with BatchNorm after its first convolution train well: the
    input scale is a suspicion without a symptom, reported as info (the check saw it)."""
    pl.seed_everything(seed, verbose=False)
    report = fit_report(tmp_path, DigitsClassifier(ResNet()), digits(seed, raw=True))
    assert report["series"]["val_loss"][-1][1] < 2.0  # it trains (chance: ln 10 = 2.30)
    assert_healthy(report)
    scale = [f for f in report["findings"] if f["code"] == "data.unnormalized_input"]
    assert [f["severity"] for f in scale] == ["info"]


@pytest.mark.parametrize("seed", SEEDS)
def test_manual_optimization_gan(tmp_path: Path, seed: int) -> None:
    pl.seed_everything(seed, verbose=False)
    assert_healthy(fit_report(tmp_path, RingGAN(), (ring_points(seed),)))


@pytest.mark.parametrize("seed", SEEDS)
def test_early_stopping_and_checkpoint(tmp_path: Path, seed: int) -> None:
    pl.seed_everything(seed, verbose=False)
    callbacks = [EarlyStopping(monitor="val_loss", patience=1),
                 ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val_loss")]
    assert_healthy(fit_report(tmp_path, DigitsClassifier(lr=1e-2), digits(seed), callbacks,
                              max_epochs=6, enable_checkpointing=True))


@pytest.mark.parametrize("seed", SEEDS)
def test_stochastic_weight_averaging(tmp_path: Path, seed: int) -> None:
    pl.seed_everything(seed, verbose=False)
    assert_healthy(fit_report(tmp_path, DigitsClassifier(), digits(seed),
                              [StochasticWeightAveraging(swa_lrs=1e-3, swa_epoch_start=2)],
                              max_epochs=3))


@pytest.mark.parametrize("seed", SEEDS)
def test_lr_find_then_fit(tmp_path: Path, seed: int) -> None:
    pl.seed_everything(seed, verbose=False)
    model = DigitsClassifier()
    check = triage(tmp_path)
    trainer = quiet_trainer(tmp_path, [check])
    train, val = digits(seed)
    found = Tuner(trainer).lr_find(model, train, val, min_lr=1e-4, max_lr=1.0, num_training=30)
    assert found is not None
    model.lr = min(float(found.suggestion() or 3e-3), 1e-2)
    trainer.fit(model, train, val)
    report = check.report.report
    assert report is not None
    assert_healthy(report)


@pytest.mark.parametrize("seed", SEEDS)
def test_resume_from_checkpoint(tmp_path: Path, seed: int) -> None:
    pl.seed_everything(seed, verbose=False)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    first = fit_report(tmp_path / "a", DigitsClassifier(), digits(seed), [ckpt], max_epochs=1,
                       enable_checkpointing=True)
    assert_healthy(first)
    assert ckpt.last_model_path
    pl.seed_everything(seed, verbose=False)
    check = triage(tmp_path / "b")
    trainer = quiet_trainer(tmp_path / "b", [check], max_epochs=3)
    trainer.fit(DigitsClassifier(), *digits(seed), ckpt_path=ckpt.last_model_path)
    assert trainer.global_step > 16  # resumed past the first epoch
    report = check.report.report
    assert report is not None
    assert_healthy(report)


@pytest.mark.parametrize("seed", seeds(3))
@pytest.mark.parametrize("net", ["mlp", "resnet"])
def test_double_softmax_in_the_loss_code_is_caught_and_leads(tmp_path: Path, net: str,
                                                             seed: int) -> None:
    pl.seed_everything(seed, verbose=False)
    model = DigitsClassifier(ResNet() if net == "resnet" else None, softmax_in_loss=True)
    report = fit_report(tmp_path, model, digits(seed))
    assert report["start_here"] == "overfit.loss_on_probabilities", problems(report)
    lead = next(f for f in report["findings"] if f["code"] == report["start_here"])
    assert lead["evidence"]["softmax_in"] == "loss"
    assert "overfit.passed" not in {f["code"] for f in report["findings"]}
    # the twin without the softmax: `test_resnet_with_batchnorm` and the digits set-ups above
