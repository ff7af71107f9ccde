"""The overfit stage's rules (functional/overfit_verdicts.py): broken probes fire, healthy ones pass."""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from lightning_triage.findings import CODES
from lightning_triage.functional.overfit import judge_curve
from lightning_triage.functional.overfit_verdicts import (
    ProbeRun,
    conclude_probe,
    matches_cross_entropy,
    overfit_causes,
    set_reference,
    skipped_verdict,
)
from lightning_triage.functional.wiring import group_by_module

LIMITS = {"tolerance": 0.05, "max_steps": 300, "min_steps": 30, "time_budget": 5.0}


def _run(losses: list[float], **kw: object) -> ProbeRun:
    return ProbeRun(losses=losses, examples=8, target=0.115, optimizer="Adam(lr=0.001)",
                    calls=len(losses), isolation="copy", **kw)  # type: ignore[arg-type]


def test_a_memorized_batch_passes_silently() -> None:
    out = conclude_probe(_run([2.3, 1.0, 0.1]), **LIMITS)
    assert out.ran and [v.code for v in out.verdicts] == ["overfit.passed"]
    assert out.outcome is not None and out.outcome.verdict == "passed"
    assert out.detail.startswith("passed: loss 2.3 -> 0.1 on 8 examples")
    assert out.curve == [[0.0, 2.3], [1.0, 1.0], [2.0, 0.1]]
    assert all(v.code in CODES for v in out.verdicts)


def test_a_flat_loss_fails_with_its_cause_and_the_wiring_causes() -> None:
    run = _run([2.3] * 12, frozen=group_by_module(["enc.weight"], {"enc.weight": 4, "head.weight": 4}))
    out = conclude_probe(run, **LIMITS)
    (v,) = out.verdicts
    assert out.ran and v.code == "overfit.failed" and v.step == 0
    assert v.evidence["causes"][0].startswith("frozen layers:")
    assert any(c.startswith("the loss never moved") for c in v.evidence["causes"])
    assert v.evidence["frozen_modules"] == ["enc"]
    assert "Likely cause: frozen layers" in v.message and "Also:" in v.message


def test_a_detached_loss_fails_as_not_connected() -> None:
    out = conclude_probe(_run([2.3], detached=True), **LIMITS)
    assert out.outcome is not None and out.outcome.reason == "detached"
    assert "loss not connected" in out.verdicts[0].message


def test_unfinished_probes_are_skipped_and_still_give_their_curve() -> None:
    out = conclude_probe(_run([2.3, 2.2], stopped="budget", step_seconds=1.0), **LIMITS)
    assert not out.ran and [v.code for v in out.verdicts] == ["overfit.skipped"]
    assert out.detail.startswith("skipped: one probe step takes 1 s") and out.detail.endswith(
        "2 `training_step` calls)")
    assert out.outcome is None and len(out.curve) == 2
    err = conclude_probe(_run([], stopped="error", error="ValueError: boom"), **LIMITS)
    assert "raised ValueError: boom" in err.verdicts[0].message
    assert skipped_verdict("why").message == "The overfit-one-batch probe was skipped: why."


def test_a_falling_curve_out_of_time_is_inconclusive() -> None:
    out = conclude_probe(_run([2.3 * 0.97 ** i for i in range(40)], stopped="time"), **LIMITS)
    assert not out.ran and out.verdicts[0].code == "overfit.inconclusive"
    assert "the time budget ran out" in out.verdicts[0].message


def test_a_loss_on_probabilities_is_reported_with_its_floor() -> None:
    probs = torch.softmax(torch.randn(8, 4), dim=-1)
    targets = torch.randint(0, 4, (8,))
    start = float(F.cross_entropy(probs, targets))
    run = _run([start] * 30)
    set_reference(run, start, targets, probs, task="auto", num_classes=None, tolerance=0.05)
    assert run.chance is not None and math.isclose(run.chance, math.log(4))
    assert run.floor is not None and run.floor > run.target
    out = conclude_probe(run, **LIMITS)
    codes = [v.code for v in out.verdicts]
    assert codes == ["overfit.loss_on_probabilities", "overfit.failed"]
    assert "cannot go below" in out.verdicts[1].evidence["causes"][0]


def test_logits_have_no_floor() -> None:
    logits = torch.randn(8, 4) * 5
    targets = torch.randint(0, 4, (8,))
    run = _run([])
    set_reference(run, float(F.cross_entropy(logits, targets)), targets, logits, task="auto",
                  num_classes=None, tolerance=0.05)
    assert run.floor is None and run.targets is targets
    assert not matches_cross_entropy(logits, targets, -1, 123.0)


def test_causes_for_rising_and_slow_curves() -> None:
    rising = [1.0] + [5.0] * 11
    assert overfit_causes(_run(rising), judge_curve(rising, 0.05, 300))[0].startswith("the loss rose")
    slow = [2.3 - 0.001 * i for i in range(300)]
    (cause,) = overfit_causes(_run(slow), judge_curve(slow, 0.05, 300))
    assert cause.startswith("slow progress")
