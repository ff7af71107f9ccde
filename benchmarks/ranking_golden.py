"""Record, or check against the record, what the report says on every demo, cause and healthy
scenario: each finding's code, severity, step, layer and ``explained_by``, and ``start_here``.

A refactor of the checks, the bundle or the ranking must leave these identical. The record
(``tests/golden/ranking_scenarios.json``) also keeps each run's findings as the checks held them
before the report ranked them, so ``tests/test_ranking_golden.py`` replays the ranking on them
in the suite at no training cost.

Usage (from the repository root; real ``Trainer.fit`` runs, a few minutes on two cores)::

    PYTHONPATH=src python benchmarks/ranking_golden.py            # compare with the record
    PYTHONPATH=src python benchmarks/ranking_golden.py --record   # write the record anew
    PYTHONPATH=src python benchmarks/ranking_golden.py --only lr-0 mixup
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from rich.console import Console

from lightning_triage import Triage
from lightning_triage.callbacks.report import collect_checks
from lightning_triage.demo import SCENARIOS, Scenario, run_scenario
from lightning_triage.demo.broken import LEAD_RUNS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' scenarios

from tests.scenarios.healthy import HEALTHY  # noqa: E402

RECORD = ROOT / "tests" / "golden" / "ranking_scenarios.json"


def summary(report: dict[str, Any] | None) -> dict[str, Any]:
    """What must not change: the lead, and each finding's code, severity, step, layer and
    ``explained_by`` in report order."""
    if report is None:
        return {"start_here": None, "findings": None}
    return {"start_here": report["start_here"],
            "findings": [[f["code"], f["severity"], f["global_step"], f["layer"],
                          list(f["explained_by"])] for f in report["findings"]]}


def _raw(trainer: pl.Trainer, report: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The findings the checks hold after the fit, as they were before the report ranked them,
    with the ``remedy`` block the report's trial gave the lead (the ranking reads it)."""
    raw = [f.to_dict() for c in collect_checks(trainer.callbacks) for f in c.findings]
    for tried in (f for f in (report or {}).get("findings", []) if "remedy" in f):
        for f in raw:
            if all(f[k] == tried[k] for k in ("code", "global_step", "layer", "check")):
                f["remedy"] = tried["remedy"]
    return raw


def _demo(scenario: Scenario, root: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    # a long probe budget, as the lead tests: a loaded machine must not skip the probe
    slow_ok = dataclasses.replace(
        scenario, triage_kwargs={"overfit_time_budget": 120.0, **scenario.triage_kwargs})
    seen: list[pl.Trainer] = []
    original = pl.Trainer.fit

    def fit(self: pl.Trainer, *args: Any, **kwargs: Any) -> Any:
        seen.append(self)
        return original(self, *args, **kwargs)

    pl.Trainer.fit = fit  # type: ignore[method-assign]
    try:
        report = run_scenario(slow_ok, root, Console(quiet=True))
    finally:
        pl.Trainer.fit = original  # type: ignore[method-assign]
    return report, _raw(seen[-1], report)


def _healthy(build: Callable[[int], Any], root: Path) -> tuple[dict[str, Any] | None,
                                                               list[dict[str, Any]]]:
    pl.seed_everything(1, verbose=False)  # as tests/scenarios/test_healthy.py
    model, train, val, kwargs = build(1)
    triage = Triage(report_dir=root, verbose=False, overfit_time_budget=120.0)
    trainer = pl.Trainer(callbacks=[triage], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=root, accelerator="cpu", **kwargs)
    trainer.fit(model, train, val)
    return triage.report.report, _raw(trainer, triage.report.report)


def run_all(only: Sequence[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        jobs: list[tuple[str, Callable[[Path], Any]]] = [
            *((s.name, lambda root, s=s: _demo(s, root)) for s in (*SCENARIOS, *LEAD_RUNS)),
            *((f"healthy/{name}", lambda root, b=b: _healthy(b, root))
              for name, b in HEALTHY.items())]
        for name, job in jobs:
            if only and name not in only and name.removeprefix("healthy/") not in only:
                continue
            report, raw = job(Path(tmp) / name)
            out[name] = {**summary(report), "raw": raw}
            print(f"{name:28s} start_here={out[name]['start_here']}", flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", help="write the record anew")
    parser.add_argument("--only", nargs="*", default=[], help="scenario names")
    args = parser.parse_args(argv)
    now = run_all(args.only)
    if args.record:
        RECORD.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(now)} scenarios in {RECORD.relative_to(ROOT)}")
        return 0
    before = json.loads(RECORD.read_text())
    differ = [name for name in now
              if {k: v for k, v in now[name].items() if k != "raw"}
              != {k: v for k, v in before.get(name, {}).items() if k != "raw"}]
    for name in differ:
        if name not in before:  # a scenario added since the record
            print(f"NEW {name}: {now[name]['findings']} -> {now[name]['start_here']}")
            continue
        print(f"DIFFERS {name}:\n  before {before[name]['findings']} -> {before[name]['start_here']}"
              f"\n  after  {now[name]['findings']} -> {now[name]['start_here']}")
    print(f"{len(now) - len(differ)} of {len(now)} scenarios identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
