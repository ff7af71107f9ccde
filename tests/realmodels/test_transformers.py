"""transformers' BERT and GPT-2, built from small configs (no downloads), under `Triage()` at its
defaults: healthy runs raise no warning and no error; a BERT classifier padded to its maximum
length that drops its attention mask, and a bidirectional BERT trained as a language model with
`labels = input_ids`, are caught and lead the report. Seed 0 here, the other seeds in the slow
lane."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest

from lightning_triage import PaddingProbe, StructureProbe
from tests.helpers import seeds
from tests.realmodels.models import (
    LENGTH,
    bert_classifier,
    bidirectional_lm,
    gpt2_lm,
    problems,
    quiet_trainer,
    token_loaders,
    triage,
)

pytest.importorskip("transformers")

#: seed 0 in every run, 1-4 in the slow lane
BERT_SEEDS = seeds(5)
GPT2_SEEDS = seeds(5)


def fit_report(tmp_path: Path, build: Callable[[], pl.LightningModule], task: str,
               seed: int) -> dict[str, Any]:
    pl.seed_everything(seed, verbose=False)
    model = build()  # seeded: the same initial weights whatever ran before
    check = triage(tmp_path)
    quiet_trainer(tmp_path, [check]).fit(model, *token_loaders(task, seed))
    report = check.report.report
    assert report is not None
    return report


def check_of(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["check"] == name)


@pytest.mark.parametrize("seed", BERT_SEEDS)
def test_bert_classifier_padded_to_its_maximum_length_is_healthy(tmp_path: Path,
                                                                 seed: int) -> None:
    report = fit_report(tmp_path, bert_classifier, "classify", seed)
    assert problems(report) == []
    assert report["start_here"] is None
    # the padding probe ran at the maximum length: fewer padded positions instead of more
    padding = check_of(report, "PaddingProbe")
    assert padding["status"] == "passed", padding
    assert "fewer padded positions" in padding["detail"] and "no leak" in padding["detail"]


@pytest.mark.parametrize("seed", seeds(3))
def test_bert_without_its_attention_mask_is_caught_at_maximum_length(tmp_path: Path,
                                                                    seed: int) -> None:
    report = fit_report(tmp_path, lambda: bert_classifier(use_mask=False), "classify", seed)
    assert report["start_here"] == "structure.padding_leak", problems(report)
    leak = next(f for f in report["findings"] if f["code"] == "structure.padding_leak")
    kinds = {p["perturbation"] for p in leak["evidence"]["perturbations"]}
    assert kinds == {"content", "fewer"}  # more padding cannot run at the maximum length
    assert leak["layer"].startswith("model.bert.encoder.layer.0.attention")


def test_no_longer_pass_beyond_the_declared_maximum_length(tmp_path: Path) -> None:
    # BERT declares `max_position_embeddings` = the batch's length: the longer pass is not even
    # tried (on a GPU an index past the position table is a device-side assert that ends the
    # process's use of the device, not an exception); the shorter pass and the content pass run
    probe = PaddingProbe(strict=True)
    pl.seed_everything(0, verbose=False)
    quiet_trainer(tmp_path, [probe], max_steps=1).fit(bert_classifier(use_mask=False),
                                                      token_loaders("classify")[0])
    assert probe.results["failed_passes"] == {
        "amount": f"not run: the model takes at most {LENGTH} positions"}
    assert "the amount pass was not run (the model takes at most" in probe.detail
    assert probe.results["shape"] == [8, LENGTH]
    assert [f.code for f in probe.findings] == ["structure.padding_leak"]
    assert probe.check_status()["status"] == "failed"


@pytest.mark.parametrize("seed", GPT2_SEEDS)
def test_gpt2_trained_with_labels_equal_to_inputs_is_healthy(tmp_path: Path, seed: int) -> None:
    report = fit_report(tmp_path, gpt2_lm, "lm", seed)
    assert problems(report) == []
    assert report["start_here"] is None
    structure = check_of(report, "StructureProbe")
    assert "causal ok (next-token data: the targets are the inputs" in structure["detail"]


@pytest.mark.parametrize("seed", seeds(3))
def test_bidirectional_bert_trained_as_a_language_model_is_caught(tmp_path: Path,
                                                                   seed: int) -> None:
    report = fit_report(tmp_path, bidirectional_lm, "lm", seed)
    assert report["start_here"] == "structure.causal_leak", problems(report)
    leak = next(f for f in report["findings"] if f["code"] == "structure.causal_leak")
    assert "`labels = input_ids`" in leak["evidence"]["reason"]
    assert leak["layer"].startswith("model.bert.encoder.layer.0.attention")


def test_causal_false_turns_the_labels_convention_off(tmp_path: Path) -> None:
    probe = StructureProbe(causal=False, strict=True)
    pl.seed_everything(0, verbose=False)
    quiet_trainer(tmp_path, [probe], max_steps=1).fit(bidirectional_lm(), token_loaders("lm")[0])
    assert "causal" not in probe.results
    assert probe.findings == []


def test_labels_equal_to_inputs_without_a_shift_in_the_loss_is_not_next_token(tmp_path: Path) -> None:
    # BertForMaskedLM compares each position with its own label (no shift): a reconstruction,
    # not next-token prediction, so a bidirectional model is right and the causal probe stays off
    from transformers import BertConfig, BertForMaskedLM

    from tests.realmodels.models import VOCAB, HFModule

    pl.seed_everything(0, verbose=False)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=LENGTH)
    probe = StructureProbe(strict=True)
    quiet_trainer(tmp_path, [probe], max_steps=1).fit(HFModule(BertForMaskedLM(config)),
                                                      token_loaders("lm")[0])
    assert "causal" not in probe.results
    # nor a missing shift: the loss scores each position against its own label by design
    assert probe.results.get("labels") == "loss offset 0"
    assert probe.findings == []
