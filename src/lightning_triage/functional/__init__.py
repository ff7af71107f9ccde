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
from lightning_triage.functional.nonfinite import (
    Localization,
    TensorStats,
    all_finite,
    dtype_max,
    localize_nonfinite,
    max_abs,
    nonfinite_examples,
    overflow_ratio,
    tensor_stats,
)
from lightning_triage.functional.series import BoundedSeries

__all__ = [
    "BatchParts",
    "BoundedSeries",
    "ChanceLevel",
    "Localization",
    "TensorStats",
    "all_finite",
    "binary_chance",
    "capture_last_output",
    "chance_level",
    "compare_to_chance",
    "dtype_max",
    "infer_task",
    "localize_nonfinite",
    "max_abs",
    "multiclass_chance",
    "nonfinite_examples",
    "overflow_ratio",
    "prior_entropy",
    "regression_chance",
    "sequence_chance",
    "split_batch",
    "tensor_stats",
]
