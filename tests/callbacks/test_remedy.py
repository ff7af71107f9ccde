"""The remedy trial in real fits: the learning-rate leads of the project's cause scenarios are
confirmed on a copy (seeds 0-2), a lead the remedy does not cure is challenged, healthy runs run
no experiment, and the user's run is bit-identical with and without the trial."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import Logger
from typing_extensions import override

from lightning_triage import Triage
from lightning_triage.callbacks._remedy import unavailable
from lightning_triage.demo import SCENARIOS, Scenario
from lightning_triage.demo.broken import LEAD_RUNS
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from tests.helpers import seeds

BY_NAME = {s.name: s for s in (*SCENARIOS, *LEAD_RUNS)}


def fit(build: Any, tmp_path: Path, seed: int, max_epochs: int = 2, logger: Any = False,
        **triage_kwargs: Any) -> tuple[Triage, pl.LightningModule, dict[str, Any]]:
    pl.seed_everything(seed, verbose=False)
    model, train, val = build()
    # the overfit probe is not what this file tests: off, to keep the fits short
    triage = Triage(report_dir=tmp_path, verbose=False, overfit=False, **triage_kwargs)
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=[triage], logger=logger,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(model, train, val)
    report = triage.report.report
    assert report is not None
    return triage, model, report


def lead_of(report: dict[str, Any]) -> dict[str, Any]:
    return next(f for f in report["findings"] if f["code"] == report["start_here"])


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize(("name", "change"), [("lr-1e-5", "x"), ("lr-50", "/")])
def test_learning_rate_leads_of_the_scenarios_are_confirmed(tmp_path: Path, name: str,
                                                            change: str, seed: int) -> None:
    scenario: Scenario = BY_NAME[name]
    triage, _, report = fit(scenario.build, tmp_path, seed)
    lead = lead_of(report)
    assert lead["code"] == scenario.expect
    remedy = lead["remedy"]
    assert remedy["verdict"] == "confirmed", remedy
    assert f"learning rate {change} " in remedy["change"]
    assert remedy["after"]["finite"] and remedy["after"]["loss"] < remedy["before"]["loss_start"]
    if name == "lr-50":  # the as-is replay reproduces the blow-up
        assert remedy["before"]["finite"] is False
    else:
        assert remedy["after"]["loss"] < remedy["before"]["loss"]
    assert triage.report.remedies.trials == 1
    text = (tmp_path / "triage_report.md").read_text()
    assert "Remedy: confirmed on a copy: lr " in text
    # the confirmation beat its placebo (the same batches, unchanged, in reverse order)
    assert remedy["placebo"]["passes"] is False
    # the user's training_step calls of this fit, by who made them
    calls = report["run"]["training_step_calls"]
    assert calls["fit"] == report["run"]["global_step"]  # one per step: no accumulation
    assert calls["trial"] >= 3 * remedy["before"]["steps"]  # as is, remedied, placebo
    assert "`training_step` calls:" in text.replace("\\", "")


class DecayedMLP(DigitsMLP):
    """The digits MLP whose SGD applies ``weight_decay`` (1.0 is a typo for 1e-4, say): the
    decay pulls every weight to zero as fast as the gradient pushes, so the loss stays near
    chance and the curve looks like a learning rate too low. A larger learning rate reaches the
    same equilibrium sooner (x10) or makes the decay step overshoot (x100: ``lr * wd`` > 2), so
    the remedy truly does not cure it; lowering the decay does."""

    def __init__(self, weight_decay: float) -> None:
        super().__init__(lr=0.1)
        self.weight_decay = weight_decay

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)


def decayed(weight_decay: float) -> Any:
    def build() -> tuple[pl.LightningModule, Any, Any]:
        train, val = digits_loaders()
        return DecayedMLP(weight_decay), train, val

    return build


@pytest.mark.parametrize("seed", seeds())
def test_a_learning_rate_lead_the_remedy_does_not_cure_is_challenged(tmp_path: Path,
                                                                     seed: int) -> None:
    _, _, report = fit(decayed(1.0), tmp_path, seed)
    lead = lead_of(report)
    assert lead["code"] in ("curve.lr_too_low", "curve.not_learning")
    remedy = lead["remedy"]
    assert remedy["verdict"] == "not confirmed", remedy
    assert remedy["tried"][0] == "x10"
    assert "`weight_decay` 1" in remedy["reason"]
    # no other finding: the report says there is no other candidate
    assert remedy["next_candidate"] is None
    text = (tmp_path / "triage_report.md").read_text()
    assert "Remedy: not confirmed on a copy" in text
    assert "no other candidate in this report" in text


@pytest.mark.parametrize("build", [decayed(1e-4), BY_NAME["healthy"].build],
                         ids=["decay-1e-4", "demo-healthy"])
def test_healthy_runs_run_no_experiment(tmp_path: Path, build: Any) -> None:
    triage, _, report = fit(build, tmp_path, 0)
    assert report["start_here"] is None
    assert triage.report.remedies.trials == 0
    assert triage.report.remedies.seconds == 0.0
    # after its 30 batches the recorder left the per-step dispatch: the steady step is unchanged
    assert triage.report.idle
    assert all(cb is not triage.report for cb, _, _ in triage._active.get("on_train_batch_start", []))
    assert not any("remedy" in f for f in report["findings"])


class RowLogger(Logger):
    """Keeps every logged row."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict[str, float]]] = []

    @property
    @override
    def name(self) -> str:
        return "rows"

    @property
    @override
    def version(self) -> int:
        return 0

    @override
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, {k: float(v) for k, v in metrics.items()}))

    @override
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


def test_the_users_run_is_bit_identical_with_and_without_the_trial(tmp_path: Path) -> None:
    runs = []
    for verify in (True, False):
        logger = RowLogger()
        triage, model, report = fit(BY_NAME["lr-1e-5"].build, tmp_path / str(verify), 0,
                                    logger=logger, verify_remedies=verify)
        runs.append((triage, model, logger.rows, torch.get_rng_state(), report))
    (with_trial, model_a, rows_a, rng_a, report_a), (_, model_b, rows_b, rng_b, report_b) = runs
    assert with_trial.report.remedies.trials == 1
    assert "remedy" in lead_of(report_a) and "remedy" not in lead_of(report_b)
    state_a, state_b = model_a.state_dict(), model_b.state_dict()
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert torch.equal(rng_a, rng_b)
    assert rows_a == rows_b and rows_a
    assert model_a.lr == model_b.lr == 1e-5
    assert model_a.trainer.optimizers[0].param_groups[0]["lr"] == 1e-5


class _Sharded:
    pass


_Sharded.__name__ = "FSDPStrategy"


def test_unavailable_says_why() -> None:
    module = DigitsMLP()
    trainer = SimpleNamespace(strategy=_Sharded(), optimizers=[object()], world_size=1)
    assert "shards the model" in (unavailable(trainer, module) or "")  # type: ignore[arg-type]
    module.automatic_optimization = False
    trainer.strategy = object()
    assert "manual optimization" in (unavailable(trainer, module) or "")  # type: ignore[arg-type]
