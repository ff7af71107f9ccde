"""The healthy-recipe corpus (issue 41, `lightning_triage.demo.recipes`): every recipe of modern
training fitted with `Triage(strict=True)` reports no warning and no error, and its weights are
bit-identical with and without `Triage()` (seed 0: the model of the first test's fit is reused).
Seed 0 in the default run, seeds 1-2 marked slow; `benchmarks/recipes.py` prints the false-alarm
rate per recipe (docs/benchmarks.md, "Healthy recipes").

The recipes that raise a false alarm today are marked `xfail(strict=True)` with the codes they
raise (`FALSE_ALARMS`): the mark flips to a failure once the checks learn the objective, and is
removed then."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from lightning_triage import Triage
from lightning_triage.demo.recipes import HEALTHY_RECIPES, Recipe
from tests.helpers import seeds

#: The warnings and errors each recipe still raises (issue 41, seeds 0-2: docs/benchmarks.md,
#: "Healthy recipes"), with the seeds that raise them.
FALSE_ALARMS: dict[str, tuple[str, tuple[int, ...]]] = {}


def fit_recipe(recipe: Recipe, seed: int, root: Path, triage: Triage | None
               ) -> pl.LightningModule:
    """The recipe's model after a seeded fit, with ``triage`` attached (or nothing)."""
    pl.seed_everything(seed, verbose=False)
    model, train, val = recipe.build(seed)
    trainer = pl.Trainer(callbacks=[] if triage is None else [triage], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=root, accelerator="cpu",
                         **recipe.fit_kwargs)
    trainer.fit(model, train, val)
    return model


def problems(recipe: Recipe, seed: int, root: Path, strict: bool = True
             ) -> tuple[list[tuple[str, str, str]], pl.LightningModule]:
    """``(code, severity, message)`` of each warning and error of the recipe's report, and the
    fitted model."""
    triage = Triage(report_dir=root, verbose=False, strict=strict, overfit_time_budget=120.0,
                    **recipe.triage_kwargs)
    model = fit_recipe(recipe, seed, root, triage)
    report = triage.report.report
    assert report is not None, recipe.name
    loud = [(f["code"], f["severity"], f["message"]) for f in report["findings"]
            if f["severity"] != "info"]
    return loud, model


#: The seed-0 models fitted under `Triage(strict=True)` by the first test, reused by the
#: bit-identity test (a recipe whose strict fit raised is fitted again there, not strict).
_TRIAGED: dict[str, dict[str, torch.Tensor]] = {}


def test_the_corpus_is_well_formed() -> None:
    names = [r.name for r in HEALTHY_RECIPES]
    assert len(names) == len(set(names)) >= 30
    assert set(FALSE_ALARMS) <= set(names)


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("recipe", HEALTHY_RECIPES, ids=[r.name for r in HEALTHY_RECIPES])
def test_healthy_recipe_raises_nothing(request: pytest.FixtureRequest, tmp_path: Path,
                                       recipe: Recipe, seed: int) -> None:
    codes, alarmed = FALSE_ALARMS.get(recipe.name, ("", ()))
    if seed in alarmed:  # fails today; the strict mark fails once the false alarm is gone
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"issue 41: {codes}"))
    loud, model = problems(recipe, seed, tmp_path)
    if seed == 0:
        _TRIAGED[recipe.name] = model.state_dict()
    assert loud == [], loud


@pytest.mark.parametrize("recipe", HEALTHY_RECIPES, ids=[r.name for r in HEALTHY_RECIPES])
def test_weights_are_bit_identical_with_and_without_triage(tmp_path: Path,
                                                           recipe: Recipe) -> None:
    if recipe.name in _TRIAGED:
        with_triage = _TRIAGED[recipe.name]
    else:
        triage = Triage(report_dir=tmp_path / "a", verbose=False, overfit_time_budget=120.0,
                        **recipe.triage_kwargs)
        with_triage = fit_recipe(recipe, 0, tmp_path / "a", triage).state_dict()
    without = fit_recipe(recipe, 0, tmp_path / "b", None).state_dict()
    assert with_triage.keys() == without.keys()
    for key in with_triage:
        assert torch.equal(with_triage[key], without[key]), key
