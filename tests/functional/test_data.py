"""Batch statistics, fingerprints and the label probe, on real digits and known cases."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_triage.demo.digits import load_digits_tensors
from lightning_triage.functional.data import (
    FeatureMoments,
    FingerprintStore,
    batch_picture,
    class_imbalance,
    constant_across_batch,
    example_fingerprints,
    input_shift,
    label_signal,
    scale_verdict,
    summarize_tensor,
    target_range,
)


@pytest.fixture(scope="module")
def digits():
    return load_digits_tensors(standardize=True)


@pytest.fixture(scope="module")
def raw_digits():
    return load_digits_tensors(standardize=False)


def test_summary_ignores_nonfinite_values():
    t = torch.tensor([1.0, float("nan"), float("inf"), 3.0])
    s = summarize_tensor(t, "x")
    assert (s.nan, s.inf, s.min, s.max, s.mean) == (1, 1, 1.0, 3.0, 2.0)
    assert summarize_tensor(torch.full((3,), float("nan"))).mean is None
    ints = summarize_tensor(torch.tensor([1, 2, 3]))
    assert (ints.dtype, ints.max, ints.nan) == ("int64", 3.0, 0)


def test_scale_verdicts(digits, raw_digits):
    assert scale_verdict(summarize_tensor(raw_digits[0][:32])) == "large"
    assert scale_verdict(summarize_tensor(raw_digits[0][:32] * 255 / 16)) == "large"
    assert scale_verdict(summarize_tensor(digits[0][:32])) is None  # standardized, max |x| ~ 37
    assert scale_verdict(summarize_tensor(raw_digits[0][:32] / 16)) is None  # [0, 1] pixels
    assert scale_verdict(summarize_tensor(raw_digits[0][:32] / 16 / 255)) == "tiny"
    assert scale_verdict(summarize_tensor(torch.randint(0, 30000, (8, 16)))) is None  # token ids


def test_constant_feature_column_is_not_constant_input(digits):
    x = digits[0][:32]
    assert bool((x[:, 0] == 0).all())  # digits' border pixel is always 0
    assert not constant_across_batch(x)
    assert constant_across_batch(x[:1].expand(32, -1))
    assert not constant_across_batch(x[:1])


def test_fingerprints_equal_iff_examples_equal(digits):
    x = digits[0][:64]
    fps = example_fingerprints(x)
    assert len(set(fps)) == 64
    assert example_fingerprints(x.clone()) == fps
    assert example_fingerprints(x.double())[0] != fps[0]  # dtype is part of the fingerprint
    big = torch.arange(3 * 32 * 32.0).reshape(1, 3, 32, 32).repeat(2, 1, 1, 1)
    big[1, 0, 0, 0] = -1.0  # the first element is always sampled
    a, b = example_fingerprints(big)
    assert a != b


def test_fingerprint_store_is_bounded():
    store = FingerprintStore(capacity=100)
    for i in range(10_000):
        store.add(i, i)
    assert len(store) == 100
    assert 9_999 in store
    assert 0 not in store


def test_target_range_off_by_one_and_ignore_index():
    y = torch.arange(1, 11).repeat(3)
    r = target_range(y, 10)
    assert (r.bad, r.min, r.max, r.values, r.first_index) == (3, 1, 10, [10], 9)
    assert target_range(torch.tensor([0, 9, -100]), 10).bad == 0
    seq = torch.tensor([[0, 1, 2], [3, 20, 1]])
    assert target_range(seq, 10).first_index == 1


def test_class_imbalance_rules():
    balanced = class_imbalance({k: 100 for k in range(10)}, [(32, 9)] * 10, 10)
    assert not balanced.dominated
    assert not balanced.sorted_batches
    assert class_imbalance({0: 60, 1: 40}, [(32, 2)] * 3, 2).dominated is False
    assert class_imbalance({0: 95, 1: 5}, [(32, 2)] * 3, 2).dominated
    # a rare-positive binary task has one-class batches by nature: not "sorted"
    rare = class_imbalance({0: 980, 1: 20}, [(32, 1)] * 10, 2)
    assert rare.expected_one_class > 0.1
    assert not rare.sorted_batches


def test_input_shift_digits(digits, raw_digits):
    train, val = FeatureMoments(), FeatureMoments()
    train.update(digits[0][:512])
    val.update(digits[2][:256])
    same = input_shift(train, val)
    assert same is not None
    assert not same.clearly_different()
    assert same.mean_shift < 0.2
    assert same.std_ratio < 1.3
    raw_val = FeatureMoments()
    raw_val.update(raw_digits[2][:256])
    shifted = input_shift(train, raw_val)
    assert shifted is not None
    assert shifted.clearly_different()
    scaled_val = FeatureMoments()
    scaled_val.update(raw_digits[2][:256] / 16)  # val scaled to [0, 1], train standardized
    assert input_shift(train, scaled_val).clearly_different()


def test_label_signal_digits_vs_shuffled(digits):
    x, y = digits[0][:512], digits[1][:512]
    healthy = label_signal(x, y)
    assert healthy.related()
    assert healthy.knn > 0.9
    g = torch.Generator().manual_seed(1)
    shuffled = label_signal(x, y[torch.randperm(512, generator=g)])
    assert not shuffled.related()
    assert abs(shuffled.knn - shuffled.knn_null) < 0.05


def test_label_signal_does_not_accuse_a_weak_but_real_task():
    # one informative feature among 64, with heavy label noise: accuracy ~0.64 at best
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1024, 64, generator=g)
    y = ((x[:, 0] + 1.5 * torch.randn(1024, generator=g)) > 0).long()
    result = label_signal(x, y)
    assert result.related()
    # a nonlinear task (XOR of two features) is caught by the neighbour probe
    x = torch.randn(1024, 16, generator=g)
    y = ((x[:, 0] > 0) ^ (x[:, 1] > 0)).long()
    assert label_signal(x, y).related()


def test_label_signal_skips_rare_classes_and_near_single_class_data(digits):
    x, y = digits[0][:600], digits[1][:600]
    rare = (y == 3).long()  # ~10% positives: still probed
    assert label_signal(x, rare).related()
    keep = torch.cat([torch.nonzero(y != 3).flatten()[:570], torch.nonzero(y == 3).flatten()[:5]])
    assert label_signal(x[keep], (y[keep] == 3).long()) is None  # 5 positives of 575
    assert label_signal(x[:20], y[:20]) is None


def test_label_signal_leaves_global_rng_alone(digits):
    before = torch.get_rng_state()
    label_signal(digits[0][:128], digits[1][:128])
    assert torch.equal(before, torch.get_rng_state())


def test_batch_picture_kinds(digits):
    pic = batch_picture(digits[0][:32], digits[1][:32])
    assert pic["kind"] == "table"
    assert pic["image_shape"] == [8, 8]
    assert len(pic["pixels"]) == 8
    assert len(pic["pixels"][0]) == 64
    assert pic["targets"] == digits[1][:8].tolist()
    img = batch_picture(torch.rand(4, 3, 100, 100))
    assert img["kind"] == "image"
    assert len(img["examples"][0]) == 3
    assert len(img["examples"][0][0]) <= 32
    tokens = batch_picture(torch.randint(0, 50, (4, 10)))
    assert tokens["kind"] == "tokens"
    assert all(isinstance(v, int) for v in tokens["examples"][0])
    assert not any(isinstance(v, float) and math.isnan(v) for v in img["examples"][0][0][0])


@pytest.mark.parametrize("contiguous", [True, False])
def test_summary_in_chunks_matches_the_whole_tensor(contiguous: bool) -> None:
    from lightning_triage.functional.data import CHUNK_ELEMENTS

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3 * CHUNK_ELEMENTS // 512 + 5, 512, generator=g) * 4 + 2  # 3+ chunks
    x[7, 3], x[-1, -1], x[100, 0] = float("nan"), float("inf"), -50.0
    t = x if contiguous else x.t()
    s = summarize_tensor(t, "x")
    finite = x[torch.isfinite(x)].double()
    assert (s.nan, s.inf, s.rows) == (1, 1, None)
    assert s.min == -50.0 and s.max == float(finite.max())
    assert s.mean == pytest.approx(float(finite.mean()), rel=1e-9)
    assert s.std == pytest.approx(float(finite.std()), rel=1e-6)
    assert s.rms == pytest.approx(float(finite.square().mean().sqrt()), rel=1e-9)


def test_summary_of_a_huge_tensor_reads_evenly_spaced_rows() -> None:
    x = torch.arange(1000.0)[:, None].repeat(1, 10)  # row i holds the value i
    s = summarize_tensor(x, "x", max_elements=1000)
    assert s.rows == 100 and s.numel == 10_000
    assert (s.min, s.max) == (0.0, 999.0)  # first and last rows are read
    assert s.mean == pytest.approx(499.5, abs=1.0)
    assert summarize_tensor(x, "x", max_elements=None).rows is None
    assert summarize_tensor(torch.ones(1, 5000), "x", max_elements=100).rows is None  # one row


def test_constant_across_batch_reads_every_chunk() -> None:
    from lightning_triage.functional.data import CHUNK_ELEMENTS

    x = torch.ones(2 * CHUNK_ELEMENTS // 64 + 3, 64)
    assert constant_across_batch(x)
    x[-1, -1] = 2.0  # only the last example differs
    assert not constant_across_batch(x)
