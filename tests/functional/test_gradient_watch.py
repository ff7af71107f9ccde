"""The gradient norms' watch decides, without a Trainer, which gradient verdicts to report and
what a spike after the window means."""

from __future__ import annotations

import pickle

import numpy as np

from lightning_triage.functional.gradient_watch import CONTEXT_STEPS, MAX_REPORTED, GradientWatch
from lightning_triage.functional.gradients import GradThresholds
from lightning_triage.functional.spikes import SpikeEvent
from lightning_triage.functional.verdict import Verdict

NAMES = ["encoder.weight", "head.weight"]


def _chunk(start: int, n: int, *, spike_at: int | None = None, head: float = 1.0
           ) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray]:
    """``n`` steps from ``start``: two parameters at norm 1, a loss of 2; at ``spike_at`` the
    head's norm jumps 40x and the loss follows one step later."""
    steps = list(range(start, start + n))
    per = np.ones((n, 2))
    loss = np.full(n, 2.0)
    if spike_at is not None:
        k = spike_at - start
        per[k, 1] = 40.0 * head
        loss[k + 1] = 20.0
    totals = np.sqrt((per ** 2).sum(axis=1))
    return steps, totals, per, loss


def test_a_window_spike_waits_for_the_steps_that_say_whether_the_loss_followed() -> None:
    watch, th = GradientWatch(), GradThresholds()
    spike = Verdict("grad.spike", 100, "a spike")
    assert watch.window([spike], last_step=100 + th.follow_steps - 1, thresholds=th) == []
    assert watch.window([spike], last_step=100 + th.follow_steps, thresholds=th) == [spike]
    other = Verdict("grad.vanishing", 100, "dies out")
    assert watch.window([other], last_step=0, thresholds=th) == [other]


def test_each_verdict_once_one_explosion_per_window_and_bounded() -> None:
    watch = GradientWatch()
    grow = [Verdict("grad.exploding", 10, "grows"), Verdict("grad.exploding", 20, "grows")]
    assert [v.step for v in watch.admit(grow, after_window=False, held=[])] == [10]
    assert watch.admit(grow[:1], after_window=True, held=[]) == []  # the same key
    late = Verdict("grad.exploding", 900, "grows again")
    assert watch.admit([late], after_window=True, held=["grad.exploding"]) == [late]
    many = [Verdict("grad.spike", s, "spike") for s in range(1000, 1000 + 2 * MAX_REPORTED)]
    assert len(watch.admit(many, after_window=True, held=[])) == MAX_REPORTED + 1 - 2


def test_a_spike_after_the_window_names_the_layer_and_the_loss_that_followed() -> None:
    watch, th = GradientWatch(), GradThresholds()
    steps, totals, per, loss = _chunk(0, 100, spike_at=80)
    watch.observe(steps, totals, per, loss)
    spike = SpikeEvent("spike", 80, float(totals[20 + 60]), float(totals[0]), 0.01, 28.0, 80)
    assert watch.events([spike], steps, totals, per, ring=totals[:60], after_window=True,
                        thresholds=th) == []  # held until its context is read
    assert watch.counts["spikes_after_window"] == 1
    [verdict] = watch.resolve(NAMES, ring=totals[:60], final=False, thresholds=th, clip_val=None)
    assert verdict.code == "grad.spike" and verdict.step == 80
    assert verdict.evidence["first_layer"] == "head"
    assert verdict.evidence["loss_spike_after_steps"] == 1
    assert watch.resolve(NAMES, ring=totals, final=True, thresholds=th, clip_val=None) == []


def test_a_spike_at_the_chunk_end_waits_unless_the_run_ends() -> None:
    watch, th = GradientWatch(), GradThresholds()
    steps, totals, per, loss = _chunk(0, 40)
    watch.observe(steps, totals, per, loss)
    watch.events([], steps, totals, per, ring=totals, after_window=True, thresholds=th)
    spike = SpikeEvent("spike", 39, 40.0, 1.4, 0.01, 28.0, 39)
    watch.events([spike], steps, totals, per, ring=totals, after_window=True, thresholds=th)
    assert watch.resolve(NAMES, ring=totals, final=False, thresholds=th, clip_val=None) == []
    [verdict] = watch.resolve(NAMES, ring=totals, final=True, thresholds=th, clip_val=None)
    assert verdict.step == 39


def test_in_the_window_events_only_set_the_level_of_healthy_steps() -> None:
    watch, th = GradientWatch(), GradThresholds()
    steps, totals, per, _ = _chunk(0, 20, spike_at=10)
    spike = SpikeEvent("spike", 10, float(totals[10]), 1.4, 0.01, 28.0, 10)
    assert watch.events([spike], steps, totals, per, ring=totals, after_window=False,
                        thresholds=th) == []
    assert watch.counts == {"spikes_after_window": 0, "explosions_after_window": 0}
    assert watch.layer_base is not None and np.allclose(watch.layer_base, 1.0)  # spike left out


def test_the_context_is_bounded() -> None:
    watch = GradientWatch()
    for start in range(0, 1000, 10):
        watch.observe(*_chunk(start, 10))
    kept = sum(c[0].size for c in watch._recent)
    assert CONTEXT_STEPS <= kept <= CONTEXT_STEPS + 10


def test_state_round_trip() -> None:
    watch, th = GradientWatch(), GradThresholds()
    steps, totals, per, _ = _chunk(0, 20)
    watch.events([], steps, totals, per, ring=totals, after_window=False, thresholds=th)
    watch.admit([Verdict("grad.vanishing", 5, "dies out"), Verdict("grad.dead_units", None, "x")],
                after_window=False, held=[])
    restored = GradientWatch()
    restored.load_state_dict(pickle.loads(pickle.dumps(watch.state_dict())))
    assert restored.reported == watch.reported and restored.counts == watch.counts
    assert restored.layer_base is not None and watch.layer_base is not None
    assert np.array_equal(restored.layer_base, watch.layer_base)
