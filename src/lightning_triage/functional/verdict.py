"""The one result type of the functional core: a :class:`Verdict` is what a rule decided.

The rules of every stage return verdicts (e.g. ``functional.mode.train_mode_in_eval``,
``functional.init_verdicts.initial_loss_verdict``, ``functional.wiring_verdicts``, the update
contracts' ledger ``functional.update_ledger.UpdateLedger``, ``functional.curve_verdicts`` and
the watches ``functional.curve_watch.CurveWatch`` and ``functional.gradient_watch.GradientWatch``,
``functional.worst.worst_errors_verdict``); the callbacks collect the inputs, call the rules and
forward each verdict to the report as a :class:`~lightning_triage.findings.Finding`
(``TriageCallback.add_verdict``), adding what only the run knows (epoch, rank, the check's
name). A verdict's message carries the numbers of this run; the advice (what to do) lives in the
finding registry's ``hint``, so the report never prints it twice.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Verdict:
    """One decision of a rule: a public finding code, where it happened and the numbers.

    Attributes:
        code: a finding code of the registry (``"curve.lr_too_high"``, ``"data.label_noise"``...).
        step: the optimizer step it refers to (``None``: not tied to a step, e.g. a fit-start
            check of the first batch).
        message: what was found, with this run's numbers (no advice: that is the registry's
            hint).
        layer: the module or parameter it points at, when there is one (keyword only).
        evidence: JSON-ready numbers behind the decision (keyword only).
        severity: overrides the registry's severity for this one verdict (keyword only; ``None``,
            the default, keeps the code's own), for a rule whose strength decides it (a batch
            that is all duplicates is an error, a few are a warning).
        hint: overrides the registry's hint for this one verdict (keyword only; ``None`` keeps
            the code's own), for a rule whose direction decides the advice (a loss that falls
            without bound is a sign bug, not a learning rate).

    Example:
        >>> v = Verdict("grad.spike", 40, "gradient norm 80 at step 40, 76x its running median",
        ...             evidence={"ratio": 76.0})
        >>> v.code, v.step, v.layer, v.evidence["ratio"]
        ('grad.spike', 40, None, 76.0)
    """

    code: str
    step: int | None
    message: str
    _: KW_ONLY
    layer: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    severity: Literal["error", "warning", "info"] | None = None
    hint: str | None = None


__all__ = ["Verdict"]
