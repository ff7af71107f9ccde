"""GradientWiringCheck on real Trainer.fit runs: broken wiring caught, healthy runs silent."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_triage import GradientWiringCheck, Triage, TriageConfigError
from tests.helpers import make_trainer, stage_codes
from tests.probe_models import (
    Classifier,
    DetachedEncoder,
    DetachedLoss,
    EncoderHead,
    FrozenEncoder,
    HeadOnlyOptimizer,
    ManualClassifier,
    ManualDetached,
    TinyGAN,
    TinyLM,
    UnusedModule,
    ZeroBranch,
    cnn,
    digits,
    lm_loaders,
    mlp,
)


def fit_wiring(tmp_path: Path, model: Any, loaders: Any = None, **trainer_kwargs: Any
               ) -> GradientWiringCheck:
    torch.manual_seed(0)
    check = GradientWiringCheck(strict=True)
    train, val = loaders or digits()
    trainer = make_trainer(tmp_path, [check], **trainer_kwargs)
    trainer.fit(model, train, val)
    return check


def the(check: GradientWiringCheck, code: str) -> Any:
    found = [f for f in check.findings if f.code == code]
    assert len(found) == 1, [f.code for f in check.findings]
    return found[0]


def test_detached_encoder_names_every_encoder_parameter(tmp_path: Path) -> None:
    check = fit_wiring(tmp_path, DetachedEncoder())
    f = the(check, "wiring.no_grad_params")
    assert f.severity == "error"
    assert f.layer == "encoder"
    assert f.global_step == 0
    assert f.evidence["modules"] == ["encoder"]
    assert f.evidence["params"] == ["encoder.0.weight", "encoder.0.bias", "encoder.2.weight",
                                    "encoder.2.bias"]
    assert "`encoder` (all 4 tensors" in f.message
    assert stage_codes(check.findings, "wiring") == {"wiring.no_grad_params"}
    assert check.check_status()["status"] == "failed"
    assert check._handles == []


def test_unused_module_is_reported(tmp_path: Path) -> None:
    check = fit_wiring(tmp_path, UnusedModule())
    f = the(check, "wiring.no_grad_params")
    assert f.evidence["modules"] == ["aux"]


def test_zero_gradient_branch(tmp_path: Path) -> None:
    check = fit_wiring(tmp_path, ZeroBranch())
    f = the(check, "wiring.zero_grad_params")
    assert f.evidence["modules"] == ["aux"]
    assert f.severity == "warning"
    assert stage_codes(check.findings, "wiring") == {"wiring.zero_grad_params"}


def test_frozen_encoder_is_info_with_counts(tmp_path: Path) -> None:
    check = fit_wiring(tmp_path, FrozenEncoder())
    f = the(check, "wiring.frozen_params")
    assert f.severity == "info"
    assert f.evidence["per_module"] == {"encoder": 64 * 32 + 32 + 32 * 32 + 32}
    # the encoder was never trained or loaded: frozen at its random draw (issue 42)
    assert stage_codes(check.findings, "wiring") == {"wiring.frozen_params",
                                                     "wiring.frozen_at_init"}
    assert the(check, "wiring.frozen_at_init").evidence["modules"] == ["encoder.0", "encoder.2"]


def test_optimizer_missing_the_encoder(tmp_path: Path) -> None:
    check = fit_wiring(tmp_path, HeadOnlyOptimizer())
    f = the(check, "wiring.params_not_in_optimizer")
    assert f.evidence["modules"] == ["encoder"]
    assert f.severity == "error"
    assert stage_codes(check.findings, "wiring") == {"wiring.params_not_in_optimizer"}


def test_detached_loss_is_reported_before_lightning_crashes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    triage = Triage(report_dir=tmp_path / "report", strict=True, verbose=False, overfit=False)
    train, val = digits()
    trainer = make_trainer(tmp_path, [triage])
    with pytest.raises(RuntimeError, match="does not require grad"):
        trainer.fit(DetachedLoss(), train, val)
    report = json.loads((tmp_path / "report" / "triage_report.json").read_text())
    assert report["status"] == "crashed"
    assert report["start_here"] == "wiring.loss_detached"
    detached = [f for f in report["findings"] if f["code"] == "wiring.loss_detached"]
    assert len(detached) == 1
    assert detached[0]["global_step"] == 0
    assert triage.check("GradientWiringCheck")._handles == []


def test_manual_optimization_detached_layer(tmp_path: Path) -> None:
    check = fit_wiring(tmp_path, ManualDetached())
    f = the(check, "wiring.no_grad_params")
    assert f.evidence["modules"] == ["net.0"]


@pytest.mark.parametrize("build", [
    pytest.param(lambda: (Classifier(mlp(dropout=0.2)), None, {}), id="mlp-dropout"),
    pytest.param(lambda: (Classifier(cnn()), None, {}), id="cnn-bn-dropout"),
    pytest.param(lambda: (EncoderHead(), None, {"accumulate_grad_batches": 2}), id="accumulate"),
    pytest.param(lambda: (ManualClassifier(), None, {}), id="manual"),
    pytest.param(lambda: (TinyLM(), lm_loaders(), {}), id="transformer-lm"),
    pytest.param(lambda: (TinyGAN(), None, {}), id="manual-gan-two-optimizers"),
])
def test_healthy_runs_are_silent(tmp_path: Path, build: Any) -> None:
    model, loaders, kwargs = build()
    check = fit_wiring(tmp_path, model, loaders, **kwargs)
    assert stage_codes(check.findings, "wiring") == set()
    assert check.check_status()["status"] == "passed"
    n = sum(1 for p in model.parameters() if p.requires_grad)
    assert check.detail.startswith(f"first backward at step 0: {n}/{n} trainable")
    assert check._handles == []


def test_state_round_trip_does_not_rerun(tmp_path: Path) -> None:
    check = fit_wiring(tmp_path, DetachedEncoder())
    clone = GradientWiringCheck(strict=True)
    clone.load_state_dict(pickle.loads(pickle.dumps(check.state_dict())))
    assert clone._done
    assert [f.code for f in clone.findings] == [f.code for f in check.findings]
    train, val = digits()
    make_trainer(tmp_path, [clone]).fit(DetachedEncoder(), train, val)
    assert len(clone.findings) == len(check.findings)


def test_arguments_are_validated() -> None:
    with pytest.raises(TriageConfigError, match="check_optimizer"):
        GradientWiringCheck(check_optimizer="yes")  # type: ignore[arg-type]


def test_sharded_strategies_are_recognized() -> None:
    from types import SimpleNamespace

    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

    from lightning_triage.callbacks._shared import sharded_strategy

    assert sharded_strategy(SimpleNamespace(strategy=FSDPStrategy())) == "FSDPStrategy"  # type: ignore[arg-type]
    assert sharded_strategy(SimpleNamespace(strategy=DDPStrategy())) is None  # type: ignore[arg-type]
