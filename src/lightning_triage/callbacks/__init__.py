"""Lightning callbacks: one per protocol concern, the report, and the ``Triage`` bundle."""

from lightning_triage.callbacks._checks import CHECKS  # the one list of checks
from lightning_triage.callbacks.autocast_check import (
    AutocastCheck,
)
from lightning_triage.callbacks.base import (
    TriageCallback,
)
from lightning_triage.callbacks.baseline_check import (
    BaselineCheck,
)
from lightning_triage.callbacks.batch_inspector import (
    BatchInspector,
)
from lightning_triage.callbacks.dataloader_check import (
    DataLoaderCheck,
)
from lightning_triage.callbacks.eval_contract import (
    EvalContractCheck,
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
from lightning_triage.callbacks.metric_sync import (
    MetricSyncCheck,
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
from lightning_triage.callbacks.rank_data import (
    RankDataCheck,
)
from lightning_triage.callbacks.replica_check import (
    ReplicaCheck,
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


def code_owners() -> dict[str, list[str]]:
    """Which classes declare (own) each finding code: the checks of :data:`CHECKS`, the report
    (``run.*``) and the base class (``triage.check_error``, reported by any check). Each code
    of the registry has exactly one owner (a test holds it).

    Example:
        >>> code_owners()["mode.train_mode_in_eval"]
        ['EvalModeCheck']
    """
    owners: dict[str, list[str]] = {}
    declarers: tuple[type[TriageCallback] | type[TriageReport], ...] = (
        TriageCallback, *CHECKS, TriageReport)
    for cls in declarers:
        for code in cls.codes:
            owners.setdefault(code, []).append(cls.__name__)
    return owners


def check_stages() -> dict[str, str]:
    """The protocol stage of each check of :data:`CHECKS`, by class name.

    Example:
        >>> check_stages()["PaddingProbe"]
        'structure'
    """
    return {cls.__name__: cls.stage for cls in CHECKS}


__all__ = [
    "CHECKS",
    "AutocastCheck",
    "BaselineCheck",
    "BatchInspector",
    "DataLoaderCheck",
    "EvalContractCheck",
    "EvalModeCheck",
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
    "TriageReport",
    "UpdateContractCheck",
    "WorstErrors",
    "check_stages",
    "code_owners",
]
