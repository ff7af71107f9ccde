"""The one list of checks (private): :data:`CHECKS`, re-exported by
:mod:`lightning_triage.callbacks`. Its own module so that the ``Triage`` bundle, which builds its
members from it, imports it without a circle through the package's ``__init__``."""

from __future__ import annotations

from lightning_triage.callbacks.autocast_check import AutocastCheck
from lightning_triage.callbacks.base import TriageCallback
from lightning_triage.callbacks.baseline_check import BaselineCheck
from lightning_triage.callbacks.batch_inspector import BatchInspector
from lightning_triage.callbacks.dataloader_check import DataLoaderCheck
from lightning_triage.callbacks.eval_contract import EvalContractCheck
from lightning_triage.callbacks.eval_mode import EvalModeCheck
from lightning_triage.callbacks.gradient_monitor import GradientMonitor
from lightning_triage.callbacks.gradient_wiring import GradientWiringCheck
from lightning_triage.callbacks.initial_loss import InitialLossCheck
from lightning_triage.callbacks.loss_curve import LossCurveMonitor
from lightning_triage.callbacks.metric_sync import MetricSyncCheck
from lightning_triage.callbacks.nonfinite_tracer import NonFiniteTracer
from lightning_triage.callbacks.overfit_batch import OverfitBatchCheck
from lightning_triage.callbacks.padding_probe import PaddingProbe
from lightning_triage.callbacks.rank_data import RankDataCheck
from lightning_triage.callbacks.replica_check import ReplicaCheck
from lightning_triage.callbacks.structure_probe import StructureProbe
from lightning_triage.callbacks.update_contracts import UpdateContractCheck
from lightning_triage.callbacks.worst_errors import WorstErrors

#: Every check of the package, in protocol order: the one list of checks. The ``Triage`` bundle
#: builds them in this order (a test holds it to it); the HTML report's stage rows, the
#: configuration reference and the docs' code tables read their ``stage`` and ``codes``.
CHECKS: tuple[type[TriageCallback], ...] = (
    BatchInspector,
    DataLoaderCheck,
    RankDataCheck,
    WorstErrors,
    InitialLossCheck,
    GradientWiringCheck,
    UpdateContractCheck,
    ReplicaCheck,
    OverfitBatchCheck,
    StructureProbe,
    PaddingProbe,
    EvalModeCheck,
    EvalContractCheck,
    MetricSyncCheck,
    LossCurveMonitor,
    BaselineCheck,
    GradientMonitor,
    AutocastCheck,
    NonFiniteTracer,
)
