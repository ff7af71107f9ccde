from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from lightning_triage import GradientMonitor, InitialLossCheck, OverfitBatchCheck, Triage
from lightning_triage.callbacks import CHECKS, TriageReport
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.callbacks.triage import FORWARDED_HOOKS
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from lightning_triage.errors import TriageConfigError
from tests.helpers import loader, make_trainer


def test_bundle_runs_every_check_in_protocol_order() -> None:
    # callbacks.CHECKS is the one list (in protocol order, tests/test_docs.py); the bundle follows it
    assert [type(c) for c in Triage().checks] == list(CHECKS)
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
    assert init == [1, 2]  # the check starts afresh: it judges the second fit's step 0 too


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


def test_window_steps_beyond_the_monitors_cap_is_accepted() -> None:
    """`Triage` has no `max_window_steps`: a long `window_steps` raises the monitors' cap instead
    of failing on an argument the user cannot pass."""
    triage = Triage(window_steps=6000)
    caps = [c.max_window_steps for c in triage.checks if hasattr(c, "max_window_steps")]
    assert caps == [6000, 6000]
    with pytest.raises(TriageConfigError, match="`window_steps`"):
        Triage(window_steps=0)


def test_a_huge_num_classes_allocates_nothing_per_class(tmp_path: Path) -> None:
    """`num_classes=2**40` used to make three checks allocate terabytes and disable themselves;
    with `strict=True` an internal error would raise."""
    triage = Triage(num_classes=2**40, strict=True, verbose=False, report_dir=tmp_path)
    x, y = torch.randn(64, 8), torch.randint(0, 5, (64,))
    make_trainer(tmp_path, [triage], max_steps=4).fit(_TinyClassifier(), loader(x, y))
    assert triage.report.report is not None
    assert not [c for c in triage.report.report["checks"] if c["status"] == "error"]


class _TinyClassifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 5)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Recorder(TriageCallback):
    """A check that records every hook Lightning's `Callback` has (guarded or not)."""

    def __init__(self) -> None:
        super().__init__(strict=True)
        self.calls: list[tuple[str, tuple[Any, ...]]] = []


def _recording(hook: str) -> Any:
    def record(self: _Recorder, trainer: Any, *args: Any) -> None:
        self.calls.append((hook, args))

    record.__name__ = hook
    return record


#: Hooks the bundle defines itself (and forwards after its own work).
OWN_HOOKS = {"setup", "teardown", "on_exception", "on_load_checkpoint"}

for _hook in (*FORWARDED_HOOKS, "on_load_checkpoint"):
    setattr(_Recorder, _hook, _recording(_hook))


def test_bundle_dispatches_every_hook_a_check_overrides() -> None:
    # every hook any check (or the report) overrides is one the bundle forwards to its members
    hooks = [name for name, value in vars(Callback).items()
             if callable(value) and not name.startswith("_")]
    overridden = {h for cls in (*CHECKS, TriageReport) for h in hooks
                  if getattr(cls, h) is not getattr(Callback, h)}
    kept = {"state_dict", "load_state_dict"}  # the bundle keeps each check's state itself
    assert overridden - kept <= set(FORWARDED_HOOKS) | OWN_HOOKS
    assert set(FORWARDED_HOOKS) | kept | OWN_HOOKS == set(hooks)
    # and each forwarded hook reaches a member with its arguments (the report last)
    triage = Triage(verbose=False)
    recorder = _Recorder()
    triage.checks = [recorder]
    triage.report = Callback()  # type: ignore[assignment]  # (Lightning's no-op hooks: not called)
    for hook in FORWARDED_HOOKS:
        assert getattr(Triage, hook) is not getattr(Callback, hook), hook
        getattr(triage, hook)(object(), "module", 1, 2)
    assert [(h, args) for h, args in recorder.calls] == [(h, ("module", 1, 2))
                                                         for h in FORWARDED_HOOKS]
    recorder.calls.clear()
    triage.on_load_checkpoint(object(), "module", {})  # type: ignore[arg-type]
    assert recorder.calls == [("on_load_checkpoint", ("module", {}))]


def test_bundle_builds_each_check_from_its_declared_arguments() -> None:
    triage = Triage(overfit_max_steps=12, window_steps=7000, numerics_mode="sync",
                    input_key="x", verbose=False)
    overfit = triage.check("OverfitBatchCheck")
    assert (overfit.max_steps, overfit.min_steps, overfit.input_key) == (12, 12, "x")  # type: ignore[attr-defined]
    assert triage.check("GradientMonitor").max_window_steps == 7000  # type: ignore[attr-defined]
    assert triage.check("NonFiniteTracer").mode == "sync"  # type: ignore[attr-defined]
    for cls in CHECKS:  # every declared argument is one of the check's and one of the bundle's
        params = inspect.signature(cls).parameters
        for own, theirs in cls.bundle_args.items():
            assert own in params, (cls.__name__, own)
            assert not isinstance(theirs, str) or theirs in inspect.signature(Triage).parameters
    with pytest.raises(TriageConfigError, match="`overfit_max_steps`"):
        Triage(overfit_max_steps=0)
