"""classify_curve: synthetic curves (each verdict at its expected step) and the labeled set of
curves recorded from real short training runs (tests/data/curves.json, built by
tests/data/make_curves.py)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lightning_triage.functional.curve import CurveThresholds, classify_curve

CHANCE = math.log(10)
FIXTURE = Path(__file__).parents[1] / "data" / "curves.json"
SEEDS_FIXTURE = Path(__file__).parents[1] / "data" / "curves_seeds.json"  # same cases, seeds 1-2
SHAPES = ("diverging", "plateau_at_chance", "not_learning", "lr_too_low", "lr_too_high")


def noise(n: int, scale: float, seed: int = 0) -> np.ndarray:
    return scale * np.random.default_rng(seed).standard_normal(n)


def healthy(n: int = 200, seed: int = 0) -> np.ndarray:
    t = np.arange(n)
    return 0.2 + 2.1 * np.exp(-t / 40) + noise(n, 0.05, seed)


def codes(verdicts: list) -> list[tuple[str, int]]:
    return [(v.code.split(".", 1)[1], v.step) for v in verdicts]


def test_healthy_decay_is_healthy() -> None:
    for seed in range(5):
        assert codes(classify_curve(healthy(seed=seed), chance=CHANCE)) == [("healthy", 199)]


def test_flat_curve_is_not_learning() -> None:
    x = CHANCE + noise(200, 0.05)
    assert codes(classify_curve(x, chance=CHANCE)) == [("not_learning", 199)]


def test_identical_validation_losses_mean_not_learning() -> None:
    x = CHANCE + noise(200, 0.05)
    val = [(49, 2.35), (99, 2.35), (149, 2.35), (199, 2.35)]
    out = classify_curve(x, val=val, chance=CHANCE)
    assert codes(out) == [("not_learning", 199)]
    assert out[0].evidence["val_constant"] is True


def test_slow_steady_decline_is_lr_too_low() -> None:
    x = CHANCE - 0.0005 * np.arange(300) + noise(300, 0.02)  # -6.5%: slow, straight, steady
    assert codes(classify_curve(x, chance=CHANCE)) == [("lr_too_low", 299)]


def test_barely_falling_validation_is_lr_too_low() -> None:
    x = CHANCE + noise(200, 0.05)
    val = [(49, 2.3550), (99, 2.3549), (149, 2.3548), (199, 2.3547)]
    assert codes(classify_curve(x, val=val, chance=CHANCE)) == [("lr_too_low", 199)]


def test_rising_loss_is_lr_too_high() -> None:
    x = CHANCE * (1 + 0.004 * np.arange(200)) + noise(200, 0.1)  # up 80%, not 10x
    out = classify_curve(x, chance=CHANCE)
    assert codes(out)[0] == ("lr_too_high", 199)
    assert out[0].evidence["rose"] is True


def test_bouncing_back_up_is_lr_too_high() -> None:
    x = np.concatenate([healthy(100)[:100], 1.5 + noise(100, 0.3, 1)])
    out = classify_curve(x, chance=CHANCE)
    assert codes(out)[0] == ("lr_too_high", 199)
    assert out[0].evidence["rebound"] is not None


def test_nonfinite_after_growth_is_diverging_at_that_step() -> None:
    x = healthy()
    x[118:123] = [5.0, 40.0, 300.0, 3e3, 4e4]
    x[123] = np.inf
    assert codes(classify_curve(x, chance=CHANCE))[0] == ("diverging", 123)
    # also mid-window
    assert codes(classify_curve(x[:130], chance=CHANCE, final=False))[0] == ("diverging", 123)


def test_nonfinite_out_of_the_blue_is_left_to_numerics() -> None:
    x = healthy()
    x[123] = np.nan  # e.g. a log(0) in the loss: the numerics stage locates it
    assert classify_curve(x, chance=CHANCE) == []


def test_geometric_growth_is_diverging_when_it_crosses() -> None:
    x = np.concatenate([CHANCE + noise(50, 0.02), CHANCE * 1.2 ** np.arange(1, 51)])
    # the running median (8 steps) passes 10x the step-0 loss 4 steps after the raw curve does
    raw_cross = 50 + int(np.argmax(CHANCE * 1.2 ** np.arange(1, 51) > 10 * x[0]))
    out = classify_curve(x, chance=CHANCE)
    assert out[0].code == "curve.diverging"
    assert raw_cross <= out[0].step <= raw_cross + 4


def test_spike_then_chance_is_plateau_at_chance() -> None:
    x = np.concatenate([[3.9, 55.0, 450.0, 10.0], CHANCE + noise(196, 0.03)])
    assert codes(classify_curve(x, chance=CHANCE))[0] == ("plateau_at_chance", 199)
    # the prior counts as chance too (a model that learned only the class frequencies)
    y = np.concatenate([[3.9, 55.0, 450.0, 10.0], 2.0 + noise(196, 0.03)])
    assert codes(classify_curve(y, chance=CHANCE, prior=2.0))[0] == ("plateau_at_chance", 199)
    assert codes(classify_curve(y, chance=CHANCE))[0][0] != "plateau_at_chance"
    # a move without a blow-up (a step-0 loss far above chance) is the plateau alone
    z = np.concatenate([[3.9, 3.5, 3.0, 2.6], CHANCE + noise(196, 0.03)])
    assert codes(classify_curve(z, chance=CHANCE)) == [("plateau_at_chance", 199)]


def test_a_blow_up_at_the_first_steps_then_chance_is_a_learning_rate_collapse() -> None:
    """Adam at 1e-1 on a small CNN: the first update blows the loss up hundreds of times, the
    units die and the model predicts the prior from then on. Beside the plateau comes the
    learning rate (an error, the collapse in its evidence), which the report explains it by."""
    for prior in (None, 2.0):
        level = CHANCE if prior is None else prior
        x = np.concatenate([[3.9, 55.0, 450.0, 10.0], level + noise(196, 0.03)])
        out = classify_curve(x, chance=CHANCE, prior=prior)
        assert codes(out) == [("plateau_at_chance", 199), ("lr_too_high", 199)]
        assert out[1].severity == "error"
        assert out[1].evidence["collapse"] == {"step": 2, "peak": 450.0, "ratio": 450.0 / 3.9}
        assert out[0].evidence["collapse"] == out[1].evidence["collapse"]
        assert "blew the loss up to 450 at step 2" in out[1].message
    # a blow-up of less than 10x the step-0 loss, or after the first 16 steps, is no collapse
    for head in ([2.3, 9.0, 20.0, 5.0], [2.3] * 20 + [450.0]):
        x = np.concatenate([head, CHANCE + noise(200 - len(head), 0.03)])
        assert "lr_too_high" not in [c for c, _ in codes(classify_curve(x, chance=CHANCE))]


def test_a_curve_still_falling_through_chance_is_not_a_plateau() -> None:
    """The `settled` guard: a spike (the curve "moved"), then a steady fall that ends within 5% of
    chance while still falling is learning, not a plateau at chance."""
    for seed in range(3):
        x = np.concatenate([[3.9, 55.0, 450.0, 10.0],
                            np.linspace(2.5, 2.2, 196) + noise(196, 0.03, seed)])
        assert abs(np.median(x[-50:]) - CHANCE) < 0.05 * CHANCE  # "near" chance at the end
        assert codes(classify_curve(x, chance=CHANCE)) == [("healthy", 199)]


def test_isolated_spike_is_reported_at_its_step() -> None:
    x = healthy()
    x[150] = 6.0
    assert codes(classify_curve(x, chance=CHANCE)) == [("loss_spike", 150)]
    assert codes(classify_curve(x[:160], chance=CHANCE, final=False)) == [("loss_spike", 150)]
    ev = classify_curve(x, chance=CHANCE)[0].evidence
    assert ev["back_to_level_within"] == 1
    # the running median of the recent accepted values (it lags a falling curve)
    assert 0.2 < ev["level_before"] < 0.2 + 2.1 * math.exp(-22 / 40)


def test_overfitting_fires_at_the_confirming_validation_run() -> None:
    x = 2.0 * np.exp(-np.arange(200) / 30) + 0.01 + noise(200, 0.005)
    vals = [1.5, 1.0, 0.7, 0.6, 0.62, 0.68, 0.75, 0.8]  # best at step 79; +13% at 119, +25% at 139
    val = [(19 + 20 * i, v) for i, v in enumerate(vals)]
    out = classify_curve(x, val=val, chance=CHANCE)
    assert ("overfitting", 139) in codes(out)
    over = next(v for v in out if v.code == "curve.overfitting")
    assert over.evidence["best_val_step"] == 79
    assert over.evidence["gap_now"] > over.evidence["gap_at_best"]


def test_validation_bump_that_recovers_is_not_overfitting() -> None:
    x = healthy()
    val = [(39, 1.0), (79, 0.6), (119, 0.8), (159, 0.5), (199, 0.4)]
    assert codes(classify_curve(x, val=val, chance=CHANCE)) == [("healthy", 199)]


def test_short_curves_get_no_shape_verdict() -> None:
    assert classify_curve([2.3] * 10, chance=CHANCE) == []
    assert classify_curve([], chance=CHANCE) == []


def test_steps_relabel_verdicts() -> None:
    x = healthy()
    x[150] = 6.0
    out = classify_curve(x, steps=list(range(1000, 1200)), chance=CHANCE)
    assert codes(out) == [("loss_spike", 1150)]
    with pytest.raises(ValueError, match="steps"):
        classify_curve(x, steps=[1, 2], chance=CHANCE)


# --------------------------------------------------------------------------- labeled real runs
def load_cases() -> list[dict]:
    return json.loads(FIXTURE.read_text())["cases"]


def classify_case(case: dict, final: bool = True, upto: int | None = None) -> list[str]:
    train = [float(v) for v in case["train"]][:upto]
    val = [(s, float(v)) for s, v in case["val"] if upto is None or s < upto]
    return [v.code.split(".", 1)[1]
            for v in classify_curve(train, val=val, chance=case["chance"], final=final)]


def confusion(cases: list[dict]) -> Counter:
    table: Counter = Counter()
    for case in cases:
        got = classify_case(case)
        shape = next((c for c in got if c in SHAPES), None)
        predicted = shape or ("overfitting" if "overfitting" in got else
                              "loss_spike" if "loss_spike" in got else "healthy")
        table[(case["label"], predicted)] += 1
    return table


@pytest.mark.parametrize("case", load_cases(), ids=lambda c: c["name"])
def test_labeled_curve(case: dict) -> None:
    got = classify_case(case)
    if case["label"] == "healthy":
        assert got == ["healthy"], f"healthy run {case['name']} got {got}"
    else:
        assert case["label"] in got, f"{case['name']} ({case['label']}) got {got}"


@pytest.mark.parametrize("case", [c for c in load_cases() if c["label"] == "healthy"],
                         ids=lambda c: c["name"])
def test_healthy_runs_stay_silent_mid_window(case: dict) -> None:
    for upto in range(20, len(case["train"]), 20):
        assert classify_case(case, final=False, upto=upto) == [], upto


# Healthy runs of other seeds on which the thresholds (calibrated on seed 0) raise a false alarm,
# measured 2026-12-03 (docs/curves.md): known, kept visible (strict: fixing one fails here).
KNOWN_FALSE_ALARMS = {("regression_linear_sgd", 1): "overfitting"}


def seed_cases() -> list[Any]:
    out = []
    for case in json.loads(SEEDS_FIXTURE.read_text())["cases"]:
        known = KNOWN_FALSE_ALARMS.get((case["name"], case["seed"]))
        marks = [pytest.mark.xfail(strict=True, reason=f"known false alarm: {known}")] if known else []
        out.append(pytest.param(case, marks=marks, id=f"{case['name']}-seed{case['seed']}"))
    return out


@pytest.mark.parametrize("case", seed_cases())
def test_labeled_curve_on_other_seeds(case: dict) -> None:
    """Every broken run caught on seeds 1 and 2 too; healthy runs get ``healthy`` only."""
    got = classify_case(case)
    if case["label"] == "healthy":
        assert got == ["healthy"], f"healthy run {case['name']} got {got}"
    else:
        assert case["label"] in got, f"{case['name']} ({case['label']}) got {got}"


def test_labeled_set_covers_every_label_and_confusion_is_diagonal() -> None:
    cases = load_cases()
    labels = Counter(c["label"] for c in cases)
    assert set(labels) == {"not_learning", "lr_too_low", "lr_too_high", "diverging",
                           "plateau_at_chance", "overfitting", "healthy"}
    assert labels["healthy"] >= 8
    table = confusion(cases)
    assert all(actual == predicted for actual, predicted in table), table


if __name__ == "__main__":  # print the confusion table for docs/curves.md
    table = confusion(load_cases())
    labels = sorted({a for a, _ in table} | {p for _, p in table})
    print("| label \\ verdict | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 1) + "|")
    for a in labels:
        print(f"| {a} | " + " | ".join(str(table.get((a, p), "")) for p in labels) + " |")


def test_validation_rise_inside_the_noise_of_a_small_validation_set_is_not_overfitting() -> None:
    # issue 14's wine run: validation 0.202 -> 0.234 over 38 examples while training falls
    x = 1.0 * np.exp(-np.arange(135) / 25) + 0.039 + noise(135, 0.003)
    vals = [0.6, 0.35, 0.25, 0.21, 0.202, 0.205, 0.225, 0.229, 0.234]
    val = [(14 + 15 * i, v) for i, v in enumerate(vals)]
    # without the size of the validation set: the old rule (a 16% rise) fires
    assert "overfitting" in {c for c, _ in codes(classify_curve(x, val=val, chance=1.0986))}
    # 38 examples: the standard error of the mean is ~0.202 / sqrt(38) = 0.033 > the rise 0.032
    out = classify_curve(x, val=val, chance=1.0986, val_examples=38)
    assert "overfitting" not in {c for c, _ in codes(out)}
    # the same rise measured on 2,000 examples is significant (SE 0.0045): overfitting
    out = classify_curve(x, val=val, chance=1.0986, val_examples=2000)
    over = next(v for v in out if v.code == "curve.overfitting")
    assert over.evidence["standard_error"] == pytest.approx(0.202 / math.sqrt(2000))
    assert over.evidence["val_examples"] == 2000


def test_real_overfitting_on_a_small_validation_set_is_still_caught() -> None:
    x = 2.0 * np.exp(-np.arange(200) / 30) + 0.01 + noise(200, 0.005)
    vals = [1.5, 1.0, 0.7, 0.6, 0.75, 0.95, 1.2, 1.5]  # the validation loss more than doubles
    val = [(19 + 20 * i, v) for i, v in enumerate(vals)]
    out = classify_curve(x, val=val, chance=CHANCE, val_examples=38)
    assert "overfitting" in {c for c, _ in codes(out)}


# The training loss of a healthy run (benchmarks/false_alarms.py, family bert-recipe, seed 10:
# transformers' BertForSequenceClassification from a small config, batch 16, AdamW 2e-3, warm-up,
# gradient_clip_val=1.0; it learns, 0.69 -> 0.05), recorded 2026-12-04. Step 126: one batch at
# 0.938 over a running level of 0.127, 8.8 robust standard deviations (its baseline already held
# excursions of 6.7): one confidently wrong sentence out of 16, not a bad batch.
BERT_RECIPE_SEED10 = [
    0.6951, 0.6938, 0.6930, 0.6915, 0.6964, 0.6931, 0.6925, 0.6968, 0.6941, 0.6984, 0.6908, 0.6895,
    0.6957, 0.6861, 0.6882, 0.6894, 0.6746, 0.6765, 0.6761, 0.7084, 0.6713, 0.6994, 0.6539, 0.6854,
    0.6855, 0.7454, 0.7472, 0.6435, 0.6848, 0.7224, 0.6842, 0.6685, 0.7065, 0.6902, 0.6867, 0.6880,
    0.6772, 0.6718, 0.6693, 0.6720, 0.6616, 0.6705, 0.6518, 0.6026, 0.6331, 0.7077, 0.6993, 0.5651,
    0.6658, 0.5739, 0.5066, 0.6256, 0.4892, 0.5570, 0.4614, 0.3974, 0.4278, 0.3890, 0.3062, 0.5608,
    0.3582, 0.3193, 0.2278, 0.3283, 0.2981, 0.2393, 0.1690, 0.3447, 0.2531, 0.1144, 0.1439, 0.2619,
    0.2545, 0.1124, 0.3286, 0.1761, 0.0965, 0.2511, 0.4035, 0.0681, 0.1266, 0.0633, 0.2044, 0.3619,
    0.1986, 0.0515, 0.2065, 0.1265, 0.0506, 0.6342, 0.1988, 0.4211, 0.1408, 0.1562, 0.4094, 0.0436,
    0.0481, 0.1880, 0.0443, 0.2150, 0.2576, 0.0399, 0.0414, 0.1002, 0.2640, 0.1885, 0.1019, 0.0388,
    0.0384, 0.0438, 0.0462, 0.0383, 0.2308, 0.0330, 0.0707, 0.0397, 0.0350, 0.0380, 0.0283, 0.0439,
    0.2356, 0.0723, 0.2491, 0.0310, 0.1350, 0.0259, 0.9383, 0.2803, 0.0352, 0.3246, 0.0252, 0.2541,
    0.0348, 0.0318, 0.1044, 0.2498, 0.2387, 0.1407, 0.2065, 0.0244, 0.0262, 0.0612, 0.0332, 0.0275,
    0.1371, 0.0275, 0.2702, 0.1627, 0.0264, 0.0515]


def test_heavy_tailed_small_batch_outlier_of_a_healthy_bert_run_is_not_a_loss_spike() -> None:
    assert [v.code for v in classify_curve(BERT_RECIPE_SEED10, chance=math.log(2))] \
        == ["curve.healthy"]
    for upto in range(20, len(BERT_RECIPE_SEED10), 20):  # mid-window too
        assert classify_curve(BERT_RECIPE_SEED10[:upto], chance=math.log(2), final=False) == []


@pytest.mark.parametrize("step", [60, 100, 126])
def test_a_bad_batch_in_the_same_bert_run_is_still_a_loss_spike(step: int) -> None:
    """A batch whose labels are all wrong (every sentence costs ~2.5 nats at this stage) in the
    same curve: caught at its step, far beyond the heavy-tailed noise."""
    x = list(BERT_RECIPE_SEED10)
    x[step] = 2.5
    verdicts = classify_curve(x, chance=math.log(2))
    assert [v.step for v in verdicts if v.code == "curve.loss_spike"] == [step]
    ev = next(v.evidence for v in verdicts if v.code == "curve.loss_spike")
    assert (ev["value"] - ev["level_before"]) / ev["spread"] > 2 * CurveThresholds().spike_z


def test_a_loss_that_falls_without_bound_is_diverging() -> None:
    # a VAE whose KL term has the wrong sign: the loss heads to minus infinity
    falling = [40.0 - 5.0 * i for i in range(20)] + [-60.0 * 1.15 ** i for i in range(40)]
    verdicts = classify_curve(falling, chance=None)
    assert [v.code for v in verdicts] == ["curve.diverging"]
    assert "fell without bound" in verdicts[0].message
    assert verdicts[0].evidence["direction"] == "down"
    # a sign bug: the advice is the objective's, not the learning rate's
    assert verdicts[0].hint is not None and "unbounded below" in verdicts[0].hint
    assert "learning rate" not in verdicts[0].message
    # a NaN after such a fall is a divergence too, not a numerics bug out of the blue
    after = classify_curve([*falling, float("-inf")])
    assert [v.code for v in after] == ["curve.diverging"]
    assert after[0].evidence["direction"] == "down" and after[0].hint == verdicts[0].hint
    assert "learning rate" not in after[0].message
    # growth to +inf keeps the registry's advice (lower the learning rate)
    up = classify_curve([2.3 * 1.5 ** i for i in range(40)] + [float("inf")])
    assert up[0].code == "curve.diverging" and up[0].hint is None


def test_a_likelihood_that_settles_below_zero_is_not_diverging() -> None:
    # a Gaussian NLL: from about 1 down to a negative plateau, bounded
    settling = [1.0 - 3.0 * (1 - 0.9 ** i) + 0.02 * ((i * 7) % 5 - 2) for i in range(120)]
    assert "curve.diverging" not in [v.code for v in classify_curve(settling)]
    # a large negative level that does not keep falling is not a fall without bound either
    flat_low = [50.0 - 30.0 * i for i in range(20)] + [-600.0 + ((i * 7) % 5) for i in range(60)]
    assert "curve.diverging" not in [v.code for v in classify_curve(flat_low)]
