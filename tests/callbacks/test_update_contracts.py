"""UpdateContractCheck on real Trainer.fit runs: broken update contracts caught with their cause,
the standard recipes (accumulation, GANs, clipping, fine-tuning, warm-up, LBFGS) silent."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import BackboneFinetuning

from lightning_triage import Triage, TriageConfigError, UpdateContractCheck
from lightning_triage._compat import grad_scaler
from tests.callbacks import update_models as m
from tests.helpers import make_trainer, seeds
from tests.probe_models import Classifier, TinyGAN, digits

BATCHES = 12


def fit(tmp_path: Path, model: pl.LightningModule, callbacks: tuple[pl.Callback, ...] = (),
        seed: int = 0, window: int = BATCHES, **kwargs: Any) -> UpdateContractCheck:
    pl.seed_everything(seed, verbose=False)
    check = UpdateContractCheck(window=window, strict=True)
    kwargs.setdefault("limit_train_batches", BATCHES)
    trainer = make_trainer(tmp_path, [check, *callbacks], **kwargs)
    trainer.fit(model, *digits())
    return check


def warm_up(first: float) -> Callable[[int], float]:
    return lambda s: min(1.0, first + s / 10)


SILENT: dict[str, Callable[[], tuple[pl.LightningModule, tuple[pl.Callback, ...], dict[str, Any]]]] = {
    "sgd": lambda: (Classifier(), (), {}),
    "adam": lambda: (Classifier(optimizer="adam", lr=1e-3, weight_decay=0.01), (), {}),
    "accumulate_grad_batches": lambda: (Classifier(), (), {"accumulate_grad_batches": 3}),
    "manual_accumulation": lambda: (m.ManualAccumulation(k=3), (), {}),
    "manual_zero_every_2": lambda: (m.ManualZeroEveryK(k=2), (), {}),
    "gan_zero_at_different_times": lambda: (m.GANZeroAtDifferentTimes(), (), {}),
    "gan_toggle_optimizer": lambda: (TinyGAN(), (), {}),
    "skip_one_batch": lambda: (m.SkipOneBatch(), (), {}),
    "clip_in_on_before_optimizer_step": lambda: (m.ClipBeforeStep(), (), {}),
    "frozen_backbone_in_eval": lambda: (m.BNBackbone(eval_at_epoch_start=True), (), {}),
    "frozen_bn_without_running_stats": lambda: (m.BNBackbone(track=False), (), {}),
    "warm_up_near_zero": lambda: (m.Scheduled(warm_up(1e-3)), (), {}),
    "warm_up_from_exactly_zero": lambda: (m.Scheduled(warm_up(0.0)), (), {}),
    "lbfgs": lambda: (m.LBFGSClassifier(), (), {}),
    "bf16_mixed": lambda: (Classifier(), (), {"precision": "bf16-mixed"}),
    "backbone_finetuning": lambda: (
        m.BNBackbone(freeze=False), (BackboneFinetuning(unfreeze_backbone_at_epoch=1),),
        {"limit_train_batches": 4, "max_epochs": 3}),
}


@pytest.mark.parametrize("name", list(SILENT))
def test_standard_recipes_stay_silent(tmp_path: Path, name: str) -> None:
    model, callbacks, kwargs = SILENT[name]()
    check = fit(tmp_path, model, callbacks, **kwargs)
    assert check.findings == [], [f.message for f in check.findings]
    assert check.ran and check.idle


def test_wgan_clipping_after_the_step_is_info_at_most(tmp_path: Path) -> None:
    check = fit(tmp_path, m.WGANClip())
    assert {f.severity for f in check.findings} <= {"info"}
    (f,) = check.findings
    assert f.code == "wiring.params_changed_outside_step" and f.layer == "discriminator"
    assert f.evidence["projection"] and "after the step of optimizer 1 (Adam)" in f.message


def _the(check: UpdateContractCheck, code: str) -> Any:
    found = [f for f in check.findings if f.code == code]
    assert len(found) == 1, [(f.code, f.message) for f in check.findings]
    return found[0]


BROKEN: dict[str, tuple[Callable[[], tuple[pl.LightningModule, tuple[pl.Callback, ...],
                                           dict[str, Any]]], str, int, dict[str, Any]]] = {
    # name: (build, code, step of the finding, evidence or layer that must match)
    "manual_without_zero_grad": (lambda: (m.ManualNoZeroGrad(), (), {}),
                                 "wiring.grads_not_zeroed", 1, {"severity": "error"}),
    "optimizer_zero_grad_does_nothing": (lambda: (m.NoOpZeroGrad(), (), {}),
                                         "wiring.grads_not_zeroed", 1, {"severity": "error"}),
    "step_replaced_by_noop": (lambda: (m.NoOpStep(), (), {}),
                              "wiring.optimizer_not_stepping", 0, {"cause": "no_effect"}),
    "optimizer_step_without_step": (lambda: (m.ClosureOnlyStep(), (), {}),
                                    "wiring.optimizer_not_stepping", 0, {"cause": "not_called"}),
    "training_step_none_from_5": (lambda: (m.NoneFrom(start=5), (), {}),
                                  "wiring.optimizer_not_stepping", 5, {"cause": "skipped"}),
    "scheduler_sets_lr_to_0": (lambda: (m.Scheduled(lambda s: 1.0 if s < 4 else 0.0), (), {}),
                               "wiring.optimizer_not_stepping", 4, {"cause": "zero_lr"}),
    "callback_resets_every_4": (lambda: (Classifier(), (m.ResetEvery(n=4),), {}),
                                "wiring.params_changed_outside_step", 4,
                                {"severity": "warning", "phase": "between batches"}),
    "load_state_dict_mid_run": (lambda: (Classifier(), (m.ReloadAt(at=6),), {}),
                                "wiring.params_changed_outside_step", 6,
                                {"severity": "warning"}),
    "no_grad_edit_in_forward": (lambda: (m.EditInForward(), (), {}),
                                "wiring.params_changed_outside_step", 0,
                                {"severity": "warning", "layer": "head"}),
    "frozen_bn_in_train_mode": (lambda: (m.BNBackbone(), (), {}),
                                "wiring.frozen_batchnorm_in_train", 0, {"layer": "backbone.2"}),
    "frozen_by_weight_decay": (lambda: (m.FreezeLater(), (), {}),
                               "wiring.frozen_params_changed", 4, {"layer": "encoder"}),
    "frozen_edited_in_place": (lambda: (m.EditFrozen(), (), {}),
                               "wiring.frozen_params_changed", 3, {"layer": "encoder.0"}),
}


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_contracts_are_caught_at_their_step(tmp_path: Path, name: str, seed: Any) -> None:
    build, code, step, expect = BROKEN[name]
    model, callbacks, kwargs = build()
    check = fit(tmp_path, model, callbacks, seed=seed, **kwargs)
    f = _the(check, code)
    assert f.global_step == step, f.message
    assert f"{step}" in f.message
    for key, value in expect.items():
        got = getattr(f, key) if key in ("severity", "layer") else f.evidence[key]
        assert got == value, (key, f.message)
    # the encoder frozen at batch 3 had trained for 3 steps: a late freeze too (issue 35)
    also = {"frozen_by_weight_decay": ["wiring.frozen_late"]}.get(name, [])
    others = [g.code for g in check.findings if g is not f and g.is_problem]
    assert others == also, [g.message for g in check.findings]


def test_optimizer_not_stepping_is_found_within_5_steps_of_its_start(tmp_path: Path) -> None:
    check = fit(tmp_path, m.NoneFrom(start=9), window=20, limit_train_batches=20)
    f = _the(check, "wiring.optimizer_not_stepping")
    assert f.global_step == 9 and f.evidence["steps"] == [9, 10, 11, 12, 13]


@pytest.mark.parametrize(("build", "cause"), [
    (m.ClosureOnlyStep, "wiring.optimizer_not_stepping"),
    (m.NoOpZeroGrad, "wiring.grads_not_zeroed"),
])
def test_triage_leads_with_the_broken_contract(tmp_path: Path, build: Any, cause: str) -> None:
    pl.seed_everything(0, verbose=False)
    triage = Triage(task="multiclass", num_classes=10, overfit=False, strict=True,
                    verbose=False, html=False, window_epochs=1, window_steps=30)
    trainer = make_trainer(tmp_path, [triage], limit_train_batches=16, max_epochs=2)
    trainer.fit(build(), *digits())
    report = json.loads((tmp_path / "triage_report.json").read_text())
    assert report["start_here"] == cause
    symptoms = [f for f in report["findings"] if f["code"].split(".")[0] in ("curve", "grad")
                and f["severity"] != "info"]
    assert symptoms, [f["code"] for f in report["findings"]]
    for f in symptoms:
        assert cause in f["explained_by"], (f["code"], f["explained_by"])


def test_check_goes_idle_and_removes_its_hooks(tmp_path: Path) -> None:
    model = Classifier()
    check = fit(tmp_path, model, window=3)
    assert check.idle and check.ran and "first 3 training batch" in check.detail
    (opt,) = model.trainer.optimizers
    assert not opt._optimizer_step_post_hooks


@pytest.mark.parametrize("build", [m.WGANClip, m.FreezeLater, m.NoOpZeroGrad])
def test_weights_are_bit_identical_with_and_without(tmp_path: Path, build: Any) -> None:
    states = []
    for callbacks in ([], [UpdateContractCheck(strict=True)]):
        pl.seed_everything(0, verbose=False)
        model = build()
        make_trainer(tmp_path, callbacks, limit_train_batches=BATCHES).fit(model, *digits())
        states.append(model.state_dict())
    for key, value in states[0].items():
        assert torch.equal(value, states[1][key]), key


def test_arguments_state_and_pickling(tmp_path: Path) -> None:
    with pytest.raises(TriageConfigError, match="`window`"):
        UpdateContractCheck(window=1)
    check = fit(tmp_path, m.NoOpZeroGrad())
    again = UpdateContractCheck()
    again.load_state_dict(check.state_dict())
    assert again.findings == check.findings and again._done
    assert pickle.loads(pickle.dumps(check)).findings == check.findings


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the gradient scaler needs CUDA")
def test_gradient_scaler_skipping_steps_is_not_a_stall(tmp_path: Path) -> None:
    class Overflow(Classifier):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            scale = 1e6 if 2 <= batch_idx < 10 else 1.0  # fp16 overflows: 8 skipped steps
            return torch.nn.functional.cross_entropy(self.net(x) * scale, y)

    pl.seed_everything(0, verbose=False)
    check = UpdateContractCheck(window=14, strict=True)
    trainer = make_trainer(tmp_path, [check], accelerator="cuda", precision="16-mixed",
                           limit_train_batches=14)
    trainer.fit(Overflow(), *digits())
    assert grad_scaler(trainer).get_scale() <= 65536.0 / 2**6  # the scaler did skip steps
    assert check.findings == [], [f.message for f in check.findings]
    assert check.ran


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed", "32-true"])
def test_cuda_runs_broken_and_healthy(tmp_path: Path, precision: str) -> None:
    kwargs = {"accelerator": "cuda", "precision": precision}
    assert fit(tmp_path, Classifier(), **kwargs).findings == []
    f = _the(fit(tmp_path, m.NoOpZeroGrad(), **kwargs), "wiring.grads_not_zeroed")
    assert f.global_step == 1
    f = _the(fit(tmp_path, m.NoneFrom(start=5), **kwargs), "wiring.optimizer_not_stepping")
    assert f.global_step == 5 and f.evidence["cause"] == "skipped"


def test_a_crashed_fit_leaves_nothing_behind(tmp_path: Path) -> None:
    class Crash(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == 3:
                raise RuntimeError("boom")

    model = Classifier()
    check = UpdateContractCheck(window=BATCHES, strict=True)
    with pytest.raises(RuntimeError, match="boom"):
        make_trainer(tmp_path, [check, Crash()], limit_train_batches=BATCHES).fit(
            model, *digits())
    assert not model.trainer.optimizers[0]._optimizer_step_post_hooks
    make_trainer(tmp_path, [check], limit_train_batches=BATCHES).fit(Classifier(), *digits())
    assert check.findings == [] and check.ran
