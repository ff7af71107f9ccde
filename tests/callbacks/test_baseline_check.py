"""BaselineCheck: simple baselines (majority, nearest centroid, linear; the mean predictor) on
the first batches, and `curve.below_baseline` for a model that ends below them."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import jsonschema
import lightning.pytorch as pl
import pytest
import torch

from lightning_triage import BaselineCheck, Triage, TriageConfigError
from lightning_triage.functional.baselines import below_baseline, compute_baselines
from lightning_triage.report import REPORT_SCHEMA
from tests.callbacks.baseline_models import DigitsRegressor, DigitsStack, digits
from tests.helpers import make_trainer, seeds

#: Two epochs of 25 batches: the model is judged at the validation run of step 50 (`min_steps`
#: 40 in these tests; the frozen body is far below by then).
FIT = dict(max_epochs=2, limit_train_batches=25, limit_val_batches=None)
#: The healthy twins are judged as a run is by default: at step 160 (`min_steps` 150).
LONG = dict(max_epochs=4, limit_train_batches=40, limit_val_batches=None)


def _fit(tmp_path: Path, model: Any, regression: bool = False, seed: int = 0,
         long: bool = False) -> BaselineCheck:
    pl.seed_everything(seed, verbose=False)
    check = BaselineCheck(strict=True) if long else BaselineCheck(strict=True, min_steps=40)
    make_trainer(tmp_path, [check], **(LONG if long else FIT)).fit(model(),
                                                                   *digits(seed, regression))
    return check


def test_frozen_body_ends_below_the_baseline_explained_by_its_cause(tmp_path: Path) -> None:
    """The body frozen at its random draw: below the baselines, explained by
    `wiring.frozen_at_init`, the cause, which leads."""
    pl.seed_everything(0, verbose=False)
    triage = Triage(report_dir=tmp_path, verbose=True, strict=True, overfit=False)
    for check in triage.checks:
        if isinstance(check, BaselineCheck):
            check.min_steps = 40
    make_trainer(tmp_path, [triage], **FIT).fit(DigitsStack(frozen=True, lr=1e-2), *digits(0))
    report = json.loads((tmp_path / "triage_report.json").read_text())
    jsonschema.validate(report, REPORT_SCHEMA)
    assert report["start_here"] == "wiring.frozen_at_init", report["findings"]
    (found,) = [f for f in report["findings"] if f["code"] == "curve.below_baseline"]
    assert "wiring.frozen_at_init" in found["explained_by"]
    ev = found["evidence"]
    assert found["severity"] == "warning"
    assert ev["model"] < ev["baseline_value"] - ev["margin"] and ev["baseline_value"] > 0.8
    assert "frozen (`requires_grad=False`)" in found["message"]
    base = report["details"]["baselines"]
    assert set(base["values"]["scores"]) == {"majority", "nearest_centroid", "linear"}
    assert base["model"]["step"] == 50 and base["model"]["value"] == ev["model"]
    assert "Simple baselines" in (tmp_path / "triage_report.html").read_text()


@pytest.mark.parametrize("seed", seeds())
def test_frozen_body_is_caught_on_seeds(tmp_path: Path, seed: int) -> None:
    check = _fit(tmp_path, lambda: DigitsStack(frozen=True, lr=1e-2), seed=seed)
    (found,) = check.findings
    assert found.code == "curve.below_baseline"
    assert found.evidence["model"] < found.evidence["baseline_value"] - 0.2  # far below


@pytest.mark.parametrize("seed", seeds())
def test_healthy_twin_is_silent(tmp_path: Path, seed: int) -> None:
    check = _fit(tmp_path, lambda: DigitsStack(lr=1e-2), seed=seed, long=True)
    assert check.findings == []
    assert check.last is not None and check.baselines is not None
    assert check.last[0] == 160 and check.last[1] > check.baselines.best - 0.08
    assert check.check_status()["status"] == "passed"


@pytest.mark.parametrize("seed", seeds())
def test_healthy_regression_is_silent(tmp_path: Path, seed: int) -> None:
    check = _fit(tmp_path, DigitsRegressor, regression=True, seed=seed, long=True)
    assert check.findings == []
    assert check.baselines is not None and check.baselines.task == "regression"
    assert check.last is not None and check.last[1] < check.baselines.scores["mean"]


def test_state_round_trip_and_arguments(tmp_path: Path) -> None:
    check = _fit(tmp_path, lambda: DigitsStack(frozen=True, lr=1e-2))
    assert [f.code for f in check.findings] == ["curve.below_baseline"]
    fresh = pickle.loads(pickle.dumps(check))
    restored = BaselineCheck()
    restored.load_state_dict(fresh.state_dict())
    assert restored.baselines == check.baselines and restored.last == check.last
    with pytest.raises(TriageConfigError, match="max_train_batches"):
        BaselineCheck(max_train_batches=0)


def test_skips_what_it_cannot_fit() -> None:
    x = torch.randn(40, 3)
    assert compute_baselines(x.long(), torch.zeros(40).long(), x.long(), torch.zeros(40).long()) \
        == "the inputs are not float features (int64)"
    big = torch.randn(8, 3, 64, 64)
    assert "12288 features" in str(compute_baselines(big, torch.zeros(8).long(), big,
                                                    torch.zeros(8).long()))
    y = torch.randn(40)
    b = compute_baselines(x, y, x, y)
    assert not isinstance(b, str) and b.best_name == "mean"
    assert below_baseline(b.best * 1.1, b, step=1) is None
    assert below_baseline(b.best * 2.0, b, step=1) is not None


def test_the_run_is_bit_identical_with_and_without_the_check(tmp_path: Path) -> None:
    states = []
    for with_check in (True, False):
        pl.seed_everything(0, verbose=False)
        model = DigitsStack(lr=1e-2)
        callbacks = [BaselineCheck(strict=True, min_steps=0)] if with_check else []
        make_trainer(tmp_path / str(with_check), callbacks, max_epochs=2, limit_train_batches=5,
                     limit_val_batches=2).fit(model, *digits(0))
        states.append(model.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_a_head_that_is_not_one_logit_per_class_is_not_compared(tmp_path: Path) -> None:
    def model() -> DigitsStack:
        net = DigitsStack(frozen=True, lr=1e-2)
        net.head = torch.nn.Linear(16, 32)  # an embedding-sized head: its argmax is no class
        return net

    check = _fit(tmp_path, model)
    assert check.findings == [] and check.last is None
    assert "32] column(s) for 10 classes" in check.detail


class TripletEmbedder(DigitsStack):
    """A 10-d embedding (as wide as the digits' class count) trained with a triplet loss on
    in-batch triplets: its outputs are no class scores. ``hand_written``: the same margin loss
    written with ``relu`` (no loss function the watch knows)."""

    def __init__(self, hand_written: bool = False) -> None:
        super().__init__(lr=1e-2)
        self.hand_written = hand_written

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        z = torch.nn.functional.normalize(self(x), dim=1)
        same = (y[:, None] == y[None, :]).float() - torch.eye(len(y))
        positive = z[same.argmax(1)]  # another example of the class (itself if none)
        negative = z[(y[:, None] != y[None, :]).float().argmax(1)]  # one of another class
        if self.hand_written:
            gap = (z - positive).norm(dim=1) - (z - negative).norm(dim=1) + 0.2
            return torch.relu(gap).mean()
        return torch.nn.functional.triplet_margin_loss(z, positive, negative, margin=0.2)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_emb_norm", self(batch[0]).norm(dim=1).mean())


@pytest.mark.parametrize("hand_written", [False, True])
def test_an_embedding_as_wide_as_the_class_count_is_not_compared(tmp_path: Path,
                                                                  hand_written: bool) -> None:
    check = _fit(tmp_path, lambda: TripletEmbedder(hand_written))
    assert check.findings == [] and check.last is None, check.detail
    assert check.not_scores is not None and "not a loss over class scores" in check.detail
    assert ("metric-learning" in check.detail) is not hand_written
    restored = BaselineCheck()
    restored.load_state_dict(pickle.loads(pickle.dumps(check)).state_dict())
    assert restored.not_scores == check.not_scores


def test_multilabel_targets_are_not_a_regression() -> None:
    x = torch.randn(40, 3)
    y = (torch.rand(40, 4) > 0.5).float()
    assert "float targets in [0, 1]" in str(compute_baselines(x, y, x, y))
