"""Deprecated alias of :mod:`lightning_triage.ranking` (a suspicion without a symptom is info).

The ranking policy (suspicions, explanations, the lead) is one module,
:mod:`lightning_triage.ranking`; import from there. This module keeps the names it used to define
for code written against it, and warns.
"""

from __future__ import annotations

import warnings

from lightning_triage.ranking import SUSPICIONS, Suspicion, settle_suspicions

warnings.warn("`lightning_triage.suspicions` is deprecated: import from `lightning_triage.ranking`.",
              DeprecationWarning, stacklevel=2)

__all__ = ["SUSPICIONS", "Suspicion", "settle_suspicions"]
