"""`torch.compile` (inductor on CPU) under `Triage()`: the user's run stays the same compiled run.

For each way of compiling (a compiled submodule built in `__init__`, compiled in
`configure_model`, the LightningModule compiled before `fit`) and in `32-true` and `bf16-mixed`:
the final weights are bit-identical with and without `Triage()`, the backend compiles exactly
the same graphs (no recompilation caused by a probe: another batch size, eval mode, `no_grad`,
hooks) and the user's steps run as many compiled calls. And the probes still work on the
compiled model: a compiled GPT without its causal mask, a compiled classifier ending in a
softmax are caught; their fixed twins stay silent.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn

from lightning_triage import NonFiniteTracer, Triage
from lightning_triage.testing import CountingBackend
from tests.callbacks.structure_models import DecoderLM, next_token_loader
from tests.callbacks.test_nonfinite_tracer import Growing
from tests.callbacks.test_nonfinite_tracer import data as tracer_data
from tests.probe_models import DoubleSoftmax, EncoderHead, digits, mlp
from tests.realmodels.models import DigitsCE, problems, quiet_trainer


def _inductor_fails() -> str | None:
    """Why inductor cannot compile these fits on this machine (``None``: it can)."""
    if not any(shutil.which(cc) for cc in ("cc", "gcc", "g++", "clang")):
        return "inductor needs a C++ compiler"
    if os.environ.get("ATEN_CPU_CAPABILITY") == "default":
        # seen with torch 2.13: the bare compiled fit fails too (C++ compile error, "`at::vec`
        # has not been declared" in a vectorized kernel); the mechanism is tested without
        # inductor in tests/probing/test_compiled.py
        return "torch 2.13's inductor does not compile these kernels under ATEN_CPU_CAPABILITY=default"
    return None


@pytest.fixture(autouse=True)
def _inductor() -> None:
    why = _inductor_fails()
    if why is not None:
        pytest.skip(why)


@contextmanager
def fresh_dynamo(cold: bool = False) -> Iterator[None]:
    """Dynamo's caches emptied before and after (each fit compiles as a new process would);
    ``cold``: inductor's on-disk caches off as well."""
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    try:
        if cold:
            with inductor_config.patch(force_disable_caches=True):
                yield
        else:
            yield
    finally:
        torch._dynamo.reset()


class CompiledClassifier(DigitsCE):
    """The digits MLP, compiled as the user chooses: ``"init"`` (`torch.compile` of a submodule
    in `__init__`), ``"configure_model"`` (the same in `configure_model`), ``"fit"`` (the whole
    LightningModule passed to `fit` compiled)."""

    def __init__(self, where: str, backend: CountingBackend) -> None:
        super().__init__()
        self.where, self.backend = where, backend
        self.net = mlp()
        if where == "init":
            self.net = torch.compile(self.net, backend=backend)

    def configure_model(self) -> None:
        if self.where == "configure_model" and not hasattr(self.net, "_orig_mod"):
            self.net = torch.compile(self.net, backend=self.backend)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)



def fit_compiled(tmp_path: Path, where: str, precision: str, with_triage: bool,
                 cold: bool = False) -> tuple[Tensor, CountingBackend, Triage | None]:
    backend = CountingBackend("inductor")
    callbacks = [Triage(report_dir=tmp_path / "triage", strict=True, verbose=False,
                        overfit_time_budget=120.0)] if with_triage else []
    with fresh_dynamo(cold):
        pl.seed_everything(0, verbose=False)
        model = CompiledClassifier(where, backend)
        trainer = quiet_trainer(tmp_path, callbacks, max_epochs=1, limit_train_batches=6,
                                limit_val_batches=1, precision=precision)
        fitted = torch.compile(model, backend=backend) if where == "fit" else model
        trainer.fit(fitted, *digits())
    weights = torch.cat([p.detach().flatten().float() for p in model.parameters()])
    return weights, backend, callbacks[0] if callbacks else None


@pytest.mark.parametrize(("where", "precision", "cold"), [
    ("init", "32-true", True),
    ("configure_model", "32-true", False),
    ("init", "bf16-mixed", False),
    ("fit", "32-true", False),
])
def test_compiled_run_is_bit_identical_and_stays_compiled(tmp_path: Path, where: str,
                                                          precision: str, cold: bool) -> None:
    bare, bare_backend, _ = fit_compiled(tmp_path / "bare", where, precision, False, cold)
    watched, backend, check = fit_compiled(tmp_path / "triage", where, precision, True, cold)
    assert bare_backend.graphs >= 1 and bare_backend.calls >= 6  # the bare run is compiled
    assert torch.equal(bare, watched)
    # no graph of ours, no recompilation, and every step of the user still compiled
    assert (backend.graphs, backend.calls) == (bare_backend.graphs, bare_backend.calls)
    assert check is not None and check.report.report is not None
    assert problems(check.report.report) == []


def test_whole_compiled_module_says_why_head_outputs_are_not_captured(tmp_path: Path) -> None:
    _, _, check = fit_compiled(tmp_path, "fit", "32-true", True)
    assert check is not None
    report = check.report.report
    assert report is not None
    chance = next(f for f in report["findings"] if f["code"] == "init.chance_unknown")
    assert chance["severity"] == "info" and "compiled as a whole" in chance["message"]
    worst = next(c for c in report["checks"] if c["check"] == "WorstErrors")
    assert worst["status"] == "skipped" and "compiled as a whole" in worst["detail"]


# --------------------------------------------------------------------- probes on compiled models
class CompiledLM(DecoderLM):
    """The decoder LM of the structure tests with its transformer blocks compiled."""

    def configure_model(self) -> None:
        if not hasattr(self.blocks, "_orig_mod"):
            self.blocks = torch.compile(self.blocks)


def fit_lm(tmp_path: Path, mask: str, callbacks: list[Any]) -> Tensor:
    with fresh_dynamo():
        pl.seed_everything(0, verbose=False)
        model = CompiledLM(mask=mask)
        quiet_trainer(tmp_path, callbacks, max_epochs=1, limit_train_batches=4,
                      limit_val_batches=0).fit(model, next_token_loader())
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("mask", ["future", "causal"])
def test_compiled_gpt_without_its_causal_mask_is_caught(tmp_path: Path, mask: str) -> None:
    check = Triage(report_dir=tmp_path, strict=True, verbose=False, task="sequence",
                   num_classes=16, causal=True, overfit_time_budget=120.0)
    watched = fit_lm(tmp_path, mask, [check])
    report = check.report.report
    assert report is not None
    statuses = {c["check"]: c["status"] for c in report["checks"]}
    assert statuses["StructureProbe"] in ("passed", "failed"), report["checks"]
    if mask == "future":
        assert report["start_here"] == "structure.causal_leak"
        leak = next(f for f in report["findings"] if f["code"] == "structure.causal_leak")
        assert leak["layer"].startswith("blocks._orig_mod.layers.0")
    else:
        assert problems(report) == []
        assert statuses["OverfitBatchCheck"] == "passed", report["checks"]
        assert torch.equal(fit_lm(tmp_path / "bare", mask, []), watched)  # SDPA, compiled


class CompiledSoftmaxHead(DoubleSoftmax):
    """A classifier ending in a softmax (cross-entropy over probabilities), encoder compiled."""

    def configure_model(self) -> None:
        if not hasattr(self.encoder, "_orig_mod"):
            self.encoder = torch.compile(self.encoder)


class CompiledEncoderHead(EncoderHead):
    def configure_model(self) -> None:
        if not hasattr(self.encoder, "_orig_mod"):
            self.encoder = torch.compile(self.encoder)


@pytest.mark.parametrize("build", [CompiledSoftmaxHead, CompiledEncoderHead])
def test_overfit_probe_works_on_a_compiled_model(tmp_path: Path, build: type[nn.Module]) -> None:
    check = Triage(report_dir=tmp_path, strict=True, verbose=False, overfit_time_budget=120.0)
    with fresh_dynamo():
        pl.seed_everything(0, verbose=False)
        quiet_trainer(tmp_path, [check], max_epochs=1, limit_train_batches=4,
                      limit_val_batches=1).fit(build(optimizer="adam", lr=1e-2), *digits())
    report = check.report.report
    assert report is not None
    overfit = next(c for c in report["checks"] if c["check"] == "OverfitBatchCheck")
    if build is CompiledSoftmaxHead:
        assert overfit["status"] == "failed", overfit
        assert report["start_here"] is not None and report["start_here"].startswith("overfit.")
    else:
        assert overfit["status"] == "passed", overfit
        assert problems(report) == []


class CompiledGrowing(Growing):
    """`exp(g * x)` compiled: overflows float32 at step 8 (see the tracer's tests)."""

    def configure_model(self) -> None:
        if not hasattr(self.grow, "_orig_mod"):
            self.grow = torch.compile(self.grow)


def test_nan_in_a_compiled_module_is_localized_by_the_eager_replay(tmp_path: Path) -> None:
    tracer = NonFiniteTracer(strict=True)
    with fresh_dynamo():
        pl.seed_everything(0, verbose=False)
        trainer = quiet_trainer(tmp_path, [tracer], max_epochs=1, limit_train_batches=12)
        trainer.fit(CompiledGrowing(), tracer_data(n_batches=12))
    forward = next(f for f in tracer.findings if f.code == "numerics.nonfinite_forward")
    assert (forward.global_step, forward.layer) == (8, "grow._orig_mod")
    assert trainer.global_step == 9  # stopped after the bad step, as without compile
