"""The mode stage's remedies in real fits (seeds 0-2): evaluation made random by a functional
dropout or an attention dropout that ignores the mode is cured on a copy by gating the dropout
on the mode; layers left in training mode by a `.train()` in a validation hook are cured by eval
mode. Each is tried by the check at its probe, only when it finds the problem; the fixed twins
try nothing, and the user's run is bit-identical with and without the trials."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor

import lightning_triage.callbacks.eval_contract as eval_contract
import lightning_triage.callbacks.eval_mode as eval_mode
from lightning_triage import Triage, TriageConfigError
from lightning_triage.findings import CODES
from lightning_triage.functional.remedy import EvalPasses, decide_eval_remedy
from lightning_triage.report.schema import REPORT_SCHEMA
from tests.callbacks.eval_models import DigitsNet, digits_loaders
from tests.helpers import make_trainer, seeds
from tests.probe_models import Classifier, TrainInValidation, cnn, digits

FIT = dict(max_epochs=1, limit_train_batches=4, limit_val_batches=1, num_sanity_val_steps=1)


class TrainInStep(Classifier):
    """`validation_step` itself puts the network in training mode."""

    def __init__(self) -> None:
        super().__init__(net=cnn())

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.net.train()
        super().validation_step(batch, batch_idx)


class NoisyEval(DigitsNet):
    """Gaussian noise added in every mode: randomness that is not a dropout call."""

    def features(self, x: Tensor) -> Tensor:
        h = super().features(x)
        return h + 0.5 * torch.randn_like(h)


def _fit(tmp_path: Path, build: Any, seed: int,
         **triage_kwargs: Any) -> tuple[pl.LightningModule, dict[str, Any]]:
    pl.seed_everything(seed, verbose=False)
    model, loaders = build()
    triage = Triage(report_dir=tmp_path, verbose=False, overfit=False, html=False, strict=True,
                    **triage_kwargs)
    make_trainer(tmp_path, [triage], **FIT).fit(model, *loaders)
    report = triage.report.report
    assert report is not None
    return model, report


def _lead(report: dict[str, Any]) -> dict[str, Any]:
    return next(f for f in report["findings"] if f["code"] == report["start_here"])


BROKEN = {
    # name: (build(seed), lead code, remedy kind)
    "functional-dropout": (lambda s: (DigitsNet("dropout"), digits_loaders(s)),
                           "mode.nondeterministic_eval", "gate_dropout"),
    "attention-dropout": (lambda s: (DigitsNet("sdpa"), digits_loaders(s)),
                          "mode.nondeterministic_eval", "gate_dropout"),
    "train-in-hook": (lambda s: (TrainInValidation(), digits()), "mode.train_mode_in_eval",
                      "eval_mode"),
    "train-in-step": (lambda s: (TrainInStep(), digits()), "mode.train_mode_in_eval",
                      "eval_mode"),
}
FIXED = {
    "functional-dropout": lambda: (DigitsNet("dropout_fixed"), digits_loaders(0)),
    "attention-dropout": lambda: (DigitsNet("sdpa_fixed"), digits_loaders(0)),
    "train-in-hook": lambda: (Classifier(net=cnn()), digits()),
}


def test_the_registry_declares_the_mode_remedies() -> None:
    assert CODES["mode.train_mode_in_eval"].remedy == "eval_mode"
    assert CODES["mode.nondeterministic_eval"].remedy == "gate_dropout"


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("name", list(BROKEN))
def test_the_mode_remedy_is_confirmed_on_a_copy(tmp_path: Path, name: str, seed: int) -> None:
    build, code, kind = BROKEN[name]
    _, report = _fit(tmp_path, lambda: build(seed), seed)
    lead = _lead(report)
    assert lead["code"] == code
    remedy = lead["remedy"]
    assert (remedy["kind"], remedy["verdict"]) == (kind, "confirmed"), remedy
    before, after = remedy["before"], remedy["after"]
    assert before["deterministic"] is False and before["difference"] > 0.05
    assert after["deterministic"] is True and after["difference"] == 0.0
    assert after["buffers_changed"] == 0
    if name.startswith("train-in"):  # BatchNorm in training mode updates its statistics
        assert before["buffers_changed"] == 3
    assert before["loss"] != after["loss"]
    assert "remedy_trial" not in lead["evidence"]  # moved into the block, not kept twice
    jsonschema.validate(report, REPORT_SCHEMA)
    md = (tmp_path / "triage_report.md").read_text()
    assert "Remedy: confirmed on a copy: " in md
    assert "validation outputs from two random states differ (largest difference" in md


@pytest.mark.parametrize("name", list(FIXED))
def test_the_fixed_twin_tries_nothing(tmp_path: Path, name: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    for module in (eval_mode, eval_contract):
        original = module.eval_remedy_trial

        def counted(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            calls.append(args[3])
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, "eval_remedy_trial", counted)
    _, report = _fit(tmp_path, FIXED[name], 0)
    assert not any(f["code"].startswith("mode.") for f in report["findings"])
    assert calls == []
    assert not any("remedy_trial" in f["evidence"] for f in report["findings"])


def test_randomness_that_is_not_dropout_is_read_as_sampling(tmp_path: Path) -> None:
    """Noise drawn in eval mode that is not a dropout call is what sampling objectives do
    (diffusion, a masked autoencoder, a VAE's latent): said at info, no remedy tried (issue 41).
    """
    _, report = _fit(tmp_path, lambda: (NoisyEval("healthy"), digits_loaders(0)), 0)
    (said,) = [f for f in report["findings"] if f["code"] == "mode.nondeterministic_eval"]
    assert said["severity"] == "info" and said["evidence"]["draws"] == ["randn_like"]
    assert "remedy" not in said and "remedy_trial" not in said["evidence"]


def test_dropout_beside_sampling_is_inconclusive_and_stays_the_lead(tmp_path: Path) -> None:
    _, report = _fit(tmp_path, lambda: (NoisyEval("dropout"), digits_loaders(0)), 0)
    lead = _lead(report)
    assert lead["code"] == "mode.nondeterministic_eval" and lead["severity"] == "warning"
    remedy = lead["remedy"]
    assert remedy["verdict"] == "inconclusive", remedy
    assert remedy["after"]["deterministic"] is False
    assert "not a dropout call" in remedy["reason"] and "does not refute it" in remedy["reason"]
    assert "1 call(s) per pass gated" in remedy["change"]


def test_the_user_run_is_bit_identical_with_and_without_the_trial(tmp_path: Path) -> None:
    states = []
    for verify in (True, False):
        model, report = _fit(tmp_path / str(verify), lambda: (TrainInValidation(), digits()),
                             0, verify_remedies=verify)
        found = next(f for f in report["findings"] if f["code"] == "mode.train_mode_in_eval")
        assert ("remedy" in found) is verify
        assert "remedy_trial" not in found["evidence"]
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_the_checks_validate_their_argument() -> None:
    with pytest.raises(TriageConfigError, match="verify_remedy"):
        eval_mode.EvalModeCheck(verify_remedy="yes")  # type: ignore[arg-type]
    with pytest.raises(TriageConfigError, match="verify_remedy"):
        eval_contract.EvalContractCheck(verify_remedy=1)  # type: ignore[arg-type]


def test_the_decision_rules() -> None:
    stats = ("bn.running_mean", "bn.running_var")
    # BatchNorm alone in training mode: deterministic outputs, but the statistics move
    bn = decide_eval_remedy("eval_mode", EvalPasses(0.0, None, (1.0, 1.0), stats),
                            EvalPasses(0.0, None, (0.8, 0.8)))
    assert bn.verdict == "confirmed" and "no running statistic moves" in bn.reason
    # nothing to cure on the copy: never confirmed
    calm = EvalPasses(0.0, None, (1.0, 1.0))
    assert decide_eval_remedy("gate_dropout", calm, calm).verdict == "inconclusive"
    assert decide_eval_remedy("eval_mode", EvalPasses(0.3, "drop"), calm).verdict == "confirmed"
    # statistics still moving with the remedy: not cured
    still = decide_eval_remedy("eval_mode", EvalPasses(0.0, None, (), stats),
                               EvalPasses(0.0, None, (), stats))
    assert still.verdict == "inconclusive"
