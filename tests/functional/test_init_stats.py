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


def _hf_draw(m: nn.Module, std: float = 0.02) -> nn.Module:
    """``m`` initialized as transformers' ``_init_weights`` does: N(0, std²) weights, zero biases
    and padding row."""
    with torch.no_grad():
        nn.init.normal_(m.weight, std=std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            m.bias.zero_()
        if isinstance(m, nn.Embedding) and m.padding_idx is not None:
            m.weight[m.padding_idx].zero_()
    return m


def test_the_declared_normal_init_is_recognized_over_seeds() -> None:
    """transformers' init (``config.initializer_range``): every draw over 60 seeds, and only
    with the std declared."""
    misses = []
    for seed in range(60):
        torch.manual_seed(seed)
        for m in (nn.Linear(64, 64), nn.Linear(64, 256, bias=False), nn.Embedding(128, 64),
                  nn.Embedding(100, 64, padding_idx=0)):
            _hf_draw(m)
            if module_at_init(m, 0.02) is not True:
                misses.append((seed, repr(m)))
            if isinstance(m, nn.Linear):
                assert module_at_init(m) is False  # PyTorch's own draw is uniform
    assert misses == []
    assert module_at_init(_hf_draw(nn.Linear(32, 32)), 0.02) is None  # 1024 values: too few


def test_trained_or_loaded_values_are_not_the_declared_draw() -> None:
    torch.manual_seed(0)
    scaled = _hf_draw(nn.Linear(64, 64), std=0.025)  # the scale moved by a quarter
    biased = _hf_draw(nn.Linear(64, 64))
    with torch.no_grad():
        biased.bias.fill_(0.01)  # a trained bias
    tailed = nn.Linear(64, 64)  # same std, heavier tails (trained weights' kurtosis)
    with torch.no_grad():
        tailed.weight.copy_(torch.distributions.Laplace(0.0, 0.02 / 2**0.5).sample((64, 64)))
        tailed.bias.zero_()
    assert [module_at_init(m, 0.02) for m in (scaled, biased, tailed)] == [False] * 3


def test_a_random_transformers_base_frozen_under_lora_is_found() -> None:
    """peft's LoRA on a base built from its config (never loaded): the frozen base is at its
    draw; the same base after a short training is not (no false alarm on a trained base)."""
    import pytest

    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=256,
                                     max_position_embeddings=64)
    base = transformers.BertModel(config)
    trained = transformers.BertModel(config)
    heads = nn.ModuleList([nn.Linear(64, 128), nn.Linear(64, 2)])  # token and sequence tasks
    opt = torch.optim.Adam([*trained.parameters(), *heads.parameters()], lr=1e-3)
    ids = torch.randint(1, 128, (16, 16))
    for _ in range(30):  # a short pretraining: every weight moves by ~0.03
        opt.zero_grad()
        out = trained(input_ids=ids)
        (nn.functional.cross_entropy(heads[0](out.last_hidden_state).flatten(0, 1), ids.flatten())
         + nn.functional.cross_entropy(heads[1](out.pooler_output), ids[:, 0] % 2)).backward()
        opt.step()
    lora = peft.LoraConfig(r=4, target_modules=["query", "value"])
    for model, expect in ((base, True), (trained, False)):
        wrapped = peft.get_peft_model(model, lora)
        trainable = {id(p) for p in wrapped.parameters() if p.requires_grad}
        found = frozen_layers_at_init(wrapped, trainable)
        names = [name for name, _, _ in found]
        if expect:
            assert any(n.endswith("intermediate.dense") for n in names), names
            assert any(n.endswith("word_embeddings") for n in names), names
        else:
            assert found == [], names
