"""AutocastCheck: layers that run in float32 under `*-mixed` precision
(numerics.autocast_bypassed), on real fits (CPU bf16 autocast; CUDA fp16 when available)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lightning_triage import AutocastCheck, TriageConfigError
from lightning_triage.functional.precision import AutocastRecorder, OpCall, autocast_bypassed
from tests.callbacks.eval_models import DigitsNet, digits_loaders
from tests.helpers import make_trainer, seeds

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))]


def _fit(tmp_path: Path, kind: str, precision: str, seed: int = 0, device: str = "cpu",
         width: int = 64) -> AutocastCheck:
    pl.seed_everything(seed, verbose=False)
    check = AutocastCheck(strict=True)
    train, val = digits_loaders(seed)
    make_trainer(tmp_path, [check], precision=precision, accelerator=device, devices=1,
                 limit_train_batches=2, limit_val_batches=0).fit(DigitsNet(kind, width=width),
                                                                 train, val)
    return check


def _found(check: AutocastCheck) -> list[Any]:
    return [f for f in check.findings if f.code == "numerics.autocast_bypassed"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", seeds())
def test_forward_outside_autocast_is_a_warning(tmp_path: Path, seed: int, device: str) -> None:
    precision = "16-mixed" if device == "cuda" else "bf16-mixed"
    check = _fit(tmp_path, "autocast_off", precision, seed, device)
    (f,) = _found(check)
    assert f.severity == "warning"
    assert f.evidence["share"] == 1.0
    assert {m["module"] for m in f.evidence["modules"]} == {"fc1", "fc2"}
    assert f.evidence["autocast_dtype"] == ("float16" if device == "cuda" else "bfloat16")


@pytest.mark.parametrize("device", DEVICES)
def test_a_small_head_in_float32_is_info(tmp_path: Path, device: str) -> None:
    precision = "16-mixed" if device == "cuda" else "bf16-mixed"
    check = _fit(tmp_path, "autocast_head", precision, device=device, width=256)
    (f,) = _found(check)
    assert f.severity == "info"
    assert f.layer == "fc2"
    assert 0 < f.evidence["share"] < 0.5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["healthy", "norms", "sdpa_fixed"])
def test_lowered_layers_and_float32_norms_are_silent(tmp_path: Path, kind: str,
                                                     device: str) -> None:
    precision = "16-mixed" if device == "cuda" else "bf16-mixed"
    check = _fit(tmp_path, kind, precision, device=device)
    assert not check.findings
    assert "call(s) of lowered operations" in check.detail


@pytest.mark.parametrize(("precision", "kind"), [("32-true", "autocast_off"),
                                                 ("bf16-true", "healthy"), ("16-true", "healthy")])
def test_true_precisions_are_not_checked(tmp_path: Path, precision: str, kind: str) -> None:
    check = _fit(tmp_path, kind, precision)
    assert not check.findings
    assert "no autocast" in check.detail


def test_cpu_16_mixed_is_bf16_autocast(tmp_path: Path) -> None:
    # Lightning runs "16-mixed" on CPU as bfloat16 autocast: Linear outputs are bfloat16 there
    check = _fit(tmp_path, "autocast_off", "16-mixed")
    (f,) = _found(check)
    assert f.evidence["autocast_dtype"] == "bfloat16"
    assert not _found(_fit(tmp_path, "healthy", "16-mixed"))


def test_weights_are_bit_identical_with_and_without(tmp_path: Path) -> None:
    def weights(callbacks: list[Any]) -> dict[str, torch.Tensor]:
        pl.seed_everything(0, verbose=False)
        model = DigitsNet("autocast_head")
        train, _ = digits_loaders(0)
        make_trainer(tmp_path, callbacks, precision="bf16-mixed",
                     limit_train_batches=4).fit(model, train)
        return {k: v.clone() for k, v in model.state_dict().items()}

    check = AutocastCheck(strict=True)
    plain, probed = weights([]), weights([check])
    assert _found(check)
    assert all(torch.equal(plain[k], probed[k]) for k in plain)


def test_recorder_names_the_module_and_flops() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Conv1d(1, 2, 3))
    with AutocastRecorder().attached(net) as rec, torch.autocast("cpu", dtype=torch.bfloat16):
        h = net[0](torch.randn(3, 4))
        with torch.autocast("cpu", enabled=False):
            net[1](h.float()[:, None, :])
    assert [(c.module, c.op, c.dtype) for c in rec.calls] == [
        ("0", "linear", torch.bfloat16), ("1", "conv1d", torch.float32)]
    assert [c.flops for c in rec.calls] == [3 * 8 * 4, 3 * 2 * 6 * 3]
    verdict = autocast_bypassed(rec.calls, precision="bf16-mixed", lowered=torch.bfloat16)
    assert verdict is not None and verdict.layer == "1"
    assert autocast_bypassed([OpCall("a", "Linear", "linear", torch.bfloat16, 1.0)],
                             precision="bf16-mixed", lowered=torch.bfloat16) is None


def test_arguments_are_validated() -> None:
    with pytest.raises(TriageConfigError, match="max_examples"):
        AutocastCheck(max_examples=0)
    with pytest.raises(TriageConfigError, match="forward_fn"):
        AutocastCheck(forward_fn=3)  # type: ignore[arg-type]
