"""Parameter-efficient fine-tuning with peft's LoRA on transformers' BERT and GPT-2 (small
configs, no downloads) under `Triage()`: a healthy fine-tune is silent (LoRA's `lora_A` gets an
exactly zero gradient at step 0 because `lora_B` starts at zero; the base is frozen; the
optimizer holds the adapters only) and its weights are bit-identical with and without the
callbacks; the broken set-ups are caught and lead: adapters in no optimizer, adapters that never
move, a frozen base that changes.

A fine-tune starts from a pretrained base: each base is trained briefly here first (a plain
loop, cached per seed), then wrapped by `get_peft_model`."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from tests.helpers import seeds
from tests.realmodels.models import (
    VOCAB,
    HFModule,
    Tokens,
    bert_classifier,
    gpt2_lm,
    problems,
    quiet_trainer,
    token_loaders,
    triage,
)

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

#: seed 0 in every run, 1-4 in the slow lane
SEEDS = seeds(5)
PRETRAIN_STEPS = {"bert": 64, "gpt2": 120}


class Chain(Tokens):
    """Token chains: each token is a function of the one before (every target predictable).

    The pretraining's rule is ``7t mod 99 + 1``; a fine-tune (``adapt``) keeps it for odd tokens
    and follows ``3t mod 99 + 1`` after even ones: a related task with something new to learn,
    as a fine-tune has (a base that already fits its fine-tuning data has nothing to learn, and
    its flat curve is rightly read as a slow one)."""

    def __init__(self, n: int, seed: int, parity: int, adapt: bool = False) -> None:
        super().__init__("lm", n, seed)
        for i in range(n):
            t = 2 * (int(self.ids[i, 0]) // 2) + parity  # first tokens of one parity
            t = t if 0 < t < VOCAB else 1 + parity
            self.ids[i, 0] = t
            for j in range(1, int(self.mask[i].sum())):
                t = (t * (3 if adapt and t % 2 == 0 else 7)) % (VOCAB - 1) + 1
                self.ids[i, j] = t
        self.labels = self.ids.masked_fill(self.mask == 0, -100)


def loaders(kind: str, seed: int) -> tuple[DataLoader, DataLoader]:
    if kind == "bert":
        return token_loaders("classify", seed)
    # the pretraining (seed >= 1000) starts its chains at odd tokens under the base rule; the
    # fine-tune's training starts at even ones and its validation at odd ones, under the
    # adapted rule (no validation example is a training example)
    pretraining = seed >= 1000
    train = DataLoader(Chain(256, seed, 1 if pretraining else 0, adapt=not pretraining),
                       batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(seed))
    return train, DataLoader(Chain(64, seed + 100, 1, adapt=not pretraining), batch_size=32)


@cache
def _pretrained(kind: str, seed: int) -> dict[str, Tensor]:
    """The base after a short full training on other data of the task (the "pretraining")."""
    torch.manual_seed(seed)
    module = bert_classifier() if kind == "bert" else gpt2_lm()
    model = module.model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    steps = 0
    while steps < PRETRAIN_STEPS[kind]:
        for batch in loaders(kind, seed + 1000)[0]:
            loss = model(**batch).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            if steps == PRETRAIN_STEPS[kind]:
                break
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def lora_module(kind: str, seed: int, module_cls: type[HFModule] = HFModule,
                **kwargs: Any) -> HFModule:
    """A pretrained base with LoRA adapters (r=8 on every linear layer of the blocks); BERT's
    classifier head starts fresh (peft trains it as a module to save)."""
    from peft import LoraConfig, get_peft_model

    base = bert_classifier() if kind == "bert" else gpt2_lm()
    base.model.load_state_dict(_pretrained(kind, seed))
    torch.manual_seed(seed)
    if kind == "bert":
        head = base.model.classifier  # a fresh head, initialized as transformers does
        torch.nn.init.normal_(head.weight, std=base.model.config.initializer_range)
        torch.nn.init.zeros_(head.bias)
        config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="SEQ_CLS",
                            target_modules=["query", "key", "value", "dense"])
    else:
        config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                            target_modules=["c_attn", "c_proj", "c_fc"])
    module = module_cls(base.model, lr=1e-3 if kind == "bert" else 1e-2, **kwargs)
    module.model = get_peft_model(base.model, config)
    return module


def fit(tmp_path: Path, module: pl.LightningModule, kind: str, seed: int,
        with_triage: bool = True, **kwargs: Any) -> dict[str, Any] | None:
    check = triage(tmp_path) if with_triage else None
    pl.seed_everything(seed, verbose=False)
    quiet_trainer(tmp_path, [check] if check else [], **kwargs).fit(module, *loaders(kind, seed))
    if check is None:
        return None
    report = check.report.report
    assert report is not None
    return report


def check_of(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["check"] == name)


# ---------------------------------------------------------------------------------------------
# healthy
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_healthy_lora_fine_tune_is_silent(tmp_path: Path, kind: str, seed: int) -> None:
    report = fit(tmp_path, lora_module(kind, seed), kind, seed)
    assert report is not None
    assert problems(report) == []
    assert report["start_here"] is None
    wiring = check_of(report, "GradientWiringCheck")
    assert wiring["status"] == "passed", wiring
    # lora_A's zero gradient at step 0 was seen, deferred and confirmed non-zero later
    assert "zero-valued partner" in wiring["detail"] and "turned non-zero" in wiring["detail"]
    assert check_of(report, "UpdateContractCheck")["status"] == "passed"
    frozen = [f for f in report["findings"] if f["code"] == "wiring.frozen_params"]
    assert [f["severity"] for f in frozen] == ["info"]


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_lora_weights_are_bit_identical_with_and_without_triage(tmp_path: Path,
                                                                 kind: str) -> None:
    finals = []
    for with_triage in (False, True):
        module = lora_module(kind, 0)
        fit(tmp_path / str(with_triage), module, kind, 0, with_triage=with_triage,
            max_epochs=1)
        finals.append({k: v.detach().clone() for k, v in module.state_dict().items()})
    assert finals[0].keys() == finals[1].keys()
    for name in finals[0]:
        assert torch.equal(finals[0][name], finals[1][name]), name


# ---------------------------------------------------------------------------------------------
# broken
# ---------------------------------------------------------------------------------------------
class BaseOptimizer(HFModule):
    """The optimizer is built over the parameters listed before `get_peft_model` wrapped the
    model (the base's, now frozen): the adapters are in no optimizer."""

    def __init__(self, model: Any, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.listed = list(model.parameters())

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.listed, lr=self.lr)


class HeadOnlyOptimizer(HFModule):
    """The optimizer holds a filtered list that misses the adapters (only the task head)."""

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW([p for n, p in self.named_parameters()
                                  if "classifier" in n and p.requires_grad], lr=self.lr)


class ZeroAdapterLR(HFModule):
    """Two param groups: the head at the learning rate, the adapters at 0 (never move)."""

    def configure_optimizers(self) -> Any:
        named = [(n, p) for n, p in self.named_parameters() if p.requires_grad]
        return torch.optim.AdamW([
            {"params": [p for n, p in named if "lora_" not in n]},
            {"params": [p for n, p in named if "lora_" in n], "lr": 0.0}], lr=self.lr)


class DecayEverything(HFModule):
    """A hand-written decoupled weight decay over every parameter after each step: the frozen
    base shrinks too."""

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        with torch.no_grad():
            for p in self.parameters():
                p.mul_(1 - 1e-2)


def frozen_lora_b(kind: str, seed: int) -> HFModule:
    """`lora_B` frozen by a careless freeze of every `*_B` weight: it stays zero and `lora_A`
    never gets a gradient."""
    module = lora_module(kind, seed)
    for name, p in module.named_parameters():
        if "lora_B" in name:
            p.requires_grad_(False)
    return module


BROKEN: dict[str, tuple[Callable[[str, int], HFModule], str]] = {
    "optimizer over the base": (lambda k, s: lora_module(k, s, BaseOptimizer),
                                "wiring.params_not_in_optimizer"),
    "optimizer over the head only": (lambda k, s: lora_module(k, s, HeadOnlyOptimizer),
                                     "wiring.params_not_in_optimizer"),
    "adapters at lr 0": (lambda k, s: lora_module(k, s, ZeroAdapterLR),
                         "wiring.zero_grad_params"),
    "lora_B frozen": (frozen_lora_b, "wiring.zero_grad_params"),
    "frozen base decayed": (lambda k, s: lora_module(k, s, DecayEverything),
                            "wiring.frozen_params_changed"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_peft_set_up_is_caught_and_leads(tmp_path: Path, case: str) -> None:
    build, code = BROKEN[case]
    report = fit(tmp_path, build("bert", 0), "bert", 0)
    assert report is not None
    assert report["start_here"] == code, problems(report)
    lead = next(f for f in report["findings"] if f["code"] == code)
    assert lead["severity"] in ("warning", "error")
    assert "lora" in str(lead["evidence"].get("params", [])) or code == \
        "wiring.frozen_params_changed"
