from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest

from lightning_triage import GradientMonitor, InitialLossCheck, OverfitBatchCheck, Triage
from lightning_triage.callbacks.base import guarded
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from tests.helpers import make_trainer


def test_bundle_runs_every_check_in_protocol_order() -> None:
    names = [type(c).__name__ for c in Triage().checks]
    assert names == [
        "BatchInspector",  # data
        "WorstErrors",  # data (validation)
        "InitialLossCheck",  # init
        "GradientWiringCheck",  # wiring
        "UpdateContractCheck",  # wiring (the update's contracts)
        "OverfitBatchCheck",  # overfit
        "StructureProbe",  # structure
        "PaddingProbe",  # structure
        "EvalModeCheck",  # mode
        "LossCurveMonitor",  # curve
        "GradientMonitor",  # grad
        "NonFiniteTracer",  # numerics
    ]
    assert "OverfitBatchCheck" not in [type(c).__name__ for c in Triage(overfit=False).checks]


def test_bundle_state_keys_are_distinct() -> None:
    keys = [c.state_key for c in Triage().checks]
    assert len(set(keys)) == len(keys)


def count_calls(monkeypatch: pytest.MonkeyPatch, cls: type, hook: str) -> list[int]:
    """Replace ``cls.hook`` by a guarded hook that records the step of every call."""
    original = getattr(cls, hook).guarded_hook
    steps: list[int] = []

    def counted(self: Any, trainer: pl.Trainer, *args: Any) -> None:
        steps.append(trainer.global_step)
        original(self, trainer, *args)

    counted.__name__ = hook
    monkeypatch.setattr(cls, hook, guarded(counted))
    return steps


def test_bundle_stops_calling_per_step_hooks_of_finished_checks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    init = count_calls(monkeypatch, InitialLossCheck, "on_train_batch_end")
    overfit = count_calls(monkeypatch, OverfitBatchCheck, "on_train_batch_start")
    grads = count_calls(monkeypatch, GradientMonitor, "on_before_optimizer_step")
    train, val = digits_loaders()
    trainer = make_trainer(tmp_path, [Triage(strict=True, verbose=False)], max_epochs=3,
                           limit_train_batches=8)
    trainer.fit(DigitsMLP(), train, val)
    assert init == [1, 2]  # after step 0 it is judged; after step 1 the check knows it is done
    assert overfit == [0, 1]  # the probe ran at step 0
    assert grads == list(range(24))  # the monitors are called at every step
    # a second fit starts the per-step hooks again
    init.clear()
    trainer = make_trainer(tmp_path, [trainer.callbacks[0]], max_epochs=1, limit_train_batches=4)
    trainer.fit(DigitsMLP(), train, val)
    assert init == [1]


def test_bundle_applies_the_guard_to_the_hooks_it_calls(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Any, trainer: pl.Trainer, *args: Any) -> None:
        raise ZeroDivisionError("bug inside the check")

    broken.__name__ = "on_before_optimizer_step"
    monkeypatch.setattr(GradientMonitor, "on_before_optimizer_step", guarded(broken))
    train, _ = digits_loaders()
    triage = Triage(verbose=False)
    trainer = make_trainer(tmp_path, [triage])
    trainer.fit(DigitsMLP(), train)
    assert trainer.global_step == 4  # the run went on
    monitor = triage.check("GradientMonitor")
    assert monitor.disabled
    [finding] = monitor.findings
    assert finding.code == "triage.check_error"
    assert finding.evidence["hook"] == "on_before_optimizer_step"
    assert not triage.check("NonFiniteTracer").disabled  # the others go on
    with pytest.raises(ZeroDivisionError):
        make_trainer(tmp_path, [Triage(strict=True, verbose=False)]).fit(DigitsMLP(), train)
