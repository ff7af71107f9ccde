from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from lightning_triage.findings import (
    CODES,
    STAGES,
    Finding,
    register_code,
    sort_findings,
)
from lightning_triage.ranking import SPIKE_WINDOW, explain_findings, start_here
from lightning_triage.report import REPORT_SCHEMA, build_report

# Every code of docs/design.md (curve.* expanded): the public contract.
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
                       "rank", "layer", "evidence", "check", "explained_by"]


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


def _mk(code: str, step: int | None = 0, layer: str | None = None, severity: Any = None,
        **evidence: Any) -> Finding:
    return Finding.create(code, f"{code} message.", check="T", global_step=step, layer=layer,
                          severity=severity, evidence=evidence)


@pytest.mark.parametrize(("cause", "layer"), [
    ("curve.diverging", None), ("curve.lr_too_low", None), ("curve.lr_too_high", None),
    ("numerics.nonfinite_forward", "net.2"), ("numerics.precision_overflow", "net.0"),
    ("numerics.nonfinite_loss", None), ("structure.batch_mixing", None),
    ("structure.shape_mismatch", None), ("grad.vanishing", "net.0"),
    ("wiring.no_grad_params", None), ("overfit.loss_on_probabilities", None),
])
def test_overfit_failure_is_explained_by_a_cause_which_leads(cause: str, layer: str | None) -> None:
    findings = [_mk("overfit.failed", 0), _mk(cause, 40, layer=layer)]
    out = {f.code: f for f in explain_findings(findings)}
    assert out["overfit.failed"].explained_by == [cause]
    assert f"Explained by `{cause}`" in out["overfit.failed"].message
    assert out[cause].explained_by == []
    assert start_here(findings) == cause
    report = build_report(findings, status="completed", run={})
    assert report["start_here"] == cause
    jsonschema.validate(report["findings"], REPORT_SCHEMA["properties"]["findings"])
    assert next(f for f in report["findings"] if f["code"] == "overfit.failed")[
        "explained_by"] == [cause]


@pytest.mark.parametrize("other", [
    "curve.loss_spike", "curve.overfitting", "mode.train_mode_in_eval", "grad.dead_units",
    "data.class_imbalance", "structure.causal_leak", "numerics.nonfinite_params",
])
def test_overfit_failure_is_not_explained_by_what_cannot_cause_it(other: str) -> None:
    findings = [_mk("overfit.failed", 0), _mk(other, 40)]
    out = {f.code: f for f in explain_findings(findings)}
    assert out["overfit.failed"].explained_by == []
    assert "Explained by" not in out["overfit.failed"].message
    assert start_here(findings) == ("overfit.failed" if other.split(".")[0] != "data" else other)


def test_info_findings_explain_nothing() -> None:
    findings = [_mk("overfit.failed", 0), _mk("wiring.frozen_params", 0),
                _mk("curve.lr_too_low", 50, severity="info")]
    assert explain_findings(findings)[0].explained_by == []
    assert start_here(findings) == "overfit.failed"


def test_spike_right_before_a_nonfinite_step_is_explained() -> None:
    spike, nan = _mk("curve.loss_spike", 20), _mk("numerics.nonfinite_loss", 23)
    grad = _mk("grad.exploding", 22)
    out = explain_findings([spike, grad, nan])
    assert [f.explained_by for f in out] == [["numerics.nonfinite_loss"]] * 2 + [[]]
    assert start_here([spike, grad, nan]) == "numerics.nonfinite_loss"
    # a divergence at the same step explains it too; the earlier stage of the causes leads
    div = _mk("curve.diverging", 23)
    assert explain_findings([spike, div, nan])[0].explained_by == [
        "curve.diverging", "numerics.nonfinite_loss"]
    assert start_here([spike, div, nan]) == "curve.diverging"


@pytest.mark.parametrize(("spike_step", "nan_step", "layer", "explained"), [
    (20, 20, "net.2", True),                              # the same step
    (20, 20 + SPIKE_WINDOW, "net.2", True),               # at the edge of the window
    (20, 21 + SPIKE_WINDOW, "net.2", False),              # too long before
    (20, 19, "net.2", False),                             # after the non-finite step
    (20, 22, None, False),                                # a non-finite forward with no layer
])
def test_spike_window(spike_step: int, nan_step: int, layer: str | None, explained: bool) -> None:
    findings = [_mk("curve.loss_spike", spike_step),
                _mk("numerics.nonfinite_forward", nan_step, layer=layer)]
    assert bool(explain_findings(findings)[0].explained_by) is explained
    assert start_here(findings) == ("numerics.nonfinite_forward" if explained
                                    else "curve.loss_spike")


def test_not_learning_is_explained_by_a_zero_update_only() -> None:
    below = _mk("grad.update_ratio", 90, layer="net.0", direction="below")
    above = _mk("grad.update_ratio", 90, layer="net.0", direction="above")
    flat = _mk("curve.not_learning", 89)
    assert explain_findings([flat, below])[0].explained_by == ["grad.update_ratio"]
    assert start_here([flat, below, _mk("overfit.failed", 0)]) == "grad.update_ratio"
    assert explain_findings([flat, above])[0].explained_by == []
    assert start_here([flat, above]) == "curve.not_learning"
    assert explain_findings([flat, _mk("curve.lr_too_high", 10)])[0].explained_by == []


def test_explain_is_idempotent_and_survives_a_round_trip() -> None:
    findings = explain_findings([_mk("overfit.failed", 0), _mk("curve.diverging", 12)])
    again = explain_findings([Finding.from_dict(f.to_dict()) for f in findings])
    assert again == findings
    assert again[0].message.count("Explained by") == 1
    # the cause gone (e.g. a report rebuilt without it): the explanation goes too
    alone = explain_findings([findings[0]])[0]
    assert alone.explained_by == [] and alone.message == "overfit.failed message."
    # a report written before `explained_by` existed still loads
    old = findings[1].to_dict()
    del old["explained_by"]
    assert Finding.from_dict(old).explained_by == []
