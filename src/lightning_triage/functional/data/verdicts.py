"""The data stage's rules: each turns the statistics of :mod:`~.inputs`, :mod:`~.duplicates`,
:mod:`~.labels` and :mod:`~.shift` into a :class:`~lightning_triage.functional.verdict.Verdict`
(``None``: nothing to report). Messages carry this run's numbers.

The rules do not remember what was reported: the caller reports each finding once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from torch import Tensor

from lightning_triage.functional.data.duplicates import FingerprintStore
from lightning_triage.functional.data.inputs import (
    TensorSummary,
    constant_across_batch,
    far_below_unit_scale,
    first_nonfinite_example,
    scale_verdict,
)
from lightning_triage.functional.data.labels import LabelSignal, class_imbalance, target_range
from lightning_triage.functional.data.shift import OUTLIER_SCALES, Outlier, Shift
from lightning_triage.functional.verdict import Verdict


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def _shape(t: Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')} {tuple(t.shape)}"


def batch_place(split: str, batch_idx: int, dataloader_idx: int = 0) -> str:
    """Where a batch comes from, for messages.

    Example:
        >>> batch_place("train", 3), batch_place("val", 2, 1)
        ('training batch 3', 'validation batch 2 of val loader 1')
    """
    if split == "train":
        return f"training batch {batch_idx}"
    loader = f" of val loader {dataloader_idx}" if dataloader_idx else ""
    return f"validation batch {batch_idx}{loader}"


def unknown_structure_rule(batch: Any, note: str | None,
                           tensors: Sequence[tuple[str, Tensor]]) -> Verdict:
    """``data.unknown_batch_structure``: the batch's inputs could not be found."""
    return Verdict(
        "data.unknown_batch_structure", None,
        f"The batch's inputs could not be found ({note}; batch type `{type(batch).__name__}`), so "
        "the data checks did not run.",
        evidence={"batch_type": type(batch).__name__, "tensors": [n for n, _ in tensors][:16]})


def nonfinite_rule(t: Tensor, summary: TensorSummary, *, target: bool, split: str, where: str,
                   batch_idx: int, step: int) -> Verdict:
    """``data.nonfinite_input``/``data.nonfinite_target`` for a tensor whose ``summary`` counts
    NaN or Inf values (the first example holding one is located here).

    Example:
        >>> import torch
        >>> from lightning_triage.functional.data.inputs import summarize_tensor
        >>> x = torch.tensor([[0.0, 1.0], [float("nan"), 2.0]])
        >>> v = nonfinite_rule(x, summarize_tensor(x, "x"), target=False, split="train",
        ...                    where="training batch 0", batch_idx=0, step=0)
        >>> v.code, v.evidence["first_example"]
        ('data.nonfinite_input', 1)
    """
    example = first_nonfinite_example(t)
    code = "data.nonfinite_target" if target else "data.nonfinite_input"
    return Verdict(
        code, step,
        f"{where} (step {step}): `{summary.name}` ({_shape(t)}) holds {summary.nan} NaN and "
        f"{summary.inf} Inf values of {summary.numel} (first in example {example}).",
        evidence={"split": split, "tensor": summary.name, "nan": summary.nan, "inf": summary.inf,
                  "numel": summary.numel, "first_example": example, "batch_idx": batch_idx})


def tiny_scale_rule(s: TensorSummary, *, max_rms: float, where: str, batch_idx: int,
                    step: int) -> Verdict | None:
    """``data.tiny_input_scale``: a float input whose every value is far below unit scale (and
    which :func:`scale_verdict` does not already flag)."""
    if scale_verdict(s, max_rms) is not None or not far_below_unit_scale(s):
        return None
    return Verdict(
        "data.tiny_input_scale", step,
        f"{where} (step {step}): float input `{s.name}` ({s.dtype} {tuple(s.shape)}) is "
        f"non-negative with values in [{_fmt(s.min)}, {_fmt(s.max)}] and root mean square "
        f"{_fmt(s.rms)}: every value is far below unit scale (images divided by their range "
        "twice?).",
        evidence={"tensor": s.name, "batch_idx": batch_idx, "min": s.min, "max": s.max,
                  "mean": s.mean, "std": s.std, "rms": s.rms})


def unnormalized_rule(s: TensorSummary, *, max_rms: float, where: str, batch_idx: int,
                      step: int) -> Verdict | None:
    """``data.unnormalized_input``: a float input far from standardized (see :func:`scale_verdict`).

    Example:
        >>> import torch
        >>> from lightning_triage.functional.data.inputs import summarize_tensor
        >>> s = summarize_tensor(torch.rand(64, 64) * 255, "x")
        >>> unnormalized_rule(s, max_rms=4.0, where="training batch 0", batch_idx=0,
        ...                   step=0).evidence["verdict"]
        'large'
    """
    verdict = scale_verdict(s, max_rms)
    if verdict is None:
        return None
    detail = (f"values in [{_fmt(s.min)}, {_fmt(s.max)}], mean {_fmt(s.mean)}, std {_fmt(s.std)}, "
              f"root mean square {_fmt(s.rms)}")
    if verdict == "large":
        advice = f"far from standardized (rms > {max_rms:g}; standardized inputs have rms ~1)."
    else:
        advice = ("so small that early layers see almost nothing (divided by 255 twice?).")
    return Verdict(
        "data.unnormalized_input", step,
        f"{where} (step {step}): float input `{s.name}` ({s.dtype} {tuple(s.shape)}) has "
        f"{detail}: {advice}",
        evidence={"tensor": s.name, "batch_idx": batch_idx, "verdict": verdict, "min": s.min,
                  "max": s.max, "mean": s.mean, "std": s.std, "rms": s.rms, "max_rms": max_rms})


def constant_rule(x: Tensor, s: TensorSummary, *, split: str, where: str, batch_idx: int,
                  step: int) -> Verdict | None:
    """``data.constant_input``: every example of the input ``x`` (summary ``s``) is identical."""
    if x.ndim < 1 or x.shape[0] < 2 or not constant_across_batch(x):
        return None
    return Verdict(
        "data.constant_input", step,
        f"{where} (step {step}): `{s.name}` ({_shape(x)}) is identical for all {x.shape[0]} "
        f"examples (min {_fmt(s.min)}, max {_fmt(s.max)}).",
        evidence={"split": split, "batch_idx": batch_idx, "tensor": s.name,
                  "examples": int(x.shape[0]), "min": s.min, "max": s.max})


def target_range_rule(y: Tensor, classes: int, *, source: str | None, inferred: bool,
                      ignore_index: int, name: str | None, split: str, where: str, batch_idx: int,
                      step: int) -> Verdict | None:
    """``data.target_out_of_range``: class targets outside ``[0, classes)``.

    A warning instead of an error when ``classes`` was ``inferred`` from the model's output and
    the targets run far beyond it (the output may not be class scores).

    Example:
        >>> import torch
        >>> v = target_range_rule(torch.tensor([1, 2, 3]), 3, source="`num_classes`",
        ...                       inferred=False, ignore_index=-100, name="y", split="train",
        ...                       where="training batch 0", batch_idx=0, step=0)
        >>> v.code, v.evidence["bad"], v.severity
        ('data.target_out_of_range', 1, None)
    """
    result = target_range(y, classes, ignore_index)
    if not result.bad:
        return None
    k = classes
    guess = ""
    if result.min >= 1 and result.max == k:
        guess = f" The targets run 1..{k}: labels counted from 1 instead of 0?"
    elif result.min < 0:
        guess = (f" Negative targets other than `ignore_index={ignore_index}`: a padding value "
                 "the loss does not ignore?")
    severity: Literal["warning"] | None = None
    if inferred and result.max >= 2 * k:
        severity = "warning"
        guess += (" If the model's output is not class scores, pass `num_classes=` to "
                  "`BatchInspector`/`Triage`.")
    return Verdict(
        "data.target_out_of_range", step,
        f"{where} (step {step}): {result.bad} of {result.total} class targets in `{name}` are "
        f"outside [0, {k}) (targets range {result.min}..{result.max}; bad values {result.values}, "
        f"first in example {result.first_index}), with {k} classes from {source}. Cross-entropy "
        f"fails or silently mis-trains on them.{guess}",
        evidence={"split": split, "batch_idx": batch_idx, "tensor": name, "bad": result.bad,
                  "total": result.total, "min": result.min, "max": result.max,
                  "values": result.values, "first_example": result.first_index,
                  "num_classes": k, "num_classes_from": source, "ignore_index": ignore_index},
        severity=severity)


def imbalance_rule(counts: Mapping[int, int], batch_classes: list[tuple[int, int]],
                   classes: int | None, batches: int) -> Verdict | None:
    """``data.class_imbalance``: one class dominates the ``counts`` of the first ``batches``
    training batches, or they come sorted by class (``batch_classes``: ``(size, classes)``
    per batch).

    Example:
        >>> v = imbalance_rule({0: 95, 1: 5}, [(10, 1)] * 10, 2, 10)
        >>> v.code, v.evidence["one_class_batches"]
        ('data.class_imbalance', 10)
        >>> imbalance_rule({0: 50, 1: 50}, [(10, 2)] * 10, 2, 10) is None
        True
    """
    result = class_imbalance(dict(counts), batch_classes, classes)
    total = sum(counts.values())
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:10]
    evidence = {"counts": {str(k): c for k, c in sorted(counts.items())[:100]},
                "targets_seen": total, "dominant": result.dominant, "share": result.share,
                "threshold": result.threshold, "one_class_batches": result.one_class_batches,
                "batches": result.batches, "expected_one_class": result.expected_one_class}
    dist = ", ".join(f"{k}: {c}" for k, c in top)
    if result.sorted_batches:
        return Verdict(
            "data.class_imbalance", None,
            f"{result.one_class_batches} of the first {result.batches} training batches hold a "
            f"single class, where a shuffled loader would give a share of "
            f"{result.expected_one_class:.2g} with this class mix (counts {dist}): the loader is "
            "not shuffled over data sorted by class.",
            evidence=evidence)
    if result.dominated:
        return Verdict(
            "data.class_imbalance", None,
            f"Class {result.dominant} is {result.share:.0%} of the {total} training targets seen "
            f"in the first {batches} batches (counts {dist}).",
            evidence=evidence)
    return None


def misalignment_rule(result: LabelSignal) -> Verdict | None:
    """``data.label_misalignment``: the label probe finds the targets unrelated to the inputs."""
    if result.related():
        return None
    return Verdict(
        "data.label_misalignment", None,
        f"The training targets look unrelated to the inputs: on {result.examples} distinct "
        f"training examples ({result.classes} classes, majority share {result.majority:.2f}), a "
        f"1-nearest-neighbour probe scores {result.knn:.3f} (shuffled labels: "
        f"{result.knn_null:.3f}, z = {result.z_knn:.1f}) and a nearest-centroid probe "
        f"{result.centroid:.3f} (shuffled: {result.centroid_null:.3f}, z = "
        f"{result.z_centroid:.1f}).",
        evidence=result.to_dict())


def probe_detail(result: LabelSignal) -> str:
    """A one-line summary of the label probe, for the check's detail."""
    return (f"label probe on {result.examples} examples: 1-NN {result.knn:.2f} vs "
            f"{result.knn_null:.2f} shuffled, centroid {result.centroid:.2f} vs "
            f"{result.centroid_null:.2f}")


def shift_rule(result: Shift, train_examples: int, val_examples: int) -> Verdict | None:
    """``data.train_val_shift``: train and validation inputs clearly differ in statistics."""
    if not result.clearly_different():
        return None
    return Verdict(
        "data.train_val_shift", None,
        f"Train and validation inputs differ: per feature, the means differ by "
        f"{result.mean_shift:.2f} pooled standard deviations and the stds by a factor "
        f"{result.std_ratio:.2f} (medians over {result.features} features; train mean "
        f"{result.train_mean:.3g} std {result.train_std:.3g}, validation mean "
        f"{result.val_mean:.3g} std {result.val_std:.3g}; {train_examples} training and "
        f"{val_examples} validation examples).",
        evidence={"mean_shift": result.mean_shift, "std_ratio": result.std_ratio,
                  "features": result.features, "train_mean": result.train_mean,
                  "val_mean": result.val_mean, "train_std": result.train_std,
                  "val_std": result.val_std, "train_examples": train_examples,
                  "val_examples": val_examples})


def val_outlier_rule(result: Outlier | None, train_examples: int,
                     scales: float = OUTLIER_SCALES) -> Verdict | None:
    """``data.val_outlier``: a validation value at least ``scales`` training scales from its
    feature's training mean (see :func:`~lightning_triage.functional.data.shift.val_outlier`).

    Example:
        >>> o = Outlier(56, (0, 2, 7), 3e8, 0.0, 0.0, 3e8)
        >>> v = val_outlier_rule(o, 1438)
        >>> v.code, v.evidence["feature"], v.evidence["val_batch"], v.evidence["example"]
        ('data.val_outlier', 56, 2, 7)
    """
    if result is None or not result.scales >= scales:
        return None
    loader, batch, row = result.where
    place = f"validation batch {batch}" + (f" of loader {loader}" if loader else "")
    const = (" (constant in the training data: a standardization that divides by its zero std, "
             "clamped to a tiny value?)" if result.train_std == 0 else "")
    return Verdict(
        "data.val_outlier", None,
        f"Example {row} of {place} has feature {result.feature} = {result.value:.4g}, "
        f"{result.scales:.3g} training scales from that feature's training mean "
        f"{result.train_mean:.4g} (training std {result.train_std:.4g}{const}; "
        f"{train_examples} training examples).",
        evidence={"feature": result.feature, "value": result.value,
                  "train_mean": result.train_mean, "train_std": result.train_std,
                  "scales": result.scales, "val_loader": loader, "val_batch": batch,
                  "example": row, "train_examples": train_examples},
    )


def duplicates_rule(n: int, repeats: int, largest: int, *, per_example: int, fraction: float,
                    name: str, split: str, where: str, batch_idx: int, step: int) -> Verdict | None:
    """``data.duplicate_samples``: at least ``fraction`` of the ``n`` examples of a batch repeat
    another one (``repeats``, ``largest`` from :func:`duplicate_stats`); a batch of one example
    repeated is ``data.constant_input`` instead.

    Example:
        >>> duplicates_rule(8, 6, 4, per_example=16, fraction=0.5, name="x", split="train",
        ...                 where="training batch 0", batch_idx=0, step=0).evidence["distinct"]
        2
        >>> duplicates_rule(8, 1, 2, per_example=16, fraction=0.5, name="x", split="train",
        ...                 where="training batch 0", batch_idx=0, step=0) is None
        True
    """
    if n < 8 or per_example < 8 or largest >= n or repeats < fraction * n:
        return None
    return Verdict(
        "data.duplicate_samples", step,
        f"{where} (step {step}): {repeats} of the {n} examples of `{name}` repeat another example "
        f"of the batch (only {n - repeats} distinct, the largest group of copies holds {largest}).",
        evidence={"split": split, "batch_idx": batch_idx, "tensor": name, "examples": n,
                  "repeats": repeats, "distinct": n - repeats, "largest_group": largest})


def repeated_batch_rule(previous: tuple[int, int] | None, n: int, largest: int, *, name: str,
                        where: str, batch_idx: int, step: int, epoch: int) -> Verdict | None:
    """``data.repeated_batch``: a training batch equal to an earlier one of the same epoch
    (``previous``: its ``(batch_idx, step)``)."""
    if previous is None or n < 2 or largest >= n:
        return None
    return Verdict(
        "data.repeated_batch", step,
        f"{where} (step {step}) is identical to training batch {previous[0]} (step {previous[1]}) "
        f"of the same epoch: all {n} examples of `{name}`, in the same order.",
        evidence={"batch_idx": batch_idx, "same_as_batch": previous[0],
                  "same_as_step": previous[1], "examples": n, "tensor": name, "epoch": epoch})


def overlap_rule(train: FingerprintStore, val: FingerprintStore) -> Verdict | None:
    """``data.train_val_overlap``: at least 5 (and 1%) of the validation examples seen are also
    among the training examples seen.

    Example:
        >>> train, val = FingerprintStore(), FingerprintStore()
        >>> for i in range(10):
        ...     train.add(i, (0, i))
        ...     val.add(i if i < 6 else 100 + i, (0, i, 0))
        >>> overlap_rule(train, val).evidence["overlap"]
        6
    """
    hits = [(where, train.get(fp)) for fp, where in val.items() if fp in train]
    checked = len(val)
    if len(hits) < 5 or len(hits) < 0.01 * checked:
        return None
    (vb, vi, vdl), (tb, ti) = min(hits, key=lambda h: (h[0][2], h[0][0], h[0][1]))
    return Verdict(
        "data.train_val_overlap", None,
        f"{len(hits)} of the {checked} distinct validation examples seen "
        f"({len(hits) / checked:.0%}) also appear among the {len(train)} training examples seen "
        f"(first: validation batch {vb} example {vi} = training batch {tb} example {ti}). "
        "Validation built from a slice of the training set? Split before augmenting and keep the "
        "validation indices disjoint.",
        evidence={"overlap": len(hits), "val_examples": checked, "train_examples": len(train),
                  "first_val_batch": vb, "first_val_example": vi, "first_train_batch": tb,
                  "first_train_example": ti, "val_dataloader": vdl})
