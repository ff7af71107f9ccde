"""Broken runs of stage 1, the data: the digits MLP fed data with one thing wrong."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset, get_worker_info

from lightning_triage.demo.broken.common import HEALTHY, Loaders, digits, fit, loaders, mlp, raw_digits
from lightning_triage.demo.broken.structure import ShapeMismatchRegressor
from lightning_triage.demo.digits import DigitsMLP, load_digits_tensors
from lightning_triage.demo.scenario import Scenario


def shuffled(y: Tensor) -> Tensor:
    """``y`` permuted with a seeded generator: labels that no longer match their inputs."""
    return y[torch.randperm(len(y), generator=torch.Generator().manual_seed(1))]


def with_nan(x: Tensor) -> Tensor:
    """``x`` with feature 10 set to NaN in every example."""
    x = x.clone()
    x[:, 10] = float("nan")
    return x


def imbalanced_loaders() -> Loaders:
    """Class 0 kept whole, every other class thinned to one example in 20."""
    x, y, xv, yv = load_digits_tensors()
    keep = (y == 0) | (torch.arange(len(y)) % 20 == 0)
    return loaders(x[keep], y[keep], xv, yv)


def constant_loaders() -> Loaders:
    """Every training input is the first image."""
    x, y, xv, yv = load_digits_tensors()
    return loaders(x[:1].expand_as(x).clone(), y, xv, yv)


def duplicate_loaders() -> Loaders:
    """180 examples, each repeated 8 times in a row, not shuffled."""
    x, y, xv, yv = load_digits_tensors()
    return loaders(x[:180].repeat_interleave(8, 0), y[:180].repeat_interleave(8, 0), xv, yv,
                   shuffle=False)


def repeated_loaders() -> Loaders:
    """The same 32 examples, batch after batch."""
    x, y, xv, yv = load_digits_tensors()
    x, y = x[:32].repeat(20, 1), y[:32].repeat(20)
    return loaders(x, y, xv, yv, shuffle=False)


def unshuffled_loaders() -> Loaders:
    """The digits in their (already random) order, not shuffled: the twin of the two above."""
    return loaders(*load_digits_tensors(), shuffle=False)


def overlap_loaders() -> Loaders:
    """Validation examples taken from the training set."""
    x, y, _, _ = load_digits_tensors()
    return loaders(x, y, x[:300], y[:300])


def clamped_std_loaders() -> Loaders:
    """Per-pixel standardization dividing by ``std.clamp(min=1e-8)``: a pixel always 0 in
    training explodes in the validation image that has ink there."""
    x, y, xv, yv = load_digits_tensors(standardize=False)
    mean, std = x.mean(0), x.std(0).clamp(min=1e-8)
    return loaders((x - mean) / std, y, (xv - mean) / std, yv)


def raw_val_loaders() -> Loaders:
    """Standardized training inputs, raw validation inputs."""
    return digits(xv=lambda x: load_digits_tensors(standardize=False)[2])


def nan_target_loaders(nan: bool = True) -> Loaders:
    """Digits with float targets (a regression of the digit's value), one of them NaN."""
    x, y, xv, yv = load_digits_tensors()
    y = y.float()
    if nan:
        y[3] = float("nan")
    return loaders(x, y, xv, yv.float(), shuffle=False)


def one_per_class(examples: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """A "deduplicating" collate keyed by the label: keeps one example per class."""
    kept = {int(y): (x, y) for x, y in examples}
    xs, ys = zip(*kept.values(), strict=True)
    return torch.stack(xs), torch.stack(ys)


def dropping_collate_loaders() -> Loaders:
    x, y, xv, yv = load_digits_tensors()
    train = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, collate_fn=one_per_class,
                       generator=torch.Generator().manual_seed(0))
    return train, DataLoader(TensorDataset(xv, yv), batch_size=256)


class NoisyDigits(TensorDataset):
    """Gaussian-noise augmentation drawn from a generator created in the main process."""

    def __init__(self, x: Tensor, y: Tensor) -> None:
        super().__init__(x, y)
        self.rng = np.random.default_rng(0)

    def __getitem__(self, i: int) -> tuple[Tensor, ...]:
        x, y = super().__getitem__(i)
        return x + torch.from_numpy(self.rng.normal(0, 0.1, x.shape)).float(), y


def reseed_worker(worker_id: int) -> None:
    """A ``worker_init_fn`` giving each worker's copy of the dataset a generator of its own."""
    info = get_worker_info()
    assert info is not None
    info.dataset.rng = np.random.default_rng(info.seed)  # type: ignore[attr-defined]


def shared_rng_loaders(reseed: bool = False) -> Loaders:
    """:class:`NoisyDigits` in 2 workers (``reseed``: each worker reseeds its generator)."""
    x, y, xv, yv = load_digits_tensors()
    train = DataLoader(NoisyDigits(x, y), batch_size=32, shuffle=True, num_workers=2,
                       worker_init_fn=reseed_worker if reseed else None,
                       generator=torch.Generator().manual_seed(0))
    return train, DataLoader(TensorDataset(xv, yv), batch_size=256)


class CaptionedDigits(DigitsMLP):
    """Digits with a "caption" of 8 tokens each (the first row's pixels, bucketed), in dict
    batches; reads ``image`` and ``label`` whatever leading axes they carry."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        logits = self(batch["image"].reshape(-1, 64))
        return F.cross_entropy(logits, batch["label"].reshape(-1))


def captioned(batch: list[tuple[Tensor, Tensor]], fold: bool = False) -> dict[str, Tensor]:
    """Collates ``(image, label)`` pairs with their tokens into ``image (B, 64)``,
    ``tokens (B, 8)``, ``label (B,)``; ``fold``: the bug, a collate written for one sample's
    list that wraps the whole batch as one sample: ``(1, B, 64)`` images beside ``(1, 8B)``
    tokens and ``(1, B)`` labels."""
    images = torch.stack([x for x, _ in batch])
    labels = torch.stack([y for _, y in batch])
    tokens = (images[:, :8].abs() * 4).long().clamp(0, 15)
    if fold:
        return {"image": images[None], "tokens": tokens.reshape(1, -1), "label": labels[None]}
    return {"image": images, "tokens": tokens, "label": labels}


def captioned_loaders(fold: bool = False) -> Loaders:
    x, y, xv, yv = load_digits_tensors()
    train = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True,
                       collate_fn=functools.partial(captioned, fold=fold),
                       generator=torch.Generator().manual_seed(0))
    return train, DataLoader(TensorDataset(xv, yv), batch_size=256)


_REGRESSOR = lambda: ShapeMismatchRegressor(lr=0.01)  # noqa: E731

DATA_RUNS: list[Scenario] = [
    Scenario("raw-pixels", "raw 0-16 pixels", "data.unnormalized_input", fit(mlp(0.5), raw_digits),
             fixed=fit(mlp(0.5))),
    Scenario("nan-input", "NaN in one input feature", "data.nonfinite_input",
             fit(mlp(), lambda: digits(x=with_nan)), fixed=HEALTHY),
    Scenario("labels-off-by-one", "labels 1..10 for a 10-class head", "data.target_out_of_range",
             fit(mlp(), lambda: digits(y=lambda y: y + 1)), fixed=HEALTHY),
    Scenario("shuffled-labels", "shuffled training labels", "data.label_misalignment",
             fit(mlp(), lambda: digits(y=shuffled)), fixed=HEALTHY),
    Scenario("class-imbalance", "class 0 dominates the training set", "data.class_imbalance",
             fit(mlp(), imbalanced_loaders), fixed=HEALTHY),
    Scenario("constant-input", "every training input is the same image", "data.constant_input",
             fit(mlp(), constant_loaders), fixed=HEALTHY),
    Scenario("duplicate-samples", "each example repeated 8 times, not shuffled",
             "data.duplicate_samples", fit(mlp(), duplicate_loaders),
             fixed=fit(mlp(), unshuffled_loaders)),
    Scenario("repeated-batch", "the loader yields the same 32 examples every step",
             "data.repeated_batch", fit(mlp(), repeated_loaders),
             fixed=fit(mlp(), unshuffled_loaders)),
    Scenario("train-val-overlap", "validation examples taken from the training set",
             "data.train_val_overlap", fit(mlp(), overlap_loaders), fixed=HEALTHY),
    Scenario("clamped-std", "per-pixel standardization dividing by a std clamped to 1e-8",
             "data.val_outlier", fit(mlp(), clamped_std_loaders), fixed=HEALTHY),
    Scenario("raw-val-inputs", "validation inputs left as raw pixels", "data.train_val_shift",
             fit(mlp(), raw_val_loaders), fixed=HEALTHY),
    Scenario("nan-target", "NaN in one regression target", "data.nonfinite_target",
             fit(_REGRESSOR, nan_target_loaders),
             # the regressor's (N, 1) vs (N,) MSE stays: structure.shape_mismatch
             fixed=fit(_REGRESSOR, lambda: nan_target_loaders(nan=False)), full_fix=False),
    Scenario("dropping-collate", "a collate function that keeps one example per class",
             "data.short_batches", fit(mlp(), dropping_collate_loaders), fixed=HEALTHY),
    # issue 42: a collate written for one sample's list folds the whole batch into one sample:
    # `(1, B, 64)` images beside `(1, 8B)` tokens; the images' second axis alone looks like a
    # time-major batch, the tokens say it is not
    Scenario("folded-collate", "a collate that wraps the whole batch as one sample",
             "data.short_batches", fit(lambda: CaptionedDigits(lr=0.1),
                                       lambda: captioned_loaders(fold=True)),
             fixed=fit(lambda: CaptionedDigits(lr=0.1), captioned_loaders)),
    Scenario("shared-worker-rng", "noise drawn from a generator the dataset created, 2 workers",
             "data.shared_worker_rng", fit(mlp(), shared_rng_loaders),
             fixed=fit(mlp(), lambda: shared_rng_loaders(reseed=True))),
]
