"""Gradient statistics (device side) and classify_gradients (host side)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_triage.functional.gradients import (
    alive_units,
    classify_gradients,
    grad_norms,
    jumped_first,
    loss_spike_after,
    suggest_clip,
    update_norms,
)

FIXTURE = Path(__file__).parents[1] / "data" / "curves.json"


def norms(n: int = 100, level: float = 1.0, seed: int = 0) -> np.ndarray:
    return level * np.exp(0.1 * np.random.default_rng(seed).standard_normal(n))


def codes(verdicts: list) -> list[tuple[str, int]]:
    return [(v.code.split(".", 1)[1], v.step) for v in verdicts]


def test_grad_norms_match_reference_and_stay_on_device() -> None:
    grads = [torch.randn(5, 3), torch.randn(7), torch.randn(2, 2, 2)]
    total, per = grad_norms(grads)
    ref = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    assert float(total) == pytest.approx(float(ref), rel=1e-6)
    assert per.shape == (3,)
    assert per.dtype == torch.float32
    assert isinstance(total, torch.Tensor)
    assert total.ndim == 0
    total16, _ = grad_norms([g.half() for g in grads] + [torch.randn(3, dtype=torch.float64)])
    assert total16.dtype == torch.float32


def test_update_norms_and_alive_units() -> None:
    old = [torch.ones(4, 3)]
    new = [torch.ones(4, 3) * 1.001]
    dn, wn = update_norms(new, old)
    assert float(dn[0] / wn[0]) == pytest.approx(1e-3, rel=1e-3)
    g = torch.zeros(4, 3)
    g[1, 2] = 0.5
    assert alive_units(g).tolist() == [False, True, False, False]


def test_spike_reported_with_following_loss_spike_and_clip() -> None:
    x = norms()
    x[60] = 50.0
    loss = np.full(100, 2.0)
    loss[62] = 9.0  # two steps after the gradient spike
    out = classify_gradients(x, loss=loss, final=False)
    assert codes(out) == [("spike", 60)]
    ev = out[0].evidence
    assert ev["loss_spike_followed"] is True
    assert ev["loss_spike_after_steps"] == 2
    assert 1.0 < ev["suggested_clip"] < 1.6
    loss[62] = 2.0
    assert classify_gradients(x, loss=loss, final=False)[0].evidence["loss_spike_followed"] is False


def test_spike_names_the_layer_that_jumped_first() -> None:
    x = norms()
    layers = {"a": norms(seed=1), "b": norms(seed=2), "c": norms(seed=3)}
    layers["b"][58:61] = [10.0, 20.0, 40.0]  # b jumps two steps before the total spikes
    layers["c"][60] = 30.0
    x[60] = 50.0
    out = classify_gradients(x, layers=layers, final=False)
    assert out[0].layer == "b"
    assert out[0].evidence["first_layer_step"] == 58


def test_jumped_first_falls_back_to_the_largest_ratio() -> None:
    mat = np.ones((10, 2))
    mat[9, 1] = 2.0
    name, row, ratios = jumped_first(mat, ["x", "y"], 9, np.ones(2))
    assert (name, row) == ("y", 9)
    assert ratios["y"] == 2.0


def test_growth_by_orders_of_magnitude_is_exploding() -> None:
    x = np.concatenate([norms(50), np.geomspace(1, 1e4, 50)])
    out = classify_gradients(x)
    assert codes(out)[-1][0] == "exploding"
    assert out[-1].evidence["growth"] > 100


def test_nonfinite_norm_after_growth_is_exploding_unless_amp_skips_it() -> None:
    x = norms()
    x[66:70] = [30.0, 300.0, 3e3, 3e4]
    x[70] = np.inf
    assert codes(classify_gradients(x))[0] == ("exploding", 70)
    skipped = [v.code for v in classify_gradients(x, nonfinite_is_skip=True)]
    assert "grad.exploding" not in skipped
    y = norms()
    y[70] = np.nan  # out of the blue: the numerics stage's business
    assert classify_gradients(y) == []
    assert classify_gradients(y, nonfinite_is_skip=True) == []


def test_depth_ratio_vanishing_and_exploding() -> None:
    x = norms()
    vanishing = {"l0": norms() * 1e-6, "l1": norms() * 1e-3, "l2": norms()}
    out = classify_gradients(x, layers=vanishing)
    assert codes(out) == [("vanishing", 99)]
    assert out[0].layer == "l0"
    exploding = {"l0": norms() * 1e5, "l1": norms() * 1e2, "l2": norms()}
    assert codes(classify_gradients(x, layers=exploding)) == [("exploding", 99)]
    fine = {"l0": norms() * 0.1, "l1": norms(), "l2": norms() * 10}
    assert classify_gradients(x, layers=fine) == []


def test_update_ratio_far_from_1e_3() -> None:
    x = norms()
    out = classify_gradients(x, update_ratios={"a": 0.0, "b": 1e-3})
    assert codes(out) == [("update_ratio", 99)]
    assert out[0].layer == "a"
    assert out[0].evidence["direction"] == "below"
    out = classify_gradients(x, update_ratios={"a": 2e-3, "b": 0.9})
    assert out[0].layer == "b"
    assert out[0].evidence["direction"] == "above"
    assert classify_gradients(x, update_ratios={"a": 1e-4, "b": 0.05}) == []


def test_dead_units_and_zero_layers() -> None:
    x = norms()
    out = classify_gradients(x, dead_units={"fc1": (30, 32), "fc2": (1, 10)})
    assert codes(out) == [("dead_units", 99)]
    assert out[0].layer == "fc1"
    out = classify_gradients(x, layers={"a": norms(), "b": np.zeros(100), "c": norms()})
    assert codes(out) == [("dead_units", 99)]
    assert out[0].layer == "b"
    assert classify_gradients(x, dead_units={"fc1": (3, 32)}) == []


def test_suggest_clip_and_loss_spike_after() -> None:
    assert suggest_clip([1.0] * 99 + [50.0]) == 1.5
    assert suggest_clip([]) is None
    assert suggest_clip([0.0]) is None
    assert suggest_clip([123.0] * 10) == 120.0
    loss = [1.0] * 20 + [1.0, 1.0, 5.0]
    assert loss_spike_after(loss, 20, 5) == 2
    assert loss_spike_after(loss, 20, 1) is None


def test_healthy_real_runs_have_no_gradient_findings() -> None:
    cases = json.loads(FIXTURE.read_text())["cases"]
    for case in cases:
        g = [float(v) for v in case["grad_norm"]]
        loss = [float(v) for v in case["train"]]
        got = codes(classify_gradients(g, loss=loss))
        if case["label"] == "healthy":
            assert got == [], (case["name"], got)
        elif case["label"] == "diverging":
            assert "exploding" in [c for c, _ in got], (case["name"], got)


def test_layer_groups_and_norms_agree_with_the_per_parameter_norms() -> None:
    from lightning_triage.functional.gradients import layer_groups, layer_norms

    names, groups = layer_groups(["enc.0.weight", "enc.0.bias", "enc.1.weight", "head.weight"],
                                 max_layers=2)
    assert (names, groups) == (["enc", "head"], [0, 0, 0, 1])
    per = np.array([[1.0, 2.0, 2.0, 7.0], [0.0, 0.0, 0.0, 0.0]])
    assert layer_norms(per, groups, len(names)).tolist() == [[3.0, 7.0], [0.0, 0.0]]
    assert layer_norms(per, [0, -1, -1, -1], 1).tolist() == [[1.0], [0.0]]  # -1: no group


def test_explosion_verdict_sustained_nonfinite_and_out_of_the_blue() -> None:
    from lightning_triage.functional.gradients import explosion_verdict
    from lightning_triage.functional.spikes import SpikeEvent

    up = SpikeEvent("sustained", 40, 50.0, 1.0, 0.1, 50.0, confirmed_step=55)
    v = explosion_verdict(up, [50.0], 0, clip=3.0, growth=1e3)
    assert v is not None and v.code == "grad.exploding" and v.evidence["suggested_clip"] == 3.0
    assert "confirmed at step 55" in v.message
    down = SpikeEvent("sustained", 40, 0.5, 1.0, 0.1, 0.5, confirmed_step=55)
    assert explosion_verdict(down, [0.5], 0, clip=None, growth=1e3) is None
    nan = SpikeEvent("nonfinite", 3, math.inf, 2.3, 0.1, math.inf, confirmed_step=3)
    grew = explosion_verdict(nan, [2.3, 125.0, 1e5, math.inf], 3, clip=None, growth=1e3)
    assert grew is not None and grew.evidence["kind"] == "nonfinite"
    assert explosion_verdict(nan, [2.3, 0.5, 0.4, math.inf], 3, clip=None, growth=1e3) is None


def test_median_ratios_skips_non_finite_and_empty_columns() -> None:
    from lightning_triage.functional.gradients import median_ratios

    rows = np.array([[1.0, np.nan, 4.0], [3.0, np.nan, np.inf], [2.0, np.nan, 6.0]])
    assert median_ratios(rows, ["a", "b", "c"]) == {"a": 2.0, "c": 5.0}
