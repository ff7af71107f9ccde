"""The functional core: pure functions over tensors and numbers, no Trainer needed."""

from lightning_triage.functional.batch import BatchParts, split_batch
from lightning_triage.functional.chance import (
    ChanceLevel,
    binary_chance,
    chance_level,
    compare_to_chance,
    infer_task,
    multiclass_chance,
    prior_entropy,
    regression_chance,
    sequence_chance,
)
from lightning_triage.functional.curve import CurveThresholds, CurveVerdict, classify_curve
from lightning_triage.functional.gradients import (
    GradThresholds,
    GradVerdict,
    classify_gradients,
    grad_norms,
    suggest_clip,
)
from lightning_triage.functional.hooks import capture_last_output
from lightning_triage.functional.series import BoundedSeries
from lightning_triage.functional.spikes import SpikeEvent, SpikeWatch, detect_spikes

__all__ = [
    "BatchParts",
    "BoundedSeries",
    "ChanceLevel",
    "CurveThresholds",
    "CurveVerdict",
    "GradThresholds",
    "GradVerdict",
    "SpikeEvent",
    "SpikeWatch",
    "binary_chance",
    "capture_last_output",
    "chance_level",
    "classify_curve",
    "classify_gradients",
    "compare_to_chance",
    "detect_spikes",
    "grad_norms",
    "infer_task",
    "multiclass_chance",
    "prior_entropy",
    "regression_chance",
    "sequence_chance",
    "split_batch",
    "suggest_clip",
]
