"""The loss curve's watch decides, without a Trainer, which of the curve's verdicts to report."""

from __future__ import annotations

import pickle

from lightning_triage.functional.curve import CurveThresholds
from lightning_triage.functional.curve_verdicts import ValidationSeen
from lightning_triage.functional.curve_watch import MAX_REPORTED, CurveWatch
from lightning_triage.functional.spikes import SpikeEvent
from lightning_triage.functional.verdict import Verdict


def _v(code: str, step: int | None) -> Verdict:
    return Verdict(code, step, f"{code} at {step}")


def test_each_verdict_is_reported_once_and_healthy_only_while_nothing_else_is() -> None:
    watch = CurveWatch()
    assert [v.code for v in watch.window([_v("curve.healthy", None)], held=[])] == ["curve.healthy"]
    assert watch.window([_v("curve.healthy", None)], held=["curve.healthy"]) == []  # same key
    watch = CurveWatch()
    assert watch.window([_v("curve.healthy", None)], held=["data.class_imbalance"]) == []
    out = watch.window([_v("curve.lr_too_high", 30), _v("curve.healthy", None)], held=[])
    assert [v.code for v in out] == ["curve.lr_too_high"]  # held grows within one call
    assert watch.window([_v("curve.lr_too_high", 30)], held=["curve.lr_too_high"]) == []


def test_one_divergence_and_one_overfitting_per_window() -> None:
    watch = CurveWatch()
    out = watch.window([_v("curve.diverging", 40), _v("curve.diverging", 50),
                        _v("curve.overfitting", 60), _v("curve.overfitting", 70)], held=[])
    assert [(v.code, v.step) for v in out] == [("curve.diverging", 40), ("curve.overfitting", 60)]
    # another kind of verdict at a new step still passes
    assert [v.code for v in watch.window([_v("curve.loss_spike", 80)], held=["curve.diverging"])] \
        == ["curve.loss_spike"]


def test_no_overfitting_while_the_user_memorizes_on_purpose() -> None:
    watch = CurveWatch()
    assert watch.window([_v("curve.overfitting", 60)], held=[], memorizing=True) == []
    # not marked reported: the same verdict without `overfit_batches` still passes
    assert len(watch.window([_v("curve.overfitting", 60)], held=[])) == 1


def test_late_events_are_counted_and_reported_once() -> None:
    watch, th = CurveWatch(), CurveThresholds()
    spike = SpikeEvent("spike", 900, 30.0, 2.0, 0.1, 15.0, 900)
    calm = SpikeEvent("nonfinite", 950, float("nan"), 2.0, 0.1, float("inf"), 950)
    out = watch.late([spike, calm], [898, 899, 900], [2.0, 2.0, 30.0], th)
    assert [(v.code, v.step) for v in out] == [("curve.loss_spike", 900)]  # NaN out of the blue
    assert watch.late([spike], [900], [30.0], th) == []  # reported already, counted again
    assert watch.counts == {"spikes_after_window": 2, "divergences_after_window": 0}


def test_late_events_are_bounded() -> None:
    watch, th = CurveWatch(), CurveThresholds()
    events = [SpikeEvent("spike", s, 30.0, 2.0, 0.1, 15.0, s) for s in range(MAX_REPORTED + 50)]
    out = watch.late(events, [], [], th)
    assert len(out) == MAX_REPORTED + 1
    assert watch.counts["spikes_after_window"] == MAX_REPORTED + 1


def _seen(window_steps: int, runs: int = 0) -> ValidationSeen:
    return ValidationSeen(runs=runs, losses=runs, in_window=runs, window_steps=window_steps,
                          epochs=3, module="Net", has_validation_step=False,
                          limit_val_batches_zero=False, has_val_loader=False,
                          check_val_every_n_epoch=1, val_check_interval=1.0)


def test_validation_is_judged_once_for_a_window_long_enough() -> None:
    watch, th = CurveWatch(), CurveThresholds()
    assert watch.validation(_seen(th.min_steps - 1), held=[], thresholds=th) is None
    verdict = watch.validation(_seen(th.min_steps), held=[], thresholds=th)
    assert verdict is not None and verdict.code == "curve.no_validation"
    assert watch.validation(_seen(th.min_steps), held=[verdict.code], thresholds=th) is None


def test_state_round_trip() -> None:
    watch = CurveWatch()
    watch.window([_v("curve.diverging", 40), _v("curve.healthy", None)], held=[])
    watch.late([SpikeEvent("spike", 900, 30.0, 2.0, 0.1, 15.0, 900)], [900], [30.0],
               CurveThresholds())
    restored = CurveWatch()
    restored.load_state_dict(pickle.loads(pickle.dumps(watch.state_dict())))
    assert restored.reported == watch.reported and restored.counts == watch.counts
