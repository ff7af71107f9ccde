"""A hostile user of the update, loader, eval and autocast contracts: unusual but legal
``Trainer.fit`` set-ups under ``Triage(strict=True)`` (an internal error raises). Each must run
without a crash, give bit-identical weights with and without the callbacks, and report no
problem; the broken twins show the fixes stay targeted."""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler, TensorDataset

from lightning_triage import Triage, UpdateContractCheck
from lightning_triage.findings import Finding
from lightning_triage.functional.data.rngs import find_rngs
from lightning_triage.functional.update import tensor_norms
from tests.helpers import make_trainer


def xy(seed: int, n: int = 64) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return x, x[:, :3].argmax(1)  # balanced, learnable


def train_loader(**kwargs: Any) -> DataLoader:
    kwargs.setdefault("batch_size", 8)
    return DataLoader(TensorDataset(*xy(0)), **kwargs)


def val_loader(**kwargs: Any) -> DataLoader:
    kwargs.setdefault("batch_size", 8)
    return DataLoader(TensorDataset(*xy(1)), **kwargs)


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("val_loss", self.loss(batch))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(tmp_path: Path, make: Callable[[], pl.LightningModule], triage: pl.Callback | None, *,
        train: Callable[[], Any] = train_loader, val: Callable[[], Any] | None = val_loader,
        **kwargs: Any) -> tuple[pl.LightningModule, pl.Trainer]:
    pl.seed_everything(0, verbose=False)
    model = make()
    kwargs = {"max_steps": 6, "max_epochs": 3, "limit_train_batches": None, **kwargs}
    trainer = make_trainer(tmp_path, [] if triage is None else [triage], **kwargs)
    trainer.fit(model, train(), None if val is None else val())
    return model, trainer


def problems(callback: pl.Callback) -> list[Finding]:
    checks = callback.triage_checks if isinstance(callback, Triage) else [callback]
    return [f for c in checks for f in c.findings if f.is_problem]


def assert_same_run(tmp_path: Path, make: Callable[[], pl.LightningModule],
                    **kwargs: Any) -> list[Finding]:
    """Fit with and without ``Triage(strict=True)``: the same weights and buffers; returns the
    problems found."""
    plain, _ = fit(tmp_path, make, None, **kwargs)
    triage = Triage(strict=True, verbose=False, html=False, overfit=False)
    watched, _ = fit(tmp_path, make, triage, **kwargs)
    a, b = plain.state_dict(), watched.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    return problems(triage)


# ---------------------------------------------------------------------- unusual models
class EmaBuffer(Net):
    """An EMA buffer and a step counter updated under `no_grad` every step: buffers, not
    parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("ema", torch.zeros(3))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        with torch.no_grad():
            self.ema.mul_(0.9).add_(self.net[2].bias, alpha=0.1)
            self.count += 1
        return loss


class Tied(pl.LightningModule):
    """A language model whose decoder shares the embedding's weight."""

    def __init__(self, max_norm: float | None = None) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8, max_norm=max_norm)
        self.dec = nn.Linear(8, 20, bias=False)
        self.dec.weight = self.emb.weight
        nn.init.normal_(self.emb.weight, std=0.02)  # as tied LMs do: N(0, 1) rows give logits
        # of size ~8 at step 0 (init.loss_above_chance, rightly)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        (tokens,) = batch  # next-token targets: the same token would be a label leak, which a
        # tied decoder scores far below chance at step 0 (init.loss_below_chance, rightly)
        return nn.functional.cross_entropy(self.dec(self.emb(tokens[:, :-1])).flatten(0, 1),
                                           tokens[:, 1:].flatten())

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=0.01)


def tokens() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randint(0, 20, (64, 5), generator=g)), batch_size=8)


class SharedTwoOptimizers(Net):
    """Manual optimization: two optimizers that share the head's parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        first, second = self.optimizers()
        loss = self.loss(batch)
        first.zero_grad()
        second.zero_grad()
        self.manual_backward(loss)
        first.step()
        second.step()
        return loss.detach()

    def configure_optimizers(self) -> Any:
        return [torch.optim.SGD(self.parameters(), lr=0.1),
                torch.optim.Adam(self.net[2].parameters(), lr=0.01)]


class ManualWithScheduler(Net):
    """Manual optimization stepping its own LR scheduler in ``training_step``."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        opt, sched = self.optimizers(), self.lr_schedulers()
        loss = self.loss(batch)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        sched.step()
        return loss.detach()

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1, 0.7)]


class ComplexWeights(Net):
    """A complex-valued parameter and an integer parameter that never trains."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = nn.Parameter(torch.ones(3, dtype=torch.complex64))
        self.ids = nn.Parameter(torch.arange(3), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x) * (self.phase * self.phase.conj()).real + 0 * self.ids


class ValidationReturns(Net):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        if self.kind == "accuracy":
            self.log("val_acc", (self(x).argmax(1) == y).float().mean())
            return None
        return {"loss": self.loss(batch), "n": len(y)} if self.kind == "dict" else None


class RaisesInEval(Net):
    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            raise RuntimeError("this model only trains")
        return self.net(x)

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        return None


class CollectsOutputs(Net):
    """Keeps its validation losses and step count, as a user's epoch-end code does."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[Tensor] = []
        self.history: list[tuple[int, float]] = []
        self.train_calls = 0

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        self.train_calls += 1
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        loss = self.loss(batch)
        self.outputs.append(loss.detach())
        self.log("val_loss", loss)

    def on_validation_epoch_end(self) -> None:
        self.history.append((len(self.outputs), torch.stack(self.outputs).mean().item()))
        self.outputs.clear()


class BatchNormNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


class LazyNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LazyLinear(16), nn.ReLU(), nn.LazyLinear(3))


class InputsOnlyValidation(Net):
    """Validation batches hold no targets: ``training_step`` cannot run on them."""

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        (x,) = batch
        self.log("val_mean", self(x).mean())


class CountsInBuffer(Net):
    """``validation_step`` counts its calls in a buffer (saved with the weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("validations", torch.zeros((), dtype=torch.long))

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        self.validations += 1
        return super().validation_step(batch, batch_idx)


RECIPES: dict[str, tuple[Callable[[], pl.LightningModule], dict[str, Any]]] = {
    "ema_buffer_and_counter": (EmaBuffer, {}),
    "tied_embedding_decoder": (Tied, {"train": tokens, "val": None}),
    "two_optimizers_sharing_params": (SharedTwoOptimizers, {}),
    "manual_with_scheduler": (ManualWithScheduler, {}),
    "complex_and_integer_params": (ComplexWeights, {}),
    "float64_model": (Net, {"precision": "64-true"}),
    "bf16_true": (Net, {"precision": "bf16-true"}),
    "fp16_true": (Net, {"precision": "16-true"}),
    "accumulate_3_last_partial": (Net, {"accumulate_grad_batches": 3, "max_steps": -1,
                                        "limit_train_batches": 7, "max_epochs": 2}),
    "limit_train_batches_1": (Net, {"limit_train_batches": 1, "max_steps": -1,
                                    "max_epochs": 2}),
    "max_steps_1": (Net, {"max_steps": 1}),
    "clip_by_norm": (Net, {"gradient_clip_val": 0.01, "gradient_clip_algorithm": "norm"}),
    "val_check_interval_quarter": (Net, {"val_check_interval": 0.25, "max_steps": -1,
                                         "max_epochs": 1}),
    "validation_returns_none": (lambda: ValidationReturns("none"), {}),
    "validation_returns_dict": (lambda: ValidationReturns("dict"), {}),
    "validation_logs_accuracy_only": (lambda: ValidationReturns("accuracy"), {}),
    "forward_raises_in_eval": (RaisesInEval, {}),
    "batchnorm_validation_batch_size_1": (BatchNormNet, {"val": lambda: val_loader(
        batch_size=1)}),
    "lazy_modules": (LazyNet, {}),
    "validation_batches_without_targets": (InputsOnlyValidation, {
        "val": lambda: DataLoader(TensorDataset(xy(1)[0]), batch_size=8)}),
    "validation_counts_in_a_buffer": (CountsInBuffer, {"num_sanity_val_steps": 2,
                                                       "val_check_interval": 3}),
}


@pytest.mark.parametrize("name", list(RECIPES))
def test_unusual_recipes_run_unchanged_and_silent(tmp_path: Path, name: str) -> None:
    make, kwargs = RECIPES[name]
    found = assert_same_run(tmp_path, make, **kwargs)
    assert found == [], [(f.code, f.message) for f in found]


def test_what_the_users_code_keeps_is_unchanged(tmp_path: Path) -> None:
    runs = []
    for triage in (None, Triage(strict=True, verbose=False, html=False, overfit=False)):
        model, trainer = fit(tmp_path, CollectsOutputs, triage, max_steps=-1, max_epochs=2,
                             limit_train_batches=4, limit_val_batches=2, num_sanity_val_steps=2)
        runs.append((model.history, model.train_calls, trainer.callback_metrics["val_loss"]))
    assert runs[0] == runs[1]


# ---------------------------------------------------------------------- fixed false alarms
class AddsParamGroup(Net):
    """A second head that joins the optimizer (``add_param_group``) in the model's own
    ``on_train_batch_start`` at step 2, after the callbacks' batch-start hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.extra = nn.Linear(3, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.extra(self.net(x)) if self.global_step >= 2 else self.net(x)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        opt = self.optimizers()
        if self.global_step == 2 and len(opt.param_groups) == 1:
            opt.optimizer.add_param_group({"params": list(self.extra.parameters())})

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.net.parameters(), lr=0.1)


class UnfreezesInBatchStart(Net):
    """Everything frozen for the first two steps (``training_step`` returns ``None``), then
    unfrozen in the model's own ``on_train_batch_start``, after the callbacks' hooks."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.net.requires_grad_(self.global_step >= 2)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return super().training_step(batch, batch_idx) if self.global_step >= 2 else None


class WeightAverage(Net):
    """A copy of the weights updated after every step, kept inside the module: an EMA
    (``AveragedModel``) or a mean teacher. Neither is in the optimizer."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        if kind == "ema":
            self.copy = AveragedModel(self.net, multi_avg_fn=get_ema_multi_avg_fn(0.9))
        else:
            self.copy = copy.deepcopy(self.net)
        self.copy.requires_grad_(False)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.kind == "ema":
            self.copy.update_parameters(self.net)
        else:
            with torch.no_grad():
                for t, s in zip(self.copy.parameters(), self.net.parameters(), strict=True):
                    t.lerp_(s, 0.01)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.net.parameters(), lr=0.1)


class EditsEmbeddingInForward(Tied):
    """The broken twin of ``Embedding(max_norm=...)``: the forward rescales the weight in
    place itself."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        with torch.no_grad():
            self.emb.weight.mul_(0.99)
        return super().training_step(batch, batch_idx)


def contracts(tmp_path: Path, make: Callable[[], pl.LightningModule],
              **kwargs: Any) -> list[Finding]:
    check = UpdateContractCheck(strict=True)
    fit(tmp_path, make, check, **{"max_steps": 8, **kwargs})
    return check.findings


def test_param_group_added_mid_batch_is_not_frozen(tmp_path: Path) -> None:
    # was: wiring.frozen_params_changed for `extra`, changed by the step that now holds it
    assert contracts(tmp_path, AddsParamGroup) == []


def test_unfrozen_in_the_models_batch_start_is_not_frozen(tmp_path: Path) -> None:
    # was: wiring.frozen_params_changed for the whole model at its first step
    assert contracts(tmp_path, UnfreezesInBatchStart) == []
    found = assert_same_run(tmp_path, UnfreezesInBatchStart, max_steps=8)
    assert found == [], [(f.code, f.message) for f in found]


@pytest.mark.parametrize("kind", ["ema", "teacher"])
def test_weight_average_copy_is_info_at_most(tmp_path: Path, kind: str) -> None:
    # was: a wiring.frozen_params_changed warning for the copy updated every step
    found = contracts(tmp_path, lambda: WeightAverage(kind))
    assert [f for f in found if f.is_problem] == []
    assert [(f.code, f.evidence["every_step"]) for f in found] == [
        ("wiring.frozen_params_changed", True)]


def test_embedding_max_norm_renormalizing_in_forward_is_silent(tmp_path: Path) -> None:
    # was: wiring.params_changed_outside_step "in forward" at every step
    assert contracts(tmp_path, lambda: Tied(max_norm=1.0), train=tokens, val=None) == []
    broken = contracts(tmp_path, EditsEmbeddingInForward, train=tokens, val=None)
    assert [(f.code, f.severity) for f in broken] == [
        ("wiring.params_changed_outside_step", "warning")]


def test_tensor_norms_of_every_parameter_dtype() -> None:
    # was: a RuntimeError from the float32 foreach kernel (float64, complex, integer)
    tensors = [torch.tensor([3.0, 4.0], dtype=torch.float64), torch.tensor([3 + 4j]),
               torch.tensor([3, 4]), torch.tensor([True, False]),
               torch.tensor([[3.0, 4.0]]).to_sparse_csr(), torch.ones(4, dtype=torch.bfloat16)]
    out = tensor_norms(tensors)
    assert out.dtype == torch.float64  # a float64 model's small steps stay visible
    assert out.tolist() == [5.0, 5.0, 5.0, 1.0, 5.0, 2.0]
    assert tensor_norms([torch.ones(4)]).dtype == torch.float32


# ---------------------------------------------------------------------- hostile datasets
class Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    def __hash__(self) -> int:
        return 1


class Odd(Dataset):
    """A map-style dataset holding odd things; ``__getattr__`` counts its calls."""

    lookups = 0

    def __init__(self, **extra: Any) -> None:
        self.x, self.y = xy(0)
        self.__dict__.update(extra)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.x[i], self.y[i]

    def __getattr__(self, name: str) -> Any:
        type(self).lookups += 1
        raise AttributeError(name)


def odd_dataset() -> Odd:
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle

    def generator() -> Any:
        yield 1

    return Odd(cycle=cycle, huge=list(range(200_000)), gen=generator(),
               handle=io.BytesIO(b"lazy"), keyed={Unprintable(): np.random.default_rng(0)})


def test_find_rngs_survives_keys_with_a_raising_repr() -> None:
    # was: RuntimeError from the key's __repr__ while naming the path
    class Keyed:
        def __init__(self) -> None:
            self.rngs = {Unprintable(): np.random.default_rng(0)}

        def __getitem__(self, i: int) -> float:
            return float(self.rngs[next(iter(self.rngs))].normal())

    assert [r.path for r in find_rngs(Keyed())] == ["dataset.rngs[<Unprintable>]"]


def test_odd_dataset_with_workers(tmp_path: Path) -> None:
    before = Odd.lookups
    found = assert_same_run(tmp_path, Net, train=lambda: DataLoader(
        odd_dataset(), batch_size=8, num_workers=1), max_steps=3)
    assert found == [], [(f.code, f.message) for f in found]
    assert Odd.lookups == before  # torch's own `__getitems__` lookup runs in the worker


class Batch:
    def __init__(self, items: list[tuple[Tensor, Tensor]]) -> None:
        self.x = torch.stack([i[0] for i in items])
        self.y = torch.stack([i[1] for i in items])


class ObjectBatches(Net):
    def loss(self, batch: Any) -> Tensor:
        return nn.functional.cross_entropy(self(batch.x), batch.y)


class KeywordsOnly(Net):
    def forward(self, *, x: Tensor) -> Tensor:  # type: ignore[override]
        return self.net(x)

    def loss(self, batch: Any) -> Tensor:
        return nn.functional.cross_entropy(self(x=batch["x"]), batch["y"])


class TwoLoaders(Net):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self.loss(batch["a"]) + self.loss(batch["b"])


class Records(Dataset):
    def __init__(self, seed: int) -> None:
        self.x, self.y = xy(seed)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {"x": self.x[i], "y": self.y[i]}


LOADERS: dict[str, tuple[Callable[[], pl.LightningModule], dict[str, Any]]] = {
    "batch_sampler": (Net, {"train": lambda: DataLoader(
        TensorDataset(*xy(0)), batch_sampler=BatchSampler(SequentialSampler(range(64)), 8,
                                                          False))}),
    "collate_to_a_custom_class": (ObjectBatches, {
        "train": lambda: train_loader(collate_fn=Batch),
        "val": lambda: val_loader(collate_fn=Batch)}),
    "persistent_workers": (Net, {"train": lambda: train_loader(num_workers=1,
                                                               persistent_workers=True)}),
    "dict_of_loaders": (TwoLoaders, {"train": lambda: {"a": train_loader(),
                                                      "b": train_loader(batch_size=4)}}),
    "kwargs_only_forward": (KeywordsOnly, {
        "train": lambda: DataLoader(Records(0), batch_size=8),
        "val": lambda: DataLoader(Records(1), batch_size=8)}),
}


@pytest.mark.parametrize("name", list(LOADERS))
def test_unusual_loaders_run_unchanged_and_silent(tmp_path: Path, name: str) -> None:
    make, kwargs = LOADERS[name]
    found = assert_same_run(tmp_path, make, **kwargs)
    assert found == [], [(f.code, f.message) for f in found]

