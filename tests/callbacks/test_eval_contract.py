"""EvalContractCheck: evaluation that is random (mode.nondeterministic_eval) and evaluation that
is not the model that trains (mode.eval_loss_gap), on real fits and their fixed twins."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lightning_triage import EvalContractCheck, Triage, TriageConfigError
from lightning_triage.callbacks.base import collect_checks
from lightning_triage.ranking import explain_findings, start_here
from tests.callbacks.eval_models import DigitsNet, digits_loaders
from tests.helpers import make_trainer, seeds

#: Validation at the sanity check (step 0) and at the end of each of two 30-step epochs: the
#: run at step 60 is the first the gap rule judges (``min_steps`` 50).
FIT = dict(max_epochs=2, limit_train_batches=30, limit_val_batches=1, num_sanity_val_steps=1)


def _fit(tmp_path: Path, kind: str, seed: int, check: Any = None, label_noise: float = 0.0,
         **kwargs: Any) -> tuple[Any, DigitsNet]:
    pl.seed_everything(seed, verbose=False)
    check = check if check is not None else EvalContractCheck(strict=True)
    model = DigitsNet(kind)
    train, val = digits_loaders(seed, label_noise=label_noise)
    make_trainer(tmp_path, [check], **{**FIT, **kwargs}).fit(model, train, val)
    return check, model


def _codes(check: Any) -> set[str]:
    return {f.code for f in check.findings}


# ---------------------------------------------------------------------- nondeterministic eval
@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize(("kind", "layer", "inside"), [("dropout", None, False),
                                                       ("sdpa", "attn", False)])
def test_random_eval_is_caught_and_localized(tmp_path: Path, kind: str, layer: str | None,
                                             inside: bool, seed: int) -> None:
    check, _ = _fit(tmp_path, kind, seed, max_epochs=1, limit_train_batches=2)
    found = [f for f in check.findings if f.code == "mode.nondeterministic_eval"]
    assert len(found) == 1, check.findings
    f = found[0]
    assert f.layer == layer
    # the functional dropout sits between `fc1` and `fc2` in DigitsNet's forward; the attention
    # dropout inside `attn`, before `attn.proj`
    assert f.evidence["module"] == ("fc2" if kind == "dropout" else "attn.proj")
    assert f.evidence["input_differs"] is True
    assert f.evidence["sanity_check"] is True
    assert "DigitsNet" in f.message or "`attn`" in f.message


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("kind", ["dropout_fixed", "sdpa_fixed", "healthy", "bn"])
def test_deterministic_eval_is_silent(tmp_path: Path, kind: str, seed: int) -> None:
    check, _ = _fit(tmp_path, kind, seed, max_epochs=1, limit_train_batches=2)
    assert not _codes(check)
    assert check.determinism is not None and check.determinism.startswith("deterministic")


def test_declared_mc_dropout_is_silent(tmp_path: Path) -> None:
    check, _ = _fit(tmp_path, "dropout", 0, EvalContractCheck(stochastic_eval=True, strict=True),
                    max_epochs=1, limit_train_batches=2)
    assert not _codes(check)
    assert "stochastic_eval" in check.detail


def test_layers_left_in_training_mode_are_left_to_eval_mode_check(tmp_path: Path) -> None:
    class TrainsInValidation(DigitsNet):
        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            self.train()  # the bug `mode.train_mode_in_eval` reports
            return super().validation_step(batch, batch_idx)

    pl.seed_everything(0, verbose=False)
    check = EvalContractCheck(strict=True)
    train, val = digits_loaders(0)
    make_trainer(tmp_path, [check], max_epochs=1, limit_train_batches=2,
                 num_sanity_val_steps=1).fit(TrainsInValidation("dropout_fixed"), train, val)
    assert "mode.nondeterministic_eval" not in _codes(check)
    assert "training mode" in (check.determinism or "")


# ---------------------------------------------------------------------- eval loss gap
@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("kind", ["bn_frozen", "ema_stale"])
def test_eval_only_path_is_caught(tmp_path: Path, kind: str, seed: int) -> None:
    check, _ = _fit(tmp_path, kind, seed)
    found = [f for f in check.findings if f.code == "mode.eval_loss_gap"]
    assert len(found) == 1, (check.detail, check.gap_runs)
    f = found[0]
    assert f.global_step >= 50
    assert f.evidence["ratio"] >= 2.0
    assert f.evidence["reference_name"] == "chance level"
    assert f.evidence["runs"][0][0] == 0  # the sanity check was probed


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize(("kind", "noise"), [("bn", 0.0), ("bn_lag", 0.0), ("healthy", 0.0), ("healthy", 0.6),
                                             ("dropout_fixed", 0.0)])
def test_same_path_in_both_modes_is_silent(tmp_path: Path, kind: str, noise: float,
                                           seed: int) -> None:
    # `bn_lag`: BatchNorm after a large-scale layer, running statistics still at their init at
    # the sanity check (a large gap there) that catch up; noise 0.6: harder validation data
    check, _ = _fit(tmp_path, kind, seed, label_noise=noise)
    assert not _codes(check), check.findings
    assert check.gap_done and check.gap_runs[-1].step >= 50
    if kind == "bn_lag":
        first, last = check.gap_runs[0], check.gap_runs[-1]
        assert first.ratio > 1.5 and last.ratio < 1.3  # the gap was there and shrank


# ---------------------------------------------------------------------- broken before training
@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize(("kind", "layer"), [("sn_old", "fc1"), ("runnorm_zero", "inorm")])
def test_eval_broken_before_training_is_caught_and_localized(tmp_path: Path, kind: str,
                                                             layer: str, seed: int) -> None:
    check, _ = _fit(tmp_path, kind, seed, max_epochs=1, limit_train_batches=2)
    found = [f for f in check.findings if f.code == "mode.eval_broken_before_training"]
    assert len(found) == 1, (check.detail, check.gap_runs)
    f = found[0]
    assert f.layer == layer and f.evidence["module"] == layer
    assert f.global_step == 0 and f.evidence["sanity_check"] is True
    assert f.evidence["chance_multiple"] >= 10.0
    assert f.evidence["train_mode_loss"] <= 2.0 * f.evidence["chance"]
    assert f.evidence["scale_ratio"] >= 4.0
    # training-mode forwards repair it (spectral_norm's at the first one): reported once
    assert check.gap_runs[-1].eval_loss < check.gap_runs[0].eval_loss / 3
    if kind == "sn_old":
        assert check.gap_runs[-1].eval_loss < 2.0 * f.evidence["chance"]
    assert _codes(check) == {"mode.eval_broken_before_training"}


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("kind", ["sn", "runnorm", "bn_lag", "dropout_fixed"])
def test_eval_sound_before_training_is_silent(tmp_path: Path, kind: str, seed: int) -> None:
    # `bn_lag`: BatchNorm running statistics at their init give a sanity-check gap (about 2x
    # chance) that is BatchNorm's normal behaviour, not a broken path
    check, _ = _fit(tmp_path, kind, seed, max_epochs=1, limit_train_batches=2)
    assert not _codes(check), check.findings
    assert check.gap_runs[0].sanity


def test_cause_leads_in_the_bundle(tmp_path: Path) -> None:
    for kind, code in (("dropout", "mode.nondeterministic_eval"),
                       ("bn_frozen", "mode.eval_loss_gap"),
                       ("sn_old", "mode.eval_broken_before_training")):
        pl.seed_everything(0, verbose=False)
        triage = Triage(strict=True, verbose=False, overfit=False, html=False,
                        report_dir=tmp_path / kind)
        train, val = digits_loaders(0)
        make_trainer(tmp_path, [triage], **FIT).fit(DigitsNet(kind), train, val)
        findings = explain_findings([f for c in collect_checks([triage]) for f in c.findings])
        assert start_here(findings) == code, [(f.code, f.explained_by) for f in findings]
        for f in findings:
            assert f.code != "curve.overfitting" or code in f.explained_by


def test_weights_are_bit_identical_with_and_without(tmp_path: Path) -> None:
    def weights(callbacks: list[Any]) -> dict[str, torch.Tensor]:
        pl.seed_everything(0, verbose=False)
        model = DigitsNet("bn_frozen")
        train, val = digits_loaders(0)
        make_trainer(tmp_path, callbacks, **FIT).fit(model, train, val)
        return {k: v.clone() for k, v in model.state_dict().items()}

    check = EvalContractCheck(strict=True)
    plain, probed = weights([]), weights([check])
    assert check.gap_runs and _codes(check)
    assert plain.keys() == probed.keys()
    assert all(torch.equal(plain[k], probed[k]) for k in plain)


def test_state_round_trip_and_arguments() -> None:
    check = EvalContractCheck(stochastic_eval=True)
    check.determinism = "deterministic over 3 module call(s)"
    restored = EvalContractCheck(stochastic_eval=True)
    restored.load_state_dict(pickle.loads(pickle.dumps(check.state_dict())))
    assert restored.determinism == check.determinism
    assert check.state_key != EvalContractCheck().state_key
    with pytest.raises(TriageConfigError, match="stochastic_eval"):
        EvalContractCheck(stochastic_eval="yes")  # type: ignore[arg-type]
    with pytest.raises(TriageConfigError, match="max_examples"):
        EvalContractCheck(max_examples=0)
    with pytest.raises(TriageConfigError, match="stochastic_eval"):
        Triage(stochastic_eval=1)  # type: ignore[arg-type]
