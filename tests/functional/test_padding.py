from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from lightning_triage.functional.padding import (
    Recording,
    compare_at_real,
    find_padding_mask,
    first_moved,
    more_padding_batch,
    pad_content_batch,
    padding_side,
    record_outputs,
)
from lightning_triage.functional.padding_probe import declared_max_length, probe_padding
from tests.callbacks.padding_models import PAD, padded_tokens


def test_finds_attention_masks_of_both_polarities() -> None:
    ids, real = padded_tokens(6, seed=1)
    found = find_padding_mask({"input_ids": ids, "attention_mask": real.long()}, ids)
    assert not isinstance(found, str)
    assert torch.equal(found.pad, ~real) and found.side == "right" and found.pad_value == PAD
    found = find_padding_mask({"input_ids": ids, "key_padding_mask": ~real}, ids)
    assert not isinstance(found, str)
    assert torch.equal(found.pad, ~real) and found.pad_is_true
    found = find_padding_mask({"input_ids": ids, "src_key_padding_mask": (~real).long()}, ids)
    assert not isinstance(found, str) and torch.equal(found.pad, ~real)


def test_unnamed_masks_are_found_by_their_padding_pattern() -> None:
    ids, real = padded_tokens(6, seed=2)
    for batch in ({"input_ids": ids, "keep": real}, (ids, real.long(), torch.arange(6)),
                  (ids, ~real, torch.arange(6))):
        found = find_padding_mask(batch, ids)
        assert not isinstance(found, str), batch
        assert torch.equal(found.pad, ~real) and found.side == "right"
    # token type ids (segments) are 0/1 tensors of the inputs' shape, but not padding
    segments = torch.zeros_like(ids)
    segments[:, 2:5] = 1
    assert "no padding mask" in find_padding_mask({"input_ids": ids, "segments": segments}, ids)


def test_a_named_mask_that_is_not_padding_is_refused() -> None:
    # a masked-LM mask: 1 at a few real positions replaced by a [MASK] id
    ids, real = padded_tokens(6, seed=10, min_len=8)
    chosen = torch.zeros_like(real)
    chosen[:, 1] = True
    chosen[:, 4] = True
    masked = torch.where(chosen, torch.full_like(ids, 11), ids)
    reason = find_padding_mask({"input_ids": masked, "mask": chosen.long()}, masked)
    assert isinstance(reason, str) and "`batch['mask']` does not mark one pad value" in reason


def test_explicit_key_and_its_errors() -> None:
    ids, real = padded_tokens(6, seed=2)
    noisy = torch.where(real, ids, torch.randint(1, 12, ids.shape))  # pads hold varied ids
    batch = {"input_ids": noisy, "keep": real}
    assert "no padding mask" in find_padding_mask(batch, noisy)
    found = find_padding_mask(batch, noisy, key="keep")
    assert not isinstance(found, str) and torch.equal(found.pad, ~real)
    assert "names no tensor" in find_padding_mask(batch, ids, key="missing")
    wrong = {"input_ids": ids, "keep": torch.rand(6, 3)}
    assert "not a bool or 0/1 mask" in find_padding_mask(wrong, ids, key="keep")


def test_masks_that_are_not_padding_are_refused() -> None:
    ids, real = padded_tokens(6, seed=3)
    # a 0/1 mask of another shape, or float values: not a padding mask
    assert isinstance(find_padding_mask({"input_ids": ids, "mask": real[:, :3]}, ids), str)
    assert isinstance(find_padding_mask({"input_ids": ids, "attention_mask": real.float()}, ids), str)
    # no padding in this batch
    full = torch.ones_like(ids)
    assert "no padding in this batch" in find_padding_mask({"input_ids": ids, "attention_mask": full}, ids)
    # masked-LM targets: ignore_index scattered inside the rows, not at a padded end
    y = ids.clone()
    y[:, ::2] = -100
    assert "not at a padded end" in find_padding_mask((ids, y), ids, y)
    # class targets: no padding from targets
    assert isinstance(find_padding_mask((ids, torch.zeros(6, dtype=torch.long)), ids,
                                        torch.zeros(6, dtype=torch.long)), str)


def test_targets_with_ignore_index_give_the_padding_of_shifted_lm_batches() -> None:
    seq, _ = padded_tokens(5, side="right", length=9, min_len=4, seed=4)
    x, y = seq[:, :-1], seq[:, 1:].clone()
    y[y == PAD] = -100
    found = find_padding_mask((x, y), x, y)
    assert not isinstance(found, str)
    assert found.side == "right" and found.mask is None
    # the last real input predicts a pad: its target is ignored but it is not padding
    assert torch.equal(found.pad, (y == -100) & (x == PAD))
    assert torch.equal(found.real, y != -100)


def test_padding_side() -> None:
    assert padding_side(torch.tensor([[False, False], [False, False]])) is None
    _, real = padded_tokens(8, side="left", seed=5)
    assert padding_side(~real) == "left"


def test_perturbed_batches_keep_the_real_positions() -> None:
    ids, real = padded_tokens(6, seed=6)
    batch = {"input_ids": ids, "attention_mask": real.long(), "labels": torch.arange(6),
             "token_type_ids": torch.zeros_like(ids)}
    mask = find_padding_mask(batch, ids)
    assert not isinstance(mask, str)
    content = pad_content_batch(batch, ids, mask)
    assert torch.equal(content["input_ids"][real], ids[real])
    assert bool((content["input_ids"][~real] != PAD).all())
    assert content["attention_mask"] is batch["attention_mask"]
    more = more_padding_batch(batch, ids, mask, 3)
    assert more["input_ids"].shape == (6, ids.shape[1] + 3)
    assert torch.equal(more["input_ids"][:, : ids.shape[1]], ids)
    assert bool((more["input_ids"][:, ids.shape[1]:] == PAD).all())
    assert bool((more["attention_mask"][:, ids.shape[1]:] == 0).all())
    assert more["token_type_ids"].shape == more["input_ids"].shape
    assert torch.equal(more["labels"], batch["labels"])


def test_more_left_padding_and_targets() -> None:
    x, real = padded_tokens(4, side="left", seed=7)
    y = torch.where(real, x, torch.full_like(x, -100))
    mask = find_padding_mask((x, y), x, y)
    assert not isinstance(mask, str)
    gx, gy = more_padding_batch((x, y), x, mask, 2, targets=y)
    assert torch.equal(gx[:, 2:], x) and bool((gx[:, :2] == PAD).all())
    assert torch.equal(gy[:, 2:], y) and bool((gy[:, :2] == -100).all())


def test_compare_at_real_aligns_shifted_and_pooled_outputs() -> None:
    real = torch.tensor([[False, True, True]])
    a = torch.tensor([[[0.0], [1.0], [2.0]]])
    shifted = torch.tensor([[[5.0], [5.0], [0.0], [1.0], [2.0]]])
    change = compare_at_real(a, shifted, real, offset=2)
    assert change is not None and not change.moved and change.compared == "positions"
    change = compare_at_real(torch.ones(1, 4), torch.ones(1, 4) * 1.5, real)
    assert change is not None and change.moved and change.compared == "pooled"
    assert compare_at_real(torch.ones(1, 3, 4), torch.ones(1, 5, 2), real) is None


def test_first_moved_matches_calls_by_name_and_index() -> None:
    real = torch.tensor([[True, False]])
    same, moved = torch.zeros(1, 2, 1), torch.tensor([[[1.0], [0.0]]])
    a = Recording([("block", 0, same), ("block", 1, same)])
    b = Recording([("block", 0, same), ("block", 1, moved)])
    assert first_moved(a, b, real) == "block"
    assert first_moved(a, a, real) is None


class _Net(nn.Module):
    def __init__(self, masked: bool) -> None:
        super().__init__()
        self.masked = masked
        self.emb = nn.Embedding(16, 4)
        self.mix = nn.Conv1d(4, 4, 3, padding=1)
        self.out = nn.Linear(4, 2)

    def forward(self, ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        if self.masked:
            h = h * keep.unsqueeze(-1)
        h = self.mix(h.transpose(1, 2)).transpose(1, 2)
        return self.out(h)


def _run(net: nn.Module) -> object:
    def run(batch: dict[str, torch.Tensor]) -> Recording:
        with record_outputs(net, batch["input_ids"].shape[0]) as rec, torch.no_grad():
            net(batch["input_ids"], batch["attention_mask"].float())
        return rec

    return run


def test_probe_padding_names_the_first_module_and_stays_silent_when_masked() -> None:
    torch.manual_seed(0)
    ids, real = padded_tokens(6, seed=8)
    batch = {"input_ids": ids, "attention_mask": real.long()}
    mask = find_padding_mask(batch, ids)
    assert not isinstance(mask, str)
    leaky = _Net(masked=False)
    result = probe_padding(_run(leaky), batch, ids, mask)  # type: ignore[arg-type]
    assert result.status == "leak" and result.passes == 4
    # the convolution reaches into the padding at the last real tokens (content changed);
    # more padding of the same token changes nothing the convolution sees
    assert [(leak.perturbation, leak.first_module) for leak in result.leaks] == [("content", "mix")]
    masked = _Net(masked=True)
    masked.load_state_dict(leaky.state_dict())
    assert probe_padding(_run(masked), batch, ids, mask).status == "ok"  # type: ignore[arg-type]


def test_probe_padding_detects_nondeterminism() -> None:
    ids, real = padded_tokens(4, seed=9)
    batch = {"input_ids": ids, "attention_mask": real.long()}
    mask = find_padding_mask(batch, ids)
    assert not isinstance(mask, str)
    net = nn.Sequential(nn.Embedding(16, 4), nn.Dropout(0.5))  # training mode, RNG not reset

    def run(b: dict[str, torch.Tensor]) -> Recording:
        with record_outputs(net, 4) as rec, torch.no_grad():
            net(b["input_ids"])
        return rec

    result = probe_padding(run, batch, ids, mask)
    assert result.status == "nondeterministic" and result.passes == 2


def test_a_model_at_its_maximum_length_is_compared_with_fewer_padded_positions() -> None:
    ids, real = padded_tokens(6, seed=8)
    ids[0], real[0] = torch.arange(1, ids.shape[1] + 1) % 15 + 1, True  # one row not padded
    batch = {"input_ids": ids, "attention_mask": real.long()}
    mask = find_padding_mask(batch, ids)
    assert not isinstance(mask, str)
    for masked, status in ((False, "leak"), (True, "ok")):
        torch.manual_seed(0)
        net = _Net(masked=masked)
        inner = _run(net)

        def run(b: dict[str, torch.Tensor], inner: Any = inner) -> Recording:
            if b["input_ids"].shape[1] > ids.shape[1]:
                raise IndexError("index out of range in self")  # position embeddings end here
            return inner(b)  # type: ignore[no-any-return]

        result = probe_padding(run, batch, ids, mask, pass_errors=(IndexError,))
        assert result.status == status
        assert set(result.failed) == {"amount"} and (result.fewer or 0) >= 1
        assert result.passes == 5
        if not masked:  # the content pass found it; the shorter pass ran on the padded rows
            assert {leak.perturbation for leak in result.leaks} >= {"content"}


def test_a_failing_pass_fails_alone_only_for_the_errors_named() -> None:
    ids, real = padded_tokens(4, seed=9)
    batch = {"input_ids": ids, "attention_mask": real.long()}
    mask = find_padding_mask(batch, ids)
    assert not isinstance(mask, str)
    inner = _run(_Net(masked=True))
    calls: list[int] = []

    def run(b: dict[str, torch.Tensor]) -> Recording:
        calls.append(1)
        if len(calls) > 2:
            raise KeyError("boom")
        return inner(b)  # type: ignore[no-any-return]

    with pytest.raises(KeyError):
        probe_padding(run, batch, ids, mask)


@pytest.mark.parametrize(("room", "longer"), [(0, False), (1, False), (2, True), (None, True)])
def test_the_longer_pass_stays_within_the_room_the_model_declares(room: int | None,
                                                                   longer: bool) -> None:
    """A model that takes at most ``T + room`` positions never gets a longer batch: with room
    for fewer than 2 more positions the shorter pass replaces the longer one, untried."""
    ids, real = padded_tokens(6, seed=8)
    batch = {"input_ids": ids, "attention_mask": real.long()}
    mask = find_padding_mask(batch, ids)
    assert not isinstance(mask, str)
    lengths: list[int] = []
    inner = _run(_Net(masked=True))

    def run(b: dict[str, torch.Tensor]) -> Recording:
        lengths.append(b["input_ids"].shape[1])
        return inner(b)  # type: ignore[no-any-return]

    result = probe_padding(run, batch, ids, mask, room=room, room_why="the model's limit")
    assert result.status == "ok"
    assert max(lengths) <= ids.shape[1] + (room if room is not None else ids.shape[1])
    assert (max(lengths) > ids.shape[1]) is longer
    assert (result.fewer is not None) is not longer
    if not longer:
        assert result.failed == {"amount": "not run: the model's limit"}


def test_a_declared_maximum_length_is_found_on_modules_and_configs() -> None:
    class Config:
        n_positions = 64

    net = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 2))
    assert declared_max_length(net) is None
    net[1].block_size = 128  # type: ignore[assignment]  # nanoGPT-style attribute
    net[0].config = Config()  # type: ignore[assignment]  # Hugging Face-style config
    assert declared_max_length(net) == 64
