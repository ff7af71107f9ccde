"""A loss computed by a compiled free function (`torch.compile` of a plain function, issue 41):
the step-0 watch cannot see inside it without changing it (dynamo traces a torch function mode
active at the call into the graph it compiles, and guards on it), so the step is not watched:
the compiled function keeps its one graph and its calls, and the checks judge no chance level
from the batch's labels (`init.chance_unknown` at info naming the function). The overfit probe,
which runs the step eager on a copy, still reads the objective."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_triage import Triage
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from lightning_triage.functional.compiled import compiled_functions
from lightning_triage.functional.objective import StepObjective
from lightning_triage.testing import CountingBackend

BACKEND = CountingBackend("eager")
compiled_ce = torch.compile(lambda logits, y: F.cross_entropy(logits, y), backend=BACKEND)


def _helper(logits: Tensor, y: Tensor) -> Tensor:
    return compiled_ce(logits, y)


class GlobalLoss(DigitsMLP):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return compiled_ce(self(x), y)


class HelperLoss(nn.Linear):
    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        return _helper(self(x), y)


class ClosureLoss(nn.Linear):
    def __init__(self) -> None:
        super().__init__(2, 2)
        fn = torch.compile(F.mse_loss, backend="eager")
        self.loss = lambda a, b: fn(a, b)  # a plain lambda holding the compiled function


def test_compiled_functions_are_found_in_the_code_the_module_runs() -> None:
    assert compiled_functions(GlobalLoss()) == ["compiled_ce"]
    assert compiled_functions(HelperLoss(2, 2)) == ["compiled_ce"]  # through a helper
    assert compiled_functions(ClosureLoss())  # a closure's cell
    assert compiled_functions(DigitsMLP()) == []


def test_the_step_calling_a_compiled_function_is_not_watched() -> None:
    step = StepObjective()
    step.start(GlobalLoss())
    assert "compiled function `compiled_ce`" in step.skipped
    objective = step.finish(2.3)
    assert objective is not None and not objective.recognized and not objective.noisy
    assert "compiled code (`compiled_ce`" in objective.describe()
    step.start(DigitsMLP())
    assert step.skipped == ""
    step.close()


def test_a_fit_calling_a_compiled_loss_keeps_its_graph_and_judges_no_label_chance(
        tmp_path: Path) -> None:
    torch._dynamo.reset()
    BACKEND.graphs = BACKEND.calls = 0
    pl.seed_everything(0, verbose=False)
    train, val = digits_loaders()
    triage = Triage(report_dir=tmp_path, verbose=False, overfit_time_budget=120.0,
                    verify_remedies=False)
    pl.Trainer(max_epochs=1, limit_train_batches=8, callbacks=[triage], logger=False,
               enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, default_root_dir=tmp_path,
               accelerator="cpu").fit(GlobalLoss(), train, val)
    assert (BACKEND.graphs, BACKEND.calls) == (1, 8)  # the user's steps only, one graph
    report = triage.report.report
    assert report is not None
    init = next(f for f in report["findings"] if f["code"] == "init.chance_unknown")
    assert init["severity"] == "info" and "compiled_ce" in init["message"]
    loud = [f["code"] for f in report["findings"] if f["severity"] != "info"]
    assert loud == [], loud
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["GlobalLoss"])
def test_weights_are_bit_identical_with_and_without_triage(tmp_path: Path, name: str) -> None:
    states = []
    for with_triage in (True, False):
        torch._dynamo.reset()
        pl.seed_everything(0, verbose=False)
        train, val = digits_loaders()
        model = GlobalLoss()
        callbacks = [Triage(report_dir=tmp_path, verbose=False)] if with_triage else []
        pl.Trainer(max_epochs=1, limit_train_batches=8, callbacks=callbacks, logger=False,
                   enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, default_root_dir=tmp_path,
                   accelerator="cpu").fit(model, train, val)
        states.append(model.state_dict())
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key
