"""Manual optimization that runs its own ``loss.backward()`` (not ``self.manual_backward``, so
Lightning announces no backward) and zeros the gradients in place: the update contracts see
the zeroing and stay silent; the twin that never zeros is caught."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lightning_triage import Triage
from tests.callbacks import update_models as m
from tests.callbacks.test_update_contracts import BATCHES, _the, fit
from tests.helpers import make_trainer, seeds
from tests.probe_models import digits

ZEROS = [("lightning", "before", 1), ("torch", "before", 1), ("loop", "before", 1),
         ("lightning", "after", 1), ("loop", "after", 1), ("torch", "before", 3)]


@pytest.mark.parametrize(("zero", "when", "micro"), ZEROS)
def test_in_place_zeroing_is_seen(tmp_path: Path, zero: Any, when: Any, micro: int) -> None:
    check = fit(tmp_path, m.DirectBackward(zero=zero, when=when, micro=micro))
    assert check.findings == [], [(f.code, f.message) for f in check.findings]
    assert check.ran and f"({BATCHES} optimizer step(s))" in check.detail


@pytest.mark.parametrize("seed", seeds())
def test_triage_is_silent_on_a_loop_with_its_own_backward(tmp_path: Path, seed: Any) -> None:
    pl.seed_everything(seed, verbose=False)
    triage = Triage(task="multiclass", num_classes=10, report_dir=tmp_path, verbose=False,
                    html=False, strict=True)
    make_trainer(tmp_path, [triage], limit_train_batches=16).fit(m.DirectBackward(), *digits())
    findings = triage.report.report["findings"]
    assert [f for f in findings if f["severity"] != "info" or f["code"].startswith("wiring.")] \
        == [], [(f["code"], f["message"]) for f in findings]


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("micro", [1, 3])
def test_the_twin_that_never_zeros_is_caught(tmp_path: Path, seed: Any, micro: int) -> None:
    check = fit(tmp_path, m.DirectBackward(zero="never", micro=micro), seed=seed)
    f = _the(check, "wiring.grads_not_zeroed")
    assert f.severity == "error" and f.global_step == 1
    assert f.evidence["zeroed"] == [True] + [False] * (BATCHES - 1)
    assert [g.code for g in check.findings if g.is_problem] == [f.code]


@pytest.mark.parametrize("zero", ["lightning", "never"])
def test_weights_are_bit_identical_with_and_without(tmp_path: Path, zero: Any) -> None:
    states = []
    for callbacks in ([], [Triage(task="multiclass", num_classes=10, report_dir=tmp_path,
                                  verbose=False, html=False, strict=True)]):
        pl.seed_everything(0, verbose=False)
        model = m.DirectBackward(zero=zero)
        make_trainer(tmp_path, callbacks, limit_train_batches=BATCHES).fit(model, *digits())
        states.append(model.state_dict())
    for key, value in states[0].items():
        assert torch.equal(value, states[1][key]), key


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_in_place_zeroing_and_its_broken_twin(tmp_path: Path) -> None:
    """The hook runs in the autograd engine's device thread."""
    healthy = fit(tmp_path, m.DirectBackward(zero="torch"), accelerator="cuda")
    assert healthy.findings == [], [(f.code, f.message) for f in healthy.findings]
    never = fit(tmp_path, m.DirectBackward(zero="never"), accelerator="cuda")
    assert _the(never, "wiring.grads_not_zeroed").severity == "error"
