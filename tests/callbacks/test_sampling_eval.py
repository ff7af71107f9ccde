"""Validation that samples on purpose (diffusion, rectified flow, a masked autoencoder, a VAE's
latent) is said at info, never `mode.nondeterministic_eval` as a warning; dropout left on in
eval stays caught, including when the objective samples too."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage import EvalContractCheck, EvalModeCheck
from lightning_triage.demo.digits import load_digits_tensors
from tests.callbacks.sampling_models import BUGS, OBJECTIVES, SamplingNet, expected_draws
from tests.helpers import make_trainer


def _fit(tmp_path: Path, objective: str, bug: str | None) -> list:
    pl.seed_everything(0, verbose=False)
    x, _, xv, _ = load_digits_tensors(seed=0)
    checks = [EvalContractCheck(strict=True, min_steps=4), EvalModeCheck(strict=True)]
    make_trainer(tmp_path, checks, limit_train_batches=4, limit_val_batches=1,
                 num_sanity_val_steps=1).fit(
        SamplingNet(objective, bug), DataLoader(TensorDataset(x[:128]), batch_size=32),
        DataLoader(TensorDataset(xv[:64]), batch_size=32))
    return [f for c in checks for f in c.findings]


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_sampling_validation_is_info(tmp_path: Path, objective: str) -> None:
    findings = _fit(tmp_path, objective, None)
    assert not [f for f in findings if f.severity != "info"], findings
    (said,) = [f for f in findings if f.code == "mode.nondeterministic_eval"]
    assert said.evidence["by_design"] is True
    assert set(said.evidence["draws"]) == expected_draws(objective)
    assert "evaluation is random by design" in said.message
    assert all(f"`{d}`" in said.message for d in expected_draws(objective))


@pytest.mark.parametrize("objective", ["diffusion", "vae"])
@pytest.mark.parametrize("bug", BUGS)
def test_dropout_left_on_is_caught_when_the_objective_samples(tmp_path: Path, objective: str,
                                                             bug: str) -> None:
    findings = _fit(tmp_path, objective, bug)
    bad = [f for f in findings if f.severity in ("warning", "error")]
    expected = "mode.train_mode_in_eval" if bug == "train_layer" else "mode.nondeterministic_eval"
    assert [f.code for f in bad] == [expected], findings
    if bug == "train_layer":
        return
    (f,) = bad
    assert f.evidence["dropouts"] == ["dropout" if bug == "dropout" else
                                      "scaled_dot_product_attention"]
    assert set(f.evidence["draws"]) == expected_draws(objective)
    assert "besides the objective's own draws" in f.message
    # located where dropout drew (the gated pass from the same random state), not at the noise
    assert f.evidence["module"] == ("net.out" if bug == "dropout" else "net.drop")
    assert f.evidence["previous"] == "net.qkv"


def test_dropout_alone_still_names_no_draws(tmp_path: Path) -> None:
    torch.manual_seed(0)
    from tests.callbacks.eval_models import DigitsNet, digits_loaders
    check = EvalContractCheck(strict=True)
    train, val = digits_loaders(0)
    make_trainer(tmp_path, [check], limit_train_batches=2, limit_val_batches=1,
                 num_sanity_val_steps=1).fit(DigitsNet("dropout"), train, val)
    (f,) = [f for f in check.findings if f.code == "mode.nondeterministic_eval"]
    assert f.severity == "warning" and f.evidence["dropouts"] == ["dropout"]
    assert f.evidence["draws"] == [] and "besides" not in f.message


def test_the_run_is_bit_identical_with_and_without_the_probes(tmp_path: Path) -> None:
    states = []
    x, _, xv, _ = load_digits_tensors(seed=0)
    for with_checks in (True, False):
        pl.seed_everything(0, verbose=False)
        model = SamplingNet("diffusion", "dropout")
        checks = [EvalContractCheck(strict=True), EvalModeCheck(strict=True)] if with_checks \
            else []
        make_trainer(tmp_path / str(with_checks), checks, limit_train_batches=3,
                     limit_val_batches=1, num_sanity_val_steps=1).fit(
            model, DataLoader(TensorDataset(x[:96]), batch_size=32),
            DataLoader(TensorDataset(xv[:32]), batch_size=32))
        states.append(model.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
