"""The demo: small real models trained on digits with ``Triage()`` attached, healthy and broken.

Run it with ``python -m lightning_triage demo`` (needs the ``demo`` extra).
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from rich.console import Console

from lightning_triage.callbacks.triage import Triage
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from lightning_triage.demo.numerics import log_softmax_scenario
from lightning_triage.demo.sequences import TinyLM, random_token_loaders
from lightning_triage.demo.wiring import DetachedEncoderMLP


@dataclass(frozen=True)
class Scenario:
    """One demo run: a model and its loaders, what is wrong with it, and what to expect."""

    name: str
    story: str
    expect: str
    build: Callable[[], tuple[pl.LightningModule, Any, Any]]
    max_epochs: int = 2
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    triage_kwargs: dict[str, Any] = field(default_factory=dict)


def _digits(**model_kwargs: Any) -> Callable[[], tuple[pl.LightningModule, Any, Any]]:
    def build() -> tuple[pl.LightningModule, Any, Any]:
        train, val = digits_loaders()
        return DigitsMLP(**model_kwargs), train, val

    return build


def _raw_digits(**model_kwargs: Any) -> Callable[[], tuple[pl.LightningModule, Any, Any]]:
    def build() -> tuple[pl.LightningModule, Any, Any]:
        train, val = digits_loaders(standardize=False)
        return DigitsMLP(**model_kwargs), train, val

    return build


def _detached_encoder() -> tuple[pl.LightningModule, Any, Any]:
    train, val = digits_loaders()
    return DetachedEncoderMLP(lr=0.1), train, val


def _future_mask_lm() -> tuple[pl.LightningModule, Any, Any]:
    train, val = random_token_loaders()
    return TinyLM(mask="future"), train, val


SCENARIOS: list[Scenario] = [
    Scenario("healthy", "standardized digits, 64-32-10 MLP, SGD lr 0.1",
             "no problems", _digits(lr=0.1)),
    Scenario("scaled-logits", "the same MLP with its logits multiplied by 100",
             "init.loss_above_chance", _digits(lr=0.1, logit_scale=100.0)),
    Scenario("raw-pixels", "digits left as raw 0-16 pixels (not standardized), SGD lr 0.5",
             "data.unnormalized_input", _raw_digits(lr=0.5)),
    Scenario("detached-encoder", "the MLP's encoder output is `.detach()`ed: only the head "
             "trains, on random features", "wiring.no_grad_params", _detached_encoder),
    Scenario("future-mask-lm", "a 1-layer transformer LM on pure random tokens whose attention "
             "mask shows the future (no `causal` argument: the next-token data says it must be "
             "causal); its loss falls far below ln 16 = 2.77", "structure.causal_leak",
             _future_mask_lm),
    Scenario("log-softmax-loss", "the MLP trained with a hand-written `-log(softmax(z))` loss, "
             "SGD lr 2.0: the logits spread until the softmax underflows to 0",
             "numerics.nonfinite_loss", log_softmax_scenario, max_epochs=3),
    Scenario("lr-50", "the same MLP trained with SGD at lr 50 (the loss overflows in a few steps)",
             "curve.diverging", _digits(lr=50.0)),
    Scenario("lr-good", "the same MLP at a good learning rate (Adam, lr 3e-3)",
             "no problems (curve.healthy)", _digits(lr=3e-3, optimizer="adam")),
]


def run_scenario(scenario: Scenario, report_root: Path, console: Console) -> dict[str, Any] | None:
    """Train one scenario with ``Triage()`` attached; return its report."""
    console.rule(f"[bold]{scenario.name}[/bold]: {scenario.story}")
    console.print(f"expected: [bold]{scenario.expect}[/bold]", highlight=False)
    pl.seed_everything(0, verbose=False)
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


def run_demo(names: Sequence[str] | None = None, report_root: str | Path | None = None) -> int:
    """Run the demo scenarios (all, or those named) and print their reports."""
    console = Console()
    chosen = [s for s in SCENARIOS if not names or s.name in names]
    unknown = set(names or ()) - {s.name for s in SCENARIOS}
    if unknown:
        console.print(f"unknown scenario(s) {sorted(unknown)}; have {[s.name for s in SCENARIOS]}")
        return 2
    root = Path(report_root) if report_root else Path(tempfile.mkdtemp(prefix="triage-demo-"))
    summary = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reports say it all; keep the demo readable
        for scenario in chosen:
            report = run_scenario(scenario, root, console)
            summary.append((scenario, report["start_here"] if report else "no report"))
    console.rule("[bold]summary[/bold]")
    for scenario, got in summary:
        console.print(f"{scenario.name:>16}: start here = {got or 'nothing (healthy)'}"
                      f"   (expected: {scenario.expect})", highlight=False)
    console.print(f"reports written under {root}", highlight=False)
    return 0
