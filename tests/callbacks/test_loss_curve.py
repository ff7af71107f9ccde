"""LossCurveMonitor on real Trainer.fit runs: broken runs caught, healthy runs silent for the
whole run (window and long-run watch), state in checkpoints, loggers, zero interference."""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import Logger
from torch.nn import functional as F

from lightning_triage import GradientMonitor, LossCurveMonitor, Triage
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from tests.helpers import make_trainer, seeds, stage_codes


class MemoryLogger(Logger):
    """Keeps what is logged (to check the monitors write to the loggers)."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.metrics.append((int(step or 0), dict(metrics)))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


class CorruptedBatchMLP(DigitsMLP):
    """Healthy, except that the labels of one late batch are wrong (a corrupted batch)."""

    def __init__(self, bad_step: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bad_step = bad_step

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.global_step == self.bad_step:
            y = (y + 5) % 10
        return F.cross_entropy(self(x), y)


class ScheduledMLP(DigitsMLP):
    """DigitsMLP with a learning-rate schedule."""

    def __init__(self, schedule: str, total_steps: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.schedule = schedule
        self.total_steps = total_steps

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        if self.schedule == "warmup_cosine":
            warm = 30

            def f(step: int) -> float:
                if step < warm:
                    return (step + 1) / warm
                return 0.5 * (1 + math.cos(math.pi * (step - warm) / (self.total_steps - warm)))

            sched: Any = torch.optim.lr_scheduler.LambdaLR(opt, f)
        else:
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=80, gamma=0.1)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


@pytest.fixture(autouse=True)
def _seed() -> None:
    pl.seed_everything(0, verbose=False)  # models are built before `fit` seeds again


def fit(tmp_path: Path, model: pl.LightningModule, callbacks: list[Any], *, batch_size: int = 32,
        standardize: bool = True, seed: int = 0, **kwargs: Any) -> pl.Trainer:
    pl.seed_everything(seed, verbose=False)
    train, val = digits_loaders(batch_size=batch_size, standardize=standardize)
    defaults: dict[str, Any] = dict(limit_train_batches=20, limit_val_batches=2, max_epochs=3)
    defaults.update(kwargs)
    trainer = make_trainer(tmp_path, callbacks, **defaults)
    trainer.fit(model, train, val)
    return trainer


#: Info findings about how often validation ran (context, tested below).
VALIDATION_INFO = {"curve.no_validation", "curve.sparse_validation"}


def curve_codes(cb: LossCurveMonitor) -> list[str]:
    return [f.code for f in cb.findings if f.code not in VALIDATION_INFO]


def test_lr_zero_is_not_learning(tmp_path: Path) -> None:
    cb = LossCurveMonitor(window_epochs=1, window_steps=40, strict=True)
    fit(tmp_path, DigitsMLP(lr=0.0), [cb])
    assert curve_codes(cb) == ["curve.not_learning"]
    f = cb.findings[0]
    assert f.global_step == 39
    assert f.evidence["val_constant"] is True
    assert f.evidence["chance"] == pytest.approx(math.log(10))
    assert cb.check_status()["status"] == "failed"


@pytest.mark.parametrize("seed", seeds())
def test_large_lr_diverges_at_the_step_it_happens(tmp_path: Path, seed: int) -> None:
    pl.seed_everything(seed, verbose=False)
    cb = LossCurveMonitor(window_epochs=1, window_steps=40, strict=True)
    fit(tmp_path, DigitsMLP(lr=50.0), [cb], max_epochs=1, seed=seed)
    assert curve_codes(cb)[0] == "curve.diverging"
    f = cb.findings[0]
    print("diverging", seed, f.global_step)
    # reported at the step the loss went non-finite, inside the 40-step window
    assert f.evidence["first_nonfinite_step"] == f.global_step < 40


@pytest.mark.parametrize("seed", seeds())
def test_raw_pixels_plateau_at_chance(tmp_path: Path, seed: int) -> None:
    pl.seed_everything(seed, verbose=False)
    cb = LossCurveMonitor(window_epochs=1, window_steps=60, strict=True)
    model = DigitsMLP(lr=0.5)
    fit(tmp_path, model, [cb], standardize=False, limit_train_batches=30, seed=seed)
    assert "curve.plateau_at_chance" in curve_codes(cb)


def test_healthy_run_is_healthy_with_bounded_series(tmp_path: Path) -> None:
    cb = LossCurveMonitor(window_epochs=1, window_steps=40, max_points=16, strict=True)
    triage = Triage(strict=True, verbose=False, window_epochs=1, window_steps=40)
    fit(tmp_path, DigitsMLP(lr=0.1), [cb, triage])
    assert curve_codes(cb) == ["curve.healthy"]
    assert cb.findings[0].severity == "info"
    series = cb.series()
    assert 2 <= len(series["train_loss"]) <= 16
    assert len(series["val_loss"]) == 3
    report = triage.report.report
    assert report is not None
    assert {"train_loss", "val_loss", "grad_norm"} <= set(report["series"])
    assert stage_codes([f for c in triage.checks for f in c.findings], "curve") - VALIDATION_INFO \
        == {"curve.healthy"}
    names = [c.check_status()["check"] for c in triage.checks]
    assert names.index("LossCurveMonitor") < names.index("GradientMonitor")


def test_accumulation_rescales_the_loss(tmp_path: Path) -> None:
    cb = LossCurveMonitor(window_epochs=0, window_steps=10, strict=True)
    fit(tmp_path, DigitsMLP(lr=0.1), [cb], accumulate_grad_batches=2, max_epochs=1)
    series = cb.series()["train_loss"]
    assert len(series) == 10  # one value per optimizer step
    assert [s for s, _ in series] == list(range(10))
    assert series[0][1] == pytest.approx(math.log(10), abs=0.15)  # not halved


def test_corrupted_late_batch_is_a_loss_spike_after_the_window(tmp_path: Path) -> None:
    logger = MemoryLogger()
    loss_cb = LossCurveMonitor(window_epochs=1, window_steps=40, flush_every_n_steps=10, strict=True)
    grad_cb = GradientMonitor(window_epochs=1, window_steps=40, flush_every_n_steps=10, strict=True)
    fit(tmp_path, CorruptedBatchMLP(bad_step=137, lr=0.1), [loss_cb, grad_cb], max_epochs=8,
        logger=logger, log_every_n_steps=10)
    spikes = [f for f in loss_cb.findings if f.code == "curve.loss_spike"]
    assert [f.global_step for f in spikes] == [137]
    ev = spikes[0].evidence
    assert ev["after_window"] is True
    assert ev["ratio"] > 5
    assert ev["level_before"] < 1.0
    assert [c for c in curve_codes(loss_cb) if c != "curve.loss_spike"] == ["curve.healthy"]
    # sent to the loggers as it happened, under triage/
    logged = {k: s for s, m in logger.metrics for k in m}
    assert logged["triage/curve.loss_spike"] == 137
    assert "triage/loss_level" in logged
    assert "triage/grad_norm" in logged
    assert all(k.startswith("triage/") or k.startswith("train") or k.startswith("val")
               or k == "epoch" for _, m in logger.metrics for k in m)
    grad_steps = sorted({s for s, m in logger.metrics if "triage/grad_norm" in m})
    assert grad_steps
    assert all(s % 10 == 0 for s in grad_steps)


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("schedule", ["warmup_cosine", "step"])
def test_healthy_schedules_stay_silent_for_the_whole_run(tmp_path: Path, schedule: str,
                                                         seed: int) -> None:
    pl.seed_everything(seed, verbose=False)
    loss_cb = LossCurveMonitor(window_epochs=1, window_steps=40, flush_every_n_steps=25, strict=True)
    grad_cb = GradientMonitor(window_epochs=1, window_steps=40, flush_every_n_steps=25, strict=True)
    fit(tmp_path, ScheduledMLP(schedule, total_steps=240, lr=0.05), [loss_cb, grad_cb],
        max_epochs=6, limit_train_batches=40, seed=seed)
    assert curve_codes(loss_cb) == ["curve.healthy"]
    assert grad_cb.findings == []
    assert loss_cb.watcher is not None
    assert loss_cb.watcher.step == 240


@pytest.mark.parametrize("seed", seeds())
def test_noisy_small_batches_stay_silent_for_the_whole_run(tmp_path: Path, seed: int) -> None:
    pl.seed_everything(seed, verbose=False)
    loss_cb = LossCurveMonitor(window_epochs=1, window_steps=60, strict=True)
    grad_cb = GradientMonitor(window_epochs=1, window_steps=60, strict=True)
    fit(tmp_path, DigitsMLP(lr=0.05), [loss_cb, grad_cb], batch_size=4, max_epochs=3,
        limit_train_batches=100, seed=seed)
    assert curve_codes(loss_cb) == ["curve.healthy"]
    assert grad_cb.findings == []


def test_resume_keeps_the_baseline(tmp_path: Path) -> None:
    cb = LossCurveMonitor(window_epochs=1, window_steps=20, flush_every_n_steps=5, strict=True)
    trainer = fit(tmp_path, DigitsMLP(lr=0.1), [cb], max_epochs=2)
    ckpt = tmp_path / "a.ckpt"
    trainer.save_checkpoint(ckpt)
    assert cb.watcher is not None
    level, step = cb.watcher.level, cb.watcher.step
    resumed = LossCurveMonitor(window_epochs=1, window_steps=20, flush_every_n_steps=5, strict=True)
    resumed.load_state_dict(torch.load(ckpt, weights_only=False)["callbacks"][cb.state_key])
    assert resumed.window_closed
    assert resumed.watcher is not None
    assert resumed.watcher.level == level
    assert resumed.watcher.step == step
    assert [f.code for f in resumed.findings] == [f.code for f in cb.findings]
    pickle.dumps(resumed)


def test_zero_interference_weights_bit_identical(tmp_path: Path) -> None:
    def run(callbacks: list[Any]) -> dict[str, torch.Tensor]:
        pl.seed_everything(0, verbose=False)
        model = DigitsMLP(lr=0.1)
        fit(tmp_path, model, callbacks, max_epochs=2)
        return {k: v.clone() for k, v in model.state_dict().items()}

    bare = run([])
    watched = run([LossCurveMonitor(window_epochs=1, window_steps=10, strict=True),
                   GradientMonitor(window_epochs=1, window_steps=10, ratio_every_n_steps=2,
                                   strict=True)])
    assert all(torch.equal(bare[k], watched[k]) for k in bare)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"window_steps": 0}, "window_steps"), ({"window_epochs": -1}, "window_epochs"),
    ({"max_window_steps": 5}, "max_window_steps"), ({"flush_every_n_steps": 0}, "flush_every_n_steps"),
    ({"watch": "yes"}, "watch"), ({"task": "nope"}, "task")])
def test_invalid_arguments_name_the_argument(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=f"`{name}`"):
        LossCurveMonitor(**kwargs)


class SuddenNaNMLP(DigitsMLP):
    """Healthy, then a NaN loss out of the blue at one step (a numerics bug, not a divergence)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        return loss * float("nan") if self.global_step == 70 else loss


def test_nan_out_of_the_blue_is_left_to_the_numerics_stage(tmp_path: Path) -> None:
    loss_cb = LossCurveMonitor(window_epochs=1, window_steps=40, flush_every_n_steps=10, strict=True)
    grad_cb = GradientMonitor(window_epochs=1, window_steps=40, flush_every_n_steps=10, strict=True)
    fit(tmp_path, SuddenNaNMLP(lr=0.1), [loss_cb, grad_cb], max_epochs=5)
    assert "curve.diverging" not in curve_codes(loss_cb)
    assert "grad.exploding" not in [f.code for f in grad_cb.findings]


# ----------------------------------------------------------------------------- validation cadence
class NoValidationStep(DigitsMLP):
    validation_step = pl.LightningModule.validation_step  # type: ignore[assignment]


class SilentValidation(DigitsMLP):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self(batch[0])  # neither returns nor logs a loss


@pytest.mark.parametrize("how", ["no_loader", "no_step", "limit_zero", "no_loss"])
def test_a_run_without_validation_gets_an_info_never_a_warning(tmp_path: Path, how: str) -> None:
    cb = LossCurveMonitor(window_epochs=1, window_steps=40, strict=True)
    train, val = digits_loaders()
    model = {"no_step": NoValidationStep, "no_loss": SilentValidation}.get(how, DigitsMLP)()
    kwargs: dict[str, Any] = {"limit_val_batches": 0} if how == "limit_zero" else {}
    trainer = make_trainer(tmp_path, [cb], limit_train_batches=20, max_epochs=3, **kwargs)
    trainer.fit(model, train, None if how == "no_loader" else val)
    found = [f for f in cb.findings if f.code in VALIDATION_INFO]
    assert [f.code for f in found] == ["curve.no_validation"]
    assert found[0].severity == "info"
    assert all(f.severity == "info" for f in cb.findings)  # a healthy run: nothing else
    reason = found[0].evidence["reason"]
    assert {"no_loader": "no validation dataloader", "no_step": "no `validation_step`",
            "limit_zero": "`limit_val_batches=0`", "no_loss": "no loss was found"}[how] in reason
    assert cb.check_status()["status"] == "passed"


def test_validation_too_rare_for_the_window_is_an_info(tmp_path: Path) -> None:
    cb = LossCurveMonitor(window_epochs=2, window_steps=20, strict=True)
    fit(tmp_path, DigitsMLP(), [cb], max_epochs=4, check_val_every_n_epoch=2)
    found = [f for f in cb.findings if f.code in VALIDATION_INFO]
    assert [f.code for f in found] == ["curve.sparse_validation"]
    assert found[0].severity == "info"
    assert found[0].evidence["validation_in_window"] < found[0].evidence["needed"]
    assert found[0].evidence["validation_runs"] == 2
    assert cb.check_status()["status"] == "passed"


def test_frequent_validation_and_short_runs_get_no_validation_info(tmp_path: Path) -> None:
    cb = LossCurveMonitor(window_epochs=1, window_steps=40, strict=True)
    fit(tmp_path / "a", DigitsMLP(), [cb], val_check_interval=5)
    assert not [f for f in cb.findings if f.code in VALIDATION_INFO]
    assert len(cb.val) >= 3
    short = LossCurveMonitor(window_epochs=1, window_steps=40, strict=True)
    train, _ = digits_loaders()
    make_trainer(tmp_path / "b", [short], limit_train_batches=8).fit(DigitsMLP(), train)
    assert short.findings == []  # 8 steps: too short to judge anything
