"""The registry of broken runs (`lightning_triage.demo.broken`), one real `Trainer.fit` each:
every broken run reports the code it demonstrates and its fixed twin does not; a twin marked
`full_fix` reports no warning and no error at all, one that is not still reports something (the
second bug its story keeps, which the registry names). Lead runs (issue 14's
causes) also start the report with their code (`test_leads.py` checks their symptoms' `explained_by`).

Two economies keep the file near a minute on two cores: the broken fits of the lead runs and of
the demo's runs and of the runs whose learning-rate lead is refuted are left to `test_leads.py`,
`tests/demo/test_demo.py` and `test_remedy_not_confirmed.py` (which assert that their report
starts with the code, so reports it), and twins that are the same fit (most are the
healthy digits MLP) are fitted once."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest

from lightning_triage import Triage
from lightning_triage.demo import DEMO_RUNS, SCENARIOS
from lightning_triage.demo.broken import BROKEN_RUNS, LEAD_RUNS, REFUTED_LEAD_RUNS, Scenario, broken_run
from lightning_triage.findings import CODES
from tests.helpers import other_seeds


def fit(scenario: Scenario, root: Path, seed: int = 0) -> dict[str, Any]:
    """The scenario's report after a seeded fit (a long overfit-probe budget: a loaded machine
    must not skip the probe, as in `test_leads.py`)."""
    pl.seed_everything(seed, verbose=False)
    model, train, val = scenario.build()
    triage = Triage(report_dir=root, verbose=False,
                    **{"overfit_time_budget": 120.0, **scenario.triage_kwargs})
    trainer = pl.Trainer(max_epochs=scenario.max_epochs, callbacks=[triage], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=root,
                         **scenario.trainer_kwargs)
    try:
        trainer.fit(model, train, val)
    except Exception:  # a broken run may crash (labels out of range): its report is written
        logging.getLogger(__name__).info("%s: the fit raised", scenario.name, exc_info=True)
    report = triage.report.report
    assert report is not None, scenario.name
    return report


#: Broken fits asserted elsewhere to lead with their code (the lead runs, the demo's, and the
#: runs whose learning-rate lead is refuted on a copy): not fitted again here.
LED_ELSEWHERE = {s.name for s in LEAD_RUNS} | set(DEMO_RUNS) | set(REFUTED_LEAD_RUNS)

_TWINS: dict[tuple[Any, ...], dict[str, Any]] = {}


def fit_twin(scenario: Scenario, root: Path) -> dict[str, Any]:
    """The report of the scenario's fixed twin, fitted once per distinct fit (seeded, so the
    same builder with the same options gives the same report)."""
    twin = scenario.twin()
    key = (twin.build, twin.max_epochs, repr(sorted(twin.trainer_kwargs.items())),
           repr(sorted(twin.triage_kwargs.items())))
    if key not in _TWINS:
        _TWINS[key] = fit(twin, root)
    return _TWINS[key]


def test_the_registry_is_well_formed() -> None:
    names = [s.name for s in BROKEN_RUNS]
    assert len(names) == len(set(names)) >= 50
    for scenario in BROKEN_RUNS:
        assert scenario.expect in CODES, scenario.name
        assert scenario.has_twin, f"{scenario.name} has no fixed twin"
    assert {s.name for s in LEAD_RUNS} >= {"lr-0", "deep-sigmoid", "mse-broadcast"}
    assert set(names) >= LED_ELSEWHERE
    # the demo's broken runs are the registry's, between its healthy runs
    assert [s.name for s in SCENARIOS[1:-1]] == list(DEMO_RUNS)
    assert all(s is broken_run(s.name) for s in SCENARIOS[1:-1])
    assert SCENARIOS[0].expect is None and SCENARIOS[-1].expect is None
    with pytest.raises(KeyError, match="no broken run 'nope'"):
        broken_run("nope")


@pytest.mark.parametrize("scenario", BROKEN_RUNS, ids=[s.name for s in BROKEN_RUNS])
def test_broken_run_reports_its_code_and_its_fixed_twin_does_not(tmp_path: Path,
                                                                 scenario: Scenario) -> None:
    if scenario.name not in LED_ELSEWHERE:
        broken = fit(scenario, tmp_path / "broken")
        codes = [f["code"] for f in broken["findings"]]
        assert scenario.expect in codes, (broken["start_here"], codes)
    fixed = fit_twin(scenario, tmp_path / "fixed")
    fixed_codes = [f["code"] for f in fixed["findings"]]
    assert scenario.expect not in fixed_codes, fixed_codes
    loud = [(f["code"], f["severity"]) for f in fixed["findings"] if f["severity"] != "info"]
    if scenario.full_fix:  # nothing to lead with, so no remedy was tried
        assert loud == [] and fixed["start_here"] is None, loud
        assert not any("remedy" in f for f in fixed["findings"]), fixed_codes
    else:  # the registry says what stays: a flag gone stale fails here
        assert loud, fixed_codes


#: Runs whose code rests on the trajectory of a free-running fit (a spike, a gap that grows,
#: the clipping seen over 90 steps), checked on more seeds (the demo's runs: `test_demo.py`).
TRAJECTORY = [broken_run(name) for name in ("lr-3", "wide-mlp-64-examples", "stale-batchnorm",
                                            "clip-1e-4", "shuffled-labels", "dead-relu")]


@pytest.mark.slow
@pytest.mark.parametrize("seed", other_seeds())
@pytest.mark.parametrize("scenario", TRAJECTORY, ids=[s.name for s in TRAJECTORY])
def test_trajectory_runs_hold_on_other_seeds(tmp_path: Path, scenario: Scenario,
                                             seed: int) -> None:
    broken = fit(scenario, tmp_path / "broken", seed)
    assert scenario.expect in [f["code"] for f in broken["findings"]], broken["start_here"]
    fixed = fit(scenario.twin(), tmp_path / "fixed", seed)
    assert scenario.expect not in [f["code"] for f in fixed["findings"]]
