"""Objectives that couple a batch's examples on purpose (in-batch negatives, batch statistics)
are said at info, never `structure.batch_mixing` as a warning; BatchNorm normalizing with the
batch's statistics in eval mode stays caught."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from lightning_triage import StructureProbe
from tests.callbacks.coupled_models import RECIPES, Coupled, coupled_loader
from tests.helpers import make_trainer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _probe(tmp_path: Path, recipe: str, bug: str | None = None) -> StructureProbe:
    pl.seed_everything(0, verbose=False)
    probe = StructureProbe(strict=True)
    make_trainer(tmp_path, [probe], limit_train_batches=2).fit(Coupled(recipe, bug),
                                                               coupled_loader(recipe))
    return probe


@pytest.mark.parametrize("recipe", RECIPES)
def test_coupled_by_design_is_info(tmp_path: Path, recipe: str) -> None:
    probe = _probe(tmp_path, recipe)
    (said,) = probe.findings
    assert said.code == "structure.batch_mixing" and said.severity == "info", said
    assert said.evidence["by_design"] is True
    assert "coupled by design" in said.message and "not batch mixing" in said.message
    expected_pairs = {"clip": [[16, 16]], "simclr": [[32, 32]]}.get(recipe, [])
    assert said.evidence["in_batch_pairs"] == expected_pairs
    assert bool(said.evidence["batch_statistics"]) == (recipe in ("vicreg", "barlow", "varcov"))
    assert probe.check_status()["status"] == "passed"


def test_batch_statistics_in_eval_mode_stay_caught(tmp_path: Path) -> None:
    probe = _probe(tmp_path, "varcov", "batch_stats")
    (found,) = probe.findings
    assert found.code == "structure.batch_mixing" and found.severity == "error"
    assert "by_design" not in found.evidence
    assert found.layer == "image.1"


def test_the_run_is_bit_identical_with_and_without_the_probe(tmp_path: Path) -> None:
    states = []
    for with_probe in (True, False):
        pl.seed_everything(0, verbose=False)
        model = Coupled("simclr")
        make_trainer(tmp_path / str(with_probe), [StructureProbe(strict=True)] if with_probe
                     else [], limit_train_batches=2).fit(model, coupled_loader("simclr"))
        states.append(model.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
