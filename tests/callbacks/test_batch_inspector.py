"""BatchInspector: every data.* code on a real broken fit, and healthy fits that stay silent."""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from typing import Any

import jsonschema
import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightning_triage import BatchInspector, InitialLossCheck, Triage, TriageReport
from lightning_triage.demo.digits import DigitsMLP, load_digits_tensors
from lightning_triage.report import REPORT_SCHEMA
from tests.helpers import assert_ran_and_passed, codes, loader, make_trainer, seeds, stage_codes


@pytest.fixture(scope="module")
def digits():
    return load_digits_tensors(standardize=True)


@pytest.fixture(scope="module")
def raw_digits():
    return load_digits_tensors(standardize=False)


def inspector(**kwargs: Any) -> BatchInspector:
    return BatchInspector(strict=True, **kwargs)


def fit(tmp_path, model, train, val=None, callbacks=None, **kwargs):
    trainer = make_trainer(tmp_path, callbacks or [], **kwargs)
    trainer.fit(model, train, val)
    return trainer


def only(findings, code):
    found = [f for f in findings if f.code == code]
    assert len(found) == 1, [f.code for f in findings]
    return found[0]


# ---------------------------------------------------------------------------- healthy runs
def test_standardized_digits_with_constant_pixels_is_silent(tmp_path, digits):
    x, y, xv, yv = digits
    assert bool((x[:, 0] == 0).all())  # an always-zero border pixel
    bi = inspector()
    pl.seed_everything(0)
    fit(tmp_path, DigitsMLP(lr=0.1), loader(x, y, shuffle=True), loader(xv, yv, batch_size=64),
        [bi], max_epochs=2, limit_train_batches=16, num_sanity_val_steps=2)
    assert stage_codes(bi.findings, "data") == set()
    assert bi.check_status()["status"] == "passed"
    assert bi.classes == 10
    assert "label probe" in bi.detail
    assert bi.sample is not None
    assert bi.sample["tensor"] == "batch[0]"
    assert bi.sample["image_shape"] == [8, 8]
    assert len(bi.batch_stats) == 32 + 2  # the 32-batch window over 2 epochs, 2 val batches


class ConvBN(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                 nn.Flatten(), nn.Linear(8 * 8 * 8, 10))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_images_with_batchnorm_are_silent(tmp_path, raw_digits):
    x, y, xv, yv = raw_digits
    images, val_images = (x / 16).reshape(-1, 1, 8, 8), (xv / 16).reshape(-1, 1, 8, 8)
    bi = inspector()
    pl.seed_everything(0)
    fit(tmp_path, ConvBN(), loader(images, y, shuffle=True), loader(val_images, yv), [bi],
        limit_train_batches=6, num_sanity_val_steps=1)
    assert stage_codes(bi.findings, "data") == set()
    assert bi.classes == 10  # read from the head, since training_step calls `self.net`
    assert bi.sample["kind"] == "image"


class TinyLM(pl.LightningModule):
    def __init__(self, vocab: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 16)
        self.head = nn.Linear(16, vocab)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.emb(ids))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        logits = self(batch["input_ids"])
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class TokenData(Dataset):
    def __init__(self, n: int = 256, length: int = 12, vocab: int = 16) -> None:
        g = torch.Generator().manual_seed(0)
        self.seq = torch.randint(0, vocab, (n, length + 1), generator=g)

    def __len__(self) -> int:
        return len(self.seq)

    def __getitem__(self, i: int) -> dict[str, Any]:
        labels = self.seq[i, 1:].clone()
        labels[-2:] = -100  # padding the loss ignores
        causal_bias = torch.full((12, 12), float("-inf")).triu(1)  # an additive mask: -inf is fine
        return {"input_ids": self.seq[i, :-1], "labels": labels, "id": f"doc-{i}",
                "attn_bias": causal_bias}


def test_token_sequences_are_silent(tmp_path):
    bi = inspector()
    pl.seed_everything(0)
    fit(tmp_path, TinyLM(), DataLoader(TokenData(), batch_size=16), None, [bi],
        limit_train_batches=6)
    assert stage_codes(bi.findings, "data") == set()
    assert bi.classes == 16  # the vocabulary, from the output width
    assert bi.sample["kind"] == "tokens"


class DictDigits(Dataset):
    def __init__(self, x: Tensor, y: Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"id": f"digit-{i}", "image": self.x[i], "label": self.y[i]}


class DictMLP(DigitsMLP):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        assert isinstance(batch["id"][0], str)
        return F.cross_entropy(self(batch["image"]), batch["label"])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", F.cross_entropy(self(batch["image"]), batch["label"]))


def test_dict_batches_with_string_ids_are_silent(tmp_path, digits):
    x, y, xv, yv = digits
    bi = inspector()
    pl.seed_everything(0)
    fit(tmp_path, DictMLP(), DataLoader(DictDigits(x, y), batch_size=32, shuffle=True),
        DataLoader(DictDigits(xv, yv), batch_size=64), [bi], limit_train_batches=6,
        num_sanity_val_steps=1)
    assert stage_codes(bi.findings, "data") == set()
    assert bi.sample["tensor"] == "batch['image']"
    assert bi.sample["target"] == "batch['label']"


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return F.mse_loss(self(batch[0]), batch[1])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", F.mse_loss(self(batch[0]), batch[1]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def regression_targets(x: Tensor) -> Tensor:
    w = torch.linspace(-1, 1, 64)
    return (x @ w / 8).unsqueeze(1)


def test_regression_targets_are_silent(tmp_path, digits):
    x, _, xv, _ = digits
    bi = inspector()
    pl.seed_everything(0)
    fit(tmp_path, Regressor(), loader(x, regression_targets(x), shuffle=True),
        loader(xv, regression_targets(xv)), [bi], limit_train_batches=6, num_sanity_val_steps=1)
    assert stage_codes(bi.findings, "data") == set()
    assert bi.classes is None
    assert_ran_and_passed(bi)
    assert bi.train_inspected == 6


class CountRegressor(Regressor):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return F.mse_loss(self(batch[0]).squeeze(1), batch[1].float())


def test_integer_regression_targets_are_not_classes(tmp_path, digits):
    x, _, _, _ = digits
    counts = (x > 0.5).sum(1)  # integer targets 0..64 with a one-column output
    bi = inspector()
    pl.seed_everything(0)
    fit(tmp_path, CountRegressor(), loader(x, counts, shuffle=True), None, [bi],
        limit_train_batches=4)
    assert "data.target_out_of_range" not in codes(bi.findings)
    assert bi.classes is None
    assert_ran_and_passed(bi)
    assert bi.train_inspected == 4


class Embedder(Regressor):
    """Metric learning: 16-d embeddings with identity labels up to 200 (not class scores)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(64, 16)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        emb = F.normalize(self(batch[0]), dim=1)
        same = (batch[1][:, None] == batch[1][None]).float()
        return F.mse_loss(emb @ emb.T, same)


def test_labels_far_beyond_an_inferred_width_are_only_a_warning(tmp_path, digits):
    x, _, _, _ = digits
    ids = torch.arange(len(x)) % 200
    bi = inspector()
    pl.seed_everything(0)
    fit(tmp_path, Embedder(), loader(x, ids, shuffle=True), None, [bi], limit_train_batches=2)
    f = only(bi.findings, "data.target_out_of_range")
    assert f.severity == "warning"
    assert "num_classes=" in f.message


def test_repeating_epochs_of_an_unshuffled_loader_are_not_repeated_batches(tmp_path, digits):
    x, y, _, _ = digits
    bi = inspector()
    fit(tmp_path, DigitsMLP(), loader(x, y, shuffle=False), None, [bi], max_epochs=3,
        limit_train_batches=2)
    assert "data.repeated_batch" not in codes(bi.findings)
    assert_ran_and_passed(bi)


# ---------------------------------------------------------------------------- broken runs
def test_nonfinite_input_names_batch_tensor_and_example(tmp_path, digits):
    x, y, _, _ = digits
    x = x.clone()
    x[70, 5] = float("nan")  # batch 2, example 6
    x[71, 9] = float("inf")
    bi = inspector()
    fit(tmp_path, DigitsMLP(), loader(x, y), None, [bi], limit_train_batches=4)
    f = only(bi.findings, "data.nonfinite_input")
    assert f.severity == "error"
    assert f.evidence["batch_idx"] == 2
    assert f.evidence["tensor"] == "batch[0]"
    assert (f.evidence["nan"], f.evidence["inf"], f.evidence["first_example"]) == (1, 1, 6)
    assert f.global_step == 2
    assert "training batch 2" in f.message
    assert "data.nonfinite_target" not in codes(bi.findings)


def test_nonfinite_target(tmp_path, digits):
    x, _, _, _ = digits
    t = regression_targets(x).clone()
    t[40, 0] = float("nan")  # batch 1, example 8
    bi = inspector()
    fit(tmp_path, Regressor(), loader(x, t), None, [bi], limit_train_batches=3)
    f = only(bi.findings, "data.nonfinite_target")
    assert (f.evidence["batch_idx"], f.evidence["tensor"], f.evidence["first_example"]) == (1, "batch[1]", 8)
    assert "data.nonfinite_input" not in codes(bi.findings)


def test_raw_pixels_are_start_here(tmp_path, raw_digits):
    x, y, xv, yv = raw_digits
    report = TriageReport(report_dir=tmp_path, verbose=False, strict=True)
    bi = inspector()
    pl.seed_everything(0)
    fit(tmp_path, DigitsMLP(lr=0.5), loader(x, y, shuffle=True), loader(xv, yv),
        [bi, InitialLossCheck(strict=True), report], limit_train_batches=8)
    assert report.report["start_here"] == "data.unnormalized_input"
    f = only(bi.findings, "data.unnormalized_input")
    assert (f.evidence["batch_idx"], f.evidence["tensor"], f.evidence["max"]) == (0, "batch[0]", 16.0)
    assert f.evidence["rms"] > 4
    # raw in both splits: no shift; the digits are still learnable: no misalignment
    assert stage_codes(bi.findings, "data") == {"data.unnormalized_input"}


def test_raw_pixels_with_the_triage_bundle(tmp_path, raw_digits):
    x, y, xv, yv = raw_digits
    triage = Triage(report_dir=tmp_path, strict=True, verbose=False)
    assert type(triage.checks[0]).__name__ == "BatchInspector"
    pl.seed_everything(0)
    fit(tmp_path, DigitsMLP(lr=0.5), loader(x, y, shuffle=True), loader(xv, yv), [triage],
        limit_train_batches=8)
    assert triage.report.report["start_here"] == "data.unnormalized_input"


def test_constant_input(tmp_path, digits):
    x, y, _, _ = digits
    broadcast = x[:1].expand(len(x), -1).clone()  # a collate bug: one example everywhere
    bi = inspector()
    fit(tmp_path, DigitsMLP(), loader(broadcast, y), None, [bi], limit_train_batches=3)
    f = only(bi.findings, "data.constant_input")
    assert (f.evidence["batch_idx"], f.evidence["tensor"], f.evidence["examples"]) == (0, "batch[0]", 32)
    assert "data.repeated_batch" not in codes(bi.findings)  # the same cause, reported once


def off_by_one(digits):
    x, y, xv, yv = digits
    return loader(x, y + 1, shuffle=True), loader(xv, yv + 1, batch_size=64)


def test_off_by_one_labels_crash_report_names_them(tmp_path, digits):
    train, val = off_by_one(digits)
    report = TriageReport(report_dir=tmp_path, verbose=False, strict=True)
    bi = inspector()
    pl.seed_everything(0)
    trainer = make_trainer(tmp_path, [bi, InitialLossCheck(strict=True), report])
    with pytest.raises(IndexError, match="out of bounds"):
        trainer.fit(DigitsMLP(), train, val)
    assert report.report["status"] == "crashed"
    assert report.report["start_here"] == "data.target_out_of_range"
    f = only(bi.findings, "data.target_out_of_range")
    assert f.evidence["split"] == "train"
    assert (f.evidence["batch_idx"], f.evidence["tensor"]) == (0, "batch[1]")
    assert (f.evidence["min"], f.evidence["max"], f.evidence["num_classes"]) == (1, 10, 10)
    assert "output width" in f.evidence["num_classes_from"]
    assert "1..10" in f.message
    jsonschema.validate(report.report, REPORT_SCHEMA)
    assert json.loads((tmp_path / "triage_report.json").read_text())["start_here"] == \
        "data.target_out_of_range"
    assert bi._capture is None  # temporary hooks removed
    assert not any(m._forward_hooks for m in trainer.lightning_module.modules())


@pytest.mark.parametrize("num_classes", [10, None])
def test_off_by_one_in_sanity_check_with_triage(tmp_path, digits, num_classes):
    train, val = off_by_one(digits)
    task = "auto" if num_classes is None else "multiclass"
    triage = Triage(report_dir=tmp_path, num_classes=num_classes, task=task, strict=True,
                    verbose=False)
    pl.seed_everything(0)
    trainer = make_trainer(tmp_path, [triage], num_sanity_val_steps=2)
    with pytest.raises(IndexError):
        trainer.fit(DigitsMLP(), train, val)
    report = triage.report.report
    assert report["status"] == "crashed"
    assert "data.target_out_of_range" in codes(report)
    f = only(triage.check("BatchInspector").findings, "data.target_out_of_range")
    assert f.evidence["split"] == "val"
    assert (f.evidence["num_classes_from"] == "`num_classes`") == (num_classes == 10)


@pytest.mark.parametrize(("num_batches", "fingerprint_batches"), [(32, 256), (2, 256), (2, 2)])
def test_bad_label_in_a_later_batch_is_named_before_the_crash(tmp_path, digits, num_batches,
                                                              fingerprint_batches):
    x, y, _, _ = digits
    y = y.clone()
    y[y == 9] = 0
    y[3 * 32 + 5] = 10  # only in batch 3, example 5
    # with num_batches=2, batch 3 is past the window: checked on crash (with fingerprint_batches=2
    # it is not read at all before the crash)
    bi = inspector(num_batches=num_batches, fingerprint_batches=fingerprint_batches)
    report = TriageReport(report_dir=tmp_path, verbose=False, strict=True)
    trainer = make_trainer(tmp_path, [bi, report], limit_train_batches=6)
    with pytest.raises(IndexError):
        trainer.fit(DigitsMLP(), loader(x, y), None)
    f = only(bi.findings, "data.target_out_of_range")
    assert (f.evidence["batch_idx"], f.evidence["first_example"], f.global_step) == (3, 5, 3)
    assert report.report["start_here"] == "data.target_out_of_range"


def test_class_imbalance_dominant_class(tmp_path, digits):
    x, y, _, _ = digits
    keep = torch.cat([torch.nonzero(y == 0).flatten(), torch.nonzero(y != 0).flatten()[:30]])
    bi = inspector()
    pl.seed_everything(0)
    fit(tmp_path, DigitsMLP(), loader(x[keep], y[keep], shuffle=True), None, [bi],
        limit_train_batches=5)
    f = only(bi.findings, "data.class_imbalance")
    assert f.evidence["dominant"] == 0
    assert f.evidence["share"] > 0.7


def test_class_imbalance_sorted_unshuffled_batches(tmp_path, digits):
    x, y, _, _ = digits
    order = torch.argsort(y, stable=True)
    bi = inspector()
    fit(tmp_path, DigitsMLP(), loader(x[order], y[order], shuffle=False), None, [bi],
        limit_train_batches=8)
    f = only(bi.findings, "data.class_imbalance")
    assert f.evidence["one_class_batches"] >= 6
    assert "not shuffled over data sorted by class" in f.message
    assert "shuffle=True" in f.hint and "shuffle=True" not in f.message  # advice: the hint's


def test_repeated_batch(tmp_path, digits):
    x, y, _, _ = digits
    stuck = DataLoader(TensorDataset(x, y), batch_sampler=[list(range(32))] * 5)
    bi = inspector()
    fit(tmp_path, DigitsMLP(), stuck, None, [bi], limit_train_batches=5)
    f = only(bi.findings, "data.repeated_batch")
    assert (f.evidence["batch_idx"], f.evidence["same_as_batch"]) == (1, 0)
    assert f.global_step == 1


def test_duplicate_samples(tmp_path, digits):
    x, y, _, _ = digits
    index = torch.arange(len(x)) // 4  # every example four times in a row
    bi = inspector()
    fit(tmp_path, DigitsMLP(), loader(x[index], y[index]), None, [bi], limit_train_batches=2)
    f = only(bi.findings, "data.duplicate_samples")
    assert (f.evidence["batch_idx"], f.evidence["distinct"], f.evidence["repeats"]) == (0, 8, 24)


def test_train_val_overlap(tmp_path, digits):
    x, y, _, _ = digits
    bi = inspector()
    pl.seed_everything(0)
    fit(tmp_path, DigitsMLP(), loader(x, y, shuffle=True), loader(x[:256], y[:256], batch_size=64),
        [bi], limit_train_batches=20, limit_val_batches=4)
    f = only(bi.findings, "data.train_val_overlap")
    assert f.evidence["overlap"] >= 50
    assert f.evidence["val_examples"] == 256


def _standardized(seed: int, clamp: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Digits standardized per pixel with training statistics; ``clamp``: the std clamped to
    1e-8 (the bug: a pixel always 0 in training, non-zero in one validation image, lands
    hundreds of millions of training scales away), else divided by 1 where it is 0 (the fix)."""
    x, y, xv, yv = load_digits_tensors(standardize=False, seed=seed)
    mean, std = x.mean(0), x.std(0)
    std = std.clamp(min=1e-8) if clamp else torch.where(std > 0, std, torch.ones_like(std))
    return (x - mean) / std, y, (xv - mean) / std, yv


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("clamp", [True, False])
def test_validation_outlier_far_outside_the_training_data(tmp_path, clamp, seed):
    x, y, xv, yv = _standardized(seed, clamp)
    bi = inspector()
    pl.seed_everything(seed)
    fit(tmp_path, DigitsMLP(), loader(x, y, shuffle=True), loader(xv, yv, batch_size=64),
        [bi], limit_train_batches=4, limit_val_batches=None, num_sanity_val_steps=2)
    if not clamp:
        assert "data.val_outlier" not in codes(bi.findings), bi.findings
        return
    f = only(bi.findings, "data.val_outlier")
    # the one validation image non-zero at a pixel constant in training, named with its place
    # (judged again as validation batches come: with seed 0 it is in batch 3, after the two
    # sanity-check batches the first judgement saw)
    pixel = f.evidence["feature"]
    assert float(x[:, pixel].std()) == 0.0
    example = 64 * f.evidence["val_batch"] + f.evidence["example"]
    assert float(xv[example, pixel]) == f.evidence["value"] and f.evidence["scales"] > 1e6
    assert "data.train_val_shift" not in codes(bi.findings)  # the median rule lets it pass


@pytest.mark.parametrize("overfit_batches", [0, 2, 0.1])
def test_overfit_batches_validating_on_the_training_batches_is_silent(tmp_path, digits,
                                                                     overfit_batches):
    # `Trainer(overfit_batches=...)` with the training loader as validation loader: the overlap
    # is what the user asked for (issue 35); the same loaders without it still overlap
    x, y, _, _ = digits
    bi = inspector()
    pl.seed_everything(0)
    train = loader(x, y, shuffle=True)
    fit(tmp_path, DigitsMLP(), train, train, [bi], max_epochs=3, overfit_batches=overfit_batches,
        limit_train_batches=1.0 if overfit_batches else 8,
        limit_val_batches=1.0 if overfit_batches else 8)
    assert ("data.train_val_overlap" in codes(bi.findings)) == (overfit_batches == 0)
    assert bi.val_fingerprinted > 0


def test_train_val_shift(tmp_path, digits, raw_digits):
    x, y, _, _ = digits
    _, _, raw_val, yv = raw_digits  # validation left unstandardized
    bi = inspector()
    pl.seed_everything(0)
    fit(tmp_path, DigitsMLP(), loader(x, y, shuffle=True), loader(raw_val, yv, batch_size=64),
        [bi], limit_train_batches=4, num_sanity_val_steps=1)
    f = only(bi.findings, "data.train_val_shift")
    assert f.evidence["std_ratio"] > 2
    assert "data.unnormalized_input" not in codes(bi.findings)  # training inputs are fine


def test_label_misalignment_shuffled_labels(tmp_path, digits):
    x, y, _, _ = digits
    shuffled = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(0))]
    bi = inspector()
    pl.seed_everything(0)
    fit(tmp_path, DigitsMLP(), loader(x, shuffled, batch_size=64, shuffle=True), None, [bi],
        limit_train_batches=16)
    f = only(bi.findings, "data.label_misalignment")
    assert f.severity == "warning"
    assert f.evidence["examples"] == 1024
    assert stage_codes(bi.findings, "data") == {"data.label_misalignment"}


class WeakMLP(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_hard_real_task_is_not_accused(tmp_path):
    # the label depends on one of 64 features, through heavy noise (best accuracy ~0.64)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2048, 64, generator=g)
    y = ((x[:, 0] + 1.5 * torch.randn(2048, generator=g)) > 0).long()
    bi = inspector()
    pl.seed_everything(0)
    fit(tmp_path, WeakMLP(), loader(x, y, batch_size=64, shuffle=True), None, [bi],
        limit_train_batches=16)
    assert stage_codes(bi.findings, "data") == set()
    assert_ran_and_passed(bi)
    assert "probe" in bi.check_status()["detail"]  # the label probe ran, and acquitted


def test_unknown_batch_structure_is_info_once(tmp_path, digits):
    x, y, _, _ = digits

    class Odd(DigitsMLP):
        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            return F.cross_entropy(self(batch["a"]), batch["b"])

    odd = DataLoader(DictDigits(x, y), batch_size=32,
                     collate_fn=lambda items: {"a": torch.stack([i["image"] for i in items]),
                                               "b": torch.stack([i["label"] for i in items])})
    bi = inspector()
    fit(tmp_path, Odd(), odd, None, [bi], limit_train_batches=3)
    f = only(bi.findings, "data.unknown_batch_structure")
    assert f.severity == "info"
    assert bi.check_status()["status"] == "skipped"
    bi2 = inspector(input_key="a", target_key=lambda b: b["b"])
    fit(tmp_path, Odd(), odd, None, [bi2], limit_train_batches=3)
    assert stage_codes(bi2.findings, "data") == set()
    assert bi2.classes == 10
    triage = Triage(report_dir=tmp_path, input_key="a", target_key="b", strict=True,
                    verbose=False)
    fit(tmp_path, Odd(), odd, None, [triage], limit_train_batches=3)
    assert stage_codes(triage.check("BatchInspector").findings, "data") == set()
    assert triage.check("BatchInspector").sample["target"] == "batch['b']"


@dataclass
class Batch:
    pixels: Tensor
    target: Tensor


def test_dataclass_batch_through_a_real_fit(tmp_path, digits):
    x, y, _, _ = digits

    class DC(DigitsMLP):
        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            return F.cross_entropy(self(batch.pixels), batch.target)

    dl = DataLoader(TensorDataset(x, y + 1), batch_size=32,
                    collate_fn=lambda items: Batch(torch.stack([a for a, _ in items]),
                                                   torch.stack([b for _, b in items])))
    bi = inspector(input_key="pixels")
    with pytest.raises(IndexError):
        fit(tmp_path, DC(), dl, None, [bi], limit_train_batches=2)
    assert only(bi.findings, "data.target_out_of_range").evidence["tensor"] == "batch.target"


# ---------------------------------------------------------------------------- promises
class DropoutMLP(DigitsMLP):
    def __init__(self) -> None:
        super().__init__(lr=0.1)
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 10))


class CountingDataset(TensorDataset):
    calls = 0

    def __getitem__(self, i: int) -> Any:
        CountingDataset.calls += 1
        return super().__getitem__(i)


def _seeded_run(tmp_path, digits, callbacks):
    x, y, xv, yv = digits
    pl.seed_everything(0)
    CountingDataset.calls = 0
    model = DropoutMLP()
    train = DataLoader(CountingDataset(x, y), batch_size=32, shuffle=True)
    val = DataLoader(CountingDataset(xv, yv), batch_size=64)
    fit(tmp_path, model, train, val, callbacks, max_epochs=2, limit_train_batches=20,
        num_sanity_val_steps=2)
    return [p.detach().clone() for p in model.parameters()], CountingDataset.calls, \
        torch.get_rng_state()


def test_zero_interference(tmp_path, digits):
    bare, bare_calls, bare_rng = _seeded_run(tmp_path / "bare", digits, [])
    bi = inspector(num_batches=64)
    watched, calls, rng = _seeded_run(tmp_path / "watched", digits, [bi])
    assert bi.train_inspected == 40  # it really inspected, probe included
    assert "label probe" in bi.detail
    assert calls == bare_calls  # no extra iteration over the loaders
    assert torch.equal(rng, bare_rng)  # no RNG drawn
    assert all(torch.equal(a, b) for a, b in zip(bare, watched, strict=True))


def test_fingerprint_memory_is_bounded_on_a_long_run(tmp_path):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(1200, 8, generator=g), torch.randint(0, 3, (1200,), generator=g)

    class Small(WeakMLP):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(8, 3)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", F.cross_entropy(self(batch[0]), batch[1]))

    bi = inspector(num_batches=4, fingerprint_batches=None, max_fingerprints=100)
    fit(tmp_path, Small(), loader(x, y, batch_size=4), loader(x[:400], y[:400], batch_size=4),
        [bi], max_epochs=1, limit_train_batches=300, limit_val_batches=100)
    assert bi.train_fingerprinted == 300
    assert len(bi._train_fps) == len(bi._val_fps) == 100
    assert len(bi._epoch_batches) <= 100
    assert len(bi.batch_stats) <= 8


def test_state_round_trip_and_pickle(tmp_path, digits):
    x, y, xv, yv = digits
    bi = inspector()
    pl.seed_everything(0)
    fit(tmp_path, DigitsMLP(), loader(x[:, :] * 16, y, shuffle=True), loader(xv, yv), [bi],
        limit_train_batches=4, num_sanity_val_steps=1)
    state = pickle.loads(pickle.dumps(bi.state_dict()))
    fresh = BatchInspector()
    fresh.load_state_dict(state)
    assert codes(fresh.findings) == codes(bi.findings)
    assert fresh.sample == bi.sample
    assert fresh.train_inspected == bi.train_inspected
    assert fresh.classes == 10
    assert fresh.class_totals == bi.class_totals
    assert pickle.loads(pickle.dumps(bi)).sample == bi.sample
    fresh.load_state_dict({})  # older checkpoints: defaults
    assert fresh.train_inspected == bi.train_inspected


def test_argument_validation():
    with pytest.raises(ValueError, match="num_batches"):
        BatchInspector(num_batches=0)
    with pytest.raises(ValueError, match="num_classes"):
        BatchInspector(num_classes=1)
    with pytest.raises(ValueError, match="input_key"):
        BatchInspector(input_key=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_rms"):
        BatchInspector(max_rms=0.5)
    with pytest.raises(ValueError, match="duplicate_fraction"):
        BatchInspector(duplicate_fraction=0)


class VarLen(pl.LightningModule):
    """Float sequences whose length changes from batch to batch, in bf16, plus a sparse mask."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 3)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x = batch["x"].float().mean(1)
        return F.cross_entropy(self.head(x), batch["y"]) + 0 * batch["mask"].to_dense().sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_odd_batches_do_not_break_the_inspector(tmp_path):
    g = torch.Generator().manual_seed(0)

    def collate(items: list[int]) -> dict[str, Any]:
        length = 3 + len(items) % 5 + items[0] % 4
        return {"x": torch.randn(len(items), length, 4, generator=g).to(torch.bfloat16),
                "y": torch.randint(0, 3, (len(items),), generator=g),
                "mask": torch.eye(len(items)).to_sparse(), "names": [str(i) for i in items]}

    dl = DataLoader(list(range(300)), batch_size=33, collate_fn=collate)  # last batch: 3
    bi = inspector()
    fit(tmp_path, VarLen(), dl, None, [bi], max_epochs=2, limit_train_batches=10)
    assert bi.check_status()["status"] in ("passed", "failed")
    assert bi.train_inspected == 20
    assert "data.unknown_batch_structure" not in codes(bi.findings)
    assert {s["tensors"][0]["dtype"] for s in bi.batch_stats} == {"bfloat16"}


def test_resume_keeps_findings_and_the_window(tmp_path, raw_digits):
    from lightning.pytorch.callbacks import ModelCheckpoint

    x, y, _, _ = raw_digits
    first = inspector(num_batches=6)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    pl.seed_everything(0)
    fit(tmp_path, DigitsMLP(), loader(x, y, shuffle=True), None, [first, ckpt],
        enable_checkpointing=True, limit_train_batches=4)
    assert first.train_inspected == 4
    resumed = inspector(num_batches=6)
    trainer = make_trainer(tmp_path, [resumed], max_epochs=2, limit_train_batches=4)
    trainer.fit(DigitsMLP(), loader(x, y, shuffle=True), None,
                ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert codes(resumed.findings) == {"data.unnormalized_input"}  # kept, and not reported twice
    assert resumed.train_inspected == 6  # the window goes on where it stopped
    assert resumed.sample == first.sample
