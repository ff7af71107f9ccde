"""Lightning callbacks: one per protocol concern, the report, and the ``Triage`` bundle."""

from lightning_triage.callbacks.base import TriageCallback
from lightning_triage.callbacks.gradient_monitor import GradientMonitor
from lightning_triage.callbacks.initial_loss import InitialLossCheck
from lightning_triage.callbacks.loss_curve import LossCurveMonitor
from lightning_triage.callbacks.report import TriageReport
from lightning_triage.callbacks.triage import Triage

__all__ = [
    "GradientMonitor",
    "InitialLossCheck",
    "LossCurveMonitor",
    "Triage",
    "TriageCallback",
    "TriageReport",
]
