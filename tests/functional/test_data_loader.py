"""The loader contracts of the data stage, without a Trainer: batch sizes and the generators
that DataLoader workers would share."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    SequentialSampler,
    Subset,
    TensorDataset,
    get_worker_info,
)

from lightning_triage.functional.data.loader import (
    BatchSizes,
    LoaderSpec,
    loader_spec,
    short_batches_rule,
    short_size,
)
from lightning_triage.functional.data.rngs import (
    MAX_DEPTH,
    SharedRng,
    find_rngs,
    shared_rng_rule,
)


# ---------------------------------------------------------------------------- batch sizes
def test_loader_spec_reads_the_configuration() -> None:
    ds = TensorDataset(torch.zeros(70, 3))
    spec = loader_spec("train", DataLoader(ds, batch_size=32))
    assert spec == LoaderSpec("train", 32, 3, False, False, 0)
    assert spec.is_last(2) and not spec.is_last(1)
    assert spec.is_last(5)  # a cycling loader (`max_size_cycle`) ends again at 5
    assert not loader_spec("train", DataLoader(ds, batch_size=32, drop_last=True)).is_last(1)


def test_loader_spec_none_without_a_promised_size() -> None:
    ds = TensorDataset(torch.zeros(70, 3))
    sampler = BatchSampler(SequentialSampler(ds), 32, False)
    assert loader_spec("train", DataLoader(ds, batch_sampler=sampler)) is None
    assert loader_spec("train", DataLoader(ds, batch_size=None)) is None
    assert loader_spec("train", [torch.zeros(2)]) is None


@pytest.mark.parametrize(("batch", "expected"), [
    ((torch.zeros(32, 3), torch.zeros(32)), None),
    ({"x": torch.zeros(32, 3), "mask": torch.zeros(5)}, None),  # one full entry is enough
    ({"input_ids": torch.zeros(32, 7, dtype=torch.long)}, None),  # (B, T), T < B
    (torch.zeros(7, 32), None),  # time-major (T, B)
    ((torch.zeros(7, 32, 3), torch.zeros(7, 32), torch.zeros(7, 7)), None),  # with a (T, T) mask
    # a collate that folded the batch into one sample: the tokens contradict "time-major"
    ({"image": torch.zeros(1, 32, 64), "tokens": torch.zeros(1, 256), "label": torch.zeros(1, 32)},
     1),
    ({"input_ids": torch.zeros(1, 900), "position_ids": torch.zeros(1, 900)}, None),  # packed
    (["a", "b"], None),  # no tensors
    ((torch.zeros(16, 3), torch.zeros(16)), 16),
    ({"x": torch.zeros(1, 3), "y": torch.zeros(1)}, 1),
])
def test_short_size(batch: Any, expected: int | None) -> None:
    assert short_size(batch, 32) == expected


@dataclass
class Pair:
    image: Tensor
    label: Tensor


def test_short_size_reads_dataclasses() -> None:
    assert short_size(Pair(torch.zeros(32, 3), torch.zeros(32)), 32) is None
    assert short_size(Pair(torch.zeros(3, 3), torch.zeros(3)), 32) == 3


def _sizes(loader: DataLoader[Any], spec: LoaderSpec, epochs: int = 1) -> BatchSizes:
    seen = BatchSizes()
    for _ in range(epochs):
        seen.new_epoch()
        for i, batch in enumerate(loader):
            seen.add(spec, batch, i, step=i)
    return seen


def test_distributed_sampler_keeps_the_per_rank_batch_size() -> None:
    ds = TensorDataset(torch.zeros(70, 3))
    for rank in (0, 1):
        loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds, 2, rank, False))
        spec = loader_spec("train", loader)
        assert spec is not None and spec.length == 5
        seen = _sizes(loader, spec)
        assert seen.checked == 4 and short_batches_rule(spec, seen) is None


class Stream(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        return iter(torch.arange(self.n, dtype=torch.float32).unsqueeze(1))


def test_iterable_dataset_partial_end_is_silent_and_more_is_reported() -> None:
    loader = DataLoader(Stream(70), batch_size=32)
    spec = loader_spec("train", loader)
    assert spec is not None and spec.iterable and spec.length is None
    seen = _sizes(loader, spec, epochs=2)
    assert seen.short == 2 and seen.most_in_epoch == 1
    assert short_batches_rule(spec, seen) is None
    cut = DataLoader(Stream(70), batch_size=32, collate_fn=lambda b: torch.stack(b[:20]))
    seen = _sizes(cut, spec, epochs=1)
    assert seen.most_in_epoch == 3
    v = short_batches_rule(spec, seen)
    assert v is not None and v.severity == "warning"


def test_rule_severity_follows_how_many_were_short() -> None:
    spec = LoaderSpec("train_dataloader", 32, 100, False, False, 0)
    some = BatchSizes()
    for i, n in enumerate([32, 31, 32, 32]):
        some.add(spec, torch.zeros(n, 2), i, step=i)
    v = short_batches_rule(spec, some)
    assert v is not None and v.severity == "info" and v.step == 1
    assert v.evidence["sizes"] == [31] and v.evidence["short"] == 1 and v.evidence["checked"] == 4
    assert "`batch_size=32`" in v.message and "31" in v.message
    assert short_batches_rule(spec, BatchSizes()) is None


# ---------------------------------------------------------------------------- generators
class Noisy(Dataset):  # type: ignore[type-arg]
    def __init__(self, rng: Any) -> None:
        self.rng = rng

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        return self.rng.random()


@pytest.mark.parametrize(("rng", "kind"), [
    (np.random.default_rng(0), "numpy.random.Generator"),
    (np.random.RandomState(0), "numpy.random.RandomState"),
    (random.Random(0), "random.Random"),
    (torch.Generator().manual_seed(0), "torch.Generator"),
])
def test_finds_each_generator_type(rng: Any, kind: str) -> None:
    assert find_rngs(Noisy(rng)) == [SharedRng("dataset.rng", kind, "rng")]


@pytest.mark.parametrize("rng", [np.random.random.__self__, random.random.__self__,  # type: ignore[attr-defined]
                                 torch.default_generator, random.SystemRandom()])
def test_generators_reseeded_by_pytorch_or_unshared_are_silent(rng: Any) -> None:
    assert find_rngs(Noisy(rng)) == []


class Jitter:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, x: float) -> float:
        return x + self.rng.normal()


class WithTransform(Dataset):  # type: ignore[type-arg]
    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        return self.transform(float(i))


class ModuleJitter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.g = torch.Generator().manual_seed(0)

    def forward(self, x: Tensor) -> Tensor:
        return x + torch.randn(x.shape, generator=self.g)


def test_generators_held_by_transforms_and_wrappers() -> None:
    ds = WithTransform(Jitter(0))
    assert [r.path for r in find_rngs(ds)] == ["dataset.transform.rng"]
    assert [r.path for r in find_rngs(Subset(ds, [0, 1]))] == ["dataset.dataset.transform.rng"]
    both = ConcatDataset([TensorDataset(torch.zeros(2)), ds])
    assert [r.path for r in find_rngs(both)] == ["dataset.datasets[1].transform.rng"]
    listed = WithTransform({"steps": [Jitter(1)]})
    assert [r.path for r in find_rngs(listed)] == ["dataset.transform['steps'][0].rng"]
    chained = WithTransform(nn.Sequential(nn.Identity(), ModuleJitter()))
    assert [r.path for r in find_rngs(chained)] == ["dataset.transform.1.g"]
    bound = WithTransform(Jitter(2).__call__)
    assert [r.path for r in find_rngs(bound)] == ["dataset.transform.rng"]


def test_generators_in_closures_partials_and_class_attributes() -> None:
    rng = np.random.default_rng(0)
    closure = WithTransform(lambda x: x + rng.normal())
    assert [(r.path, r.attribute) for r in find_rngs(closure)] == \
        [("dataset.transform.<locals>.rng", "rng")]

    def noise(x: float, gen: Any) -> float:
        return x + gen.normal()

    partial = WithTransform(functools.partial(noise, gen=rng))
    assert [r.path for r in find_rngs(partial)] == ["dataset.transform.keywords['gen']"]

    class Randomizable:  # as MONAI's transforms: a generator on the class
        R = np.random.RandomState(0)

        def __call__(self, x: float) -> float:
            return x + self.R.rand()

    assert [r.path for r in find_rngs(WithTransform(Randomizable()))] == ["dataset.transform.R"]


class SetupOnly(Dataset):  # type: ignore[type-arg]
    """Draws its data once with a generator it keeps: nothing is drawn per example."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.data = self.rng.normal(size=8)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> float:
        return float(self.data[i])


class ResampledPerEpoch(Dataset):  # type: ignore[type-arg]
    """The main process redraws the order every epoch; workers only read it."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.order = self.rng.permutation(8)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return int(self._lookup(i))

    def _lookup(self, i: int) -> Any:
        return self.order[i]


class DrawsInAHelper(ResampledPerEpoch):
    def _lookup(self, i: int) -> Any:
        return self.order[i] + self.rng.random()


class ReseedsPerWorker(Noisy):
    def __getitem__(self, i: int) -> Any:
        info = get_worker_info()
        if info is not None and getattr(self, "_worker", None) != info.id:
            self.rng, self._worker = np.random.default_rng(info.seed), info.id
        return self.rng.random()


class Sneaky(Dataset):  # type: ignore[type-arg]
    """Properties and `__getattr__` must never run during the walk."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    @property
    def expensive(self) -> Any:
        raise AssertionError("a property was called")

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"__getattr__({name!r}) was called")

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        return self.rng.random()


def test_silent_when_only_setup_reads_it_or_the_code_reseeds() -> None:
    assert find_rngs(SetupOnly()) == []
    assert find_rngs(ResampledPerEpoch()) == []
    assert [r.path for r in find_rngs(DrawsInAHelper())] == ["dataset.rng"]
    assert find_rngs(ReseedsPerWorker(np.random.default_rng(0))) == []
    assert [r.path for r in find_rngs(Sneaky())] == ["dataset.rng"]


def test_walk_is_bounded_and_survives_cycles() -> None:
    deep: Any = Jitter(0)
    for _ in range(MAX_DEPTH + 1):
        deep = WithTransform(deep)
    assert find_rngs(deep) == []
    ds = WithTransform(Jitter(0))
    ds.self_ref = ds  # type: ignore[attr-defined]
    ds.many = [Jitter(i) for i in range(1000)]  # type: ignore[attr-defined]
    assert len(find_rngs(ds)) <= 33


def test_rule_severity_and_worker_init_fn() -> None:
    rngs = [SharedRng("dataset.transform.rng", "numpy.random.Generator", "rng")]
    assert shared_rng_rule("train", rngs, num_workers=0, persistent=False,
                           worker_init_fn=None) is None
    v = shared_rng_rule("train", rngs, num_workers=2, persistent=True, worker_init_fn=None)
    assert v is not None and v.severity == "warning"
    assert "`dataset.transform.rng`" in v.message and "every epoch" not in v.message

    def reseed(worker_id: int) -> None:
        info = get_worker_info()
        info.dataset.transform.rng = np.random.default_rng(info.seed)

    assert shared_rng_rule("train", rngs, num_workers=2, persistent=False,
                           worker_init_fn=reseed) is None

    def seed_numpy(worker_id: int) -> None:
        np.random.seed(torch.initial_seed() % 2**32)

    v = shared_rng_rule("train", rngs, num_workers=2, persistent=False, worker_init_fn=seed_numpy)
    assert v is not None and v.severity == "info" and "`seed_numpy`" in v.message


class Reseeder:
    """A callable `worker_init_fn` object."""

    def __call__(self, worker_id: int) -> None:
        get_worker_info().dataset.rng = np.random.default_rng(worker_id)


def test_worker_init_fn_objects_and_several_generators() -> None:
    rngs = [SharedRng("dataset.rng", "random.Random", "rng"),
            SharedRng("dataset.g", "torch.Generator", "g")]
    v = shared_rng_rule("train", rngs, num_workers=2, persistent=False, worker_init_fn=Reseeder())
    assert v is not None and v.severity == "info" and v.evidence["paths"] == ["dataset.g"]
    v = shared_rng_rule("train", rngs, num_workers=2, persistent=False, worker_init_fn=None)
    assert v is not None and "random generators" in v.message and "`dataset.g`" in v.message
