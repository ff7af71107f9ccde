"""The registry's table of finding codes: one :class:`CodeSpec` per public code (stage, default
severity, title, hint, when it fires, how its fix is verified).

Pure Python, no Lightning import. :mod:`lightning_triage.findings` builds the registry
(``CODES``) from :data:`SPECS` and holds the :class:`~lightning_triage.findings.Finding` record;
this package is its table alone, in protocol order: one module per stage (``codes/data.py``...
``codes/run.py``), each a tuple of ``spec(...)`` rows; :mod:`~lightning_triage.codes.spec` says what
a row holds. A new code is one ``spec(...)`` row in its stage's module.

Example:
    >>> next(s for s in SPECS if s.code == "init.loss_above_chance").stage
    'init'
"""

from __future__ import annotations

from lightning_triage.codes import curve as _curve
from lightning_triage.codes import data as _data
from lightning_triage.codes import grad as _grad
from lightning_triage.codes import init as _init
from lightning_triage.codes import mode as _mode
from lightning_triage.codes import numerics as _numerics
from lightning_triage.codes import overfit as _overfit
from lightning_triage.codes import run as _run
from lightning_triage.codes import structure as _structure
from lightning_triage.codes import wiring as _wiring
from lightning_triage.codes.spec import REMEDY_KINDS, SEVERITIES, CodeSpec, RemedyKind, Severity

#: The registered codes, in protocol order (``findings.CODES`` is built from them).
SPECS: tuple[CodeSpec, ...] = (
    *_data.SPECS,
    *_init.SPECS,
    *_wiring.SPECS,
    *_overfit.SPECS,
    *_structure.SPECS,
    *_mode.SPECS,
    *_curve.SPECS,
    *_grad.SPECS,
    *_numerics.SPECS,
    *_run.SPECS,
)

__all__ = ["REMEDY_KINDS", "SEVERITIES", "SPECS", "CodeSpec", "RemedyKind", "Severity"]
