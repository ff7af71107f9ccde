"""lightning-triage: PyTorch Lightning callbacks that debug training runs while they train.

The callbacks (they need Lightning and torch) load on first use, so the command line and the
report helpers (:mod:`lightning_triage.report`, :mod:`lightning_triage.testing`) start fast.

Example:
    >>> from lightning.pytorch import Trainer
    >>> from lightning_triage import Triage
    >>> trainer = Trainer(callbacks=[Triage()])"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_triage._version import __version__
from lightning_triage.errors import TriageConfigError, TriageReportError
from lightning_triage.findings import (
    CODES,
    STAGES,
    Finding,
)
from lightning_triage.report.build import TriageGateError

if TYPE_CHECKING:  # the callbacks' names, for type checkers (`callbacks.__all__`)
    from lightning_triage.callbacks import *  # noqa: F403


def __getattr__(name: str) -> Any:
    """The names of :data:`__all__` not defined here come from :mod:`lightning_triage.callbacks`
    (Lightning and torch), imported on first access (PEP 562)."""
    if name in __all__:
        from lightning_triage import callbacks

        value = getattr(callbacks, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lightning_triage' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "CODES",
    "STAGES",
    "AutocastCheck",
    "BaselineCheck",
    "BatchInspector",
    "DataLoaderCheck",
    "EvalContractCheck",
    "EvalModeCheck",
    "Finding",
    "GradientMonitor",
    "GradientWiringCheck",
    "InitialLossCheck",
    "LossCurveMonitor",
    "MetricSyncCheck",
    "NonFiniteTracer",
    "OverfitBatchCheck",
    "PaddingProbe",
    "RankDataCheck",
    "ReplicaCheck",
    "StructureProbe",
    "Triage",
    "TriageCallback",
    "TriageConfigError",
    "TriageGateError",
    "TriageReport",
    "TriageReportError",
    "UpdateContractCheck",
    "WorstErrors",
    "__version__",
]
