"""Language-model labels misaligned with the inputs (structure.label_misaligned, issue 35):
labels shifted by the user and again by a transformers causal LM (every position predicts two
tokens ahead), and labels not shifted for a causal model that does not shift (each position
sees its target); the fixed twins, and a bidirectional reconstruction, stay silent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage import StructureProbe, Triage
from lightning_triage.callbacks.base import collect_checks
from lightning_triage.demo.sequences import TinyLM, random_token_loaders
from lightning_triage.ranking import explain_findings, start_here
from tests.helpers import make_trainer, seeds

pytest.importorskip("transformers")

from tests.realmodels.models import (
    gpt2_lm,
    quiet_trainer,
    token_loaders,
)


def _shifted_once(loader: DataLoader) -> DataLoader:
    """The user's collate shifted `labels` by one (`labels[:, t] = input_ids[:, t + 1]`)."""
    ds = loader.dataset
    ds.labels = torch.cat([ds.labels[:, 1:], torch.full_like(ds.labels[:, :1], -100)], 1)
    return loader


def _unshifted(loader: DataLoader) -> DataLoader:
    """Targets equal to the inputs for a model whose loss compares each position with its own
    target (no shift anywhere)."""
    x = loader.dataset.tensors[0]
    return DataLoader(TensorDataset(x, x.clone()), batch_size=loader.batch_size)


def _build(kind: str, seed: int) -> tuple[pl.LightningModule, DataLoader, DataLoader]:
    if kind.startswith("gpt2"):
        train, val = token_loaders("lm", seed)
        if kind == "gpt2_shifted_twice":
            train, val = _shifted_once(train), _shifted_once(val)
        return gpt2_lm(), train, val
    train, val = random_token_loaders(seed=seed)
    if kind == "tiny_unshifted":
        train, val = _unshifted(train), _unshifted(val)
    return TinyLM(), train, val


def _probe(tmp_path: Path, kind: str, seed: int) -> StructureProbe:
    pl.seed_everything(seed, verbose=False)
    model, train, _ = _build(kind, seed)
    probe = StructureProbe(strict=True)
    quiet_trainer(tmp_path, [probe], max_steps=1).fit(model, train)
    return probe


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize(("kind", "offset", "model"), [
    ("gpt2_shifted_twice", 2, "GPT2LMHeadModel"), ("tiny_unshifted", 0, "TinyLM")])
def test_misaligned_labels_are_caught(tmp_path: Path, kind: str, offset: int, model: str,
                                      seed: int) -> None:
    probe = _probe(tmp_path, kind, seed)
    found = [f for f in probe.findings if f.code == "structure.label_misaligned"]
    assert len(found) == 1, probe.findings
    f = found[0]
    assert f.severity == "error" and f.global_step == 0
    assert f.evidence["loss_offset"] == offset and f.evidence["model"] == model
    assert f.evidence["labels_shifted_by_user"] is (offset == 2)
    assert f.evidence["causal_model"] is (offset == 0)


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("kind", ["gpt2", "tiny"])
def test_labels_shifted_once_are_silent(tmp_path: Path, kind: str, seed: int) -> None:
    probe = _probe(tmp_path, kind, seed)
    assert not [f for f in probe.findings if f.code == "structure.label_misaligned"]
    assert "labels" not in probe.results


@pytest.mark.parametrize("kind", ["gpt2_shifted_twice", "tiny_unshifted"])
def test_misaligned_labels_lead(tmp_path: Path, kind: str) -> None:
    pl.seed_everything(0, verbose=False)
    model, train, val = _build(kind, 0)
    triage = Triage(strict=True, verbose=False, html=False, report_dir=tmp_path / "report")
    kwargs: dict[str, Any] = dict(max_epochs=3, limit_train_batches=None, limit_val_batches=None)
    make_trainer(tmp_path, [triage], **kwargs).fit(model, train, val)
    findings = explain_findings([f for c in collect_checks([triage]) for f in c.findings])
    assert start_here(findings) == "structure.label_misaligned", \
        [(f.code, f.explained_by) for f in findings]
    for f in findings:
        if f.code.startswith("curve.") and f.is_problem:
            assert "structure.label_misaligned" in f.explained_by, f
