"""Manual optimization with the user's own ``torch.amp.GradScaler`` (on CPU: the scaler scales
and unscales there as on a GPU, ``enabled=True``), clipping by hand: clipping before
``scaler.unscale_`` is found and leads (not the slow loss it causes), whether the scaler steps
Lightning's optimizer wrapper or the raw torch optimizer (which Lightning never sees); the loop
that unscales first stays silent (issue 42, item 5). The models are the registry's run
``scaler-clip-before-unscale`` and its fixed twin: one fit each per seed (seeds 1 and 2 slow),
shared by the tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest

from lightning_triage import Triage
from lightning_triage.demo.broken import Scenario, broken_run
from lightning_triage.demo.broken.common import fit
from lightning_triage.demo.broken.curves import ScalerClipMLP
from tests.helpers import make_trainer, seeds

RUN = broken_run("scaler-clip-before-unscale")
SCALE = 2.0**16  # GradScaler's default first scale


def _fit(root: Path, scenario: Scenario, seed: int) -> tuple[dict[str, Any], ScalerClipMLP]:
    pl.seed_everything(seed, verbose=False)
    model, train, val = scenario.build()
    assert isinstance(model, ScalerClipMLP)
    triage = Triage(task="multiclass", num_classes=10, report_dir=root, verbose=False,
                    html=False, strict=True)
    make_trainer(root, [triage], max_epochs=scenario.max_epochs, limit_train_batches=None,
                 **scenario.trainer_kwargs).fit(model, train, val)
    report = triage.report.report
    assert report is not None
    return report, model


@pytest.fixture(scope="module", params=seeds())
def reports(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], Any]]:
    seed = request.param
    return {"clip first": _fit(tmp_path_factory.mktemp("first"), RUN, seed),
            "unscale first": _fit(tmp_path_factory.mktemp("unscaled"), RUN.twin(), seed)}


def assert_clipping_leads(report: dict[str, Any], model: ScalerClipMLP) -> None:
    assert model.clip_first and not model.automatic_optimization
    assert model.scaler.is_enabled() and model.scaler.get_scale() == SCALE  # it really scaled
    codes = [(f["code"], f["severity"], f["explained_by"]) for f in report["findings"]]
    assert report["start_here"] == "grad.clipping_eats_update", codes
    clip = next(f for f in report["findings"] if f["code"] == "grad.clipping_eats_update")
    assert clip["severity"] == "warning" and clip["explained_by"] == []
    ev = clip["evidence"]
    assert ev["how"] == "manual" and ev["scale"] == SCALE and ev["clipped_scaled"] is True
    assert ev["median_kept"] * SCALE < 100  # the max_norm over the unscaled norm: order 1
    assert "before `scaler.unscale_(optimizer)`" in clip["message"]
    # the slow loss it causes is its symptom (every other warning or error is explained by it),
    # and the loop's contracts hold
    loud = [f for f in report["findings"] if f["severity"] != "info" and f is not clip]
    assert loud and all(f["explained_by"] == ["grad.clipping_eats_update"] for f in loud), codes
    for f in report["findings"]:
        if f["code"] in ("curve.not_learning", "curve.lr_too_low", "grad.update_ratio"):
            assert f["explained_by"] == ["grad.clipping_eats_update"], codes
        assert not f["code"].startswith("wiring."), codes


def test_clipping_before_unscale_is_found_and_leads(reports: dict[str, Any]) -> None:
    assert RUN.lead and RUN.expect == "grad.clipping_eats_update"
    report, model = reports["clip first"]
    assert not model.raw_step and report["run"]["global_step"] > 0
    assert_clipping_leads(report, model)


def test_unscale_then_clip_is_silent(reports: dict[str, Any]) -> None:
    report, model = reports["unscale first"]
    assert not model.clip_first and model.scaler.get_scale() == SCALE
    problems = [(f["code"], f["message"]) for f in report["findings"]
                if f["severity"] != "info" or f["code"].startswith("wiring.")]
    assert problems == [] and report["start_here"] is None


def test_clipping_before_unscale_is_found_when_the_raw_optimizer_steps(tmp_path: Path) -> None:
    # `scaler.step(opt.optimizer)`: no `on_before_optimizer_step`, `global_step` stays 0; the
    # clipping is read by torch hooks on the backward and the raw optimizer's step
    raw = dataclasses.replace(RUN, build=fit(lambda: ScalerClipMLP(raw_step=True, lr=0.1)))
    report, model = _fit(tmp_path, raw, 0)
    assert model.raw_step and report["run"]["global_step"] == 0
    assert_clipping_leads(report, model)
