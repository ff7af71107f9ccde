from __future__ import annotations

import pytest
import torch

from lightning_triage.functional.worst import WorstBuffer, example_losses, thumbnail


def test_buffer_keeps_the_global_top_k_over_batches() -> None:
    g = torch.Generator().manual_seed(0)
    buf = WorstBuffer(k=7)
    all_losses = []
    for b in range(6):
        logits = torch.randn(10, 4, generator=g) * 3
        y = torch.randint(0, 4, (10,), generator=g)
        scored = example_losses(logits, y)
        assert scored is not None
        all_losses.append(scored.loss)
        buf.add(scored, batch_idx=b, dataset_index=torch.arange(10) + 10 * b,
                thumbnails=torch.full((10, 1, 2, 2), b, dtype=torch.uint8))
        assert len(buf) <= 7
    rows = buf.rows()
    expected = torch.cat(all_losses).topk(7)
    assert [r["dataset_index"] for r in rows] == expected.indices.tolist()
    assert [r["loss"] for r in rows] == pytest.approx(expected.values.tolist())
    assert all(r["batch_idx"] == r["dataset_index"] // 10 for r in rows)
    assert all(r["position"] == r["dataset_index"] % 10 for r in rows)
    assert all(r["thumbnail"] == [[[r["batch_idx"]] * 2] * 2] for r in rows)
    assert buf.seen == 60


def test_rows_of_multiclass_examples_carry_label_prediction_and_confidence() -> None:
    logits = torch.tensor([[5.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
    scored = example_losses(logits, torch.tensor([0, 1]))
    assert scored is not None
    buf = WorstBuffer(k=1)
    buf.add(scored, batch_idx=3)
    (row,) = buf.rows()
    assert (row["label"], row["prediction"], row["batch_idx"], row["position"]) == (1, 2, 3, 1)
    assert row["confidence"] == pytest.approx(torch.softmax(logits[1], 0)[2].item())
    assert row["label_probability"] == pytest.approx(torch.softmax(logits[1], 0)[1].item())
    assert row["dataset_index"] is None and row["thumbnail"] is None


def test_ignored_and_invalid_targets_never_rank() -> None:
    scored = example_losses(torch.zeros(4, 3), torch.tensor([0, -100, 7, 2]))
    assert scored is not None
    buf = WorstBuffer(k=4)
    buf.add(scored, batch_idx=0)
    assert sorted(r["position"] for r in buf.rows()) == [0, 3]


def test_binary_logits() -> None:
    scored = example_losses(torch.tensor([[4.0], [-4.0], [0.0]]), torch.tensor([[0.0], [0.0], [1.0]]))
    assert scored is not None
    assert scored.prediction.tolist() == [1, 0, 0]
    assert int(scored.loss.argmax()) == 0
    assert example_losses(torch.randn(3, 1), torch.tensor([0.5, 1.0, 0.0])).loss[0] == float("-inf")


def test_not_classification_shapes_are_refused() -> None:
    assert example_losses(torch.randn(4, 3), torch.randn(4, 3)) is None  # regression
    assert example_losses(torch.randn(4, 5, 3), torch.randint(0, 3, (4, 5))) is None  # tokens
    assert example_losses(torch.randn(4, 3), torch.randint(0, 3, (5,))) is None


def test_thumbnails_are_bounded_and_scaled_per_image() -> None:
    images = torch.rand(3, 3, 100, 50) * 7 - 2
    t = thumbnail(images, max_side=16)
    assert t is not None and t.shape == (3, 3, 16, 8) and t.dtype == torch.uint8
    assert int(t.min()) == 0 and int(t.max()) == 255
    assert thumbnail(torch.rand(2, 28, 28)).shape == (2, 1, 28, 28)
    assert thumbnail(torch.rand(2, 2, 8, 8)) is None  # 2 channels: not an image
    assert thumbnail(torch.rand(2, 3, 64), image_shape=(3, 8, 8)).shape == (2, 3, 8, 8)
    assert thumbnail(torch.rand(2, 65), image_shape=(8, 8)) is None
    with pytest.raises(ValueError, match="`k`"):
        WorstBuffer(k=0)


def test_per_batch_work_never_reads_a_tensor_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """`example_losses`, `thumbnail` and `WorstBuffer.add` stay on the device: any value read
    (`item`, `tolist`, `bool`, `float`, `int`, a move to the CPU) would be a host sync per batch."""
    buf = WorstBuffer(k=4)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 5, generator=g), torch.randint(0, 5, (8,), generator=g),
                torch.rand(8, 1, 40, 40, generator=g)) for _ in range(3)]

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("host read in the per-batch path")

    with monkeypatch.context() as m:
        for name in ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy"):
            m.setattr(torch.Tensor, name, forbidden)
        with pytest.raises(AssertionError, match="host read"):
            bool(torch.ones(1) > 0)  # the guard works
        for b, (logits, y, images) in enumerate(batches):
            scored = example_losses(logits, y)
            assert scored is not None
            buf.add(scored, batch_idx=b, dataset_index=torch.arange(8) + 8 * b,
                    thumbnails=lambda rows, images=images: thumbnail(images[rows]))
    rows = buf.rows()  # the one host transfer
    assert len(rows) == 4 and len(rows[0]["thumbnail"][0]) == 32
