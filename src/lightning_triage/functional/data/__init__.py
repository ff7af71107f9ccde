"""The data stage's functional core: batch statistics, fingerprints, class counts, train/val
shift, a label-misalignment probe, and the rules that turn them into verdicts.

Pure functions over tensors (no Lightning). Nothing here consumes the global RNG: the
misalignment probe draws its permutations from a private, seeded ``torch.Generator``.

Modules: :mod:`~.inputs` (summaries, finiteness, scale, constancy), :mod:`~.duplicates`
(fingerprints: repeated batches, duplicate examples, train/val overlap), :mod:`~.labels`
(target range, imbalance, label misalignment), :mod:`~.shift` (train/val shift).
"""

from lightning_triage.functional.data.duplicates import (
    FingerprintStore,
    batch_fingerprint,
    duplicate_stats,
    example_fingerprints,
)
from lightning_triage.functional.data.inputs import (
    CHUNK_ELEMENTS,
    FEATURES,
    MAX_SUMMARY_ELEMENTS,
    TINY_MIN_FEATURES,
    TensorSummary,
    batch_picture,
    constant_across_batch,
    far_below_unit_scale,
    first_nonfinite_example,
    flat_features,
    is_class_target,
    is_float,
    scale_verdict,
    summarize_tensor,
)
from lightning_triage.functional.data.labels import (
    Imbalance,
    LabelSignal,
    RangeCheck,
    class_counts,
    class_imbalance,
    label_signal,
    target_range,
)
from lightning_triage.functional.data.shift import (
    FeatureExtremes,
    FeatureMoments,
    Outlier,
    Shift,
    input_shift,
    val_outlier,
)

__all__ = [
    "CHUNK_ELEMENTS",
    "FEATURES",
    "MAX_SUMMARY_ELEMENTS",
    "TINY_MIN_FEATURES",
    "FeatureExtremes",
    "FeatureMoments",
    "FingerprintStore",
    "Imbalance",
    "LabelSignal",
    "Outlier",
    "RangeCheck",
    "Shift",
    "TensorSummary",
    "batch_fingerprint",
    "batch_picture",
    "class_counts",
    "class_imbalance",
    "constant_across_batch",
    "duplicate_stats",
    "example_fingerprints",
    "far_below_unit_scale",
    "first_nonfinite_example",
    "flat_features",
    "input_shift",
    "is_class_target",
    "is_float",
    "label_signal",
    "scale_verdict",
    "summarize_tensor",
    "target_range",
    "val_outlier",
]
