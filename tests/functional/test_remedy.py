"""The decision of a remedy trial (functional.remedy), the registry's remedy kinds, the ranking
of an unconfirmed lead and the report's remedy block (schema, console, Markdown, HTML)."""

from __future__ import annotations

import math

import pytest
from rich.console import Console

from lightning_triage.findings import CODES, REMEDY_KINDS, Finding, register_code
from lightning_triage.functional.remedy import (
    RemedyThresholds,
    Replay,
    decide_remedy,
    next_candidate,
    partly,
    remedy_kind,
    remedy_works,
    symptom_reproduced,
    with_remedy,
)
from lightning_triage.ranking import start_here
from lightning_triage.report import build_report, print_report, remedy_line, render_markdown
from lightning_triage.report.html import render_html
from lightning_triage.report.schema import validate_report
from tests.report_samples import broken_report

START = [2.30, 2.31, 2.29, 2.30, 2.32, 2.28]


def replay(end: list[float], steps: list[float] | None = None) -> Replay:
    return Replay(steps if steps is not None else [2.3] * 30, end)


def test_registry_declares_the_remedies() -> None:
    kinds = {code: spec.remedy for code, spec in CODES.items() if spec.remedy != "none"}
    assert {c for c, k in kinds.items() if k == "lr_down"} == {
        "curve.lr_too_high", "curve.diverging"}
    assert kinds["grad.exploding"] == "lr_down_clip"
    assert {c for c, k in kinds.items() if k == "standardize_input"} == {
        "data.unnormalized_input", "data.tiny_input_scale"}
    assert kinds["wiring.grads_not_zeroed"] == "zero_grads"
    assert kinds["wiring.params_not_in_optimizer"] == "add_params"
    assert {c for c, k in kinds.items() if k == "realign_labels"} == {"structure.label_misaligned"}
    assert {c for c, k in kinds.items() if k == "lr_up"} == {
        "curve.lr_too_low", "curve.not_learning", "grad.update_ratio"}
    assert kinds["numerics.precision_overflow"] == "float32_replay"
    assert {c for c, k in kinds.items() if k == "causal"} == {
        "structure.batch_mixing", "structure.causal_leak", "structure.target_leak",
        "structure.padding_leak"}
    assert all(spec.remedy in REMEDY_KINDS for spec in CODES.values())
    with pytest.raises(ValueError, match="remedy"):
        register_code("curve.new_thing", "warning", "t", "h", remedy="magic")  # type: ignore[arg-type]


def test_update_ratio_direction_picks_the_remedy() -> None:
    above = Finding.create("grad.update_ratio", "big", check="T", evidence={"direction": "above"})
    below = Finding.create("grad.update_ratio", "tiny", check="T", evidence={"direction": "below"})
    assert (remedy_kind(above), remedy_kind(below)) == ("lr_down", "lr_up")


def test_a_loss_unbounded_below_has_no_learning_rate_remedy() -> None:
    down = Finding.create("curve.diverging", "fell", check="T", evidence={"direction": "down"})
    up = Finding.create("curve.diverging", "grew", check="T")
    assert (remedy_kind(down), remedy_kind(up)) == ("none", "lr_down")


@pytest.mark.parametrize(("kind", "as_is", "shown"), [
    ("lr_down", replay([], [2.3, 9.0, math.inf]), True),       # blew up
    ("lr_down", replay([2.2] * 6, [2.3, 3.5, 2.4]), True),       # rose 1.5x
    ("lr_down", replay([2.25] * 6), True),                       # 2% progress
    ("lr_down", replay([1.0] * 6), False),                       # trained fine
    ("lr_up", replay([2.28] * 6), True),                         # no real progress
    ("lr_up", replay([1.2] * 6), False),                         # 48% progress
    ("lr_up", replay([], [2.3, math.nan]), False),               # a blow-up is not slowness
])
def test_symptom_must_reproduce(kind: str, as_is: Replay, shown: bool) -> None:
    assert symptom_reproduced(kind, START, as_is)[0] is shown  # type: ignore[arg-type]


def test_remedy_needs_margin_and_significance() -> None:
    as_is = replay([2.30, 2.20, 2.40, 2.30, 2.25, 2.35])
    # clearly lower on every batch
    assert remedy_works(START, as_is, replay([1.1, 1.0, 1.2, 1.1, 1.05, 1.15]))[0]
    # lower on average by 1% only: below the 2% margin
    assert not remedy_works(START, as_is, replay([v - 0.023 for v in as_is.end]))[0]
    # lower on average by 4%, but one noisy batch carries it all: not significant
    noisy = list(as_is.end)
    noisy[0] -= 0.55
    assert not remedy_works(START, as_is, replay(noisy))[0]
    # non-finite remedy never works
    assert not remedy_works(START, as_is, replay([], [2.3, math.inf]))[0]
    # a blown-up as-is: the remedy must end finite and below the start
    blew = replay([], [2.3, math.inf])
    assert remedy_works(START, blew, replay([1.5] * 6))[0]
    assert not remedy_works(START, blew, replay([2.29] * 6))[0]


def test_decide_verdicts() -> None:
    slow = replay([2.29] * 6)
    fast = replay([1.0] * 6)
    d = decide_remedy("lr_up", START, slow, [(10.0, replay([2.28] * 6)), (100.0, fast)])
    assert (d.verdict, d.factor, d.tried) == ("confirmed", 100.0, (10.0, 100.0))
    d = decide_remedy("lr_up", START, slow, [(10.0, replay([2.28] * 6)),
                                             (100.0, replay([], [2.3, math.inf]))])
    assert d.verdict == "not confirmed" and "non-finite" in d.reason
    # the symptom did not reproduce: never confirmed, however good the remedy looks
    d = decide_remedy("lr_up", START, replay([1.2] * 6), [(10.0, replay([0.1] * 6))])
    assert d.verdict == "inconclusive"


def test_thresholds_are_the_curve_classifiers() -> None:
    from lightning_triage.functional.curve import CurveThresholds

    th, curve = RemedyThresholds(), CurveThresholds()
    assert (th.low_progress, th.rise_ratio) == (curve.low_progress, curve.rise_ratio)


def _block(verdict: str, **extra: object) -> dict[str, object]:
    return {"kind": "lr_up", "change": "every param group's learning rate x 10 (lr 0.001 -> 0.01)",
            "before": {"lr": 1e-3, "loss": 2.30, "finite": True, "steps": 30, "loss_start": 2.31},
            "after": {"lr": 1e-2, "loss": 2.29, "finite": True, "steps": 30, "loss_start": 2.31},
            "verdict": verdict, "reason": "numbers", "tried": ["x10"], **extra}


def test_an_unconfirmed_lead_yields_to_its_stage_and_names_the_next_candidate() -> None:
    low = Finding.create("curve.lr_too_low", "slow", check="T", global_step=10)
    plateau = Finding.create("curve.plateau_at_chance", "at chance", check="T", global_step=50)
    ratio = Finding.create("grad.update_ratio", "tiny", check="T", evidence={"direction": "below"})
    assert start_here([low, plateau, ratio]) == "curve.lr_too_low"
    challenged = with_remedy(low, _block("not confirmed"))
    assert start_here([challenged, plateau, ratio]) == "curve.plateau_at_chance"
    # a later stage does not overtake it: the report challenges it and names the candidate
    assert start_here([challenged, ratio]) == "curve.lr_too_low"
    # the same remedy (a larger learning rate) was refuted for the update ratio too
    assert next_candidate([challenged, ratio, plateau], challenged) == "curve.plateau_at_chance"
    assert next_candidate([challenged, ratio], challenged) is None
    # a confirmed one keeps its place
    assert start_here([with_remedy(low, _block("confirmed")), plateau]) == "curve.lr_too_low"


def test_report_carries_the_block_and_old_reports_stay_valid() -> None:
    run = broken_report()["run"]
    low = Finding.create("curve.lr_too_low", "slow", check="T", global_step=10)
    plain_report = build_report([low], status="completed", run=run)
    assert "remedy" not in plain_report["findings"][0]  # unchanged when nothing was tried
    validate_report(plain_report)
    f = with_remedy(low, _block("not confirmed", next_candidate=None, seconds=0.2))
    assert Finding.from_dict(f.to_dict()) == f
    report = build_report([f], status="completed", run=run)
    validate_report(report)
    bad = build_report([with_remedy(low, {**_block("confirmed"), "verdict": "maybe"})],
                       status="completed", run=run)
    with pytest.raises(ValueError, match="verdict"):
        validate_report(bad)
    line = remedy_line("curve.lr_too_low", report["findings"][0]["remedy"])
    assert line == ("not confirmed on a copy: lr 0.001 -> 0.01, loss after replaying the fit's "
                    "first 30 steps from its start: 2.3 -> 2.29 (tried x10); no other candidate "
                    "in this report")
    assert "Remedy: not confirmed on a copy: lr 0.001 -> 0.01" in render_markdown(report)
    assert "<b>Remedy:</b> not confirmed on a copy" in render_html(report)
    console = Console(record=True, width=200)
    print_report(report, console=console)
    assert "Remedy: not confirmed on a copy: lr 0.001 -> 0.01" in console.export_text()


def test_remedy_lines() -> None:
    assert remedy_line("curve.lr_too_low", None) is None
    assert "causal" in (remedy_line("structure.target_leak", None) or "")
    skipped = {"kind": "lr_down", "change": "c", "verdict": "skipped", "reason": "manual optimization"}
    assert remedy_line("curve.diverging", skipped) == "remedy not tried: manual optimization"
    blew = _block("confirmed")
    blew["before"] = {"lr": 50.0, "loss": None, "finite": False, "steps": 13,
                      "nonfinite_at_step": 4}
    blew["after"] = {"lr": 0.5, "loss": 0.59, "finite": True, "steps": 13}
    assert remedy_line("curve.diverging", blew) == (
        "confirmed on a copy: lr 50 -> 0.5, loss after replaying the fit's first 13 steps from "
        "its start: non-finite (step 4) -> 0.59")
    unsure = {**blew, "verdict": "inconclusive", "reason": "why"}
    assert remedy_line("curve.diverging", unsure) == (
        "remedy inconclusive on a copy (replaying the fit's first 13 steps from its start): why")


def test_the_hint_uses_the_factor_the_trial_measured() -> None:
    """Under "Start here", the hint and the remedy line agree: a confirmed learning-rate trial's
    factor replaces the registry's generic one (console, Markdown, HTML); without a confirmed
    trial the hint is the registry's."""
    run = broken_report()["run"]
    f = Finding.create("curve.diverging", "the loss became inf", check="T", global_step=12)
    assert "(3-10x)" in f.hint
    block = _block("confirmed")
    block["before"] = {"lr": 50.0, "loss": None, "finite": False, "steps": 13,
                       "nonfinite_at_step": 12}
    block["after"] = {"lr": 0.5, "loss": 0.59, "finite": True, "steps": 13}
    report = build_report([with_remedy(f, block)], status="completed", run=run)
    measured = "Lower the learning rate (100x: lr 50 -> 0.5 worked on a copy), add warmup"
    console = Console(record=True, width=200)
    print_report(report, console=console)
    for shown in (console.export_text(), render_markdown(report),
                  render_html(report).replace("&gt;", ">")):
        assert measured in shown and "3-10x" not in shown
    for verdict in ("not confirmed", "inconclusive"):
        report = build_report([with_remedy(f, {**block, "verdict": verdict})], status="completed",
                              run=run)
        assert "(3-10x)" in render_markdown(report) and measured not in render_markdown(report)
    low = Finding.create("curve.lr_too_low", "flat", check="T", global_step=0)
    up = {**block, "before": {"lr": 1e-6, "steps": 30, "loss": 2.3, "finite": True},
          "after": {"lr": 1e-3, "steps": 30, "loss": 0.5, "finite": True}}
    assert "Raise the learning rate (1,000x: lr 1e-06 -> 0.001 worked on a copy)" in render_markdown(
        build_report([with_remedy(low, up)], status="completed", run=run))


def test_a_zero_grad_remedy_whose_loss_rises_says_why() -> None:
    """Stale gradients speed up a short replay: the zeroed replay ending higher is expected, and
    the trial's reason says so (docs/remedies.md), instead of reading as a fix that hurts."""
    start = [2.3] * 3
    as_is, zeroed = Replay([2.0] * 30, [0.57, 0.58, 0.56]), Replay([2.2] * 30, [1.3, 1.32, 1.33])
    decision = decide_remedy("zero_grads", start, as_is, [("zeroed", zeroed)],
                             symptom=(True, "the as-is replay kept stale gradients"))
    assert decision.verdict == "inconclusive"
    assert "higher, as expected over a short replay" in decision.reason
    lower = decide_remedy("zero_grads", start, as_is, [("zeroed", Replay([2.0] * 30, [0.57] * 3))],
                          symptom=(True, "stale"))
    assert "as expected" not in lower.reason  # not higher: nothing to explain


def test_the_html_plots_the_replays_before_and_after() -> None:
    run = broken_report()["run"]
    f = Finding.create("data.unnormalized_input", "raw pixels", check="T", global_step=0)
    block = {"kind": "standardize_input", "change": "the main input standardized per channel",
             "before": {"loss": 2.3, "finite": True, "steps": 30, "loss_start": 2.3,
                        "losses": [3.9, 10.1, *[2.31] * 28]},
             "after": {"loss": 0.2, "finite": True, "steps": 30, "loss_start": 2.3,
                       "losses": [2.3 - 0.07 * i for i in range(30)]},
             "verdict": "confirmed", "reason": "numbers", "tried": ["standardized"]}
    report = build_report([with_remedy(f, block)], status="completed", run=run)
    validate_report(report)
    assert remedy_line(f.code, block) == ("confirmed on a copy: the main input standardized per "
                                          "channel, loss after replaying the fit's first 30 steps "
                                          "from its start: 2.3 -> 0.2")
    page = render_html(report)
    caption = "The lead&#39;s fix tried on a copy"
    assert caption in page
    figure = page[page.rindex("<figure", 0, page.index(caption)):page.index(caption)]
    assert 'src="data:image/png;base64,' in figure
    # without matplotlib's plots the numbers stand in as a table; a blown-up replay (None
    # losses) and a hostile length are drawn within the plots' bounds
    assert caption not in render_html(report, plots=False)
    block["before"] = {**block["before"], "finite": False, "loss": None,
                       "losses": [2.3, 40.0, None] + [None] * 100_000}
    report = build_report([with_remedy(f, block)], status="completed", run=run)
    assert caption in render_html(report)
    # no remedy trial with replays: no plot
    assert caption not in render_html(build_report([f], status="completed", run=run))


def test_a_remedy_that_works_no_better_than_its_placebo_is_not_confirmed() -> None:
    as_is = replay([2.3, 2.2, 2.4, 2.3, 2.3, 2.2])
    cured = replay([1.1, 1.0, 1.2, 1.1, 1.0, 1.1])
    neutral = replay([2.29, 2.21, 2.41, 2.3, 2.31, 2.2])
    kept = decide_remedy("lr_up", START, as_is, [(10.0, cured)], placebo=neutral)
    assert kept.verdict == "confirmed"
    lucky = decide_remedy("lr_up", START, as_is, [(10.0, cured)], placebo=cured)
    assert lucky.verdict == "inconclusive"
    assert "placebo" in lucky.reason


def test_a_learning_rate_remedy_is_partial_while_a_part_never_trains() -> None:
    frozen = Finding.create("wiring.frozen_at_init", "head frozen", check="T")
    confirmed = {"kind": "lr_up", "verdict": "confirmed", "change": "lr x 10",
                 "reason": "ends lower", "placebo": {"change": "reversed", "loss": 2.3,
                                                     "passes": False}}
    block = partly("lr_up", confirmed, [frozen])
    assert (block["verdict"], block["remains"]) == ("inconclusive", "wiring.frozen_at_init")
    assert block["reason"].startswith("partly: the loss falls faster")
    assert partly("lr_up", confirmed, []) is confirmed
    assert partly("standardize_input", confirmed, [frozen]) is confirmed
    fixed = with_remedy(Finding.create("curve.lr_too_low", "slow", check="T"), block)
    report = build_report([fixed, frozen], status="completed", run=broken_report()["run"])
    validate_report(report)
    assert report["start_here"] == "wiring.frozen_at_init"
