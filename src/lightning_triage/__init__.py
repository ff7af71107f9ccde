"""lightning-triage: PyTorch Lightning callbacks that debug training runs while they train.

Example:
    >>> from lightning.pytorch import Trainer
    >>> from lightning_triage import Triage
    >>> trainer = Trainer(callbacks=[Triage()])"""

from lightning_triage.callbacks import (
    BatchInspector,
    EvalModeCheck,
    GradientMonitor,
    GradientWiringCheck,
    InitialLossCheck,
    LossCurveMonitor,
    NonFiniteTracer,
    OverfitBatchCheck,
    PaddingProbe,
    StructureProbe,
    Triage,
    TriageCallback,
    TriageReport,
    UpdateContractCheck,
    WorstErrors,
)
from lightning_triage.errors import TriageConfigError
from lightning_triage.findings import (
    CODES,
    STAGES,
    Finding,
)
from lightning_triage.report import TriageGateError

__version__ = "0.1.0.dev0"

__all__ = [
    "CODES",
    "STAGES",
    "BatchInspector",
    "EvalModeCheck",
    "Finding",
    "GradientMonitor",
    "GradientWiringCheck",
    "InitialLossCheck",
    "LossCurveMonitor",
    "NonFiniteTracer",
    "OverfitBatchCheck",
    "PaddingProbe",
    "StructureProbe",
    "Triage",
    "TriageCallback",
    "TriageConfigError",
    "TriageGateError",
    "TriageReport",
    "UpdateContractCheck",
    "WorstErrors",
    "__version__",
]
