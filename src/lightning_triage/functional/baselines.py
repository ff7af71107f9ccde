"""Simple baselines: what "good" means for this data, before judging the model.

The protocol's second step: compute simple baselines to know what a model should beat. On the
first training batches, in closed form on the host (float64, no random draw, bounded cost), these
functions fit

- for classification (integer class targets): the **majority class**, a **nearest-centroid**
  classifier and a **ridge least-squares linear** classifier (one-hot targets) on the inputs
  flattened to vectors and standardized with the training batches' statistics;
- for regression (float targets): the **mean predictor** (and a ridge linear model, shown for
  context);

and evaluate them on the first validation batches. :func:`below_baseline` compares the model's
own validation metric on those batches (accuracy from the argmax of its output, or its mean
squared error) with the best simple baseline: a model that ends clearly below it is
``curve.below_baseline``.

Example:
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> y = torch.randint(0, 3, (300,), generator=g)
    >>> x = torch.randn(300, 5, generator=g) + 3 * torch.nn.functional.one_hot(y, 5)
    >>> b = compute_baselines(x[:200], y[:200], x[200:], y[200:])
    >>> b.task, b.best_name, b.best > 0.9, b.majority < 0.5
    ('classification', 'linear', True, True)
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from lightning_triage.functional.objective import Objective
from lightning_triage.functional.verdict import Verdict

#: Inputs with more features than this (per example, flattened) are not fitted.
MAX_FEATURES = 4096
#: Class targets at or above this are not class indices of a small classifier.
MAX_CLASSES = 1000
#: Regression targets with more values per example than this are not fitted.
MAX_OUTPUTS = 64
#: The ridge penalty (on standardized features; scikit-learn's ``RidgeClassifier`` default).
RIDGE = 1.0
#: Fewer validation examples than this: no verdict (the accuracies are too noisy).
MIN_VAL_EXAMPLES = 30
#: The least margin (accuracy) by which the model must be below the best baseline.
ACCURACY_MARGIN = 0.08
#: The model's validation MSE must be this many times the mean predictor's.
MSE_RATIO = 1.25

Task = Literal["classification", "regression"]


@dataclass(frozen=True)
class Baselines:
    """The simple baselines of one run, evaluated on the first validation batches.

    Classification: accuracies ``majority``, ``nearest_centroid`` and ``linear``; regression:
    the mean squared errors ``mean`` and ``linear``. ``best``/``best_name`` is the one the model
    is compared with (the highest accuracy; for regression the mean predictor's MSE).
    """

    task: Task
    train_examples: int
    val_examples: int
    features: int
    scores: dict[str, float]
    best_name: str
    classes: int | None = None
    milliseconds: float = 0.0

    @property
    def best(self) -> float:
        return self.scores[self.best_name]

    @property
    def majority(self) -> float:
        return self.scores.get("majority", math.nan)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the report's ``details.baselines.values``)."""
        return {**asdict(self), "metric": self.metric}

    @property
    def metric(self) -> str:
        return "accuracy" if self.task == "classification" else "mse"


def as_features(x: Any, max_features: int = MAX_FEATURES) -> tuple[Tensor | None, str | None]:
    """``x`` as an ``(N, D)`` float64 matrix, or ``None`` and why it cannot be.

    Example:
        >>> as_features(torch.zeros(4, 1, 8, 8))[0].shape
        torch.Size([4, 64])
        >>> as_features(torch.zeros(4, 7, dtype=torch.long))[1]
        'the inputs are not float features (int64)'
    """
    if not isinstance(x, Tensor) or x.dim() < 1:
        return None, "no input tensor with examples on dim 0"
    if not x.is_floating_point():
        return None, f"the inputs are not float features ({str(x.dtype).replace('torch.', '')})"
    flat = x.detach().reshape(x.shape[0], -1)
    if flat.shape[1] > max_features:
        return None, f"{flat.shape[1]} features per example (more than {max_features})"
    flat = flat.to("cpu", torch.float64)
    if not bool(torch.isfinite(flat).all()):
        return None, "the inputs hold NaN/Inf"
    return flat, None


def target_task(y: Any, n: int) -> tuple[Task | None, str | None]:
    """Whether targets ``y`` (for ``n`` examples) are class indices or regression values.

    Example:
        >>> target_task(torch.tensor([0, 2, 1]), 3)[0], target_task(torch.tensor([-1.0, 3.0]), 2)[0]
        ('classification', 'regression')
        >>> target_task(torch.tensor([[0.0, 1.0], [1.0, 1.0]]), 2)[0] is None  # multilabel
        True
        >>> target_task(torch.zeros(3, 5, dtype=torch.long), 3)[1]
        'the targets are not one class index or value per example (shape (3, 5))'
    """
    if not isinstance(y, Tensor) or y.dim() < 1 or y.shape[0] != n:
        return None, "no targets with one entry per example"
    if y.dtype == torch.bool:
        return None, "boolean targets"
    if not y.is_floating_point():
        if y.numel() != n:
            return None, (f"the targets are not one class index or value per example "
                          f"(shape {tuple(y.shape)})")
        if int(y.min()) < 0 or int(y.max()) >= MAX_CLASSES:
            return None, f"class targets outside [0, {MAX_CLASSES})"
        return "classification", None
    if y.numel() > n * MAX_OUTPUTS:
        return None, f"more than {MAX_OUTPUTS} regression values per example"
    if not bool(torch.isfinite(y).all()):
        return None, "the targets hold NaN/Inf"
    if float(y.min()) >= 0.0 and float(y.max()) <= 1.0:
        return None, ("float targets in [0, 1] (0/1 labels, multilabel, soft or one-hot "
                      "targets): not judged as a regression")
    return "regression", None


def _standardize(x: Tensor, xv: Tensor) -> tuple[Tensor, Tensor]:
    mean, std = x.mean(0), x.std(0, unbiased=False)
    std = torch.where(std > 1e-12, std, torch.ones_like(std))
    return (x - mean) / std, (xv - mean) / std


def ridge_fit_predict(x: Tensor, y: Tensor, xv: Tensor, alpha: float = RIDGE) -> Tensor:
    """Ridge least squares with an intercept, in closed form (the dual when examples are fewer
    than features): the predictions for ``xv``.

    Example:
        >>> x = torch.randn(50, 3, dtype=torch.float64)
        >>> y = (x @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64))[:, None] + 4
        >>> (ridge_fit_predict(x, y, x, alpha=1e-9) - y).abs().max() < 1e-6
        tensor(True)
    """
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    n, d = xc.shape
    if n < d:
        k = xc @ xc.T + alpha * torch.eye(n, dtype=x.dtype)
        w = xc.T @ torch.linalg.solve(k, yc)
    else:
        w = torch.linalg.solve(xc.T @ xc + alpha * torch.eye(d, dtype=x.dtype), xc.T @ yc)
    return (xv - mx) @ w + my


def classification_baselines(x: Tensor, y: Tensor, xv: Tensor, yv: Tensor) -> dict[str, float]:
    """Accuracies on ``(xv, yv)`` of the majority class, a nearest-centroid and a ridge linear
    classifier fitted on ``(x, y)`` (``x`` standardized features, ``y`` class indices)."""
    y, yv = y.reshape(-1).long(), yv.reshape(-1).long()
    classes = int(max(int(y.max()), int(yv.max()))) + 1
    counts = torch.bincount(y, minlength=classes)
    majority = float((yv == counts.argmax()).double().mean())
    seen = counts > 0
    onehot = torch.nn.functional.one_hot(y, classes).to(x.dtype)
    centroids = (onehot.T @ x) / counts.clamp(min=1).to(x.dtype)[:, None]
    dist = torch.cdist(xv, centroids)
    dist[:, ~seen] = math.inf
    centroid = float((dist.argmin(1) == yv).double().mean())
    scores = ridge_fit_predict(x, onehot, xv)
    scores[:, ~seen] = -math.inf
    linear = float((scores.argmax(1) == yv).double().mean())
    return {"majority": majority, "nearest_centroid": centroid, "linear": linear}


def regression_baselines(x: Tensor, y: Tensor, xv: Tensor, yv: Tensor) -> dict[str, float]:
    """Mean squared errors on ``(xv, yv)`` of the mean predictor and a ridge linear model fitted
    on ``(x, y)``."""
    y, yv = y.reshape(y.shape[0], -1).double(), yv.reshape(yv.shape[0], -1).double()
    mean = float(((yv - y.mean(0)) ** 2).mean())
    linear = float(((ridge_fit_predict(x, y, xv) - yv) ** 2).mean())
    return {"mean": mean, "linear": linear}


def compute_baselines(x: Tensor, y: Tensor, xv: Tensor, yv: Tensor) -> Baselines | str:
    """The simple baselines fitted on ``(x, y)`` (training examples) and evaluated on
    ``(xv, yv)`` (validation examples), or why they cannot be computed."""
    start = time.perf_counter()
    feats, why = as_features(x)
    feats_v, why_v = as_features(xv)
    if feats is None or feats_v is None:
        return str(why or why_v)
    if feats.shape[1] != feats_v.shape[1]:
        return "training and validation inputs differ in size"
    task, why = target_task(y, feats.shape[0])
    task_v, why_v = target_task(yv, feats_v.shape[0])
    if task is None or task_v != task:
        return str(why or why_v or "training and validation targets differ in kind")
    xs, xvs = _standardize(feats, feats_v)
    if task == "classification":
        scores = classification_baselines(xs, y.cpu(), xvs, yv.cpu())
        best = max(scores, key=lambda k: scores[k])
        classes: int | None = int(max(int(y.max()), int(yv.max()))) + 1
    else:
        scores = regression_baselines(xs, y.cpu(), xvs, yv.cpu())
        best, classes = "mean", None
    return Baselines(task, int(feats.shape[0]), int(feats_v.shape[0]), int(feats.shape[1]),
                     scores, best, classes, round(1000 * (time.perf_counter() - start), 2))


def model_score(output: Tensor, y: Tensor, task: Task) -> tuple[float, int] | None:
    """The model's (sum of correct predictions, examples) for classification (argmax of an
    ``(N, C)`` output) or (sum of squared errors, values) for regression; ``None`` when the
    output does not fit the targets.

    Example:
        >>> model_score(torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]), "classification")
        (1.0, 2)
    """
    if task == "classification":
        if output.dim() != 2 or output.shape[1] < 2 or output.shape[0] != y.numel():
            return None
        return float((output.argmax(1) == y.reshape(-1).to(output.device)).sum()), int(y.numel())
    if output.numel() != y.numel() or output.shape[0] != y.shape[0]:
        return None
    err = (output.detach().double().reshape(-1) - y.to(output.device).double().reshape(-1)) ** 2
    return float(err.sum()), int(y.numel())


def below_baseline(metric: float, baselines: Baselines, *, step: int,
                   extra: str = "") -> Verdict | None:
    """``curve.below_baseline`` when the model's validation ``metric`` (accuracy, or MSE for
    regression) on the baselines' validation examples is clearly worse than the best simple
    baseline; ``None`` otherwise. ``extra`` ends the message (what may explain it).

    For accuracy the margin is the larger of :data:`ACCURACY_MARGIN` and three standard errors of
    the baseline's accuracy over the examples; for MSE the model must be above
    :data:`MSE_RATIO` times the mean predictor's.

    Example:
        >>> b = Baselines("classification", 400, 360, 64,
        ...               {"majority": 0.1, "nearest_centroid": 0.9, "linear": 0.95}, "linear", 10)
        >>> below_baseline(0.9, b, step=500) is None
        True
        >>> below_baseline(0.78, b, step=500).evidence["margin"]
        0.08
    """
    n = baselines.val_examples
    if n < MIN_VAL_EXAMPLES or not math.isfinite(metric):
        return None
    best, name = baselines.best, baselines.best_name.replace("_", "-")
    evidence: dict[str, Any] = {"metric": baselines.metric, "model": metric, "baseline": name,
                                "baseline_value": best, "baselines": dict(baselines.scores),
                                "val_examples": n, "train_examples": baselines.train_examples}
    if baselines.task == "classification":
        margin = max(ACCURACY_MARGIN, 3 * math.sqrt(max(best * (1 - best), 0.0) / n))
        if metric >= best - margin:
            return None
        evidence["margin"] = round(margin, 4)
        text = (f"At the last validation run the model's accuracy on the first {n} validation "
                f"examples is {metric:.3f}, below a {name} classifier fitted in closed form on "
                f"{baselines.train_examples} training examples ({best:.3f}; majority class "
                f"{baselines.majority:.3f}).")
    else:
        if metric <= MSE_RATIO * best:
            return None
        evidence["ratio"] = metric / best if best > 0 else math.inf
        text = (f"At the last validation run the model's mean squared error on the first {n} "
                f"validation examples is {metric:.4g}, {metric / best if best > 0 else math.inf:.2f}"
                f"x that of predicting the training mean ({best:.4g}).")
    return Verdict("curve.below_baseline", step, text + extra, evidence=evidence)


#: The loss kinds (:class:`~lightning_triage.functional.loss_terms.LossCall`) whose input is one
#: score per class: the argmax of the model's head output is its predicted class.
CLASS_SCORE_KINDS = frozenset({"multiclass", "sequence", "masked_lm", "soft_targets", "binary",
                               "multilabel", "distillation", "margin"})


def head_not_class_scores(objective: Objective | None) -> str | None:
    """Why the model's head output cannot be compared with the classification baselines as
    class scores (``None``: it can), from the objective of its first training step: a
    metric-learning or contrastive loss (a triplet or embedding head, in-batch negatives) or a
    loss the watch does not recognize trains an embedding, whose argmax means nothing even when
    it is exactly as wide as the class count. ``None`` objective (the step was not watched, a
    compiled module): the head's width decides, as before.

    Example:
        >>> from lightning_triage.functional.objective import Objective
        >>> from lightning_triage.functional.loss_terms import LossCall
        >>> triplet = LossCall("triplet_margin_loss", 0.4, "metric")
        >>> ce = LossCall("cross_entropy", 2.3, "multiclass", "indices", 10, 2.303, 0.0)
        >>> head_not_class_scores(Objective((ce,), 2.3, "single")) is None
        True
        >>> head_not_class_scores(Objective((triplet,), 0.4, "single"))[:45]
        'the training loss is a metric-learning loss, '
    """
    if objective is None or objective.hand_written_ce \
            or any(c.kind in CLASS_SCORE_KINDS for c in objective.calls):
        return None
    return (f"the training loss is {objective.describe()}, not a loss over class scores: the "
            "head output is an embedding, not compared with the classification baselines")


__all__ = ["ACCURACY_MARGIN", "CLASS_SCORE_KINDS", "MAX_CLASSES", "MAX_FEATURES",
           "MIN_VAL_EXAMPLES", "MSE_RATIO", "RIDGE", "Baselines", "as_features", "below_baseline",
           "classification_baselines", "compute_baselines", "head_not_class_scores",
           "model_score", "regression_baselines", "ridge_fit_predict", "target_task"]
