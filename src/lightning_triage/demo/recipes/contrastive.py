"""Healthy recipes whose examples are coupled or whose step is not plain supervision: CLIP's
InfoNCE, SimCLR's NT-Xent, triplet and cosine embedding losses, a mixture of experts with a
load-balancing loss, REINFORCE on a bandit; and two training techniques (gradient accumulation
with a warmup-cosine schedule, an EMA of the weights)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from lightning_triage.demo.recipes.classify import Classifier, digits
from lightning_triage.demo.recipes.common import Recipe, RecipeModule, loaders, mlp, sklearn_split

Built = tuple[RecipeModule, Any, Any]


class CLIP(RecipeModule):
    """Two towers, L2-normalized 32-d embeddings, a learned logit scale (init ``1/0.07``), the
    symmetric cross-entropy over the in-batch similarity matrix (``scale_twice``: the broken
    twin multiplies by the scale a second time)."""

    def __init__(self, scale_twice: bool = False) -> None:
        super().__init__(lr=1e-3)
        self.image = mlp(64, 32)
        self.text = mlp(24, 32)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.scale_twice = scale_twice

    def loss(self, batch: Any) -> Tensor:
        image, text = batch[0], batch[1]
        a, b = F.normalize(self.image(image), dim=-1), F.normalize(self.text(text), dim=-1)
        scale = self.logit_scale.exp().clamp(max=100)
        logits = scale * a @ b.T
        if self.scale_twice:
            logits = logits * scale
        labels = torch.arange(len(a), device=a.device)
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def pairs(seed: int) -> tuple[Any, Any]:
    """Digits images paired with a second modality: a fixed random projection of the image to
    24 features, plus noise."""
    xt, _, xv, _ = sklearn_split("digits", seed)
    g = torch.Generator().manual_seed(seed + 1)
    proj = torch.randn(64, 24, generator=g) / 8
    tt = xt @ proj + 0.3 * torch.randn(len(xt), 24, generator=g)
    tv = xv @ proj + 0.3 * torch.randn(len(xv), 24, generator=g)
    return loaders((xt, tt), (xv, tv), seed, batch_size=64)


def clip(seed: int) -> Built:
    return CLIP(), *pairs(seed)


def augment(x: Tensor) -> Tensor:
    """A random shift of the 8x8 image by one pixel, 10% of the pixels dropped, noise."""
    shift = [int(s) for s in torch.randint(-1, 2, (2,))]
    x = torch.roll(x.view(-1, 8, 8), shifts=shift, dims=(1, 2)).reshape(-1, 64)
    return x * (torch.rand_like(x) > 0.1) + 0.3 * torch.randn_like(x)


class SimCLR(RecipeModule):
    """Two augmented views made inside the step, an encoder and projection head, NT-Xent at
    temperature 0.5."""

    def __init__(self) -> None:
        super().__init__(lr=1e-3)
        self.encoder = mlp(64, 32)
        self.projection = nn.Sequential(nn.ReLU(), nn.Linear(32, 16))

    def loss(self, batch: Any) -> Tensor:
        x = batch[0]
        z = F.normalize(self.projection(self.encoder(torch.cat([augment(x), augment(x)]))), dim=1)
        sim = z @ z.T / 0.5
        sim = sim.masked_fill(torch.eye(len(z), dtype=torch.bool, device=z.device), -1e9)
        n = len(x)
        targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
        return F.cross_entropy(sim, targets)


def simclr(seed: int) -> Built:
    return SimCLR(), *digits(seed, batch_size=64)


class Embedder(RecipeModule):
    """A 32-d embedding of digits trained with ``kind``: ``"triplet"`` (batch-hard mining,
    margin 0.2) or ``"cosine"`` (``CosineEmbeddingLoss`` on in-batch pairs)."""

    def __init__(self, kind: str) -> None:
        super().__init__(lr=1e-3)
        self.net = mlp(64, 32)
        self.kind = kind

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        emb = F.normalize(self.net(x), dim=1)
        if self.kind == "cosine":
            perm = torch.randperm(len(x), device=x.device)
            target = (y == y[perm]).float() * 2 - 1
            return F.cosine_embedding_loss(emb, emb[perm], target, margin=0.2)
        dist = torch.cdist(emb, emb)
        same = y[:, None] == y[None]
        hardest_pos = (dist * same).max(1).values
        hardest_neg = dist.masked_fill(same, float("inf")).min(1).values
        return F.relu(hardest_pos - hardest_neg + 0.2).mean()


def triplet(seed: int) -> Built:
    return Embedder("triplet"), *digits(seed, batch_size=64)


def cosine_embedding(seed: int) -> Built:
    return Embedder("cosine"), *digits(seed)


class MixtureOfExperts(RecipeModule):
    """Four expert MLPs behind a top-1 router; each example's output is its expert's, scaled by
    the router's probability; plus 0.01 of the Switch load-balancing loss (``detach_router``:
    the broken twin's router probabilities are detached)."""

    def __init__(self, detach_router: bool = False, experts: int = 4) -> None:
        super().__init__()
        self.router = nn.Linear(64, experts)
        self.experts = nn.ModuleList(mlp(64, 10, hidden=32) for _ in range(experts))
        self.detach_router = detach_router
        self.aux = torch.zeros(())

    def forward(self, x: Tensor) -> Tensor:
        probs = F.softmax(self.router(x), dim=-1)
        if self.detach_router:
            probs = probs.detach()
        choice = probs.argmax(-1)
        outs = torch.stack([e(x) for e in self.experts], 1)
        picked = outs[torch.arange(len(x)), choice] * probs.gather(1, choice[:, None])
        share = F.one_hot(choice, len(self.experts)).float().mean(0)
        self.aux = len(self.experts) * (share * probs.mean(0)).sum()
        return picked

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y) + 0.01 * self.aux


def moe(seed: int) -> Built:
    return MixtureOfExperts(), *digits(seed)


class Reinforce(RecipeModule):
    """A contextual bandit on digits: the policy picks one of 10 arms, reward 1 for the right
    digit; REINFORCE with a running-mean baseline and an entropy bonus. Validation logs the
    greedy reward."""

    baseline: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.policy = mlp(64, 10)
        self.register_buffer("baseline", torch.zeros(()))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        dist = torch.distributions.Categorical(logits=self.policy(x))
        action = dist.sample()
        reward = (action == y).float()
        advantage = reward - self.baseline
        self.baseline.mul_(0.9).add_(0.1 * reward.mean())
        loss = -(advantage * dist.log_prob(action)).mean() - 0.01 * dist.entropy().mean()
        self.log("train_reward", reward.mean())
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_reward", (self.policy(x).argmax(-1) == y).float().mean())


def reinforce(seed: int) -> Built:
    return Reinforce(), *digits(seed)


class WarmupCosine(Classifier):
    """AdamW with a linear warmup then cosine decay, stepped each optimizer step."""

    def __init__(self, total_steps: int) -> None:
        super().__init__(mlp(64, 10))
        self.total_steps = total_steps

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr)
        warm = max(1, self.total_steps // 10)

        def factor(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, self.total_steps - warm)))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def accumulate_cosine(seed: int) -> Built:
    return WarmupCosine(total_steps=2 * 32 // 4), *digits(seed, batch_size=16)


class EMAClassifier(Classifier):
    """An EMA of the weights (decay 0.9) updated after each step; validation uses it."""

    def __init__(self) -> None:
        super().__init__(mlp(64, 10))
        self.ema = AveragedModel(self.net, multi_avg_fn=get_ema_multi_avg_fn(0.9))
        self.ema.requires_grad_(False)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.ema.update_parameters(self.net)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.ema(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.net.parameters(), lr=self.lr)


def ema(seed: int) -> Built:
    return EMAClassifier(), *digits(seed)


COUPLED_RECIPES: list[Recipe] = [
    Recipe("clip", "contrastive", "CLIP-style InfoNCE over two towers, learned logit scale", clip),
    Recipe("simclr", "contrastive", "SimCLR NT-Xent, augmentation inside the step", simclr),
    Recipe("triplet", "contrastive", "triplet loss, batch-hard mining, 32-d embedding", triplet),
    Recipe("cosine-embedding", "contrastive", "`CosineEmbeddingLoss` on in-batch pairs",
           cosine_embedding),
    Recipe("moe", "technique", "top-1 mixture of experts, Switch load-balancing loss", moe),
    Recipe("reinforce", "technique", "REINFORCE with a baseline on a contextual bandit",
           reinforce),
    Recipe("accumulate-cosine", "technique",
           "gradient accumulation (4) with warmup and cosine decay", accumulate_cosine,
           trainer_kwargs={"accumulate_grad_batches": 4, "limit_train_batches": 32}),
    Recipe("ema", "technique", "an EMA of the weights, validated with the average", ema),
]
