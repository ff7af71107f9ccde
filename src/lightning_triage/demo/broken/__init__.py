"""The registry of broken runs: one list, :data:`BROKEN_RUNS`, shared by the demo, the gallery
(``docs/make_gallery.py``) and the tests.

Each entry is a :class:`~lightning_triage.demo.Scenario`: a real ``Trainer.fit`` on a small
data set (scikit-learn's digits or diabetes, or random tokens) with one bug put in, the finding
code it demonstrates (``expect``), its
fixed twin (the same run with the bug removed, which
must not report that code) and, for the causes of issue 14, ``lead`` (the report must start
with the code). The modules follow the protocol's stages; the bugs of the healthy-recipe corpus
(issue 41) come last, in ``recipes``. Needs the ``demo`` extra.

A new check's broken run goes here, in its stage's module (see "Adding a check" in
``docs/design.md``).
"""

from __future__ import annotations

from lightning_triage.demo.broken.curves import CURVE_RUNS
from lightning_triage.demo.broken.data import DATA_RUNS
from lightning_triage.demo.broken.mode import MODE_RUNS
from lightning_triage.demo.broken.numerics import NUMERICS_RUNS
from lightning_triage.demo.broken.overfit import OVERFIT_RUNS, REFUTED_LEAD_RUNS
from lightning_triage.demo.broken.recipes import RECIPE_RUNS
from lightning_triage.demo.broken.structure import STRUCTURE_RUNS
from lightning_triage.demo.broken.wiring import WIRING_RUNS
from lightning_triage.demo.scenario import Scenario

#: Every broken run, in the protocol's order of stages.
BROKEN_RUNS: list[Scenario] = [*DATA_RUNS, *WIRING_RUNS, *OVERFIT_RUNS, *STRUCTURE_RUNS,
                               *MODE_RUNS, *NUMERICS_RUNS, *CURVE_RUNS, *RECIPE_RUNS]

#: The runs whose report must lead with the code they demonstrate (issue 14's causes).
LEAD_RUNS: list[Scenario] = [s for s in BROKEN_RUNS if s.lead]


def broken_run(name: str) -> Scenario:
    """The broken run called ``name``.

    Raises:
        KeyError: for a name the registry does not have, listing those it has.
    """
    for scenario in BROKEN_RUNS:
        if scenario.name == name:
            return scenario
    raise KeyError(f"no broken run {name!r}; have {[s.name for s in BROKEN_RUNS]}")


__all__ = ["BROKEN_RUNS", "LEAD_RUNS", "REFUTED_LEAD_RUNS", "Scenario", "broken_run"]
