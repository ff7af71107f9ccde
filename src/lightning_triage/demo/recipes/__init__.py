"""A corpus of healthy recipes of modern training (issue 41): one list,
:data:`HEALTHY_RECIPES`, each a tiny CPU fit on synthetic or scikit-learn data that
``Triage()`` must leave without a warning or an error. ``tests/scenarios/test_recipes.py`` fits
them (one seed by default, three when slow tests run) and ``benchmarks/recipes.py`` prints the
false-alarm rate per recipe. Their bugs are broken runs of the registry
(:mod:`lightning_triage.demo.broken.recipes`). Needs the ``demo`` extra.
"""

from __future__ import annotations

from lightning_triage.demo.recipes.classify import CLASSIFY_RECIPES
from lightning_triage.demo.recipes.common import FIT, Recipe
from lightning_triage.demo.recipes.contrastive import COUPLED_RECIPES
from lightning_triage.demo.recipes.generative import GENERATIVE_RECIPES
from lightning_triage.demo.recipes.regress import REGRESS_RECIPES
from lightning_triage.demo.recipes.sequence import SEQUENCE_RECIPES

#: Every healthy recipe.
HEALTHY_RECIPES: list[Recipe] = [*CLASSIFY_RECIPES, *REGRESS_RECIPES, *GENERATIVE_RECIPES,
                                 *SEQUENCE_RECIPES, *COUPLED_RECIPES]


def recipe(name: str) -> Recipe:
    """The healthy recipe called ``name``.

    Raises:
        KeyError: for a name the corpus does not have, listing those it has.
    """
    for entry in HEALTHY_RECIPES:
        if entry.name == name:
            return entry
    raise KeyError(f"no recipe {name!r}; have {[r.name for r in HEALTHY_RECIPES]}")


__all__ = ["FIT", "HEALTHY_RECIPES", "Recipe", "recipe"]
