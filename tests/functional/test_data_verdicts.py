"""The data stage's rules: a broken input fires with its numbers, a healthy one stays silent."""

from __future__ import annotations

import torch

from lightning_triage.demo.digits import load_digits_tensors
from lightning_triage.functional.data import (
    FeatureMoments,
    FingerprintStore,
    duplicate_stats,
    example_fingerprints,
    input_shift,
    label_signal,
    summarize_tensor,
    verdicts,
)
from lightning_triage.functional.data.state import DataRunState
from lightning_triage.functional.hooks import HeadCapture
from lightning_triage.functional.verdict import Verdict

PLACE = {"where": "training batch 2", "batch_idx": 2, "step": 7}


def test_batch_place():
    assert verdicts.batch_place("train", 4) == "training batch 4"
    assert verdicts.batch_place("val", 4) == "validation batch 4"
    assert verdicts.batch_place("val", 4, 2) == "validation batch 4 of val loader 2"


def test_nonfinite_fires_with_counts():
    x = torch.zeros(4, 3)
    x[2, 1] = float("nan")
    x[3, 0] = float("inf")
    v = verdicts.nonfinite_rule(x, summarize_tensor(x, "x"), target=False, split="train", **PLACE)
    assert isinstance(v, Verdict)
    assert (v.code, v.step, v.evidence["nan"], v.evidence["inf"], v.evidence["first_example"]) == \
        ("data.nonfinite_input", 7, 1, 1, 2)
    assert "1 NaN and 1 Inf values of 12" in v.message
    y = torch.tensor([0.0, float("nan")])
    assert verdicts.nonfinite_rule(y, summarize_tensor(y, "y"), target=True, split="val",
                                **PLACE).code == "data.nonfinite_target"


def test_scale_rules():
    big = summarize_tensor(torch.rand(64, 64) * 255, "x")
    v = verdicts.unnormalized_rule(big, max_rms=4.0, **PLACE)
    assert v is not None and v.evidence["verdict"] == "large" and "rms > 4" in v.message
    assert verdicts.tiny_scale_rule(big, max_rms=4.0, **PLACE) is None
    tiny = summarize_tensor(torch.rand(64, 64) / 16, "x")  # [0, 1] pixels divided by 16 again
    t = verdicts.tiny_scale_rule(tiny, max_rms=4.0, **PLACE)
    assert t is not None and t.code == "data.tiny_input_scale"
    healthy = summarize_tensor(torch.randn(64, 64, generator=torch.Generator().manual_seed(0)), "x")
    assert verdicts.unnormalized_rule(healthy, max_rms=4.0, **PLACE) is None
    assert verdicts.tiny_scale_rule(healthy, max_rms=4.0, **PLACE) is None


def test_constant_rule():
    x = torch.ones(5, 3)
    v = verdicts.constant_rule(x, summarize_tensor(x, "x"), split="train", **PLACE)
    assert v is not None and v.evidence["examples"] == 5 and "identical for all 5" in v.message
    x = torch.randn(5, 3)
    assert verdicts.constant_rule(x, summarize_tensor(x, "x"), split="train", **PLACE) is None


def test_target_range_rule():
    args = {"ignore_index": -100, "name": "y", "split": "train", **PLACE}
    v = verdicts.target_range_rule(torch.tensor([1, 2, 3]), 3, source="`num_classes`",
                                inferred=False, **args)
    assert v is not None and v.severity is None and "labels counted from 1" in v.message
    far = verdicts.target_range_rule(torch.tensor([0, 50]), 3, source="width", inferred=True, **args)
    assert far is not None and far.severity == "warning"
    assert verdicts.target_range_rule(torch.tensor([0, 1, 2, -100]), 3, source="`num_classes`",
                                   inferred=False, **args) is None


def test_imbalance_rule():
    dominated = verdicts.imbalance_rule({0: 950, 1: 50}, [(100, 2)] * 10, 2, 10)
    assert dominated is not None and "Class 0 is 95%" in dominated.message
    assert dominated.step is None
    balanced = verdicts.imbalance_rule({0: 500, 1: 500}, [(100, 2)] * 10, 2, 10)
    assert balanced is None


def test_duplicate_and_repeated_batch_rules():
    x = torch.randn(4, 16).repeat(4, 1)  # 16 examples, 4 distinct
    repeats, largest = duplicate_stats(example_fingerprints(x))
    v = verdicts.duplicates_rule(16, repeats, largest, per_example=16, fraction=0.5, name="x",
                              split="train", **PLACE)
    assert v is not None and v.evidence["distinct"] == 4
    fresh = torch.randn(16, 16)
    repeats, largest = duplicate_stats(example_fingerprints(fresh))
    assert verdicts.duplicates_rule(16, repeats, largest, per_example=16, fraction=0.5, name="x",
                                 split="train", **PLACE) is None
    r = verdicts.repeated_batch_rule((0, 3), 16, 1, name="x", epoch=0, **PLACE)
    assert r is not None and r.evidence["same_as_step"] == 3
    assert verdicts.repeated_batch_rule(None, 16, 1, name="x", epoch=0, **PLACE) is None
    assert verdicts.repeated_batch_rule((0, 3), 16, 16, name="x", epoch=0, **PLACE) is None


def test_overlap_rule():
    train, val, disjoint = FingerprintStore(), FingerprintStore(), FingerprintStore()
    for i in range(100):
        train.add(i, (0, i))
        val.add(i if i < 10 else 1000 + i, (1, i, 0))
        disjoint.add(2000 + i, (1, i, 0))
    v = verdicts.overlap_rule(train, val)
    assert v is not None and v.evidence["overlap"] == 10 and "(10%)" in v.message
    assert verdicts.overlap_rule(train, disjoint) is None


def test_shift_rule():
    g = torch.Generator().manual_seed(0)
    train, val, same = FeatureMoments(), FeatureMoments(), FeatureMoments()
    train.update(torch.randn(256, 8, generator=g))
    val.update(torch.randn(128, 8, generator=g) * 16)
    same.update(torch.randn(128, 8, generator=g))
    shifted = input_shift(train, val)
    assert shifted is not None
    v = verdicts.shift_rule(shifted, 256, 128)
    assert v is not None and v.evidence["train_examples"] == 256
    healthy = input_shift(train, same)
    assert healthy is not None and verdicts.shift_rule(healthy, 256, 128) is None


def test_misalignment_rule_on_digits():
    x, y = load_digits_tensors(standardize=True)[:2]
    x, y = x[:600], y[:600]
    related = label_signal(x, y)
    assert related is not None and verdicts.misalignment_rule(related) is None
    shuffled = label_signal(x, y[torch.randperm(600, generator=torch.Generator().manual_seed(0))])
    assert shuffled is not None
    v = verdicts.misalignment_rule(shuffled)
    assert v is not None and v.code == "data.label_misalignment"
    assert verdicts.probe_detail(shuffled).startswith("label probe on 600 examples")


def test_unknown_structure_rule():
    v = verdicts.unknown_structure_rule({"a": 1}, "no tensor", [])
    assert v.code == "data.unknown_batch_structure" and "batch type `dict`" in v.message


def test_run_state_counts_and_round_trip():
    st = DataRunState.fresh(16, 64, None, None)
    assert st.wants("train", (0, 0), 2, 3)
    assert st.count("train", (0, 0), 2, 3) == (True, True)
    assert st.count("train", (0, 1), 2, 3) == (True, True)
    assert st.count("train", (0, 2), 2, 3) == (False, True)
    assert not st.wants("train", (0, 3), 2, 3)
    assert st.count("val", (0, 0), 2, None) == (True, True)
    assert st.count("val", (0, 0), 2, None) == (False, True)
    st.count_classes(torch.tensor([0, 0, 1, -100]), -100)
    assert st.class_totals == {0: 2, 1: 1} and st.batch_classes == [(4, 2)]
    st.collect_probe(torch.randn(8, 4), torch.tensor([0, 1] * 4), 64)
    assert st.probe_count == 8
    other = DataRunState.fresh(16, 64, None, None)
    other.load_state_dict(st.state_dict())
    assert other.train_inspected == 2 and other.class_totals == st.class_totals
    assert other.val_inspected == {(0, 0)}


def test_head_capture_take_and_on_forward():
    net = torch.nn.Sequential(torch.nn.Linear(4, 3))
    calls = []
    capture = HeadCapture()
    capture.start(net, None, on_forward=lambda: calls.append(capture.captured.output.shape))
    net(torch.randn(2, 4))
    assert calls == [torch.Size([2, 3])]
    assert capture.captured is not None and capture.captured.module_name is not None
    assert capture.take().shape == (2, 3) and capture.take() is None
    capture.close()
    assert capture.captured is None
    assert not any(m._forward_hooks for m in net.modules())
