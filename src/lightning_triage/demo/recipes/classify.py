"""Healthy classification recipes: hard, smoothed, mixed, multilabel, binary, robust-loss,
distilled, focal, ordinal and segmentation objectives on scikit-learn data."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_triage.demo.recipes.common import (
    Recipe,
    RecipeModule,
    loaders,
    mlp,
    sklearn_split,
)

Built = tuple[RecipeModule, Any, Any]


class Classifier(RecipeModule):
    """Cross-entropy over ``net``'s logits (``label_smoothing`` in training only)."""

    def __init__(self, net: nn.Module, lr: float = 3e-3, label_smoothing: float = 0.0) -> None:
        super().__init__(lr)
        self.net = net
        self.label_smoothing = label_smoothing

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        smoothing = self.label_smoothing if self.training else 0.0
        return F.cross_entropy(self(x), y, label_smoothing=smoothing)


def digits(seed: int, batch_size: int = 32) -> tuple[Any, Any]:
    xt, yt, xv, yv = sklearn_split("digits", seed)
    return loaders((xt, yt), (xv, yv), seed, batch_size)


def multiclass_ce(seed: int) -> Built:
    return Classifier(mlp(64, 10)), *digits(seed)


def label_smoothing(seed: int) -> Built:
    return Classifier(mlp(64, 10), label_smoothing=0.1), *digits(seed)


class Mixup(Classifier):
    """timm's recipe: mixup (or cutmix on the 8x8 images) with soft targets and a soft-target
    cross-entropy; validation on hard labels."""

    def __init__(self, net: nn.Module, cutmix: bool = False, alpha: float = 0.4,
                 lr: float = 3e-3) -> None:
        super().__init__(net, lr=lr)
        self.cutmix, self.alpha = cutmix, alpha

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        lam = float(torch.distributions.Beta(self.alpha, self.alpha).sample())
        perm = torch.randperm(x.shape[0], device=x.device)
        if self.cutmix:  # a box of the partner image pasted in, lam corrected to its area
            side = round(8 * (1 - lam) ** 0.5)
            top, left = (int(v) for v in torch.randint(0, 9 - side, (2,)))
            images = x.view(-1, 8, 8).clone()
            images[:, top:top + side, left:left + side] = \
                images[perm][:, top:top + side, left:left + side]
            x, lam = images.view(-1, 64), 1 - side * side / 64
        else:
            x = lam * x + (1 - lam) * x[perm]
        onehot = F.one_hot(y, 10).float()
        target = lam * onehot + (1 - lam) * onehot[perm]
        loss = torch.sum(-target * F.log_softmax(self(x), dim=-1), dim=-1).mean()
        self.log("train_loss", loss)
        return loss


def mixup(seed: int) -> Built:
    return Mixup(mlp(64, 10)), *digits(seed)


class SmallCNN(nn.Module):
    """Two convolutions over the 8x8 digits (the second with stride 2), then a linear head."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(8, 16, 3, padding=1, stride=2), nn.ReLU(),
                                  nn.Flatten(), nn.Linear(16 * 16, classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x.view(-1, 1, 8, 8))


def cutmix(seed: int) -> Built:
    return Mixup(SmallCNN(), cutmix=True, alpha=1.0), *digits(seed)


def _attributes(y: Tensor) -> Tensor:
    """Four binary attributes of a digit: even, at least 5, has a loop, prime."""
    loop, prime = torch.tensor([0, 6, 8, 9]), torch.tensor([2, 3, 5, 7])
    return torch.stack([y % 2 == 0, y >= 5, torch.isin(y, loop), torch.isin(y, prime)], 1).float()


class Multilabel(RecipeModule):
    """``BCEWithLogitsLoss(pos_weight=...)`` over four attributes, with a torchmetrics F1
    updated in ``training_step``."""

    def __init__(self, pos_weight: Tensor) -> None:
        super().__init__()
        from torchmetrics.classification import MultilabelF1Score

        self.net = mlp(64, 4)
        self.criterion = nn.BCEWithLogitsLoss(pos_weight=pos_weight)
        self.train_f1 = MultilabelF1Score(num_labels=4)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        return self.criterion(self(x), y)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        loss = self.criterion(logits, y)
        self.train_f1(logits, y.long())
        self.log_dict({"train_loss": loss, "train_f1": self.train_f1})
        return loss


def multilabel_bce(seed: int) -> Built:
    xt, yt, xv, yv = sklearn_split("digits", seed)
    yt, yv = _attributes(yt), _attributes(yv)
    pos = yt.mean(0)
    return Multilabel((1 - pos) / pos), *loaders((xt, yt), (xv, yv), seed)


class Binary(RecipeModule):
    """One logit, ``F.binary_cross_entropy_with_logits`` against 0/1 floats."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.net = mlp(features, 1, hidden=16)

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        return F.binary_cross_entropy_with_logits(self.net(x).squeeze(-1), y.float())


def binary_bce(seed: int) -> Built:
    xt, yt, xv, yv = sklearn_split("breast_cancer", seed)
    return Binary(30), *loaders((xt, yt), (xv, yv), seed)


class RobustLoss(Classifier):
    """A classification loss other than plain cross-entropy: ``focal`` (gamma 2), ``sce``
    (symmetric cross-entropy, alpha 0.1, beta 1) or ``gce`` (generalized cross-entropy, q 0.7)."""

    def __init__(self, kind: str) -> None:
        super().__init__(mlp(64, 10))
        self.kind = kind

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        logits = self(x)
        if self.kind == "focal":
            ce = F.cross_entropy(logits, y, reduction="none")
            return ((1 - torch.exp(-ce)) ** 2 * ce).mean()
        probs = F.softmax(logits, dim=1)
        if self.kind == "gce":
            return ((1 - probs.gather(1, y[:, None]).clamp_min(1e-7) ** 0.7) / 0.7).mean()
        onehot = F.one_hot(y, 10).float().clamp(min=1e-4, max=1.0)
        rce = -(probs.clamp(min=1e-7, max=1.0) * torch.log(onehot)).sum(1).mean()
        return 0.1 * F.cross_entropy(logits, y) + rce


def _noisy(seed: int) -> tuple[Any, Any]:
    """Digits with 20% of the training labels replaced by random classes."""
    xt, yt, xv, yv = sklearn_split("digits", seed)
    g = torch.Generator().manual_seed(seed + 1)
    flip = torch.rand(len(yt), generator=g) < 0.2
    yt = torch.where(flip, torch.randint(0, 10, yt.shape, generator=g), yt)
    return loaders((xt, yt), (xv, yv), seed)


def focal(seed: int) -> Built:
    return RobustLoss("focal"), *digits(seed)


def symmetric_ce(seed: int) -> Built:
    return RobustLoss("sce"), *_noisy(seed)


def noisy_labels(seed: int) -> Built:
    return RobustLoss("gce"), *_noisy(seed)


class Distill(Classifier):
    """A small student trained on ``KL(student/T || teacher/T) * T^2`` at T=4 plus 0.1 of the
    hard-label CE; the teacher is frozen and run under ``no_grad``."""

    def __init__(self, teacher: nn.Module, temperature: float = 4.0) -> None:
        super().__init__(mlp(64, 10, hidden=16))
        self.teacher = teacher.requires_grad_(False).eval()
        self.temperature = temperature

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        logits = self(x)
        with torch.no_grad():
            teacher = self.teacher(x)
        t = self.temperature
        kd = F.kl_div(F.log_softmax(logits / t, dim=-1), F.softmax(teacher / t, dim=-1),
                      reduction="batchmean") * t * t
        return 0.9 * kd + 0.1 * F.cross_entropy(logits, y)


def _teacher(seed: int) -> nn.Module:
    """An MLP trained on the training split for 150 full-batch Adam steps."""
    xt, yt, _, _ = sklearn_split("digits", seed)
    teacher = mlp(64, 10, hidden=128)
    opt = torch.optim.Adam(teacher.parameters(), lr=1e-2)
    for _ in range(150):
        opt.zero_grad()
        F.cross_entropy(teacher(xt), yt).backward()
        opt.step()
    return teacher


def distillation(seed: int) -> Built:
    return Distill(_teacher(seed)), *digits(seed)


class Ranker(RecipeModule):
    """A scalar score trained with ``MarginRankingLoss`` on every in-batch pair of examples
    whose targets differ (ordered by target)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp(10, 1, hidden=32)
        self.criterion = nn.MarginRankingLoss(margin=0.1)

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        score = self.net(x).squeeze(-1)
        first, second = torch.triu_indices(len(x), len(x), offset=1, device=x.device)
        sign = torch.sign(y[first] - y[second])
        keep = sign != 0
        return self.criterion(score[first][keep], score[second][keep], sign[keep])


def ranking_margin(seed: int) -> Built:
    xt, yt, xv, yv = sklearn_split("diabetes", seed)
    return Ranker(), *loaders((xt, yt), (xv, yv), seed)


def _shapes(n: int, seed: int) -> tuple[Tensor, Tensor]:
    """16x16 noisy images holding a bright and a dark square; per-pixel classes 0/1/2."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 1, 16, 16, generator=g) * 0.3
    masks = torch.zeros(n, 16, 16, dtype=torch.long)
    for i in range(n):
        for cls, value in ((1, 1.5), (2, -1.5)):
            size = int(torch.randint(3, 7, (1,), generator=g))
            top, left = (int(v) for v in torch.randint(0, 16 - size, (2,), generator=g))
            images[i, 0, top:top + size, left:left + size] += value
            masks[i, top:top + size, left:left + size] = cls
    return images, masks


class Segmenter(RecipeModule):
    """A fully convolutional net, per-pixel cross-entropy over ``(N, 3, H, W)`` logits."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 3, 1))

    def loss(self, batch: Any) -> Tensor:
        x, mask = batch
        return F.cross_entropy(self.net(x), mask)


def segmentation(seed: int) -> Built:
    x, m = _shapes(400, seed)
    return Segmenter(), *loaders((x[80:], m[80:]), (x[:80], m[:80]), seed)


CLASSIFY_RECIPES: list[Recipe] = [
    Recipe("multiclass-ce", "classification", "digits MLP, cross-entropy", multiclass_ce),
    Recipe("label-smoothing", "classification", "cross-entropy with label smoothing 0.1",
           label_smoothing),
    Recipe("mixup", "classification", "mixup (alpha 0.4), soft-target cross-entropy", mixup),
    Recipe("cutmix", "classification", "cutmix on 8x8 images, a small CNN", cutmix),
    Recipe("multilabel-bce", "classification",
           "four attributes, `BCEWithLogitsLoss(pos_weight=...)`, torchmetrics F1", multilabel_bce),
    Recipe("binary-bce", "classification", "breast cancer, one logit, BCE with logits",
           binary_bce),
    Recipe("focal", "classification", "focal loss (gamma 2)", focal),
    Recipe("symmetric-ce", "classification", "symmetric cross-entropy on 20% noisy labels",
           symmetric_ce),
    Recipe("noisy-labels", "classification", "generalized cross-entropy on 20% noisy labels",
           noisy_labels),
    Recipe("distillation", "classification",
           "KL at T=4 from a frozen teacher under `no_grad`, plus 0.1 CE", distillation),
    Recipe("ranking-margin", "regression", "diabetes, `MarginRankingLoss` on all in-batch pairs",
           ranking_margin),
    Recipe("segmentation", "classification", "per-pixel cross-entropy on 16x16 shapes",
           segmentation),
]
