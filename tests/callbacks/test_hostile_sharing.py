"""Probes never touch the user's model or trainer through what a copy shares: a copy that shares
a tensor's storage with the model (a ``__deepcopy__`` that returns ``self``, a submodule that is
also a callback, a tied parameter that refuses to be copied) is not used, and a step that
writes the trainer (stops the run, changes ``limit_val_batches``, logs) writes only the real
trainer. Each row is a seeded fit with and without ``Triage()``: bit-identical weights and
buffers (batch-norm statistics included), and the same trainer state at the end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_triage import Triage, probing
from lightning_triage.demo.digits import DigitsMLP, digits_loaders


# ----------------------------------------------------------------------------- ways of sharing
class SelfCopyingBatchNorm(nn.BatchNorm1d):
    """A batch norm whose ``__deepcopy__`` returns itself (to save memory, say)."""

    def __deepcopy__(self, memo: dict[int, Any]) -> SelfCopyingBatchNorm:
        return self


class PinnedParameter(nn.Parameter):
    """A parameter that refuses to be copied (``__deepcopy__`` returns itself)."""

    def __deepcopy__(self, memo: dict[int, Any]) -> PinnedParameter:
        return self


class Teacher(nn.Module, Callback):
    """A submodule that is also one of the trainer's callbacks: the copy shares the trainer's
    callbacks, so it would share this module too."""

    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.proj = nn.Linear(64, 64)
        self.bn = nn.BatchNorm1d(64)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn(self.proj(x))


class Normed(DigitsMLP):
    """The digits MLP at SGD lr 1e-5 (a lead whose remedy is tried at the end of fit) with a
    batch norm in front; ``norm`` chooses the way it is shared."""

    def __init__(self, way: str, teacher: Teacher | None = None) -> None:
        super().__init__(lr=1e-5)
        self.way = way
        if way == "deepcopy_returns_self":
            self.pre: nn.Module = SelfCopyingBatchNorm(64)
        elif way == "submodule_held_by_a_callback":
            assert teacher is not None
            self.pre = teacher
        else:  # tied across the boundary: the pinned weight is also the first layer's
            self.pre = nn.Linear(64, 64)
            self.pre.weight = PinnedParameter(self.pre.weight.detach().clone())
            self.tied = nn.Linear(64, 64, bias=False)
            self.tied.weight = self.pre.weight

    def forward(self, x: Tensor) -> Tensor:
        h = self.pre(x)
        if self.way == "tied_across_the_boundary":
            h = h + 0.1 * self.tied(x)
        return self.net(h)


WAYS = ["deepcopy_returns_self", "submodule_held_by_a_callback", "tied_across_the_boundary"]


def _fit(tmp_path: Path, make: Callable[[], pl.LightningModule], triage: Triage | None,
         extra: list[Any] | None = None, **kwargs: Any) -> tuple[pl.LightningModule, pl.Trainer]:
    pl.seed_everything(0, verbose=False)
    model = make()
    callbacks = [*(extra or []), *([triage] if triage is not None else [])]
    options: dict[str, Any] = dict(max_epochs=2, limit_train_batches=12, limit_val_batches=2,
                                   logger=False, enable_checkpointing=False,
                                   enable_progress_bar=False, enable_model_summary=False,
                                   default_root_dir=tmp_path, num_sanity_val_steps=0)
    options.update(kwargs)
    trainer = pl.Trainer(callbacks=callbacks, **options)
    train, val = digits_loaders()
    trainer.fit(model, train, val)
    return model, trainer


def _state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_identical(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("way", WAYS)
def test_a_copy_that_shares_storage_is_never_used(tmp_path: Path, way: str) -> None:
    states, trials = [], []
    for with_triage in (True, False):
        teacher = Teacher() if way == "submodule_held_by_a_callback" else None
        triage = Triage(report_dir=tmp_path / "r", verbose=False) if with_triage else None
        model, _ = _fit(tmp_path / str(with_triage), lambda t=teacher: Normed(way, t), triage,
                        extra=[teacher] if teacher is not None else None)
        states.append(_state(model))
        if triage is not None:
            report = triage.report.report
            assert report is not None
            trials = [f["remedy"] for f in report["findings"] if "remedy" in f]
    _assert_identical(*states)  # batch-norm statistics and trained weights included
    # the end-of-fit trial needs a copy: it says why it did not run
    assert trials and all(t["verdict"] == "skipped" and "shares its storage" in t["reason"]
                          for t in trials), trials


@pytest.mark.parametrize("way", WAYS)
def test_probe_module_falls_back_to_the_snapshot(way: str) -> None:
    teacher = Teacher()
    model = Normed(way, teacher)
    trainer = pl.Trainer(callbacks=[teacher], logger=False, enable_progress_bar=False)
    before = _state(model)
    with probing.probe_module(trainer, model) as probe:
        assert not probe.copied and "shares its storage" in probe.how, probe.how
        probe.module.train()
        probe.module(torch.randn(8, 64) * 3)  # moves the batch-norm statistics in place
    _assert_identical(before, _state(model))


def test_a_plain_copy_shares_nothing() -> None:
    model = Normed("tied_across_the_boundary")
    model.pre.weight = nn.Parameter(model.pre.weight.detach().clone())
    model.tied.weight = model.pre.weight
    with probing.probe_module(None, model) as probe:
        assert probe.copied, probe.how


# ----------------------------------------------------------------------------- the trainer
class StopsWhenLow(DigitsMLP):
    """Stops the run once the loss is below a level that the overfit probe's copy reaches."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        if loss.item() < 0.5:
            self.trainer.should_stop = True
        return loss


class ChangesLimits(DigitsMLP):
    """Ends validation and the run's epochs from the step once the loss is low."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        if loss.item() < 0.5:
            self.trainer.limit_val_batches = 0
            self.trainer.fit_loop.max_epochs = 1
        return loss


class Logs(DigitsMLP):
    """Logs its loss and writes ``callback_metrics`` directly."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("seen", float(batch_idx), on_step=True)
        self.trainer.callback_metrics["direct"] = loss.detach()
        return loss


STEPS: dict[str, Callable[[], pl.LightningModule]] = {
    "should_stop": StopsWhenLow,
    "limits": ChangesLimits,
    "logs": Logs,
}


@pytest.mark.parametrize("name", sorted(STEPS))
def test_a_step_that_writes_the_trainer_writes_only_the_real_one(tmp_path: Path,
                                                                  name: str) -> None:
    runs = []
    for with_triage in (True, False):
        triage = Triage(report_dir=tmp_path / "r", verbose=False) if with_triage else None
        model, trainer = _fit(tmp_path / str(with_triage), STEPS[name], triage)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        runs.append((_state(model), trainer.global_step, trainer.current_epoch,
                     trainer.limit_val_batches, trainer.should_stop, metrics))
    (state_a, *rest_a), (state_b, *rest_b) = runs
    _assert_identical(state_a, state_b)
    assert rest_a == rest_b


def test_trainer_state_puts_back_what_a_step_writes() -> None:
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, max_epochs=3)
    with probing.trainer_state(trainer):
        trainer.should_stop = True
        trainer.limit_train_batches = 2
        trainer.fit_loop.max_epochs = 1
        trainer.fit_loop.epoch_loop.max_steps = 5
        trainer.callbacks.clear()
    assert trainer.should_stop is False and trainer.limit_train_batches == 1.0
    assert trainer.fit_loop.max_epochs == 3 and trainer.fit_loop.epoch_loop.max_steps == -1
    assert trainer.callbacks
