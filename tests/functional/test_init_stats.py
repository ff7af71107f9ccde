"""The default-initialization tests of `functional.init_stats` (issue 42): every layer kind at its
`reset_parameters` draw is recognized over many seeds and shapes, trained or loaded values are
not, and kinds or sizes it cannot judge say so (`None`)."""

from __future__ import annotations

import torch
from torch import nn

from lightning_triage.functional.init_stats import (
    frozen_layers_at_init,
    module_at_init,
    normal_at_init,
    uniform_at_init,
)


def layers() -> list[nn.Module]:
    return [nn.Linear(64, 32), nn.Linear(8, 16), nn.Linear(512, 10), nn.Conv2d(1, 8, 3),
            nn.Conv2d(16, 32, 3), nn.Conv1d(4, 8, 5), nn.ConvTranspose2d(8, 4, 3),
            nn.Embedding(300, 16), nn.Embedding(65, 64, padding_idx=0), nn.LSTM(8, 16),
            nn.GRU(4, 8, batch_first=True), nn.Bilinear(8, 8, 4)]


def test_every_layer_at_its_draw_is_recognized_over_seeds() -> None:
    misses = []
    for seed in range(60):
        torch.manual_seed(seed)
        misses += [(seed, repr(m)) for m in layers() if module_at_init(m) is not True]
    assert misses == []


def test_half_precision_copies_are_recognized() -> None:
    torch.manual_seed(0)
    assert module_at_init(nn.Linear(64, 32).half()) is True
    assert module_at_init(nn.Linear(256, 64).bfloat16()) is True


def test_moved_or_rescaled_weights_are_not_the_draw() -> None:
    torch.manual_seed(0)
    for change in (lambda w: w.mul_(1.5), lambda w: w.mul_(0.5), lambda w: w.add_(0.02),
                   lambda w: w.copy_(torch.randn_like(w) * w.abs().max() / 3)):
        layer = nn.Linear(64, 32)
        with torch.no_grad():
            change(layer.weight)
        assert module_at_init(layer) is False
    embedding = nn.Embedding(300, 16)
    with torch.no_grad():
        embedding.weight.mul_(0.8)
    assert module_at_init(embedding) is False


def test_what_cannot_be_judged_is_none() -> None:
    assert module_at_init(nn.Linear(4, 4)) is None  # 16 values
    assert module_at_init(nn.LayerNorm(8)) is None
    assert module_at_init(nn.LazyLinear(4)) is None
    assert uniform_at_init(torch.zeros(10), 0.1) is None
    assert normal_at_init(torch.zeros(10)) is None
    assert module_at_init(nn.Embedding(2, 32)) is None  # a small table: too loose to judge


def test_frozen_layers_with_a_trainable_copy_are_left_out() -> None:
    torch.manual_seed(0)
    live = nn.Linear(64, 32)
    model = nn.ModuleDict({"live": live, "ema": nn.Linear(64, 32), "random": nn.Linear(64, 32)})
    model["ema"].load_state_dict(live.state_dict())
    trainable = {id(p) for p in live.parameters()}
    assert frozen_layers_at_init(model, trainable) == [("random", "Linear", 64 * 32 + 32)]
