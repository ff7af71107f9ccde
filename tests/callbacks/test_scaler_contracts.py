"""Manual optimization with the user's own gradient scaler (``torch.amp.GradScaler``): the
update contracts stay silent on the healthy loops and catch the broken twins."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lightning_triage import Triage, UpdateContractCheck
from tests.callbacks import update_models as m
from tests.callbacks.test_update_contracts import BATCHES, _the, fit
from tests.helpers import make_trainer, seeds
from tests.probe_models import ManualClassifier, digits

LOOPS = [  # (backward, step, clip)
    ("direct", "raw", False), ("direct", "raw", True), ("manual", "raw", False),
    ("manual", "raw", True), ("direct", "lightning", False), ("manual", "lightning", True),
]


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
@pytest.mark.parametrize(("backward", "step", "clip"), LOOPS)
def test_a_healthy_loop_with_its_own_scaler_is_silent(tmp_path: Path, backward: Any, step: Any,
                                                      clip: bool, precision: str) -> None:
    model = m.OwnScaler(backward=backward, step=step, clip=clip)
    check = fit(tmp_path, model, precision=precision)
    assert check.findings == [], [(f.code, f.message) for f in check.findings]
    assert check.ran and f"({BATCHES} optimizer step(s))" in check.detail
    assert model.scaler.get_scale() == 2.0**10  # the scaler scaled every step, skipped none


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize(("backward", "precision"), [("direct", "32-true"),
                                                     ("manual", "bf16-mixed")])
def test_triage_is_silent_on_a_loop_with_its_own_scaler(tmp_path: Path, seed: Any,
                                                        backward: Any, precision: str) -> None:
    pl.seed_everything(seed, verbose=False)
    triage = Triage(task="multiclass", num_classes=10, report_dir=tmp_path, verbose=False,
                    html=False, strict=True)
    trainer = make_trainer(tmp_path, [triage], limit_train_batches=16, precision=precision)
    trainer.fit(m.OwnScaler(backward=backward, clip=True), *digits())
    findings = triage.report.report["findings"]
    assert [f for f in findings if f["severity"] != "info" or f["code"].startswith("wiring.")] \
        == [], [(f["code"], f["message"]) for f in findings]


@pytest.mark.parametrize("backward", ["direct", "manual"])
@pytest.mark.parametrize("step", ["raw", "lightning"])
def test_the_broken_twins_are_caught(tmp_path: Path, backward: Any, step: Any) -> None:
    never = fit(tmp_path, m.OwnScaler(backward=backward, step=step, zero=False))
    f = _the(never, "wiring.grads_not_zeroed")
    assert f.severity == "error" and f.evidence["zeroed"] == [True] + [False] * (BATCHES - 1)
    assert [g.code for g in never.findings if g.is_problem] == [f.code]
    reset = fit(tmp_path, m.OwnScaler(backward=backward, step=step, reset_at=5))
    f = _the(reset, "wiring.params_changed_outside_step")
    assert f.severity == "warning" and f.layer == "net.2"
    assert f.evidence["phase"].startswith("after the step of optimizer 0")
    assert [g.code for g in reset.findings if g.is_problem] == [f.code]


@pytest.mark.parametrize("step", ["raw", "lightning"])
def test_weights_are_bit_identical_with_and_without(tmp_path: Path, step: Any) -> None:
    states = []
    for callbacks in ([], [Triage(task="multiclass", num_classes=10, report_dir=tmp_path,
                                  verbose=False, html=False, strict=True)]):
        pl.seed_everything(0, verbose=False)
        model = m.OwnScaler(step=step, clip=True)
        make_trainer(tmp_path, callbacks, limit_train_batches=BATCHES).fit(model, *digits())
        states.append((model.state_dict(), model.scaler.state_dict()))
    for key, value in states[0][0].items():
        assert torch.equal(value, states[1][0][key]), key
    assert states[0][1] == states[1][1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("backward", "step"), [("direct", "raw"), ("manual", "lightning")])
def test_cuda_own_scaler_and_lightnings_scaler_under_manual_optimization(
        tmp_path: Path, backward: Any, step: Any) -> None:
    cuda = {"accelerator": "cuda", "precision": "32-true"}
    own = fit(tmp_path, m.OwnScaler(backward=backward, step=step, clip=True, device="cuda"), **cuda)
    assert own.findings == [], [(f.code, f.message) for f in own.findings]
    # Lightning's own scaler (16-mixed): its hook reads before the raw step's pre-hook
    mixed = fit(tmp_path, ManualClassifier(), accelerator="cuda", precision="16-mixed")
    assert mixed.findings == [] and f"({BATCHES} optimizer step(s))" in mixed.detail
    never = fit(tmp_path, m.OwnScaler(backward=backward, step=step, zero=False, device="cuda"),
                **cuda)
    assert _the(never, "wiring.grads_not_zeroed").severity == "error"


def test_the_check_pickles_inside_its_window(tmp_path: Path) -> None:
    """The weak references to the gradients (the zeroing evidence) do not travel."""
    sizes = []

    class Pickle(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == 4:
                check = next(c for c in trainer.callbacks  # type: ignore[attr-defined]
                             if isinstance(c, UpdateContractCheck))
                assert check._grad_refs and not check.idle
                sizes.append(len(pickle.loads(pickle.dumps(check))._grad_refs))

    check = fit(tmp_path, m.OwnScaler(step="lightning"), (Pickle(),))
    assert sizes == [0] and check.findings == []
