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
from lightning_triage.functional.mode import mode_sensitive_in_training
from lightning_triage.functional.overfit import (
    CurveVerdict,
    batch_size_of,
    judge_curve,
    near_zero_target,
    plateaued,
    probability_floor,
    slice_batch,
)
from lightning_triage.functional.series import BoundedSeries
from lightning_triage.functional.wiring import (
    ModuleGroup,
    WiringResult,
    analyze_wiring,
    describe_groups,
    group_by_module,
    inspect_gradients,
)

__all__ = [
    "BatchParts",
    "BoundedSeries",
    "ChanceLevel",
    "CurveVerdict",
    "ModuleGroup",
    "WiringResult",
    "analyze_wiring",
    "batch_size_of",
    "binary_chance",
    "capture_last_output",
    "chance_level",
    "compare_to_chance",
    "describe_groups",
    "group_by_module",
    "infer_task",
    "inspect_gradients",
    "judge_curve",
    "mode_sensitive_in_training",
    "multiclass_chance",
    "near_zero_target",
    "plateaued",
    "prior_entropy",
    "probability_floor",
    "regression_chance",
    "sequence_chance",
    "slice_batch",
    "split_batch",
]
