from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import Callback

from lightning_triage.callbacks._monitor import _GlobalStep, step_counter
from tests.helpers import make_trainer
from tests.probe_models import Classifier, ManualClassifier, digits


class CompareSteps(Callback):
    """Reads the step counter at every per-step hook against ``trainer.global_step``."""

    def __init__(self) -> None:
        self.pairs: list[tuple[int, int]] = []
        self.counter: Any = None
        self.kinds: list[type] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.counter = step_counter(trainer)
        self.kinds.append(type(self.counter))

    def _compare(self, trainer: pl.Trainer, *args: Any) -> None:
        self.pairs.append((self.counter.completed, trainer.global_step))

    on_train_batch_start = on_before_optimizer_step = on_train_batch_end = _compare


@pytest.mark.parametrize("model", [Classifier, ManualClassifier])
def test_step_counter_is_the_global_step(tmp_path: Path, model: type) -> None:
    train, _ = digits()
    spy = CompareSteps()
    make_trainer(tmp_path, [spy], max_epochs=2, accumulate_grad_batches=1).fit(model(), train)
    assert len(spy.pairs) > 20
    assert all(a == b for a, b in spy.pairs)
    assert spy.pairs[-1][1] == 8  # 4 batches x 2 epochs: the counter moved with the steps
    # the fast path was taken (the loop's progress counter), not the property fallback
    assert len(spy.kinds) == 2
    assert not any(issubclass(k, _GlobalStep) for k in spy.kinds), spy.kinds


def test_step_counter_falls_back_where_the_loops_differ() -> None:
    class Loopless:  # a trainer whose loops lack the progress counter
        fit_loop = None
        lightning_module = None
        global_step = 5

    counter = step_counter(Loopless())  # type: ignore[arg-type]
    assert isinstance(counter, _GlobalStep)
    assert counter.completed == 5


def test_step_counter_outside_fit() -> None:
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    assert step_counter(trainer).completed == trainer.global_step == 0
