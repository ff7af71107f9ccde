"""DataLoaderCheck: the loader's contracts (batch size, worker generators) on real fits."""

from __future__ import annotations

import functools
import pickle
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.fabric.utilities.seed import pl_worker_init_function
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    Sampler,
    TensorDataset,
    default_collate,
    get_worker_info,
)

from lightning_triage import BatchInspector, DataLoaderCheck, Triage
from lightning_triage.demo.digits import DigitsMLP, load_digits_tensors
from lightning_triage.errors import TriageConfigError
from lightning_triage.ranking import explain_findings, start_here
from tests.helpers import codes, make_trainer, seeds, stage_codes


@pytest.fixture(scope="module")
def digits() -> tuple[Tensor, ...]:
    return load_digits_tensors(standardize=True)


def check(**kwargs: Any) -> DataLoaderCheck:
    return DataLoaderCheck(strict=True, **kwargs)


def fit(tmp_path: Any, model: pl.LightningModule, train: Any, callbacks: list[Any],
        **kwargs: Any) -> pl.Trainer:
    trainer = make_trainer(tmp_path, callbacks, **kwargs)
    trainer.fit(model, train)
    return trainer


def only(findings: Any, code: str) -> Any:
    found = [f for f in findings if f.code == code]
    assert len(found) == 1, [f.code for f in findings]
    return found[0]


def shuffled(ds: Dataset[Any], seed: int, **kwargs: Any) -> DataLoader[Any]:
    return DataLoader(ds, shuffle=True, generator=torch.Generator().manual_seed(seed), **kwargs)


def dedup_collate(batch: list[tuple[Tensor, Tensor]]) -> Any:
    """Meant to drop repeated examples, but keys them by label: one example per class."""
    kept = {int(y): (x, y) for x, y in batch}
    return default_collate(list(kept.values()))


# ---------------------------------------------------------------------------- short batches
@pytest.mark.parametrize("seed", seeds())
def test_collate_that_drops_examples_is_caught_and_leads(tmp_path, digits, seed) -> None:
    x, y, _, _ = digits
    pl.seed_everything(seed)
    triage = Triage(report_dir=tmp_path, strict=True, verbose=False, overfit=False)
    fit(tmp_path, DigitsMLP(lr=0.1), shuffled(TensorDataset(x, y), seed, batch_size=32,
                                              collate_fn=dedup_collate), [triage])
    f = only(triage.check("DataLoaderCheck").findings, "data.short_batches")
    assert f.severity == "warning" and f.global_step == 0
    assert f.evidence["batch_size"] == 32 and f.evidence["short"] == f.evidence["checked"] == 4
    assert all(s <= 10 for s in f.evidence["sizes"])
    assert "`train_dataloader`" in f.message and "`batch_size=32`" in f.message
    assert triage.report.report["start_here"] == "data.short_batches"


@pytest.mark.parametrize("seed", seeds())
def test_default_collate_is_silent(tmp_path, digits, seed) -> None:
    x, y, _, _ = digits
    pl.seed_everything(seed)
    dc, bi = check(), BatchInspector(strict=True)
    fit(tmp_path, DigitsMLP(lr=0.1), shuffled(TensorDataset(x, y), seed, batch_size=32),
        [dc, bi])
    assert stage_codes(dc.findings + bi.findings, "data") == set()
    assert dc.check_status()["status"] == "passed"
    assert dc.idle  # no per-step work after the window


class TokenSeqs(Dataset[Tensor]):
    """Token sequences of random lengths 4..12 (vocabulary 32)."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.seqs = [torch.randint(0, 32, (int(k),), generator=gen)
                     for k in torch.randint(4, 13, (n,), generator=gen)]

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> Tensor:
        return self.seqs[i]


def flatten_collate(batch: list[Tensor], keep_one: bool = False) -> dict[str, Tensor]:
    """Packs a batch into one `(1, T)` row with `position_ids` restarting at each example, as
    transformers' `DataCollatorWithFlattening` does; ``keep_one``: the bug (a refactor left
    `batch = batch[:1]`): one example per batch, still a `(1, T)` row."""
    batch = batch[:1] if keep_one else batch
    ids = torch.cat(batch)[None]
    return {"input_ids": ids, "labels": ids.clone(),
            "position_ids": torch.cat([torch.arange(len(s)) for s in batch])[None]}


class PackedLM(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.out = nn.Embedding(32, 16), nn.Linear(16, 32)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        logits = self.out(self.emb(batch["input_ids"]))
        return F.cross_entropy(logits[0, :-1], batch["labels"][0, 1:])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("keep_one", [True, False])
def test_packed_batch_that_holds_one_example_is_caught(tmp_path, keep_one, seed) -> None:
    # a `(1, T)` packed row: its leading dimension says nothing; the sequence starts of its
    # `position_ids` count the examples it holds (issue 35)
    pl.seed_everything(seed)
    dc = check()
    loader = shuffled(TokenSeqs(256, seed), seed, batch_size=16,
                      collate_fn=functools.partial(flatten_collate, keep_one=keep_one))
    fit(tmp_path, PackedLM(), loader, [dc])
    if not keep_one:
        assert stage_codes(dc.findings, "data") == set()
        return
    f = only(dc.findings, "data.short_batches")
    assert f.severity == "warning" and f.evidence["sizes"] == [1, 1, 1, 1]
    assert f.evidence["batch_size"] == 16


def test_sporadic_drops_are_info(tmp_path, digits) -> None:
    x, y, _, _ = digits

    def drop_corrupt(batch: list[tuple[Tensor, Tensor]]) -> Any:  # "corrupt": label 9 of row 0
        return default_collate([b for i, b in enumerate(batch) if i or int(b[1]) != 9])

    ds = TensorDataset(x, y)
    first = next(i for i in range(len(ds)) if int(y[i]) == 9)
    order = [first, *[i for i in range(len(ds)) if i != first]]
    dc = check(num_batches=3)
    fit(tmp_path, DigitsMLP(), DataLoader(ds, batch_size=32, sampler=order,
                                          collate_fn=drop_corrupt), [dc])
    f = only(dc.findings, "data.short_batches")
    assert f.severity == "info" and f.evidence["sizes"] == [31] and f.evidence["checked"] == 3


def test_last_partial_batch_is_silent_every_epoch(tmp_path, digits) -> None:
    x, y, _, _ = digits
    dc = check(num_batches=8)
    fit(tmp_path, DigitsMLP(), DataLoader(TensorDataset(x[:70], y[:70]), batch_size=32), [dc],
        max_epochs=3, limit_train_batches=None)
    assert dc.findings == [] and dc.ran


def test_limit_train_batches_is_silent(tmp_path, digits) -> None:
    x, y, _, _ = digits
    dc = check(num_batches=8)
    fit(tmp_path, DigitsMLP(), DataLoader(TensorDataset(x, y), batch_size=32), [dc],
        max_epochs=4, limit_train_batches=2)
    assert dc.findings == []


class Buckets(Sampler[list[int]]):
    """Batches of varying size (as length-bucketing samplers yield)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        i, size = 0, 3
        while i < self.n:
            yield list(range(i, min(i + size, self.n)))
            i, size = i + size, 11 - size

    def __len__(self) -> int:
        return (self.n + 6) // 7 * 2


class SelfBatching(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, x: Tensor, y: Tensor) -> None:
        self.x, self.y = x, y

    def __iter__(self) -> Any:
        for i in range(0, 64, 5):
            yield self.x[i:i + 5], self.y[i:i + 5]


class Streamed(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, x: Tensor, y: Tensor) -> None:
        self.x, self.y = x, y

    def __iter__(self) -> Any:
        return zip(self.x[:70], self.y[:70], strict=True)


@pytest.mark.parametrize("kind", ["batch_sampler", "self_batching", "streamed"])
def test_loaders_without_a_fixed_size_are_silent(tmp_path, digits, kind) -> None:
    x, y, _, _ = digits
    loader = {
        "batch_sampler": lambda: DataLoader(TensorDataset(x, y), batch_sampler=Buckets(64)),
        "self_batching": lambda: DataLoader(SelfBatching(x, y), batch_size=None),
        "streamed": lambda: DataLoader(Streamed(x, y), batch_size=32),  # 32, 32, 6
    }[kind]()
    dc = check(num_batches=6)
    fit(tmp_path, DigitsMLP(), loader, [dc], max_epochs=2, limit_train_batches=None)
    assert dc.findings == [] and dc.ran


class DictModel(pl.LightningModule):
    """Reads `{"image": (B, 64), "label": (B,)}` or `{"ids": (B, T), ...}` batches."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 64)
        self.head = nn.Linear(64, 10)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        if "ids" in batch:
            out = self.head(self.emb(batch["ids"]).mean(-2))
            return F.cross_entropy(out, batch["label"])
        return F.cross_entropy(self.head(batch["image"]), batch["label"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_dict_and_sequence_batches_of_the_right_size_are_silent(tmp_path, digits) -> None:
    x, y, _, _ = digits

    def as_dict(batch: Any) -> dict[str, Tensor]:
        xs, ys = default_collate(batch)
        return {"image": xs, "label": ys, "lengths": torch.tensor([3, 4])}

    def as_tokens(batch: Any) -> dict[str, Tensor]:  # (B, T) with T = 5 < B = 32
        xs, ys = default_collate(batch)
        return {"ids": (xs[:, :5].abs() * 4).long().clamp(0, 15), "label": ys}

    for collate in (as_dict, as_tokens):
        dc = check()
        fit(tmp_path, DictModel(), DataLoader(TensorDataset(x, y), batch_size=32,
                                              collate_fn=collate), [dc])
        assert dc.findings == [], collate.__name__


class TwoLoaders(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(64, 10)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return sum(F.cross_entropy(self.net(b[0]), b[1]) for b in batch.values())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_combined_loaders_name_the_one_that_drops(tmp_path, digits) -> None:
    x, y, _, _ = digits
    short = DataLoader(TensorDataset(x[:70], y[:70]), batch_size=32)  # 3 batches, cycled
    broken = DataLoader(TensorDataset(x, y), batch_size=32, collate_fn=dedup_collate)
    dc = check(num_batches=8)
    fit(tmp_path, TwoLoaders(), {"a": short, "b": broken}, [dc], limit_train_batches=8)
    f = only(dc.findings, "data.short_batches")
    assert f.evidence["loader"] == "train_dataloader['b']" and f.evidence["checked"] == 8
    dc = check(num_batches=8)
    fine = DataLoader(TensorDataset(x, y), batch_size=32)
    fit(tmp_path, TwoLoaders(), {"a": short, "b": fine}, [dc], limit_train_batches=8)
    assert dc.findings == []


# ---------------------------------------------------------------------------- worker generators
class NoisyDigits(Dataset):  # type: ignore[type-arg]
    """Digits with additive noise from a generator made in `__init__` (the main process)."""

    def __init__(self, x: Tensor, y: Tensor, seed: int) -> None:
        self.x, self.y = x[:32], y[:32]
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        noise = torch.from_numpy(self.rng.normal(0, 1, 64).astype("float32"))
        return noise + 0.0 * self.x[i], self.y[i]  # pure noise: the batches show the sharing


def seed_worker(worker_id: int) -> None:
    info = get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("fixed", [False, True])
def test_workers_sharing_a_generator(tmp_path, digits, seed, fixed) -> None:
    x, y, _, _ = digits
    pl.seed_everything(seed)
    loader = DataLoader(NoisyDigits(x, y, seed), batch_size=4, num_workers=2,
                        worker_init_fn=seed_worker if fixed else None)
    triage = Triage(report_dir=tmp_path, strict=True, verbose=False, overfit=False)
    fit(tmp_path, DigitsMLP(), loader, [triage], limit_train_batches=3)
    found = explain_findings([f for c in triage.checks for f in c.findings])
    if fixed:
        assert not {"data.shared_worker_rng", "data.repeated_batch"} & codes(found)
        return
    f = only(found, "data.shared_worker_rng")
    assert f.severity == "warning" and f.evidence["paths"] == ["dataset.rng"]
    assert "numpy.random.Generator" in f.message and "every epoch" in f.message
    # the symptom: worker 1's first batch repeats worker 0's
    assert only(found, "data.repeated_batch").explained_by == ["data.shared_worker_rng"]
    assert start_here(found) == "data.shared_worker_rng"
    assert triage.report.report["start_here"] == "data.shared_worker_rng"


def test_without_workers_nothing_is_shared(tmp_path, digits) -> None:
    x, y, _, _ = digits
    dc = check()
    fit(tmp_path, DigitsMLP(), DataLoader(NoisyDigits(x, y, 0), batch_size=4), [dc],
        limit_train_batches=2)
    assert dc.findings == [] and "0 with workers" in dc.detail


def test_lightning_worker_init_does_not_count_a_user_one_lowers_to_info(digits) -> None:
    x, y, _, _ = digits

    def seed_numpy(worker_id: int) -> None:
        np.random.seed(worker_id)

    expected = {functools.partial(pl_worker_init_function, rank=0): "warning",
                seed_numpy: "info", seed_worker: None}
    for fn, severity in expected.items():
        dc = check()
        loader = DataLoader(NoisyDigits(x, y, 0), batch_size=4, num_workers=2,
                            worker_init_fn=fn)
        dc._check_workers(None, "train_dataloader", loader)  # type: ignore[arg-type]
        assert [f.severity for f in dc.findings] == ([severity] if severity else [])


def test_arguments_and_pickling() -> None:
    with pytest.raises(TriageConfigError, match="num_batches"):
        DataLoaderCheck(num_batches=0)
    dc = DataLoaderCheck()
    assert dc.stage == "data" and set(dc.codes) == {"data.short_batches", "data.shared_worker_rng"}
    assert pickle.loads(pickle.dumps(dc)).num_batches == 4
    assert isinstance(Triage().check("DataLoaderCheck"), DataLoaderCheck)


def test_a_plain_iterable_is_skipped(tmp_path, digits) -> None:
    x, y, _, _ = digits
    batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)]

    class Batches:
        def __iter__(self) -> Any:
            return iter(batches)

        def __len__(self) -> int:
            return len(batches)

    dc = check()
    fit(tmp_path, DigitsMLP(), Batches(), [dc])
    assert dc.findings == [] and dc.check_status()["status"] == "skipped" and dc.idle
