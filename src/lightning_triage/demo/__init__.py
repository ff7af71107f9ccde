"""The demo: small real models trained on digits with ``Triage()`` attached, healthy and broken.

Run it with ``python -m lightning_triage demo`` (needs the ``demo`` extra).
"""

from __future__ import annotations

import shlex
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from rich.console import Console
from rich.table import Table

from lightning_triage.callbacks.triage import Triage
from lightning_triage.demo.broken import broken_run
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from lightning_triage.demo.scenario import Builder, Scenario


def _digits(**model_kwargs: Any) -> Builder:
    def build() -> tuple[pl.LightningModule, Any, Any]:
        train, val = digits_loaders()
        return DigitsMLP(**model_kwargs), train, val

    return build


#: The broken runs of the registry (:data:`~lightning_triage.demo.broken.BROKEN_RUNS`) that the
#: demo shows, between its two healthy runs.
DEMO_RUNS = ("raw-pixels", "scaled-logits", "detached-encoder", "future-mask-lm", "lr-50",
             "log-softmax-loss")

SCENARIOS: list[Scenario] = [
    Scenario("healthy", "standardized digits, 64-32-10 MLP, SGD lr 0.1", None, _digits(lr=0.1)),
    *(broken_run(name) for name in DEMO_RUNS),
    Scenario("lr-good", "the MLP at a good learning rate (Adam, lr 3e-3)", None,
             _digits(lr=3e-3, optimizer="adam")),
]


def run_scenario(scenario: Scenario, report_root: Path, console: Console,
                 seed: int = 0) -> dict[str, Any] | None:
    """Train one scenario with ``Triage()`` attached (everything seeded with ``seed``); return
    its report."""
    console.rule(f"[bold]{scenario.name}[/bold]: {scenario.story}")
    console.print(f"expected: [bold]{scenario.expect or 'no problem'}[/bold]", highlight=False)
    pl.seed_everything(seed, verbose=False)
    model, train, val = scenario.build()
    triage = Triage(report_dir=report_root / scenario.name, **scenario.triage_kwargs)
    trainer = pl.Trainer(
        max_epochs=scenario.max_epochs, callbacks=[triage], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=report_root / scenario.name, **scenario.trainer_kwargs,
    )
    try:
        trainer.fit(model, train, val)
    except Exception as exc:  # a broken scenario may crash: its report was written anyway
        console.print(f"[red]fit raised {type(exc).__name__}: {exc}[/red]", highlight=False)
    return triage.report.report


def caught(scenario: Scenario, report: dict[str, Any] | None) -> bool:
    """Whether a scenario's report shows what it demonstrates (healthy: nothing to fix)."""
    if report is None:
        return False
    if scenario.expect is None:
        return report["start_here"] is None
    return any(f["code"] == scenario.expect for f in report["findings"])


def verdict(scenario: Scenario, report: dict[str, Any] | None) -> str:
    """``"leads"`` (the report starts with what the scenario demonstrates, or a healthy run has
    nothing to fix), ``"shown"`` (present, not first) or ``"missed"``."""
    if report is None or not caught(scenario, report):
        return "missed"
    return "leads" if report["start_here"] == scenario.expect else "shown"


def _shown(path: Path, cwd: Path) -> str:
    """``path`` (absolute) relative to ``cwd`` when it is below it (what a reader types)."""
    return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)


def next_steps(report_root: str | Path, names: Sequence[str],
               executable: str | Path | None = None, cwd: str | Path | None = None) -> str:
    """What to type after the demo: open one run's HTML report in a browser, and read it again
    with the command line, both through the Python environment that ran the demo (``make demo``
    leaves its virtual environment inactive, so a bare ``lightning-triage`` may not be found).

    The run shown is ``lr-50`` when it ran, else the first broken scenario that ran. Relative
    paths are taken from ``cwd`` (default: the working directory).

    Example:
        >>> print(next_steps("runs/demo", ["healthy", "lr-50"], "/src/lt/.venv/bin/python",
        ...                  cwd="/src/lt"))
        Next:
          1. open the HTML report of the lr-50 run in a browser:
             .venv/bin/python -m webbrowser file:///src/lt/runs/demo/lr-50/triage_report.html
          2. read it with the command line, through the environment that ran the demo:
             .venv/bin/python -m lightning_triage show runs/demo/lr-50
    """
    from lightning_triage.report.files import HTML_NAME

    here = Path(cwd or Path.cwd()).absolute()
    broken = [n for n in names if n == "lr-50"] + [
        s.name for s in SCENARIOS if s.name in names and s.expect is not None]
    name = (broken or list(names) or ["lr-50"])[0]
    run_dir = here / report_root / name
    python = here / (executable or sys.executable)
    script = python.with_name("lightning-triage")  # the console script beside the interpreter
    cli = [_shown(script, here)] if script.exists() else [_shown(python, here), "-m",
                                                          "lightning_triage"]
    lines = [
        "Next:",
        f"  1. open the HTML report of the {name} run in a browser:",
        f"     {shlex.join([_shown(python, here), '-m', 'webbrowser', (run_dir / HTML_NAME).as_uri()])}",
        "  2. read it with the command line, through the environment that ran the demo:",
        f"     {shlex.join([*cli, 'show', _shown(run_dir, here)])}",
    ]
    if (here / "examples" / "train.py").exists():  # a clone of the repository: its example
        lines += ["     or train the example project the same way (README, \"Reading the report\"):",
                  f"     {shlex.join([_shown(python, here), '-m', 'examples.train', '--lr', '50'])}"]
    return "\n".join(lines)


def run_demo(names: Sequence[str] | None = None, report_root: str | Path | None = None) -> int:
    """Run the demo scenarios (all, or those named), print their reports and a summary.

    Returns 0 when every scenario's report shows what it demonstrates, else 1.
    """
    console = Console()
    chosen = [s for s in SCENARIOS if not names or s.name in names]
    unknown = set(names or ()) - {s.name for s in SCENARIOS}
    if unknown:
        console.print(f"unknown scenario(s) {sorted(unknown)}; have {[s.name for s in SCENARIOS]}",
                      markup=False, highlight=False)
        return 2
    root = Path(report_root) if report_root else Path(tempfile.mkdtemp(prefix="triage-demo-"))
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reports say it all; keep the demo readable
        for scenario in chosen:
            results.append((scenario, run_scenario(scenario, root, console)))
    # codes never wrap: at 80 columns the table keeps one line per scenario
    table = Table(title="summary: does each report start with its bug?",
                  show_header=True, header_style="bold")
    table.add_column("scenario", no_wrap=True)
    table.add_column("start here", no_wrap=True)
    table.add_column("as expected", no_wrap=True)
    marks = {"leads": "[green]yes[/green]", "shown": "[yellow]shown, not first[/yellow]",
             "missed": "[red]MISSED[/red]"}
    for scenario, report in results:
        start = "no report" if report is None else (report["start_here"] or "- (nothing to fix)")
        table.add_row(scenario.name, start, marks[verdict(scenario, report)])
    console.print(table)
    console.print(f"reports written under {root}", highlight=False)
    console.print(next_steps(root, [s.name for s in chosen]), highlight=False, markup=False,
                  soft_wrap=True)
    return 0 if all(caught(s, r) for s, r in results) else 1
