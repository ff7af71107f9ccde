"""Lightning callbacks: one per protocol concern, the report, and the ``Triage`` bundle."""

from lightning_triage.callbacks.base import (
    TriageCallback,
)
from lightning_triage.callbacks.batch_inspector import (
    BatchInspector,
)
from lightning_triage.callbacks.eval_mode import (
    EvalModeCheck,
)
from lightning_triage.callbacks.gradient_monitor import (
    GradientMonitor,
)
from lightning_triage.callbacks.gradient_wiring import (
    GradientWiringCheck,
)
from lightning_triage.callbacks.initial_loss import (
    InitialLossCheck,
)
from lightning_triage.callbacks.loss_curve import (
    LossCurveMonitor,
)
from lightning_triage.callbacks.nonfinite_tracer import (
    NonFiniteTracer,
)
from lightning_triage.callbacks.overfit_batch import (
    OverfitBatchCheck,
)
from lightning_triage.callbacks.padding_probe import (
    PaddingProbe,
)
from lightning_triage.callbacks.report import (
    TriageReport,
)
from lightning_triage.callbacks.structure_probe import (
    StructureProbe,
)
from lightning_triage.callbacks.triage import (
    Triage,
)
from lightning_triage.callbacks.update_contracts import (
    UpdateContractCheck,
)
from lightning_triage.callbacks.worst_errors import (
    WorstErrors,
)

__all__ = [
    "BatchInspector",
    "EvalModeCheck",
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
    "TriageReport",
    "UpdateContractCheck",
    "WorstErrors",
]
