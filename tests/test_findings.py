from __future__ import annotations

import json

import pytest

from lightning_triage.findings import (
    CODES,
    STAGES,
    Finding,
    register_code,
    sort_findings,
    start_here,
)

# Every code of DESIGN.md (curve.* expanded): the public contract.
DESIGN_CODES = """
data.nonfinite_input data.nonfinite_target data.unnormalized_input data.constant_input
data.target_out_of_range data.class_imbalance data.repeated_batch data.duplicate_samples
data.train_val_overlap data.train_val_shift data.label_misalignment
init.loss_above_chance init.loss_below_chance init.chance_unknown
wiring.no_grad_params wiring.zero_grad_params wiring.frozen_params wiring.loss_detached
wiring.params_not_in_optimizer overfit.failed overfit.passed
structure.batch_mixing structure.causal_leak structure.shape_mismatch structure.target_leak
mode.train_mode_in_eval
curve.not_learning curve.lr_too_low curve.lr_too_high curve.diverging curve.plateau_at_chance
curve.loss_spike curve.overfitting curve.healthy
grad.exploding grad.vanishing grad.spike grad.dead_units grad.update_ratio
numerics.nonfinite_loss numerics.nonfinite_forward numerics.nonfinite_backward
numerics.nonfinite_params numerics.precision_overflow numerics.near_overflow
""".split()


def test_every_design_code_is_registered_in_its_stage() -> None:
    missing = [c for c in DESIGN_CODES if c not in CODES]
    assert not missing
    for code in DESIGN_CODES:
        spec = CODES[code]
        assert spec.stage in STAGES
        assert spec.title and spec.hint


def test_stage_order_is_the_protocol() -> None:
    assert STAGES == ("data", "init", "wiring", "overfit", "structure", "mode", "curve", "grad",
                      "numerics")


def test_info_codes_are_info() -> None:
    for code in ("init.chance_unknown", "wiring.frozen_params", "overfit.passed", "curve.healthy"):
        assert CODES[code].severity == "info"


def test_unknown_code_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"Unknown finding code 'init.loss_too_high'"):
        Finding.create("init.loss_too_high", "x", check="T")


def test_bad_severity_is_rejected() -> None:
    with pytest.raises(ValueError, match="`severity` must be one of"):
        Finding.create("init.loss_above_chance", "x", check="T", severity="fatal")  # type: ignore[arg-type]


def test_defaults_come_from_the_registry_and_can_be_overridden() -> None:
    f = Finding.create("grad.spike", "norm 40x", check="GradientMonitor", global_step=7,
                       layer="encoder.0", severity="error", evidence={"ratio": 40.0})
    assert f.title == CODES["grad.spike"].title
    assert f.severity == "error"
    assert (f.stage, f.global_step, f.layer) == ("grad", 7, "encoder.0")


def test_roundtrip_and_json_ready_evidence() -> None:
    import numpy as np
    import torch

    f = Finding.create("data.nonfinite_input", "2 NaN", check="BatchInspector", global_step=3,
                       evidence={"count": torch.tensor(2), "rows": np.array([1, 5]),
                                 "max": float("inf"), "shape": (4, 8)})
    d = f.to_dict()
    assert json.loads(json.dumps(d, allow_nan=False))["evidence"] == {
        "count": 2, "rows": [1, 5], "max": "inf", "shape": [4, 8]}
    assert Finding.from_dict(d) == f
    assert list(d) == ["code", "severity", "title", "message", "hint", "global_step", "epoch",
                       "rank", "layer", "evidence", "check"]


def test_sort_by_stage_then_step_and_start_here() -> None:
    def mk(code: str, step: int | None) -> Finding:
        return Finding.create(code, code, check="T", global_step=step)

    findings = [mk("numerics.nonfinite_forward", 3), mk("curve.healthy", 0),
                mk("data.unnormalized_input", 5), mk("init.chance_unknown", 0),
                mk("data.nonfinite_input", 2), mk("triage.check_error", 0)]
    ordered = [f.code for f in sort_findings(findings)]
    assert ordered == ["data.nonfinite_input", "data.unnormalized_input", "init.chance_unknown",
                       "curve.healthy", "numerics.nonfinite_forward", "triage.check_error"]
    assert start_here(findings) == "data.nonfinite_input"
    # info findings and the checks' own failures never lead the report
    assert start_here([mk("curve.healthy", 0), mk("triage.check_error", 0)]) is None


def test_register_code_validates() -> None:
    spec = register_code("overfit.test_only_code", "info", "Title", "Hint")
    assert CODES["overfit.test_only_code"] == spec
    with pytest.raises(ValueError, match=r"must be `<stage>.<name>`"):
        register_code("nostage", "info", "t", "h")
    with pytest.raises(ValueError, match="already registered differently"):
        register_code("init.loss_above_chance", "info", "t", "h")
    del CODES["overfit.test_only_code"]
