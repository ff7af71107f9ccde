from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from lightning_triage import InitialLossCheck
from lightning_triage.demo.broken import broken_run
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from tests.helpers import loader, make_trainer, stage_codes


def fit_check(tmp_path: Path, model: pl.LightningModule, train: Any, **check_kwargs: Any
              ) -> InitialLossCheck:
    pl.seed_everything(0)
    check = InitialLossCheck(strict=True, **check_kwargs)
    trainer = make_trainer(tmp_path, [check], limit_train_batches=2)
    trainer.fit(model, train)
    return check


def test_healthy_digits_mlp_is_silent(tmp_path: Path) -> None:
    train, _ = digits_loaders()
    check = fit_check(tmp_path, DigitsMLP(), train)
    assert check.ran
    assert check.chance is not None
    assert (check.chance.task, check.chance.num_classes) == ("multiclass", 10)
    assert check.initial_loss == pytest.approx(math.log(10), abs=0.4)
    assert stage_codes(check.findings, "init") == set()


def test_scaled_logits_are_caught(tmp_path: Path) -> None:
    model, train, _ = broken_run("scaled-logits").build()  # the registry's broken run
    check = fit_check(tmp_path, model, train)
    [finding] = check.findings
    assert finding.code == "init.loss_above_chance"
    assert finding.global_step == 0
    assert finding.evidence["task"] == "multiclass"
    assert finding.evidence["num_classes"] == 10
    assert finding.evidence["ratio"] > 5
    assert "ln(10) = 2.303" in finding.message


def test_loss_scaled_down_is_caught(tmp_path: Path) -> None:
    # the registry's broken run: the mean loss divided by the batch size again
    model, train, _ = broken_run("loss-divided-twice").build()
    check = fit_check(tmp_path, model, train)
    assert [f.code for f in check.findings] == ["init.loss_below_chance"]
    assert check.findings[0].evidence["ratio"] < 0.1


class BinaryNet(pl.LightningModule):
    def __init__(self, n_features: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_features, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.binary_cross_entropy_with_logits(self.net(x).squeeze(-1), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def _standardize(x: Tensor) -> Tensor:
    return (x - x.mean(0)) / x.std(0).clamp_min(1e-8)


def test_healthy_binary_bce_is_silent(tmp_path: Path) -> None:
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x = _standardize(torch.tensor(data.data, dtype=torch.float32))
    y = torch.tensor(data.target, dtype=torch.float32)
    check = fit_check(tmp_path, BinaryNet(x.shape[1]), loader(x, y, shuffle=True))
    assert check.chance is not None and check.chance.task == "binary"
    assert check.initial_loss == pytest.approx(math.log(2), abs=0.25)
    assert check.findings == []


class Regressor(pl.LightningModule):
    def __init__(self, n_features: int, loss: str = "mse") -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_features, 16), nn.ReLU(), nn.Linear(16, 1))
        self.loss = loss

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        pred = self.net(x).squeeze(-1)
        return F.mse_loss(pred, y) if self.loss == "mse" else F.l1_loss(pred, y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


@pytest.mark.parametrize("loss", ["mse", "l1"])
@pytest.mark.parametrize("standardize_targets", [True, False])
def test_healthy_regression_is_silent(tmp_path: Path, loss: str, standardize_targets: bool) -> None:
    from sklearn.datasets import load_diabetes

    data = load_diabetes()
    x = _standardize(torch.tensor(data.data, dtype=torch.float32))
    y = torch.tensor(data.target, dtype=torch.float32)  # raw targets: 25..346
    if standardize_targets:
        y = _standardize(y)
    check = fit_check(tmp_path, Regressor(x.shape[1], loss), loader(x, y, shuffle=True))
    assert check.chance is not None and check.chance.task == "regression"
    assert check.findings == []


class TinyLM(pl.LightningModule):
    def __init__(self, vocab: int = 32, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        tokens = batch["input_ids"]
        logits = self.head(self.embed(tokens[:, :-1]))
        targets = tokens[:, 1:].clone()
        targets[:, :2] = -100  # ignored positions
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class DictTokens(Dataset):
    def __init__(self, n: int = 64, length: int = 12, vocab: int = 32) -> None:
        self.tokens = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i], "id": f"doc-{i}"}


def test_token_level_run_with_explicit_task_is_silent(tmp_path: Path) -> None:
    check = fit_check(tmp_path, TinyLM(), DataLoader(DictTokens(), batch_size=8),
                      task="sequence", num_classes=32)
    assert check.chance is not None and check.chance.describe().startswith("ln(32)")
    assert check.findings == []


def test_token_level_run_with_scaled_logits_is_caught(tmp_path: Path) -> None:
    class HotLM(TinyLM):
        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            tokens = batch["input_ids"]
            logits = self.head(self.embed(tokens[:, :-1])) * 50
            return F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:])

    check = fit_check(tmp_path, HotLM(), DataLoader(DictTokens(), batch_size=8))
    # the dict batch's labels (8, 12) and the head's output (8, 11, 32) do not line up, but the
    # step's `F.cross_entropy` call says what the loss is: 32 classes along dim 1
    assert [f.code for f in check.findings] == ["init.loss_above_chance"]
    assert check.findings[0].evidence["num_classes"] == 32
    check = fit_check(tmp_path, HotLM(), DataLoader(DictTokens(), batch_size=8),
                      task="sequence", num_classes=32)
    assert [f.code for f in check.findings] == ["init.loss_above_chance"]


class DictDigits(Dataset):
    def __init__(self) -> None:
        train, _ = digits_loaders()
        self.x, self.y = train.dataset.tensors  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"image": self.x[i], "label": self.y[i], "name": f"digit-{i}"}


class DictMLP(DigitsMLP):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return F.cross_entropy(self(batch["image"]), batch["label"])


@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_task_inference_on_dict_batches(tmp_path: Path, scale: float) -> None:
    check = fit_check(tmp_path, DictMLP(logit_scale=scale), DataLoader(DictDigits(), batch_size=32))
    assert check.chance is not None
    assert (check.chance.task, check.chance.num_classes) == ("multiclass", 10)
    assert [f.code for f in check.findings] == (["init.loss_above_chance"] if scale > 1 else [])


def test_gradient_accumulation_reads_the_unscaled_loss(tmp_path: Path) -> None:
    model = DigitsMLP()
    x, y = next(iter(digits_loaders()[0]))  # the same first batch the trainer will see
    train, _ = digits_loaders()
    with torch.no_grad():
        expected = float(F.cross_entropy(model(x), y))
    check = InitialLossCheck(strict=True)
    trainer = make_trainer(tmp_path, [check], limit_train_batches=4, accumulate_grad_batches=4)
    trainer.fit(model, train)
    assert check.initial_loss == pytest.approx(expected, rel=1e-5)
    assert check.findings == []


def test_manual_optimization_is_supported(tmp_path: Path) -> None:
    class Manual(DigitsMLP):
        def __init__(self) -> None:
            super().__init__(logit_scale=100.0)
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            opt = self.optimizers()
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            opt.zero_grad()  # type: ignore[union-attr]
            self.manual_backward(loss)
            opt.step()  # type: ignore[union-attr]
            return loss.detach()

    train, _ = digits_loaders()
    check = fit_check(tmp_path, Manual(), train)
    assert [f.code for f in check.findings] == ["init.loss_above_chance"]


def test_no_targets_gives_chance_unknown_naming_the_argument(tmp_path: Path) -> None:
    class AutoEncoder(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 64))

        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            (x,) = batch
            return (self.net(x) - x).pow(2).mean()  # no loss function the check knows

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters())

    check = fit_check(tmp_path, AutoEncoder(), loader(torch.randn(64, 64)))
    [finding] = check.findings
    assert finding.code == "init.chance_unknown"
    assert finding.severity == "info"
    assert "`task=`" in finding.message


def test_hooks_are_removed_after_the_first_batch(tmp_path: Path) -> None:
    train, _ = digits_loaders()
    model = DigitsMLP()
    fit_check(tmp_path, model, train)
    assert all(not m._forward_hooks for m in model.modules())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"task": "segmentation"}, r"`task` must be one of .* got 'segmentation'"),
        ({"task": "multiclass", "num_classes": 1}, r"`num_classes` must be an integer >= 2 .* got 1"),
        ({"task": "multiclass"}, r"`num_classes` is required with task='multiclass'"),
        ({"above_ratio": 0.5}, r"`above_ratio` must be > 1, got 0.5"),
        ({"below_ratio": 2.0}, r"`below_ratio` must be in \(0, 1\), got 2.0"),
    ],
)
def test_bad_configuration_is_rejected(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        InitialLossCheck(**kwargs)
