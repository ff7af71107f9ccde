"""NonFiniteTracer: real broken `Trainer.fit` runs must be caught at the exact step and layer;
healthy runs (32, bf16-mixed, 16-true) must stay silent and unchanged."""

from __future__ import annotations

import json
import math
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.precision import MixedPrecision
from torch import Tensor, nn

from lightning_triage import NonFiniteTracer, Triage
from lightning_triage.findings import Finding
from tests.helpers import codes, fit_ddp_spawn, loader, make_trainer, stage_codes

N_FEATURES, N_CLASSES, BATCH = 8, 4, 16


def data(n_batches: int = 8, edit: Callable[[Tensor, Tensor], None] | None = None,
         seed: int = 0) -> Any:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_batches * BATCH, N_FEATURES, generator=g)
    y = torch.randint(0, N_CLASSES, (n_batches * BATCH,), generator=g)
    if edit is not None:
        edit(x, y)
    return loader(x, y, batch_size=BATCH)


def at(batch: int, example: int) -> int:
    """Row index of ``example`` of batch ``batch`` (no shuffling)."""
    return batch * BATCH + example


class Classifier(pl.LightningModule):
    def __init__(self, net: nn.Module | None = None, lr: float = 0.1) -> None:
        super().__init__()
        self.net = net if net is not None else nn.Sequential(
            nn.Linear(N_FEATURES, 16), nn.ReLU(), nn.Linear(16, N_CLASSES))
        self.lr = lr

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def loss_fn(self, logits: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(logits, y)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = self.loss_fn(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def fit(tmp_path: Path, model: pl.LightningModule, train: Any, tracer: NonFiniteTracer | None = None,
        **kwargs: Any) -> tuple[pl.Trainer, NonFiniteTracer]:
    tracer = tracer if tracer is not None else NonFiniteTracer(strict=True)
    kwargs.setdefault("limit_train_batches", 8)
    trainer = make_trainer(tmp_path, [tracer], **kwargs)
    trainer.fit(model, train)
    return trainer, tracer


def only(findings: list[Finding], code: str) -> Finding:
    matches = [f for f in findings if f.code == code]
    assert len(matches) == 1, [f.code for f in findings]
    return matches[0]


def params_finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


# ---------------------------------------------------------------------- broken runs
def test_nan_in_one_input_example(tmp_path: Path) -> None:
    def edit(x: Tensor, y: Tensor) -> None:
        x[at(3, 5), 2] = float("nan")

    pl.seed_everything(0)
    model = Classifier()
    trainer, tracer = fit(tmp_path, model, data(edit=edit))
    forward = only(tracer.findings, "numerics.nonfinite_forward")
    assert (forward.global_step, forward.layer) == (3, "net.0")
    assert forward.evidence["first_nonfinite"]["inputs_finite"] is False
    data_finding = only(tracer.findings, "data.nonfinite_input")
    assert data_finding.global_step == 3
    assert data_finding.evidence["examples"] == [5]
    assert "data.nonfinite_target" not in codes(tracer.findings)
    # "stop": fit stopped after that batch (its optimizer step counted, its update dropped):
    # the weights are exactly those of a bare run over the 3 good batches
    assert trainer.should_stop
    assert trainer.global_step == 4
    pl.seed_everything(0)
    reference = Classifier()
    make_trainer(tmp_path, [], limit_train_batches=3).fit(reference, data(edit=edit))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters(),
                                                 strict=True))
    assert (tracer.nonfinite_steps, tracer.skipped_steps, tracer.first_step) == (1, 1, 3)


class Grow(nn.Module):
    """``exp(g * x)``: ``g`` grows by ``lr`` every step, the output overflows float32 at step 8."""

    def __init__(self) -> None:
        super().__init__()
        self.g = nn.Parameter(torch.tensor(1.0))

    def forward(self, x: Tensor) -> Tensor:
        return torch.exp(self.g * x)


class Growing(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(N_FEATURES, N_FEATURES)
        self.grow = Grow()

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, _ = batch
        h = self.grow(torch.full_like(self.encoder(x), 10.0))
        return -self.grow.g + 0.0 * h.mean() + 0.0 * self.encoder.weight.sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1.0)


def test_activation_that_overflows_after_some_steps(tmp_path: Path) -> None:
    # g = 1 + step; exp(10 * g) first exceeds float32's range (exp(88.7)) at g = 9: step 8
    pl.seed_everything(0)
    trainer, tracer = fit(tmp_path, Growing(), data(n_batches=12), limit_train_batches=12)
    forward = only(tracer.findings, "numerics.nonfinite_forward")
    assert (forward.global_step, forward.layer) == (8, "grow")
    assert forward.evidence["first_nonfinite"]["inputs_finite"] is True
    assert stage_codes(tracer.findings, "data") == set()
    assert trainer.global_step == 9  # stopped after the bad step


class NormNoEps(nn.Module):
    """Per-example standardization without epsilon."""

    def forward(self, x: Tensor) -> Tensor:
        return (x - x.mean(dim=1, keepdim=True)) / x.std(dim=1, keepdim=True)


def test_normalization_without_epsilon(tmp_path: Path) -> None:
    def edit(x: Tensor, y: Tensor) -> None:
        x[at(2, 7)] = 0.5  # a constant example: its std is 0

    pl.seed_everything(0)
    net = nn.Sequential(NormNoEps(), nn.Linear(N_FEATURES, 16), nn.ReLU(),
                        nn.Linear(16, N_CLASSES))
    _trainer, tracer = fit(tmp_path, Classifier(net), data(edit=edit))
    forward = only(tracer.findings, "numerics.nonfinite_forward")
    assert (forward.global_step, forward.layer) == (2, "net.0")
    assert forward.evidence["first_nonfinite"]["nan"] == N_FEATURES
    assert stage_codes(tracer.findings, "data") == set()


class HandWrittenLoss(Classifier):
    def loss_fn(self, logits: Tensor, y: Tensor) -> Tensor:
        probs = torch.softmax(logits, dim=1)
        return -torch.log(probs.gather(1, y[:, None])).mean()


def test_hand_written_log_softmax_loss(tmp_path: Path) -> None:
    def edit(x: Tensor, y: Tensor) -> None:
        x[at(4, 0):at(5, 0)] *= 1000.0  # batch 4: huge logits, softmax underflows to 0

    pl.seed_everything(0)
    _trainer, tracer = fit(tmp_path, HandWrittenLoss(), data(edit=edit))
    loss = only(tracer.findings, "numerics.nonfinite_loss")
    assert loss.global_step == 4
    assert loss.layer is None
    assert "numerics.nonfinite_forward" not in codes(tracer.findings)
    assert stage_codes(tracer.findings, "data") == set()


class Magnitude(nn.Module):
    """Features plus their L2 norm written as ``sqrt(sum(h**2))``: fine forward at h = 0, NaN
    gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(N_FEATURES, N_FEATURES, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        h = self.proj(x)
        return torch.cat([h, torch.sqrt((h**2).sum(dim=1, keepdim=True))], dim=1)


def test_gradient_nonfinite_in_backward_only(tmp_path: Path) -> None:
    def edit(x: Tensor, y: Tensor) -> None:
        x[at(2, 3)] = 0.0  # h = 0 for that example: d sqrt / du = inf at u = 0

    pl.seed_everything(0)
    net = nn.Sequential(Magnitude(), nn.Linear(N_FEATURES + 1, N_CLASSES))
    model = Classifier(net)
    trainer, tracer = fit(tmp_path, model, data(edit=edit))
    backward = only(tracer.findings, "numerics.nonfinite_backward")
    assert (backward.global_step, backward.layer) == (2, "net.0")
    assert backward.evidence["backward"]["op"] == "SqrtBackward0"
    assert "numerics.nonfinite_forward" not in codes(tracer.findings)
    assert params_finite(model)
    assert trainer.global_step == 3


class Square(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x * x * 1000.0


def test_fp16_overflow_is_precision_overflow(tmp_path: Path) -> None:
    def edit(x: Tensor, y: Tensor) -> None:
        x[at(1, 0):at(2, 0)] *= 30.0  # batch 1 only: |h|^2 * 1000 > 65504 in float16

    pl.seed_everything(0)
    net = nn.Sequential(nn.Linear(N_FEATURES, 16), Square(), nn.Linear(16, N_CLASSES))
    model = Classifier(net, lr=1e-4)
    _trainer, tracer = fit(tmp_path, model, data(edit=edit), precision="16-true")
    overflow = only(tracer.findings, "numerics.precision_overflow")
    assert (overflow.global_step, overflow.layer) == (1, "net.1")
    assert overflow.evidence["dtype"] == "float16"
    assert overflow.evidence["float32_max_abs"] > 65504.0
    assert "net.1" in overflow.evidence["exceeding_in_float32"]
    assert "numerics.nonfinite_forward" not in codes(tracer.findings)
    # the run keeps its float16 weights
    assert all(p.dtype == torch.float16 for p in model.parameters())


def test_bf16_mixed_nan_input_is_not_a_precision_problem(tmp_path: Path) -> None:
    def edit(x: Tensor, y: Tensor) -> None:
        x[at(2, 1), 3] = float("nan")

    pl.seed_everything(0)
    _, tracer = fit(tmp_path, Classifier(), data(edit=edit), precision="bf16-mixed")
    forward = only(tracer.findings, "numerics.nonfinite_forward")
    assert (forward.global_step, forward.layer) == (2, "net.0")
    assert "float32 too" in forward.message
    assert "numerics.precision_overflow" not in codes(tracer.findings)


class ManualNaN(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        opt = self.optimizers()
        x, y = batch
        loss = self.loss_fn(self(x), y)
        if batch_idx == 2:
            loss = loss * float("nan")
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss


def test_manual_optimization_is_detected_not_replayed(tmp_path: Path) -> None:
    pl.seed_everything(0)
    model = ManualNaN()
    trainer, tracer = fit(tmp_path, model, data())
    detected = only(tracer.findings, "numerics.nonfinite_detected")
    assert detected.global_step == 2
    assert "manual optimization" in detected.message
    assert params_finite(model)
    assert trainer.should_stop


class RefusesNaN(Classifier):
    """Its `training_step` raises on a NaN batch, but only when replayed (the second call)."""

    calls = 0

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        if batch_idx == 1:
            self.calls += 1
            if self.calls > 1:
                raise ValueError("NaN in batch")
        return super().training_step(batch, batch_idx)


def test_a_replay_that_raises_still_applies_the_policy(tmp_path: Path) -> None:
    def edit(x: Tensor, y: Tensor) -> None:
        x[at(1, 0), 0] = float("nan")

    pl.seed_everything(0)
    model = RefusesNaN()
    trainer, tracer = fit(tmp_path, model, data(edit=edit), tracer=NonFiniteTracer())
    detected = only(tracer.findings, "numerics.nonfinite_detected")
    assert detected.global_step == 1
    assert "ValueError: NaN in batch" in detected.message
    assert params_finite(model)
    assert trainer.should_stop
    assert not tracer.disabled


def test_update_that_overflows_gives_nonfinite_params(tmp_path: Path) -> None:
    pl.seed_everything(0)
    model = Classifier(lr=float("inf"))
    _trainer, tracer = fit(tmp_path, model, data(), tracer=NonFiniteTracer(strict=True))
    params = only(tracer.findings, "numerics.nonfinite_params")
    assert params.global_step == 0
    assert "net.0.weight" in params.evidence["params"]


# ---------------------------------------------------------------------- policies and modes
def two_bad_batches(x: Tensor, y: Tensor) -> None:
    x[at(1, 2), 0] = float("inf")
    x[at(5, 9), 4] = float("nan")


def test_skip_policy_drops_bad_steps_and_continues(tmp_path: Path) -> None:
    pl.seed_everything(0)
    model = Classifier()
    trainer, tracer = fit(tmp_path, model, data(edit=two_bad_batches),
                          tracer=NonFiniteTracer(on_nonfinite="skip", strict=True))
    assert trainer.global_step == 8
    assert not trainer.should_stop
    assert params_finite(model)
    assert (tracer.nonfinite_steps, tracer.skipped_steps, tracer.first_step) == (2, 2, 1)
    steps = sorted(f.global_step for f in tracer.findings if f.code == "numerics.nonfinite_forward")
    assert steps == [1, 5]
    assert "2 skipped" in tracer.check_status()["detail"]


def test_warn_policy_lets_the_step_happen(tmp_path: Path) -> None:
    pl.seed_everything(0)
    model = Classifier()
    trainer, tracer = fit(tmp_path, model, data(edit=two_bad_batches),
                          tracer=NonFiniteTracer(on_nonfinite="warn", max_localized=1, strict=True))
    assert trainer.global_step == 8
    assert not params_finite(model)
    forward = only(tracer.findings, "numerics.nonfinite_forward")
    assert forward.global_step == 1
    assert only(tracer.findings, "numerics.nonfinite_params").global_step == 1
    assert tracer.skipped_steps == 0
    assert tracer.nonfinite_steps == 7


def test_gradient_accumulation_localizes_the_micro_batch(tmp_path: Path) -> None:
    def edit(x: Tensor, y: Tensor) -> None:
        x[at(5, 1), 3] = float("nan")  # micro-batch 5: optimizer step 2 (batches 4, 5)

    pl.seed_everything(0)
    model = Classifier()
    trainer, tracer = fit(tmp_path, model, data(edit=edit), accumulate_grad_batches=2)
    forward = only(tracer.findings, "numerics.nonfinite_forward")
    assert (forward.global_step, forward.layer) == (2, "net.0")
    assert forward.evidence["batch_idx"] == 5
    assert only(tracer.findings, "data.nonfinite_input").evidence["examples"] == [1]
    assert params_finite(model)
    assert trainer.global_step == 3


def test_deferred_mode_reports_the_exact_step_late(tmp_path: Path) -> None:
    def edit(x: Tensor, y: Tensor) -> None:
        x[at(2, 0), 0] = float("nan")

    pl.seed_everything(0)
    trainer, tracer = fit(tmp_path, Classifier(), data(edit=edit),
                          tracer=NonFiniteTracer(mode="deferred", check_every_n_steps=4,
                                                 strict=True))
    detected = only(tracer.findings, "numerics.nonfinite_detected")
    assert detected.global_step == 2
    assert detected.evidence["read_at_step"] == 4
    assert trainer.global_step == 4
    assert trainer.should_stop


# ---------------------------------------------------------------------- healthy runs
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-true"])
def test_healthy_runs_stay_silent(tmp_path: Path, precision: str) -> None:
    pl.seed_everything(0)
    tracer = NonFiniteTracer(near_overflow_every_n_steps=1, strict=True)
    trainer, _ = fit(tmp_path, Classifier(lr=0.05), data(), tracer=tracer, precision=precision)
    assert stage_codes(tracer.findings, "numerics") == set()
    assert stage_codes(tracer.findings, "data") == set()
    assert trainer.global_step == 8
    assert tracer.check_status()["status"] == "passed"
    assert tracer._handles == []


def test_near_overflow_warns_before_fp16_overflows(tmp_path: Path) -> None:
    def edit(x: Tensor, y: Tensor) -> None:
        x[at(0, 0):at(1, 0)] *= 3.0  # |h|^2 * 1000 reaches ~4e4: below 65504, above 25%

    pl.seed_everything(0)
    net = nn.Sequential(nn.Linear(N_FEATURES, 16), Square(), nn.Linear(16, N_CLASSES))
    tracer = NonFiniteTracer(near_overflow_every_n_steps=1, strict=True)
    model = Classifier(net, lr=1e-6)
    fit(tmp_path, model, data(edit=edit), tracer=tracer, precision="16-true")
    near = [f for f in tracer.findings if f.code == "numerics.near_overflow"]
    assert near
    assert near[0].global_step == 0
    assert near[0].layer == "net.1"
    assert 0.25 < near[0].evidence["ratio"] < 1.0
    assert not {"numerics.precision_overflow", "numerics.nonfinite_forward"} & codes(tracer.findings)


def scaler_plugin(init_scale: float) -> tuple[MixedPrecision, torch.amp.GradScaler]:
    """fp16 autocast with a real GradScaler on CPU (what `16-mixed` does on a GPU)."""
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    return MixedPrecision("16-mixed", "cpu", scaler=scaler), scaler


def test_gradient_scaler_skips_are_not_findings(tmp_path: Path) -> None:
    # a scale of 2**40 overflows the fp16 gradients: the scaler skips and halves it each time
    plugin, scaler = scaler_plugin(2.0**40)
    pl.seed_everything(0)
    _, tracer = fit(tmp_path, Classifier(), data(), plugins=[plugin])
    assert stage_codes(tracer.findings, "numerics") == set()
    assert tracer.scaler_skips == round(math.log2(2.0**40 / scaler.get_scale())) > 0
    assert "gradient-scaler skip" in tracer.check_status()["detail"]


def test_nan_input_under_a_gradient_scaler_is_still_found(tmp_path: Path) -> None:
    def edit(x: Tensor, y: Tensor) -> None:
        x[at(2, 0), 0] = float("nan")

    plugin, _ = scaler_plugin(2.0**8)
    pl.seed_everything(0)
    _, tracer = fit(tmp_path, Classifier(), data(edit=edit), plugins=[plugin])
    forward = only(tracer.findings, "numerics.nonfinite_forward")
    assert (forward.global_step, forward.layer) == (2, "net.0")
    assert tracer.scaler_skips == 0


@pytest.mark.parametrize("precision", ["32-true", "16-true"])
def test_zero_interference(tmp_path: Path, precision: str) -> None:
    def run(callbacks: list[Any]) -> list[Tensor]:
        pl.seed_everything(0)
        model = Classifier(nn.Sequential(nn.Linear(N_FEATURES, 16), nn.Dropout(0.2), nn.ReLU(),
                                         nn.Linear(16, N_CLASSES)))
        trainer = make_trainer(tmp_path, callbacks, limit_train_batches=6, precision=precision)
        trainer.fit(model, data())
        return [p.detach().clone() for p in model.parameters()]

    bare = run([])
    traced = run([NonFiniteTracer(near_overflow_every_n_steps=1, strict=True)])
    assert all(torch.equal(a, b) for a, b in zip(bare, traced, strict=True))


class NaNLossTerm(Classifier):
    """Batch 1 adds a constant NaN term to the loss: the loss is NaN, the gradients are not."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        if batch_idx == 1:
            loss = loss + 0.0 * torch.log(torch.zeros((), device=loss.device))
        return loss


def test_replay_leaves_the_run_untouched(tmp_path: Path) -> None:
    """Under "warn" the run goes on exactly as without the tracer, replay included (dropout: the
    replay restores the RNG it used)."""

    def run(callbacks: list[Any]) -> list[Tensor]:
        pl.seed_everything(0)
        net = nn.Sequential(nn.Linear(N_FEATURES, 16), nn.Dropout(0.3), nn.ReLU(),
                            nn.Linear(16, N_CLASSES))
        model = NaNLossTerm(net)
        make_trainer(tmp_path, callbacks, limit_train_batches=4).fit(model, data())
        return [p.detach().clone() for p in model.parameters()]

    bare = run([])
    tracer = NonFiniteTracer(on_nonfinite="warn", strict=True)
    traced = run([tracer])
    assert only(tracer.findings, "numerics.nonfinite_loss").global_step == 1
    assert all(bool(torch.isfinite(p).all()) for p in traced)
    assert all(torch.equal(a, b) for a, b in zip(bare, traced, strict=True))


# ---------------------------------------------------------------------- bundle, args, state
def test_triage_bundle_runs_it_last_and_writes_the_report(tmp_path: Path) -> None:
    def edit(x: Tensor, y: Tensor) -> None:
        x[at(1, 4), 1] = float("nan")

    triage = Triage(report_dir=tmp_path / "report", on_nonfinite="stop", strict=True, verbose=False)
    assert isinstance(triage.checks[-1], NonFiniteTracer)
    assert triage.check("NonFiniteTracer").on_nonfinite == "stop"
    pl.seed_everything(0)
    trainer = make_trainer(tmp_path, [triage], limit_train_batches=8)
    trainer.fit(Classifier(), data(edit=edit))
    report = triage.report.report
    assert report is not None
    assert report["status"] == "completed"
    forward = [f for f in report["findings"] if f["code"] == "numerics.nonfinite_forward"]
    assert forward
    assert forward[0]["global_step"] == 1
    assert forward[0]["layer"] == "net.0"
    assert report["start_here"] == "data.nonfinite_input"
    assert (tmp_path / "report" / "triage_report.json").exists()


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"on_nonfinite": "halt"}, "on_nonfinite"),
    ({"mode": "lazy"}, "mode"),
    ({"check_every_n_steps": 0}, "check_every_n_steps"),
    ({"near_overflow_every_n_steps": 0}, "near_overflow_every_n_steps"),
    ({"near_overflow_ratio": 1.5}, "near_overflow_ratio"),
    ({"max_localized": -1}, "max_localized"),
])
def test_arguments_are_validated(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=f"`{name}`"):
        NonFiniteTracer(**kwargs)


def test_state_round_trip_and_pickle(tmp_path: Path) -> None:
    pl.seed_everything(0)
    _, tracer = fit(tmp_path, Classifier(), data(edit=two_bad_batches),
                    tracer=NonFiniteTracer(on_nonfinite="skip", strict=True))
    clone = pickle.loads(pickle.dumps(tracer))
    fresh = NonFiniteTracer()
    fresh.load_state_dict(clone.state_dict())
    assert fresh.findings == tracer.findings
    assert (fresh.nonfinite_steps, fresh.skipped_steps, fresh.first_step) == (2, 2, 1)


class NaNOnRankOne(Classifier):
    """Rank 1 only: a NaN enters the first layer's input at batch 1."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        if self.global_rank == 1 and batch_idx == 1:
            x = x.clone()
            x[5, 0] = float("nan")
        return self.loss_fn(self(x), y)


def test_ddp_every_rank_stops_and_the_report_names_the_rank(tmp_path: Path) -> None:
    fit_ddp_spawn(lambda: make_trainer(
        tmp_path, [Triage(report_dir=tmp_path / "report", strict=True, verbose=False)],
        strategy="ddp_spawn", devices=2, limit_train_batches=4), NaNOnRankOne(), data())
    report = json.loads((tmp_path / "report" / "triage_report.json").read_text())
    numerics = [
        (f["code"], f["rank"], f["global_step"], f["layer"]) for f in report["findings"]
        if f["code"].startswith("numerics.")]
    # rank 0's gradients were NaN too (all-reduce), but only rank 1 reports: where it was born
    assert numerics == [("numerics.nonfinite_forward", 1, 1, "net.0")]
    assert report["status"] == "completed"
    assert report["run"]["global_step"] == 2  # rank 0 stopped with rank 1, after batch 1
