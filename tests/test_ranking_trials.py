"""The ranking reads the remedy trials (docs/remedies.md, "How the ranking uses the trials"), on
constructed findings: a confirmed input remedy explains the curve it cured, a refuted lead
explains nothing and yields, the loss-floor suspicion is shown by a refuted learning-rate lead,
and the mode stage's trials (in the evidence) count like the recorded-batch ones."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from lightning_triage.findings import Finding
from lightning_triage.ranking import rank, remedy_verdict, role


def finding(code: str, *, step: int | None = None, verdict: str | None = None,
            in_evidence: bool = False, **evidence: Any) -> Finding:
    """A finding of ``code``; with ``verdict``, a remedy trial of that verdict (in the
    ``remedy`` block, or in ``evidence["remedy_trial"]`` as the mode stage's checks keep it)."""
    block = None if verdict is None else {"kind": "x", "verdict": verdict}
    if block is not None and in_evidence:
        evidence["remedy_trial"] = block
        block = None
    f = Finding.create(code, f"{code} seen", check="T", global_step=step, evidence=evidence)
    return f if block is None else replace(f, remedy=block)


def by_code(ordered: list[Finding]) -> dict[str, Finding]:
    return {f.code: f for f in ordered}


@pytest.mark.parametrize("curve", ["curve.lr_too_low", "curve.lr_too_high", "curve.diverging",
                                   "curve.not_learning", "curve.plateau_at_chance"])
@pytest.mark.parametrize("scale", ["data.unnormalized_input", "data.tiny_input_scale"])
def test_a_confirmed_input_remedy_explains_the_curve_it_cured(scale: str, curve: str) -> None:
    ordered, lead = rank([finding(curve, step=80), finding(scale, step=0, verdict="confirmed"),
                          finding("overfit.passed", step=0)])
    found = by_code(ordered)
    assert lead == scale
    assert scale in found[curve].explained_by
    # the trial showed the trouble: the suspicion keeps its severity whatever else cleared it
    assert found[scale].severity == "warning"


def test_without_a_trial_or_with_a_refuted_one_the_input_scale_explains_no_curve() -> None:
    for verdict in (None, "not confirmed", "inconclusive"):
        ordered, _ = rank([finding("curve.lr_too_high", step=80),
                           finding("data.unnormalized_input", step=0, verdict=verdict)])
        assert by_code(ordered)["curve.lr_too_high"].explained_by == []


def test_a_confirmed_input_remedy_outranks_the_curve_when_nothing_else_confirms_it() -> None:
    # the curve stage saw a noisy loss (not a symptom of scale by the suspicion's table) and the
    # overfit probe passed: untried, the input scale would be info and the curve would lead
    untried, lead = rank([finding("data.unnormalized_input", step=0),
                          finding("overfit.passed", step=0), finding("curve.lr_too_high", step=60)])
    assert lead == "curve.lr_too_high"
    assert by_code(untried)["data.unnormalized_input"].severity == "info"
    tried, lead = rank([finding("data.unnormalized_input", step=0, verdict="confirmed"),
                        finding("overfit.passed", step=0), finding("curve.lr_too_high", step=60)])
    assert lead == "data.unnormalized_input"
    assert by_code(tried)["curve.lr_too_high"].explained_by == ["data.unnormalized_input"]


def test_a_refuted_lead_explains_nothing_and_its_symptom_leads() -> None:
    failed, low = finding("overfit.failed", step=0), finding("curve.lr_too_low", step=90)
    ordered, lead = rank([failed, low])
    assert lead == "curve.lr_too_low"
    assert by_code(ordered)["overfit.failed"].explained_by == ["curve.lr_too_low"]
    refuted = finding("curve.lr_too_low", step=90, verdict="not confirmed")
    ordered, lead = rank([failed, refuted])
    assert lead == "overfit.failed"
    assert by_code(ordered)["overfit.failed"].explained_by == []
    confirmed = finding("curve.lr_too_low", step=90, verdict="confirmed")
    assert rank([failed, confirmed])[1] == "curve.lr_too_low"


def test_the_loss_floor_is_shown_by_a_refuted_learning_rate_lead() -> None:
    assert role("overfit.loss_floor") == "cause"
    floor = finding("overfit.loss_floor", step=0, floor=2.27, share=0.99)
    passed = finding("overfit.passed", step=0)
    for verdict in (None, "confirmed", "inconclusive", "skipped"):
        ordered, lead = rank([floor, passed, finding("curve.lr_too_low", step=90,
                                                     verdict=verdict)])
        assert lead == "curve.lr_too_low", verdict
        found = by_code(ordered)
        assert found["overfit.loss_floor"].severity == "info"
        assert found["curve.lr_too_low"].explained_by == []
    for slow in ("curve.lr_too_low", "curve.not_learning"):
        ordered, lead = rank([floor, passed, finding(slow, step=90, verdict="not confirmed")])
        found = by_code(ordered)
        assert lead == "overfit.loss_floor"
        assert found["overfit.loss_floor"].severity == "warning"
        assert found[slow].explained_by == ["overfit.loss_floor"]
    # a refuted lower learning rate says nothing about a floor
    ordered, lead = rank([floor, finding("curve.lr_too_high", step=90, verdict="not confirmed")])
    assert lead == "curve.lr_too_high"
    assert by_code(ordered)["overfit.loss_floor"].severity == "info"


@pytest.mark.parametrize("in_evidence", [False, True], ids=["remedy-block", "mode-evidence"])
def test_within_a_stage_confirmed_first_and_refuted_last(in_evidence: bool) -> None:
    # the two mode findings of one validation run; the earlier one's trial decides its place
    def mode(code: str, step: int, verdict: str | None) -> Finding:
        return finding(code, step=step, verdict=verdict, in_evidence=in_evidence)

    gap = mode("mode.eval_loss_gap", 20, None)
    assert rank([mode("mode.train_mode_in_eval", 0, None), gap])[1] == "mode.train_mode_in_eval"
    assert rank([mode("mode.train_mode_in_eval", 0, "not confirmed"), gap])[1] \
        == "mode.eval_loss_gap"
    assert rank([mode("mode.nondeterministic_eval", 0, None),
                 mode("mode.train_mode_in_eval", 10, "confirmed")])[1] \
        == "mode.train_mode_in_eval"
    # never across stages: an earlier stage still comes first
    assert rank([mode("mode.train_mode_in_eval", 0, "not confirmed"),
                 finding("curve.lr_too_low", step=90)])[1] == "mode.train_mode_in_eval"


def test_the_mode_trials_are_read_like_the_recorded_batch_ones() -> None:
    in_block = finding("mode.train_mode_in_eval", verdict="not confirmed")
    in_evidence = finding("mode.train_mode_in_eval", verdict="not confirmed", in_evidence=True)
    assert remedy_verdict(in_block) == remedy_verdict(in_evidence) == "not confirmed"
    assert remedy_verdict(finding("mode.train_mode_in_eval")) is None
    # a malformed trial counts as none
    odd = Finding.create("mode.train_mode_in_eval", "x", check="T",
                         evidence={"remedy_trial": "confirmed"})
    assert remedy_verdict(odd) is None
