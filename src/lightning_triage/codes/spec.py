"""What a finding code is: :class:`CodeSpec` and its severities (the remedy kinds are the remedy
table's, :mod:`lightning_triage.codes.remedies`)."""


from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lightning_triage.codes.remedies import REMEDY_KINDS, RemedyKind

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")


@dataclass(frozen=True)
class CodeSpec:
    """What the registry knows of a finding code: its stage, default severity, title, hint and
    when it fires. The registry is the one source of a code: the docs' code tables are generated
    from it (``docs/make_code_tables.py``)."""

    code: str
    severity: Severity
    title: str
    hint: str
    #: When the code fires, in one sentence for the docs (the thresholds are the rule's).
    when: str = ""
    #: How its fix is verified on a copy (a kind of the remedy table,
    #: :data:`~lightning_triage.codes.remedies.REMEDIES`; docs/remedies.md).
    remedy: RemedyKind = "none"

    @property
    def stage(self) -> str:
        return self.code.split(".", 1)[0]


def spec(code: str, severity: Severity, title: str, hint: str, *, when: str = "",
          remedy: RemedyKind = "none") -> CodeSpec:
    return CodeSpec(code, severity, title, hint, when, remedy)


__all__ = ["REMEDY_KINDS", "SEVERITIES", "CodeSpec", "RemedyKind", "Severity", "spec"]
