"""The report leads with the cause over the whole scenario suite: the demo's scenarios and the
cause-before-symptom runs of issue 14, the registry's lead runs (real `Trainer.fit` runs)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from rich.console import Console

from lightning_triage.callbacks import CHECKS, TriageReport
from lightning_triage.demo import SCENARIOS, Scenario, run_scenario
from lightning_triage.demo.broken import LEAD_RUNS

#: The lead each scenario's report must start with (``None``: a healthy run, nothing to fix).
EXPECTED_LEAD = {
    "healthy": None,
    "raw-pixels": "data.unnormalized_input",
    "scaled-logits": "init.loss_above_chance",
    "detached-encoder": "wiring.no_grad_params",
    "future-mask-lm": "structure.causal_leak",
    "lr-50": "curve.diverging",
    "log-softmax-loss": "numerics.nonfinite_loss",
    "lr-good": None,
    "lr-1e-5": "curve.lr_too_low",
    "lr-0": "wiring.optimizer_not_stepping",
    "exp-overflow": "numerics.nonfinite_forward",
    "norm-without-eps": "numerics.nonfinite_forward",
    "fp16-overflow": "numerics.precision_overflow",
    "batch-softmax": "structure.batch_mixing",
    "mse-broadcast": "structure.shape_mismatch",
    "deep-sigmoid": "grad.vanishing",
    "layers-in-plain-list": "wiring.unregistered_params",
    "frozen-random-body": "wiring.frozen_at_init",
    "frozen-random-head": "wiring.frozen_at_init",
    "random-teacher": "wiring.frozen_at_init",
    "sigmoid-before-bce-with-logits": "overfit.loss_on_probabilities",
    "inverted-padding-mask": "structure.padding_leak",
    "adam-lr-0.1-cnn": "curve.lr_too_high",
    "scaler-clip-before-unscale": "grad.clipping_eats_update",
}


#: The codes each reporter may report: its own, those it shares, and the meta code.
DECLARED = {cls.__name__: {*cls.codes, *cls.shared_codes, "triage.check_error"} for cls in CHECKS}
DECLARED["TriageReport"] = set(TriageReport.codes)

#: Lead runs whose overfit probe may memorize its batch (no symptom to explain).
PROBE_MAY_PASS = {"batch-softmax", "frozen-random-head",
                  # the probe's fresh copy memorizes 8 examples before Adam at 0.1 kills it
                  "adam-lr-0.1-cnn"}

#: Lead runs under manual optimization: the overfit probe is skipped (no symptom to explain).
PROBE_SKIPPED = {"scaler-clip-before-unscale"}

SYMPTOMS = {"overfit.failed", "overfit.inconclusive", "curve.not_learning", "curve.loss_spike",
            "grad.exploding", "curve.plateau_at_chance"}


def test_every_scenario_has_an_expected_lead() -> None:
    names = [s.name for s in (*SCENARIOS, *LEAD_RUNS)]
    assert sorted(names) == sorted(EXPECTED_LEAD)
    for scenario in (*SCENARIOS, *LEAD_RUNS):
        assert EXPECTED_LEAD[scenario.name] == scenario.expect, scenario.name


@pytest.mark.parametrize("scenario", LEAD_RUNS, ids=[s.name for s in LEAD_RUNS])
def test_report_leads_with_the_cause_and_explains_the_symptom(tmp_path: Path,
                                                              scenario: Scenario) -> None:
    # a long probe budget: a loaded machine must not skip the probe whose failure is explained
    slow_ok = dataclasses.replace(
        scenario, triage_kwargs={"overfit_time_budget": 120.0, **scenario.triage_kwargs})
    report = run_scenario(slow_ok, tmp_path, Console(quiet=True))
    assert report is not None
    codes = [(f["code"], f["explained_by"]) for f in report["findings"]]
    assert report["start_here"] == EXPECTED_LEAD[scenario.name], codes
    lead = next(f for f in report["findings"] if f["code"] == report["start_here"])
    assert lead["explained_by"] == []
    # the probe's failure (the symptom of the table's rows; inconclusive where the loss still
    # falls when the steps run out) names the cause. With the batch-axis softmax the probed
    # examples' logits may all be right while the loss sits on a floor, and a trained adapter in
    # front of a frozen random head can memorize 8 examples: the probe then reports
    # memorization (no symptom); otherwise it fails and is explained.
    failed = [f for f in report["findings"]
              if f["code"] in ("overfit.failed", "overfit.inconclusive")]
    if scenario.name in PROBE_SKIPPED:
        probe = next(c for c in report["checks"] if c["check"] == "OverfitBatchCheck")
        assert probe["status"] == "skipped" and not failed, (probe, codes)
    elif scenario.name not in PROBE_MAY_PASS or failed:
        assert len(failed) == 1, codes
        assert scenario.expect in failed[0]["explained_by"], codes
        assert f"`{scenario.expect}`" in failed[0]["message"]
    # every symptom present is explained by a finding of this report
    for f in report["findings"]:
        if f["code"] in SYMPTOMS and f["severity"] != "info":
            assert f["explained_by"], (f["code"], codes)
    # every finding comes from a check that declares its code (callbacks.CHECKS' `codes`)
    for f in report["findings"]:
        assert f["code"] in DECLARED[f["check"]], (f["check"], f["code"])
    # nothing that leads is explained; everything explained names findings of this report
    present = {f["code"] for f in report["findings"]}
    for f in report["findings"]:
        assert set(f["explained_by"]) <= present
