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
from lightning_triage.functional.hooks import capture_last_output
from lightning_triage.functional.series import BoundedSeries
from lightning_triage.functional.structure import (
    BatchDependence,
    CausalDependence,
    LossWatch,
    OutputChange,
    batch_mixing,
    broadcast_mismatch,
    causal_leak,
    is_next_token,
    output_change,
    redraw_targets,
)

__all__ = [
    "BatchDependence",
    "BatchParts",
    "BoundedSeries",
    "CausalDependence",
    "ChanceLevel",
    "LossWatch",
    "OutputChange",
    "batch_mixing",
    "binary_chance",
    "broadcast_mismatch",
    "capture_last_output",
    "causal_leak",
    "chance_level",
    "compare_to_chance",
    "infer_task",
    "is_next_token",
    "multiclass_chance",
    "output_change",
    "prior_entropy",
    "redraw_targets",
    "regression_chance",
    "sequence_chance",
    "split_batch",
]
