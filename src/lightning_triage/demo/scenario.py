"""One broken (or healthy) training run: its model and loaders, what is wrong with it, the finding
code it demonstrates and its fixed twin. The demo, the gallery and the tests share these."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl

#: Builds one run: ``() -> (model, train_loader, val_loader)``, called after seeding.
Builder = Callable[[], tuple[pl.LightningModule, Any, Any]]


@dataclass(frozen=True)
class Scenario:
    """One run: a model and its loaders, what is wrong with it, and the finding code it
    demonstrates (``None`` for a healthy run, which must have no "start here").

    Args:
        name: a slug (``python -m lightning_triage demo NAME``).
        story: what is wrong, in a few words (the gallery prints "run: STORY").
        expect: the finding code the run demonstrates; ``None`` for a healthy run.
        build: the broken run.
        max_epochs: the fit's epochs.
        trainer_kwargs: further ``Trainer`` arguments (``precision``, ``gradient_clip_val``).
        triage_kwargs: ``Triage`` arguments (``task``).
        fixed: the fixed twin: the same run with the bug removed (``None``: the same builder,
            with ``fixed_trainer_kwargs`` / ``fixed_triage_kwargs`` as the fix).
        fixed_trainer_kwargs: what the fix changes in ``trainer_kwargs``.
        fixed_triage_kwargs: what the fix changes in ``triage_kwargs``.
        lead: the report must start with ``expect`` and explain the symptoms by it (a cause of
            ``tests/scenarios/test_leads.py``).
        full_fix: the fixed twin reports no warning and no error at all; ``False`` where it only
            loses ``expect`` (another bug of the story stays, as the raw pixels of a run whose
            precision is fixed, or the fixed run is weak in its own right).
    """

    name: str
    story: str
    expect: str | None
    build: Builder
    max_epochs: int = 2
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    triage_kwargs: dict[str, Any] = field(default_factory=dict)
    fixed: Builder | None = None
    fixed_trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    fixed_triage_kwargs: dict[str, Any] = field(default_factory=dict)
    lead: bool = False
    full_fix: bool = True

    @property
    def has_twin(self) -> bool:
        """Whether the run has a fixed twin (a builder or a change of its options)."""
        return (self.fixed is not None or bool(self.fixed_trainer_kwargs)
                or bool(self.fixed_triage_kwargs))

    def twin(self) -> Scenario:
        """The fixed twin as a healthy scenario of its own (``expect`` ``None``).

        Raises:
            ValueError: when the run has no twin.
        """
        if not self.has_twin:
            raise ValueError(f"scenario {self.name!r} has no fixed twin")
        return dataclasses.replace(
            self, name=f"{self.name}-fixed", expect=None, build=self.fixed or self.build,
            trainer_kwargs={**self.trainer_kwargs, **self.fixed_trainer_kwargs},
            triage_kwargs={**self.triage_kwargs, **self.fixed_triage_kwargs},
            fixed=None, fixed_trainer_kwargs={}, fixed_triage_kwargs={}, lead=False)
