"""OverfitBatchCheck on real Trainer.fit runs: memorizes healthy models, fails broken ones,
and leaves the run untouched."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_triage import EvalModeCheck, GradientWiringCheck, OverfitBatchCheck, Triage
from lightning_triage.callbacks.overfit_batch import preserved_attributes
from lightning_triage.demo.broken import broken_run
from lightning_triage.demo.broken.overfit import DistilledMLP
from tests.helpers import make_trainer, seeds, stage_codes
from tests.probe_models import (
    Classifier,
    DetachedLoss,
    DetachedTrunkWithBias,
    DictBatchClassifier,
    DoubleSoftmax,
    FrozenAllButBias,
    ManualClassifier,
    Regressor,
    TinyLM,
    WarmupClassifier,
    cnn,
    dict_loaders,
    digits,
    lm_loaders,
    mlp,
    regression_loaders,
)

# A budget no loaded machine spends before pytest's own 300 s timeout: the probes end on their
# step counts, never on the wall clock (the budget itself has its own test, with 1e-6 s).
NO_CLOCK = 3600.0


def fit_overfit(tmp_path: Path, model: Any, loaders: Any = None, check: Any = None,
                **trainer_kwargs: Any) -> OverfitBatchCheck:
    torch.manual_seed(0)
    check = check or OverfitBatchCheck(max_steps=200, time_budget=NO_CLOCK, strict=True)
    train, val = loaders or digits()
    trainer = make_trainer(tmp_path, [check], **trainer_kwargs)
    trainer.fit(model, train, val)
    return check


def the(check: OverfitBatchCheck, code: str) -> Any:
    found = [f for f in check.findings if f.code == code]
    assert len(found) == 1, [(f.code, f.message) for f in check.findings]
    return found[0]


@pytest.mark.parametrize("build", [
    pytest.param(lambda: (Classifier(mlp(dropout=0.3), lr=0.05), None, {}), id="mlp-sgd-dropout"),
    pytest.param(lambda: (Classifier(cnn(), lr=1e-3, optimizer="adam", weight_decay=0.5), None,
                          {}), id="cnn-bn-adam-wd"),
    pytest.param(lambda: (Classifier(mlp(), lr=0.05), None, {"accumulate_grad_batches": 2}),
                 id="accumulate"),
    pytest.param(lambda: (TinyLM(), lm_loaders(), {}), id="transformer-lm"),
    pytest.param(lambda: (Classifier(mlp(), lr=0.05), None, {"precision": "bf16-mixed"}),
                 id="bf16-mixed"),
    pytest.param(lambda: (DictBatchClassifier(), dict_loaders(), {}), id="dict-batch"),
    pytest.param(lambda: (WarmupClassifier(lr=0.05), None, {}), id="warmup-from-lr-0"),
    pytest.param(lambda: (Regressor(), regression_loaders(), {}), id="mse-regression"),
])
def test_healthy_models_pass(tmp_path: Path, build: Any) -> None:
    model, loaders, kwargs = build()
    check = fit_overfit(tmp_path, model, loaders, **kwargs)
    f = the(check, "overfit.passed")
    assert stage_codes(check.findings, "overfit") == {"overfit.passed"}
    assert f.evidence["best"] <= f.evidence["target"] < 0.06 * f.evidence["start"]
    assert check.check_status()["status"] == "passed"
    assert "steps" in check.detail
    assert " s," in check.detail
    assert check.series()["overfit_loss"][0][0] == 0.0


def test_double_softmax_fails_with_the_floor(tmp_path: Path) -> None:
    check = fit_overfit(tmp_path, DoubleSoftmax(lr=0.05))
    f = the(check, "overfit.failed")
    assert f.evidence["floor"] == pytest.approx(1.4612, abs=1e-3)
    assert f.evidence["best"] >= 1.43
    assert "probabilities" in f.evidence["causes"][0]
    assert "`overfit.loss_on_probabilities`" in f.message  # the likely cause links to its finding
    assert check.check_status()["status"] == "failed"


def test_double_softmax_fails_with_adam_too(tmp_path: Path) -> None:
    check = fit_overfit(tmp_path, DoubleSoftmax(lr=1e-3, optimizer="adam"))
    f = the(check, "overfit.failed")
    assert "probabilities" in f.evidence["causes"][0]


def test_broken_gradient_path_fails_and_names_it(tmp_path: Path) -> None:
    check = fit_overfit(tmp_path, DetachedTrunkWithBias(lr=0.05))
    f = the(check, "overfit.failed")
    assert f.evidence["reason"] in ("plateau", "max_steps")
    assert f.evidence["causes"][0].startswith("broken gradient path")
    assert f.evidence["no_grad_modules"] == ["encoder", "head"]


def test_frozen_layers_fail_and_are_named(tmp_path: Path) -> None:
    check = fit_overfit(tmp_path, FrozenAllButBias(lr=0.05))
    f = the(check, "overfit.failed")
    assert f.evidence["causes"][0].startswith("frozen layers")
    assert f.evidence["frozen_modules"] == ["encoder", "head"]


class GradTeacherMLP(DistilledMLP):
    """The distillation student whose frozen teacher runs with gradients enabled."""

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        soft = F.softmax(self.teacher(x) / self.temperature, dim=1)
        return -(soft * F.log_softmax(self(x), dim=1)).sum(1).mean()


def test_a_frozen_teacher_run_under_no_grad_is_not_named_a_cause(tmp_path: Path) -> None:
    # distillation from a teacher whose checkpoint was never loaded: the probe fails, but the
    # teacher is frozen by design and runs under `no_grad`, off the student's gradient path
    run = broken_run("random-teacher")
    pl.seed_everything(0, verbose=False)
    model, _, _ = run.build()
    check = fit_overfit(tmp_path, model)
    f = the(check, "overfit.failed")
    assert f.evidence["frozen_modules"] == []
    assert not any("frozen" in cause for cause in f.evidence["causes"]), f.evidence["causes"]
    # the same teacher called with gradients enabled is on the path: it is named
    check = fit_overfit(tmp_path / "on-path", GradTeacherMLP(nn.Linear(64, 10)))
    assert the(check, "overfit.failed").evidence["frozen_modules"] == ["teacher"]


def test_detached_loss_fails_at_once_and_report_keeps_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    triage = Triage(report_dir=tmp_path / "r", strict=True, verbose=False)
    train, val = digits()
    with pytest.raises(RuntimeError):
        make_trainer(tmp_path, [triage]).fit(DetachedLoss(), train, val)
    report = json.loads((tmp_path / "r" / "triage_report.json").read_text())
    failed = [f for f in report["findings"] if f["code"] == "overfit.failed"]
    assert len(failed) == 1
    assert "loss not connected" in failed[0]["evidence"]["causes"][0]
    assert report["start_here"] == "wiring.loss_detached"


def test_manual_optimization_is_skipped_with_info(tmp_path: Path) -> None:
    check = fit_overfit(tmp_path, ManualClassifier())
    f = the(check, "overfit.skipped")
    assert f.severity == "info"
    assert "manual optimization" in f.message
    assert check.check_status()["status"] == "skipped"


def test_time_budget_skips_a_slow_probe(tmp_path: Path) -> None:
    check = OverfitBatchCheck(max_steps=100, time_budget=1e-6, strict=True)
    check = fit_overfit(tmp_path, Classifier(), check=check)
    f = the(check, "overfit.skipped")
    assert "budget" in f.message
    assert check.check_status()["status"] == "skipped"
    assert "(1 steps" in check.detail or "(2 steps" in check.detail


def test_custom_optimizer_is_copied_not_rebuilt(tmp_path: Path) -> None:
    built: list[int] = []

    class NeedsArgs(torch.optim.SGD):
        def __init__(self, params: Any, lr: float, special: int) -> None:
            super().__init__(params, lr=lr)
            built.append(special)  # a constructor side effect: must happen once

    class Custom(Classifier):
        def configure_optimizers(self) -> Any:
            return NeedsArgs(self.parameters(), lr=0.05, special=1)

    check = fit_overfit(tmp_path, Custom())
    f = the(check, "overfit.passed")
    assert "optimizer_fallback" not in f.evidence
    assert f.evidence["optimizer"].startswith("NeedsArgs(lr=0.05")
    assert built == [1]


def test_fallback_optimizer_is_said(tmp_path: Path) -> None:
    class Locked(torch.optim.SGD):
        def __init__(self, params: Any, lr: float) -> None:
            super().__init__(params, lr=lr)
            self.param_groups[0]["lock"] = threading.Lock()  # cannot be copied

    class Custom(Classifier):
        def configure_optimizers(self) -> Any:
            return Locked(self.parameters(), lr=0.05)

    check = fit_overfit(tmp_path, Custom())
    f = the(check, "overfit.passed")
    assert "could not copy `Locked`" in f.evidence["optimizer_fallback"]
    assert f.evidence["isolation"].startswith("in place: the module could not be copied")
    assert "Adam(lr=1e-3)" in check.detail


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _seeded_fit(tmp_path: Path, make: Any, callbacks: list[Any]) -> Classifier:
    pl.seed_everything(7, verbose=False)
    model = make()
    train, val = digits()
    trainer = make_trainer(tmp_path, callbacks, limit_train_batches=6, max_epochs=2,
                           limit_val_batches=1)
    trainer.fit(model, train, val)
    return model


@pytest.mark.parametrize("make", [
    pytest.param(lambda: Classifier(mlp(dropout=0.3), lr=0.05), id="mlp-dropout"),
    pytest.param(lambda: Classifier(cnn(), lr=1e-3, optimizer="adam", weight_decay=0.1),
                 id="cnn-batchnorm"),
])
def test_zero_interference_bit_identical(tmp_path: Path, make: Any) -> None:
    bare = _seeded_fit(tmp_path / "bare", make, [])
    checks = [GradientWiringCheck(strict=True),
              OverfitBatchCheck(max_steps=50, time_budget=NO_CLOCK, strict=True),
              EvalModeCheck(strict=True)]
    probed = _seeded_fit(tmp_path / "probed", make, checks)
    assert checks[1].ran
    assert checks[1].verdict is not None
    a, b = _weights(bare), _weights(probed)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # nothing from the probe was logged and the module's own records were restored
    assert probed.log_calls == bare.log_calls == 2 * 6 + 2 * 1
    assert probed.seen_batches == bare.seen_batches
    triage = Triage(report_dir=tmp_path / "r", strict=True, verbose=False, overfit_max_steps=50)
    bundled = _seeded_fit(tmp_path / "triage", make, [triage])
    c = _weights(bundled)
    for key in a:
        assert torch.equal(a[key], c[key]), key
    # healthy: the bundle's wiring, overfit and mode stages are silent
    assert triage.report.report is not None
    problems = {f["code"] for f in triage.report.report["findings"] if f["severity"] != "info"}
    assert not {c for c in problems if c.split(".")[0] in ("wiring", "overfit", "mode")}
    assert triage.check("OverfitBatchCheck").has_finding("overfit.passed")
    # the probe ran between InitialLossCheck's arming and its reading: it still saw the real step
    init = triage.check("InitialLossCheck")
    assert init.findings == []
    assert "ln(10) = 2.303 for 10 classes" in init.detail


def test_probe_runs_once_per_fit(tmp_path: Path) -> None:
    calls = []

    class Counting(Classifier):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            calls.append(batch_idx)
            return super().training_step(batch, batch_idx)

    check = fit_overfit(tmp_path, Counting(), max_epochs=2)
    steps = check.verdict.steps if check.verdict else 0
    assert len(calls) == steps + 2 * 4


def test_preserved_attributes_restores_metrics_and_counters() -> None:
    import torchmetrics

    net = nn.Linear(2, 2)
    net.acc = torchmetrics.classification.MulticlassAccuracy(num_classes=2)
    net.count = 3
    net.acc.update(torch.tensor([0, 1]), torch.tensor([0, 0]))
    before = float(net.acc.compute())
    with preserved_attributes(net):
        net.created_in_probe = 1.0
        net.count += 10
        for _ in range(3):
            net.acc.update(torch.tensor([1, 1]), torch.tensor([1, 1]))
    assert net.count == 3
    assert not hasattr(net, "created_in_probe")
    assert float(net.acc.compute()) == before


def test_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match="`batch_size`"):
        OverfitBatchCheck(batch_size=0)
    with pytest.raises(ValueError, match="`tolerance`"):
        OverfitBatchCheck(tolerance=1.5)
    with pytest.raises(ValueError, match="`min_steps`"):
        OverfitBatchCheck(max_steps=10, min_steps=20)
    with pytest.raises(ValueError, match="`time_budget`"):
        OverfitBatchCheck(time_budget=0)


def test_triage_arguments_are_validated_and_forwarded() -> None:
    with pytest.raises(ValueError, match="`overfit_max_steps`"):
        Triage(overfit_max_steps=1)
    with pytest.raises(ValueError, match="`overfit_time_budget`"):
        Triage(overfit_time_budget=-1.0)
    with pytest.raises(ValueError, match="`overfit_batch_size`"):
        Triage(overfit_batch_size=0)
    triage = Triage(overfit_batch_size=4, overfit_max_steps=20, overfit_time_budget=2.0)
    check = triage.check("OverfitBatchCheck")
    assert isinstance(check, OverfitBatchCheck)
    assert (check.batch_size, check.max_steps, check.time_budget, check.min_steps) == (4, 20, 2.0, 20)
    names = [type(c).__name__ for c in triage.checks]
    assert names.index("InitialLossCheck") < names.index("GradientWiringCheck") \
        < names.index("OverfitBatchCheck") < names.index("EvalModeCheck")
    assert "OverfitBatchCheck" not in [type(c).__name__ for c in Triage(overfit=False).checks]


class LabelSmoothing(Classifier):
    """A healthy classifier trained with label smoothing 0.2: for 10 classes its loss cannot go
    below ~0.87, far above the probe's near-zero target."""

    def loss(self, batch: Any) -> Any:
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y, label_smoothing=0.2)


@pytest.mark.parametrize("seed", seeds())
def test_label_smoothing_is_memorized_down_to_its_floor(tmp_path: Path, seed: int) -> None:
    torch.manual_seed(seed)
    check = OverfitBatchCheck(max_steps=300, time_budget=60.0, strict=True)
    trainer = make_trainer(tmp_path, [check])
    trainer.fit(LabelSmoothing(lr=0.2), *digits())
    f = the(check, "overfit.passed")
    assert stage_codes(check.findings, "overfit") == {"overfit.passed"}
    assert f.evidence["reason"] == "memorized_floor"
    assert f.evidence["all_predictions_right"] is True
    # the floor of label smoothing 0.2 over 10 classes: 0.18 * ln(0.02 / 0.82)... about 0.87
    assert 0.8 < f.evidence["best"] < 1.0
    assert "floor" in f.message


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_double_softmax_has_its_own_code_and_explains_the_failure(tmp_path: Path,
                                                                 optimizer: str) -> None:
    torch.manual_seed(0)
    triage = Triage(report_dir=tmp_path / "r", strict=True, verbose=False, overfit_time_budget=60.0)
    lr = 0.05 if optimizer == "sgd" else 1e-3
    make_trainer(tmp_path, [triage]).fit(DoubleSoftmax(lr=lr, optimizer=optimizer), *digits())
    report = triage.report.report
    codes = {f["code"]: f for f in report["findings"]}
    assert "overfit.loss_on_probabilities" in codes
    assert codes["overfit.loss_on_probabilities"]["evidence"]["floor"] == pytest.approx(1.4612,
                                                                                        abs=1e-3)
    assert report["start_here"] == "overfit.loss_on_probabilities"
    if "overfit.failed" in codes:  # the probe failing is the symptom of it
        assert codes["overfit.failed"]["explained_by"] == ["overfit.loss_on_probabilities"]


def test_healthy_and_label_smoothing_runs_raise_no_probability_finding(tmp_path: Path) -> None:
    for model in (Classifier(lr=0.05), LabelSmoothing(lr=0.2)):
        check = fit_overfit(tmp_path, model)
        assert "overfit.loss_on_probabilities" not in {f.code for f in check.findings}


class SoftmaxInLoss(Classifier):
    """The module returns logits; the loss code applies a softmax before `F.cross_entropy`."""

    def loss(self, batch: Any) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(torch.softmax(self(x), 1), y)


@pytest.mark.parametrize("seed", seeds())
def test_a_softmax_in_the_loss_code_is_caught_and_leads(tmp_path: Path, seed: int) -> None:
    torch.manual_seed(seed)
    triage = Triage(report_dir=tmp_path / "r", strict=True, verbose=False,
                    overfit_time_budget=NO_CLOCK)
    make_trainer(tmp_path, [triage]).fit(SoftmaxInLoss(lr=0.05), *digits())
    report = triage.report.report
    found = {f["code"]: f for f in report["findings"]}
    assert report["start_here"] == "overfit.loss_on_probabilities", sorted(found)
    f = found["overfit.loss_on_probabilities"]
    assert f["evidence"]["softmax_in"] == "loss"
    assert f["evidence"]["floor"] == pytest.approx(1.4612, abs=1e-3)
    assert "softmax is applied inside the loss" in f["message"]
    # right predictions do not turn the floor into a pass
    assert "overfit.passed" not in found
    assert found["overfit.failed"]["explained_by"] == ["overfit.loss_on_probabilities"]


@pytest.mark.parametrize("seed", seeds())
def test_logits_into_cross_entropy_raise_no_probability_finding(tmp_path: Path, seed: int) -> None:
    torch.manual_seed(seed)
    for model in (Classifier(lr=0.05), LabelSmoothing(lr=0.2)):
        check = fit_overfit(tmp_path, model)
        assert "overfit.loss_on_probabilities" not in {f.code for f in check.findings}
        assert "overfit.passed" in {f.code for f in check.findings}  # the probe ran, and memorized
        assert check.check_status()["status"] == "passed"
