"""Models that hand the hooks unusual tensors: a seeded fit with and without ``Triage()`` must
give bit-identical weights, no crash and no false finding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn

from lightning_triage import Triage
from lightning_triage.findings import Finding
from tests.helpers import loader, make_trainer


class SparseEmbeddingBag(pl.LightningModule):
    """Token classification over an ``nn.Embedding(sparse=True)``: sparse COO gradients."""

    def __init__(self, optimizer: str) -> None:
        super().__init__()
        self.optimizer = optimizer
        self.emb = nn.Embedding(50, 16, sparse=True)
        self.head = nn.Linear(16, 4)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(self.emb(tokens).mean(1))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        tokens, y = batch
        return nn.functional.cross_entropy(self(tokens), y)

    def configure_optimizers(self) -> Any:
        if self.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.5)
        # SparseAdam takes only sparse gradients: the dense head gets Adam
        return [torch.optim.SparseAdam(list(self.emb.parameters()), lr=0.01),
                torch.optim.Adam(self.head.parameters(), lr=0.01)]

    def on_fit_start(self) -> None:
        if self.optimizer != "sgd":
            self.automatic_optimization = False

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        pass


class ManualSparseAdam(SparseEmbeddingBag):
    def __init__(self) -> None:
        super().__init__("sparse_adam")
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        tokens, y = batch
        opts = self.optimizers()
        loss = nn.functional.cross_entropy(self(tokens), y)
        for opt in opts:
            opt.zero_grad()
        self.manual_backward(loss)
        for opt in opts:
            opt.step()
        return loss.detach()


def token_data(seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 50, (256, 6), generator=g)
    y = tokens[:, 0] % 4  # learnable from the first token
    return tokens, y


class MoE(pl.LightningModule):
    """Top-1 mixture of experts with a learned gate. Tokens go to one of the first three
    experts by a feature of the input; the fourth expert is routed to only for inputs above 10,
    which never come: it sees an empty ``(0, d)`` batch at every step."""

    def __init__(self, experts: int = 4, dim: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(8, dim)
        self.gate = nn.Linear(dim, experts)
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))
        self.head = nn.Linear(dim, classes)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.inp(x))
        choice = torch.bucketize(x[:, 2].contiguous(), torch.tensor([-0.5, 0.5, 10.0], device=x.device))
        weight = self.gate(h).softmax(-1).gather(1, choice[:, None])
        out = torch.zeros_like(h)
        for i, expert in enumerate(self.experts):
            rows = (choice == i).nonzero().flatten()
            out = out.index_add(0, rows, expert(h[rows]) * weight[rows])  # empty for expert 3
        return self.head(out + h)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def moe_data() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=g)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    return x, y


def fit(tmp_path: Path, make: Any, data: tuple[Tensor, ...], triage: Triage | None,
        **kwargs: Any) -> tuple[dict[str, Tensor], list[Finding]]:
    pl.seed_everything(0, verbose=False)
    model = make()
    trainer = make_trainer(tmp_path, [] if triage is None else [triage], max_epochs=2,
                           limit_train_batches=8, limit_val_batches=0, **kwargs)
    trainer.fit(model, loader(*data, batch_size=32, shuffle=True))
    findings = [] if triage is None else [f for c in triage.triage_checks for f in c.findings]
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, findings


def assert_identical(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("make", [lambda: SparseEmbeddingBag("sgd"), ManualSparseAdam],
                         ids=["sgd", "sparse_adam"])
def test_sparse_embedding(tmp_path: Path, make: Any) -> None:
    data = token_data()
    plain, _ = fit(tmp_path, make, data, None)
    triage = Triage(strict=True, verbose=False)
    watched, findings = fit(tmp_path, make, data, triage)
    assert_identical(plain, watched)
    problems = [f for f in findings if f.is_problem]
    assert problems == [], problems


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-true"])
def test_moe_with_an_empty_expert(tmp_path: Path, precision: str) -> None:
    data = moe_data()
    plain, _ = fit(tmp_path, MoE, data, None, precision=precision)
    triage = Triage(strict=True, verbose=False)
    watched, findings = fit(tmp_path, MoE, data, triage, precision=precision)
    assert_identical(plain, watched)
    problems = [f for f in findings if f.is_problem]
    # the expert that never gets a token really has a zero gradient: the one true finding
    assert [f.code for f in problems] == ["wiring.zero_grad_params"], problems
    assert problems[0].evidence["modules"] == ["experts.3"]
