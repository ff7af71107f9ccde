"""What one call of a loss function says about the objective: the form of its targets, its
chance level (the loss of uniform predictions), its memorization floor and its lower bound.

:func:`describe_call` reads one call of a ``torch.nn.functional`` loss (the ``nn.*Loss`` modules
call them too) with its arguments and its result, and returns a :class:`LossCall`. It only reads:
every computation is on detached copies, under ``no_grad``, with no random draw.
:mod:`~lightning_triage.functional.objective` watches a training step and combines its calls.

Example:
    >>> import torch
    >>> import torch.nn.functional as F
    >>> logits, y = torch.zeros(8, 10), torch.randint(0, 10, (8,))
    >>> call = describe_call(F.cross_entropy, (logits, y), {}, F.cross_entropy(logits, y))
    >>> call.kind, round(call.chance, 3), call.floor
    ('multiclass', 2.303, 0.0)
    >>> call.describe()
    'cross-entropy over 10 classes'
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_triage.functional.chance import ChanceLevel, chance_level, prior_entropy

#: The loss functions watched, by the name used in messages.
LOSS_FUNCTIONS: dict[Any, str] = {
    F.cross_entropy: "cross_entropy", F.nll_loss: "nll_loss",
    F.binary_cross_entropy: "binary_cross_entropy",
    F.binary_cross_entropy_with_logits: "binary_cross_entropy_with_logits",
    F.kl_div: "kl_div", F.mse_loss: "mse_loss", F.l1_loss: "l1_loss",
    F.smooth_l1_loss: "smooth_l1_loss", F.huber_loss: "huber_loss",
    F.gaussian_nll_loss: "gaussian_nll_loss", F.poisson_nll_loss: "poisson_nll_loss",
    F.ctc_loss: "ctc_loss", F.triplet_margin_loss: "triplet_margin_loss",
    F.triplet_margin_with_distance_loss: "triplet_margin_with_distance_loss",
    F.cosine_embedding_loss: "cosine_embedding_loss",
    F.margin_ranking_loss: "margin_ranking_loss",
    F.hinge_embedding_loss: "hinge_embedding_loss",
    F.multilabel_margin_loss: "multilabel_margin_loss",
    F.multilabel_soft_margin_loss: "multilabel_soft_margin_loss",
    F.multi_margin_loss: "multi_margin_loss", F.soft_margin_loss: "soft_margin_loss",
}
_REGRESSION = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
#: The robust regression losses (chosen for targets with outliers: heavy-tailed batch losses).
ROBUST_LOSSES = ("l1_loss", "smooth_l1_loss", "huber_loss")
_METRIC = ("triplet_margin_loss", "triplet_margin_with_distance_loss", "cosine_embedding_loss",
           "margin_ranking_loss", "hinge_embedding_loss")
_KIND_TEXT = {
    "multiclass": "cross-entropy over {c} classes",
    "sequence": "token-level cross-entropy over {c} classes",
    "masked_lm": "masked-token cross-entropy over {c} classes ({masked} of positions scored)",
    "soft_targets": "cross-entropy against soft targets over {c} classes",
    "in_batch_negatives": "a contrastive loss with in-batch negatives ({c} candidates)",
    "multilabel": "binary cross-entropy over {c} labels",
    "binary": "binary cross-entropy",
    "distillation": "a KL divergence to soft targets over {c} classes",
    "regression": "a regression loss",
    "likelihood": "a Gaussian negative log-likelihood",
    "count": "a Poisson negative log-likelihood",
    "sequence_alignment": "a CTC loss",
    "metric": "a metric-learning loss",
    "margin": "a margin loss",
}
_SIGNATURES: dict[Any, inspect.Signature] = {}


@dataclass(frozen=True)
class LossCall:
    """One call of a loss function in the step, with what it says about the objective.

    Attributes:
        name: the function (``"cross_entropy"``, ``"binary_cross_entropy_with_logits"``...).
        value: what it returned (the mean of the elements for ``reduction="none"``).
        kind: ``"multiclass"``, ``"sequence"``, ``"masked_lm"``, ``"soft_targets"``,
            ``"in_batch_negatives"``, ``"multilabel"``, ``"binary"``, ``"distillation"``,
            ``"regression"``, ``"likelihood"``, ``"count"``, ``"sequence_alignment"``,
            ``"metric"`` or ``"margin"``.
        target_form: ``"indices"``, ``"soft"``, ``"one_hot"``, ``"multilabel"``, ``"binary"``,
            ``"continuous"`` or ``"none"``.
        num_classes: the classes (labels, candidates) scored, when there are.
        chance: the loss of uniform predictions (``None``: not known for this loss).
        floor: the least loss reachable on these targets (0 for hard targets; the targets' own
            entropy for soft ones; ``None``: not known).
        lower_bound: the least value the function can return (``-inf`` when unbounded).
        regression: the regression baselines of its targets (regression losses).
        facts: the call's arguments that shape it (``label_smoothing``, ``pos_weight``,
            ``ignore_share``, ``log_target``, ``reduction``).
    """

    name: str
    value: float
    kind: str
    target_form: str = "none"
    num_classes: int | None = None
    chance: float | None = None
    floor: float | None = None
    lower_bound: float = 0.0
    regression: ChanceLevel | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """The call named for messages, e.g. ``cross-entropy over 10 classes``."""
        masked = self.facts.get("masked_share")
        text = _KIND_TEXT.get(self.kind, "`{name}`").format(
            c=self.num_classes, name=self.name,
            masked=f"{masked:.0%}" if isinstance(masked, float) else "some")
        smoothing = self.facts.get("label_smoothing")
        if smoothing:
            text += f" with label smoothing {smoothing:g}"
        if self.facts.get("pos_weight") is not None:
            text += " with `pos_weight`"
        return text


def _bound(func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    sig = _SIGNATURES.get(func)
    if sig is None:
        sig = _SIGNATURES[func] = inspect.signature(func)
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _reduction(a: Mapping[str, Any]) -> str:
    if a.get("size_average") is False or a.get("reduce") is False:
        return "sum" if a.get("reduce") is not False else "none"
    return str(a.get("reduction", "mean"))


def _entropy(p: Tensor, dim: int) -> Tensor:
    """Entropy of each distribution along ``dim`` (``0 log 0 = 0``)."""
    return -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(dim)


def _constant(t: Tensor) -> bool | None:
    """``True`` when every target is the same value (labels made in the step, as a GAN's all
    ones / all zeros, not read from the batch); ``None`` otherwise (left out of the facts)."""
    return True if t.numel() > 1 and bool((t == t.flatten()[0]).all()) else None


def _cross_entropy(a: Mapping[str, Any], name: str) -> dict[str, Any]:
    x, t = a["input"].detach(), a["target"].detach()
    class_dim = 0 if x.ndim == 1 else 1
    c = int(x.shape[class_dim])
    smoothing = float(a.get("label_smoothing", 0.0) or 0.0)
    facts: dict[str, Any] = {"label_smoothing": smoothing or None,
                             "constant_target": _constant(t)}
    chance = math.log(c) if c > 1 else None
    if t.is_floating_point():  # class probabilities, same shape as the input
        p = t.double()
        p = p * (1 - smoothing) + smoothing / c
        sums = p.sum(class_dim)
        one_hot = bool(((t == 0) | (t == 1)).all()) and bool((t.sum(class_dim) == 1).all())
        form = "one_hot" if one_hot else "soft"
        floor = float(_entropy(p, class_dim).mean())
        return {"kind": "multiclass" if one_hot and not smoothing else "soft_targets",
                "target_form": form, "num_classes": c, "floor": floor, "facts": facts,
                "chance": None if chance is None else chance * float(sums.mean())}
    ignore = int(a.get("ignore_index", -100))
    valid = t != ignore
    share = 1.0 - float(valid.double().mean()) if t.numel() else 0.0
    facts.update(ignore_share=share)
    kind = "multiclass" if t.ndim <= 1 else "sequence"
    if share > 0 and t.ndim >= 2:
        kind, facts["masked_share"] = "masked_lm", 1.0 - share
    square = x.ndim == 2 and x.shape[0] == x.shape[1] > 1 and t.ndim == 1
    # each row scored against the batch, its positive another column: the diagonal (CLIP) or a
    # permutation of the rows (SimCLR's NT-Xent pairs view i with view i + N)
    if square and bool((t.sort().values == torch.arange(t.numel(), device=t.device)).all()):
        kind = "in_batch_negatives"
    floor = 0.0
    if smoothing and name == "cross_entropy":
        q = torch.full((c,), smoothing / c, dtype=torch.float64)
        q[0] += 1 - smoothing
        floor = float(_entropy(q, 0))
    return {"kind": kind, "target_form": "indices", "num_classes": c, "chance": chance,
            "floor": None if kind == "in_batch_negatives" else floor, "facts": facts,
            "count": int(valid.sum()), "prior": prior_entropy(t, c, ignore)}


def _bce(a: Mapping[str, Any], logits: bool) -> dict[str, Any]:
    x, t = a["input"].detach(), a["target"].detach().double()
    w = a.get("weight")
    pw = a.get("pos_weight") if logits else None
    weight = torch.ones_like(t) if w is None else w.detach().double().expand_as(t)
    positive = torch.ones_like(t) if pw is None else pw.detach().double().expand_as(t)
    hard = bool(((t == 0) | (t == 1)).all())
    labels = int(x.shape[-1]) if x.ndim >= 2 and x.shape[-1] > 1 else None
    form = ("multilabel" if labels else "binary") if hard else "soft"
    per = weight * (positive * t + (1 - t))
    chance = math.log(2) * float(per.mean())
    # the best prediction of each element: p* = pw y / (pw y + 1 - y)
    best = (positive * t) / (positive * t + (1 - t))

    def loss_at(p: Tensor, y: Tensor) -> Tensor:
        lp = torch.where(p > 0, p.clamp_min(1e-300).log(), torch.zeros_like(p))
        lq = torch.where(p < 1, (1 - p).clamp_min(1e-300).log(), torch.zeros_like(p))
        return -weight * (positive * y * lp + (1 - y) * lq)

    floor = 0.0 if hard else float(loss_at(best, t).mean())
    prior = None
    if labels and t.ndim >= 2:  # the best constant per label
        pi = t.reshape(-1, labels).mean(0).expand_as(t)
        p_const = (positive * pi) / (positive * pi + (1 - pi))
        prior = float(loss_at(p_const, t).mean())
    return {"kind": "multilabel" if labels else "binary", "target_form": form,
            "num_classes": labels, "chance": chance, "floor": floor, "prior": prior,
            "facts": {"constant_target": _constant(t),
                      "pos_weight": None if pw is None else [float(v) for v in
                                                             pw.detach().flatten()[:16]]}}


def _kl(a: Mapping[str, Any]) -> dict[str, Any]:
    x, t = a["input"].detach(), a["target"].detach().double()
    log_target = bool(a.get("log_target", False))
    p = t.exp() if log_target else t
    c = int(x.shape[-1]) if x.ndim else 1
    # KL(target || uniform): sum of p log p + p ln C over every element, then reduced
    pointwise = -_entropy(p, -1) + p.sum(-1) * math.log(max(c, 1))
    total = float(pointwise.sum())
    reduction = str(a.get("reduction", "mean"))
    count = {"batchmean": x.shape[0] if x.ndim else 1, "sum": 1}.get(reduction, x.numel())
    return {"kind": "distillation", "target_form": "soft", "num_classes": c,
            "chance": total / max(int(count), 1), "floor": 0.0,
            "facts": {"log_target": log_target}, "reduced_by": reduction}


def _gaussian(a: Mapping[str, Any]) -> dict[str, Any]:
    eps = float(a.get("eps", 1e-6))
    bound = 0.5 * math.log(eps) + (0.5 * math.log(2 * math.pi) if a.get("full") else 0.0)
    return {"kind": "likelihood", "target_form": "continuous", "lower_bound": bound,
            "floor": bound}


def _analysis(name: str, a: Mapping[str, Any]) -> dict[str, Any]:
    if name in ("cross_entropy", "nll_loss"):
        return _cross_entropy(a, name)
    if name in ("binary_cross_entropy", "binary_cross_entropy_with_logits"):
        return _bce(a, logits=name.endswith("logits"))
    if name == "multilabel_soft_margin_loss":
        x = a["input"]
        return {"kind": "multilabel", "target_form": "multilabel", "chance": math.log(2),
                "num_classes": int(x.shape[-1]) if x.ndim >= 2 else None, "floor": 0.0}
    if name == "kl_div":
        return _kl(a)
    if name in _REGRESSION:
        target = a["target"].detach()
        level = chance_level("regression", targets=target) if target.is_floating_point() \
            else None
        return {"kind": "regression", "target_form": "continuous", "regression": level,
                "floor": 0.0}
    if name == "gaussian_nll_loss":
        return _gaussian(a)
    if name == "poisson_nll_loss":
        return {"kind": "count", "target_form": "continuous", "lower_bound": -math.inf}
    if name == "ctc_loss":
        return {"kind": "sequence_alignment", "target_form": "indices", "floor": 0.0}
    if name in _METRIC:
        floor = None if name in ("cosine_embedding_loss",) else 0.0
        return {"kind": "metric", "target_form": "none", "floor": floor}
    return {"kind": "margin", "target_form": "indices", "floor": 0.0}


def _scaled(info: dict[str, Any], reduction: str, count: int) -> dict[str, Any]:
    """Per-element levels times ``count`` for ``reduction="sum"``."""
    if reduction != "sum" or info.get("reduced_by"):
        return info
    for key in ("chance", "floor", "prior"):
        if info.get(key) is not None:
            info[key] = info[key] * count
    level = info.get("regression")
    if isinstance(level, ChanceLevel):
        info["regression"] = ChanceLevel(
            level.task, level.value * count, None,
            None if level.prior is None else level.prior * count,
            None if level.zero_baseline is None else level.zero_baseline * count)
    return info


def describe_call(func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                  out: Any) -> LossCall | None:
    """Read one call of a watched loss function (see :data:`LOSS_FUNCTIONS`).

    Returns ``None`` for a function that is not watched or a result that is not a finite
    floating tensor; a call whose arguments cannot be read is returned with what is known
    (its name, its value, ``kind="other"``).

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> z = torch.zeros(4, 3)
        >>> y = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0]])
        >>> call = describe_call(F.binary_cross_entropy_with_logits, (z, y),
        ...                      {"pos_weight": torch.full((3,), 3.0)}, torch.tensor(0.0))
        >>> call.kind, call.target_form, round(call.chance, 3)  # ln 2 x mean(3 y + 1 - y)
        ('multilabel', 'multilabel', 1.155)
    """
    name = LOSS_FUNCTIONS.get(func)
    if name is None or not isinstance(out, Tensor) or not out.is_floating_point() \
            or out.numel() == 0:
        return None
    with torch.no_grad():
        value = float(out.detach().double().mean())
        try:
            a = _bound(func, args, kwargs)
            info = _analysis(name, a)
            reduction = _reduction(a)
            count = info.pop("count", None)
            if count is None:
                target = a.get("target")
                count = int(target.numel()) if isinstance(target, Tensor) else 1
            info = _scaled(info, reduction, count)
        except Exception:  # arguments this reading does not understand
            return LossCall(name, value, "other", lower_bound=-math.inf)
    info.pop("reduced_by", None)
    facts = {k: v for k, v in {**info.pop("facts", {}), "reduction": reduction}.items()
             if v is not None}
    prior = info.pop("prior", None)
    if prior is not None:
        facts["prior"] = prior
    return LossCall(name, value, facts=facts, **info)


__all__ = ["LOSS_FUNCTIONS", "ROBUST_LOSSES", "LossCall", "describe_call"]
