"""Deprecated alias of :mod:`lightning_triage.ranking` (cause before symptom and the lead).

The ranking policy (suspicions, explanations, the lead) is one module,
:mod:`lightning_triage.ranking`; import from there. This module keeps the names it used to define
for code written against it, and warns.
"""

from __future__ import annotations

import warnings

from lightning_triage.ranking import MODEST_INPUT, SPIKE_WINDOW, explain_findings, start_here

warnings.warn("`lightning_triage.explain` is deprecated: import from `lightning_triage.ranking`.",
              DeprecationWarning, stacklevel=2)

__all__ = ["MODEST_INPUT", "SPIKE_WINDOW", "explain_findings", "start_here"]
