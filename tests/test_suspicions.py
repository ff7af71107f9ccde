"""The severity pass: a suspicion without a symptom is info (constructed findings)."""

from __future__ import annotations

from typing import Any

import pytest

from lightning_triage.findings import CODES, Finding
from lightning_triage.ranking import SUSPICIONS, settle_suspicions
from lightning_triage.report import build_report


def make(code: str, step: int | None = None, check: str = "T", **evidence: Any) -> Finding:
    return Finding.create(code, f"{code} seen", check=check, global_step=step, evidence=evidence)


def severities(findings: list[Finding]) -> dict[str, str]:
    return {f.code: f.severity for f in settle_suspicions(findings)}


def test_every_code_of_the_table_is_registered() -> None:
    for code, rule in SUSPICIONS.items():
        assert code in CODES and CODES[code].severity == "warning"
        assert rule.confirmed_by <= set(CODES) and rule.cleared_by <= set(CODES)


def test_an_isolated_gradient_spike_is_info_that_says_so() -> None:
    spike = make("grad.spike", 40, loss_spike_followed=False)
    [out] = settle_suspicions([spike])
    assert out.severity == "info" and not out.is_problem
    assert out.message.startswith(spike.message) and "no loss spike" in out.message
    assert out.evidence["severity_if_confirmed"] == "warning"
    assert settle_suspicions([out]) == [out]  # idempotent


@pytest.mark.parametrize(("confirm", "step", "severity"), [
    ("curve.loss_spike", 42, "warning"),
    ("curve.diverging", 50, "warning"),
    ("numerics.nonfinite_loss", 40, "warning"),
    ("grad.exploding", 45, "warning"),
    ("curve.loss_spike", 80, "info"),  # 40 steps later: not a consequence of this spike
    ("curve.loss_spike", 30, "info"),  # before it
])
def test_a_gradient_spike_is_a_warning_when_trouble_follows(confirm: str, step: int,
                                                            severity: str) -> None:
    found = severities([make("grad.spike", 40), make(confirm, step)])
    assert found["grad.spike"] == severity
    assert found[confirm] == CODES[confirm].severity  # the confirming finding is left alone


def test_a_spike_that_saw_the_loss_spike_itself_stays_a_warning() -> None:
    spike = make("grad.spike", 40, loss_spike_followed=True)
    assert severities([spike])["grad.spike"] == "warning"
    # one batch's loss doubled, but the curve stage (loss against its noise) saw no spike
    assert severities([spike, make("curve.healthy", 149)])["grad.spike"] == "info"


@pytest.mark.parametrize("code", ["data.unnormalized_input", "data.tiny_input_scale"])
def test_an_input_scale_needs_a_failing_probe_or_curve(code: str) -> None:
    assert severities([make(code), make("overfit.passed")])[code] == "info"
    assert severities([make(code), make("curve.healthy")])[code] == "info"
    for trouble in ("overfit.failed", "curve.plateau_at_chance", "curve.not_learning",
                    "init.loss_above_chance"):
        assert severities([make(code), make("overfit.passed"), make(trouble)])[code] == "warning"
    # nothing shows that training works (no probe, no curve verdict): it stays a warning
    assert severities([make(code)])[code] == "warning"


def test_an_overfitting_the_users_callbacks_handle_is_info() -> None:
    handled = make("curve.overfitting", 90, handled_by=["EarlyStopping(monitor='val_loss')"])
    assert severities([handled])["curve.overfitting"] == "info"
    assert severities([make("curve.overfitting", 90, handled_by=[])])["curve.overfitting"] \
        == "warning"


def test_the_report_settles_first_and_the_check_status_agrees() -> None:
    spike = make("grad.spike", 40, check="GradientMonitor")
    scale = make("data.unnormalized_input", 0, check="BatchInspector")
    failed = make("overfit.failed", 0, check="OverfitBatchCheck")
    checks = [{"check": c, "status": "failed", "detail": ""} for c in
              ("GradientMonitor", "BatchInspector", "OverfitBatchCheck")]
    report = build_report([spike, scale, failed], status="completed", run={}, checks=checks)
    status = {c["check"]: c["status"] for c in report["checks"]}
    sev = {f["code"]: f["severity"] for f in report["findings"]}
    assert sev == {"grad.spike": "info", "data.unnormalized_input": "warning",
                   "overfit.failed": "error"}
    assert status == {"GradientMonitor": "passed", "BatchInspector": "failed",
                      "OverfitBatchCheck": "failed"}
    # the unconfirmed-free scale explains the failed probe and leads
    assert report["start_here"] == "data.unnormalized_input"
    quiet = build_report([spike], status="completed", run={}, checks=checks[:1])
    assert quiet["start_here"] is None
