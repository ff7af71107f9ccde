"""SpikeWatch: spikes, level shifts and NaN/Inf at the expected step, chunking-invariant,
bounded memory, state round trip."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from lightning_triage.functional.spikes import SpikeWatch, detect_spikes, robust_level


def noisy(n: int, level: float = 1.0, noise: float = 0.05, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return level + noise * rng.standard_normal(n)


def test_spike_fires_at_its_step_and_does_not_move_the_baseline() -> None:
    x = noisy(300)
    x[137] = 5.0
    x[250] = 6.0
    events = detect_spikes(x)
    assert [(e.kind, e.step) for e in events] == [("spike", 137), ("spike", 250)]
    assert events[0].level == pytest.approx(1.0, abs=0.05)
    assert events[0].ratio == pytest.approx(5.0, rel=0.1)


def test_noise_alone_is_silent() -> None:
    for seed in range(5):
        assert detect_spikes(noisy(2000, noise=0.2, seed=seed)) == []


def test_level_shift_is_sustained_and_rebaselined() -> None:
    x = np.concatenate([noisy(100), noisy(100, level=10.0, seed=1)])
    events = detect_spikes(x, patience=8)
    assert [(e.kind, e.step, e.confirmed_step) for e in events] == [
        ("spike", 100, 100), ("sustained", 100, 107)]
    assert events[1].value == pytest.approx(10.0, rel=0.05)


def test_nonfinite_reported_once_per_run() -> None:
    x = noisy(100)
    x[40:45] = np.nan
    x[70] = np.inf
    events = detect_spikes(x)
    assert [(e.kind, e.step) for e in events] == [("nonfinite", 40), ("nonfinite", 70)]


def test_min_jump_and_ratio_gate_small_absolute_jumps() -> None:
    x = noisy(200, level=0.01, noise=0.0005)
    x[150] = 0.05  # 5x the level but only 0.04 above it
    assert [e.step for e in detect_spikes(x)] == [150]
    assert detect_spikes(x, min_jump=0.5) == []


def test_result_does_not_depend_on_chunking() -> None:
    x = noisy(1000, noise=0.1)
    x[[200, 201, 555, 900]] = [4.0, 4.5, 9.0, 3.0]
    x[700:730] = 8.0
    whole = detect_spikes(x)
    watch = SpikeWatch()
    rng = np.random.default_rng(1)
    chunked, i = [], 0
    while i < x.size:
        n = int(rng.integers(1, 70))
        chunked += watch.update(x[i:i + n])
        i += n
    assert [e.to_dict() for e in chunked] == [e.to_dict() for e in whole]
    assert {e.kind for e in whole} == {"spike", "sustained"}


def test_state_round_trip_keeps_the_baseline() -> None:
    x = noisy(400)
    x[300] = 7.0
    a = SpikeWatch()
    a.update(x[:250])
    b = SpikeWatch()
    b.load_state_dict(pickle.loads(pickle.dumps(a.state_dict())))
    assert b.threshold() == a.threshold()
    assert [e.step for e in b.update(x[250:])] == [300]


def test_threshold_infinite_while_warming_up() -> None:
    w = SpikeWatch(warmup=16)
    w.update(noisy(10))
    assert w.threshold() == math.inf
    w.update(noisy(10))
    assert 1.0 < w.threshold() < 3.0


def test_memory_flat_over_a_million_steps() -> None:
    w = SpikeWatch()
    sizes = []
    rng = np.random.default_rng(0)
    for _chunk in range(100):
        x = 1.0 + 0.1 * rng.standard_normal(10_000)
        x[5000] = 50.0  # a spike per chunk
        w.update(x)
        sizes.append(w.state_size())
    assert w.step == 1_000_000
    assert w.counts["spike"] == 100
    assert max(sizes) <= w.window + w.patience + 16
    assert len(pickle.dumps(w.state_dict())) < 10_000


def test_robust_level_ignores_outliers_and_nonfinite() -> None:
    med, spread = robust_level([1.0, 1.1, 0.9, 1.0, 100.0, math.nan])
    assert med == pytest.approx(1.0)
    assert spread < 0.2


@pytest.mark.parametrize("kwargs", [{"window": 0}, {"warmup": 100, "window": 10}, {"z": 0},
                                    {"ratio": 0.5}, {"min_jump": -1}])
def test_invalid_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="must"):
        SpikeWatch(**kwargs)


def test_update_finite_feeds_each_finite_run_from_its_own_step() -> None:
    values = [2.0, 2.1, 1.9, 2.0] * 10
    steps = list(range(len(values)))
    gapped = [*values[:20], math.inf, math.nan, *values[20:], 30.0]
    gapped_steps = [*steps[:20], 20, 21, *(s + 2 for s in steps[20:]), len(values) + 2]
    a, b = SpikeWatch(warmup=8), SpikeWatch(warmup=8)
    plain = a.update([*values, 30.0])
    finite = b.update_finite(gapped, gapped_steps)
    assert [e.kind for e in plain] == [e.kind for e in finite] == ["spike"]
    assert plain[0].step == len(values) and finite[0].step == len(values) + 2  # its own step
    assert finite[0].value == plain[0].value
    assert b.update_finite([math.inf, math.nan], [100, 101]) == []  # nothing finite: no events
