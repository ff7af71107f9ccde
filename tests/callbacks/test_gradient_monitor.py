"""GradientMonitor on real Trainer.fit runs: vanishing, dead units, exploding, update ratios,
the long-run watch (a recurrent LM whose loss explodes after the window), the skip action,
state in checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_triage import GradientMonitor, LossCurveMonitor
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from tests.helpers import loader, make_trainer, seeds


class Net(pl.LightningModule):
    """A digits classifier around ``net`` with plain SGD."""

    def __init__(self, net: nn.Module, lr: float = 0.1) -> None:
        super().__init__()
        self.net, self.lr = net, lr

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def deep(act: type[nn.Module], depth: int = 8, width: int = 32, gain: float = 1.0) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(64, width), act()]
    for _ in range(depth - 2):
        layers += [nn.Linear(width, width), act()]
    layers.append(nn.Linear(width, 10))
    if gain != 1.0:
        for m in layers:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=gain / m.in_features ** 0.5)
    return nn.Sequential(*layers)


@pytest.fixture(autouse=True)
def _seed() -> None:
    pl.seed_everything(0, verbose=False)  # models are built before `fit` seeds again


def fit(tmp_path: Path, model: pl.LightningModule, callbacks: list[Any], *, batch_size: int = 32,
        seed: int = 0, **kwargs: Any) -> pl.Trainer:
    pl.seed_everything(seed, verbose=False)
    train, _ = digits_loaders(batch_size=batch_size)
    defaults: dict[str, Any] = dict(limit_train_batches=15, max_epochs=2, limit_val_batches=0)
    defaults.update(kwargs)
    trainer = make_trainer(tmp_path, callbacks, **defaults)
    trainer.fit(model, train)
    return trainer


def gcodes(cb: GradientMonitor) -> list[str]:
    return [f.code for f in cb.findings]


@pytest.mark.parametrize("seed", seeds())
def test_healthy_mlp_is_silent(tmp_path: Path, seed: int) -> None:
    pl.seed_everything(seed, verbose=False)
    cb = GradientMonitor(window_epochs=1, window_steps=20, strict=True)
    fit(tmp_path, DigitsMLP(lr=0.1), [cb], seed=seed)
    assert cb.findings == []
    assert cb.check_status()["status"] == "passed"
    assert len(cb.series()["grad_norm"]) == 30


@pytest.mark.parametrize("seed", seeds())
def test_deep_sigmoid_mlp_vanishes(tmp_path: Path, seed: int) -> None:
    pl.seed_everything(seed, verbose=False)
    cb = GradientMonitor(window_epochs=1, window_steps=20, strict=True)
    fit(tmp_path, Net(deep(nn.Sigmoid, depth=10)), [cb], seed=seed)
    assert "grad.vanishing" in gcodes(cb)
    f = next(f for f in cb.findings if f.code == "grad.vanishing")
    print("vanishing ratio", seed, f.evidence["ratio"])
    assert f.layer == "net.0"
    assert f.evidence["ratio"] < 1e-3


@pytest.mark.parametrize("seed", seeds())
def test_deep_stack_initialized_too_large_explodes(tmp_path: Path, seed: int) -> None:
    pl.seed_everything(seed, verbose=False)
    cb = GradientMonitor(window_epochs=1, window_steps=20, strict=True)
    # lr 0.03 (at lr 0.01 SGD recovers on half the seeds): gradient norms in the thousands,
    # overflowing at step 3 on seeds 0-2 (median before 3.6e4-2.4e5 under default kernels)
    fit(tmp_path, Net(deep(nn.ReLU, depth=10, gain=2.5), lr=0.03), [cb], seed=seed)
    assert gcodes(cb)[0] == "grad.exploding"
    f = cb.findings[0]
    print("exploding", seed, f.global_step, f.evidence["median_before"])
    assert f.global_step is not None
    assert f.global_step < 10
    assert f.evidence["median_before"] > 1e3  # norms in the thousands before they overflowed


def test_relu_units_pushed_below_zero_are_dead(tmp_path: Path) -> None:
    pl.seed_everything(0, verbose=False)
    net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    with torch.no_grad():
        net[0].bias[:24] = -20.0  # 24 of 32 hidden units never activate
    cb = GradientMonitor(window_epochs=1, window_steps=20, strict=True)
    fit(tmp_path, Net(net), [cb])
    dead = [f for f in cb.findings if f.code == "grad.dead_units"]
    assert len(dead) == 1
    assert dead[0].layer == "net.0"
    assert dead[0].evidence["layers"]["net.0"] == {"dead": 24, "units": 32}


def test_lr_zero_update_ratio_far_below(tmp_path: Path) -> None:
    cb = GradientMonitor(window_epochs=1, window_steps=20, ratio_every_n_steps=2, strict=True)
    fit(tmp_path, DigitsMLP(lr=0.0), [cb])
    assert gcodes(cb) == ["grad.update_ratio"]
    assert cb.findings[0].evidence["direction"] == "below"


# --------------------------------------------------------------------------- long-run watch
V = 16


def lag_language(n: int = 2048, length: int = 32, lag: int = 8, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Random tokens where each token after the first `lag` is (token `lag` back) + 1 mod V."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V, (n, length + 1), generator=g)
    for t in range(lag, length + 1):
        x[:, t] = (x[:, t - lag] + 1) % V
    return x[:, :-1], x[:, 1:]


class RecurrentLM(pl.LightningModule):
    """A tiny Elman RNN language model, plain SGD, no gradient clipping. At ``spike_step`` the
    gradient reaching the logits is multiplied by ``spike``: a gradient spike at a known step,
    whose SGD update then throws the loss up at the next steps."""

    def __init__(self, lr: float, spike_step: int = -1, spike: float = 1.0) -> None:
        super().__init__()
        self.lr, self.spike_step, self.spike = lr, spike_step, spike
        self.emb = nn.Embedding(V, 64)
        self.rnn = nn.RNN(64, 64, batch_first=True)
        self.head = nn.Linear(64, V)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.rnn(self.emb(x))[0])

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        if self.global_step == self.spike_step:
            logits.register_hook(lambda g: g * self.spike)
        return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


@pytest.mark.parametrize("seed", seeds())
def test_recurrent_lm_explodes_after_the_window_grad_spike_first(tmp_path: Path, seed: int) -> None:
    """Plain SGD, no clipping: the RNN learns; at step 160, long after the 60-step window, its
    gradient is blown up 300x (constructed, not left to a chaotic trajectory): the gradient
    spike comes first, the loss spike at the next steps."""
    pl.seed_everything(seed, verbose=False)
    x, y = lag_language(n=1024, seed=seed)
    loss_cb = LossCurveMonitor(window_epochs=0, window_steps=60, flush_every_n_steps=20, strict=True)
    grad_cb = GradientMonitor(window_epochs=0, window_steps=60, flush_every_n_steps=20, strict=True)
    trainer = make_trainer(tmp_path, [loss_cb, grad_cb], max_steps=200, max_epochs=-1,
                           limit_train_batches=None, limit_val_batches=0)
    trainer.fit(RecurrentLM(lr=1.0, spike_step=160, spike=300.0),
                loader(x, y, batch_size=32, shuffle=True))
    late_loss = [f for f in loss_cb.findings if f.evidence.get("after_window")]
    late_grad = [f for f in grad_cb.findings if f.evidence.get("after_window")]
    print([(f.code, f.global_step, f.evidence.get("ratio")) for f in late_loss + late_grad])
    loss_spikes = [f.global_step for f in late_loss if f.code == "curve.loss_spike"]
    grad_spikes = [f for f in late_grad if f.code == "grad.spike"]
    assert [g.global_step for g in grad_spikes][:1] == [160]
    g = grad_spikes[0]
    assert g.evidence["loss_spike_followed"], g.evidence
    # the gradient spike came first, the loss spike a few steps later, both after the window
    assert any(160 < s <= 165 for s in loss_spikes), loss_spikes
    assert not [s for s in loss_spikes if s < 160]
    assert g.evidence["ratio"] > 50
    assert g.evidence["suggested_clip"] is not None
    assert g.evidence["suggested_clip"] < g.evidence["norm"]
    assert g.layer is not None


class BadBatchMLP(DigitsMLP):
    """Plain SGD MLP whose inputs are multiplied by 1000 at one late step; keeps the weights
    after the steps around it."""

    def __init__(self, bad_step: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bad_step = bad_step
        self.snaps: dict[int, Tensor] = {}

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        if self.global_step == self.bad_step:
            x = x * 1000.0
        return F.cross_entropy(self(x), y)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.global_step in (self.bad_step, self.bad_step + 1):  # after steps bad-1, bad
            self.snaps[self.global_step] = self.net[0].weight.detach().clone()


@pytest.mark.parametrize("on_spike", ["warn", "skip"])
def test_skip_action_zeroes_the_spiking_update(tmp_path: Path, on_spike: str) -> None:
    cb = GradientMonitor(window_epochs=0, window_steps=30, flush_every_n_steps=10, on_spike=on_spike,
                         strict=True)
    model = BadBatchMLP(bad_step=50, lr=0.1)
    fit(tmp_path, model, [cb], max_epochs=5)
    spikes = [f for f in cb.findings if f.code == "grad.spike"]
    assert spikes[0].global_step == 50
    if on_spike == "skip":  # the model was spared: no later spike (with "warn" there may be)
        assert [f.global_step for f in spikes] == [50]
    assert spikes[0].evidence["after_window"] is True
    assert spikes[0].evidence["ratio"] > 100
    unchanged = torch.equal(model.snaps[50], model.snaps[51])
    if on_spike == "skip":
        assert unchanged
        assert cb.skipped_steps == 1
        assert "1 step(s) skipped" in cb.check_status()["detail"]
    else:
        assert not unchanged
        assert cb.skipped_steps == 0


def test_state_round_trip_keeps_the_watch_baseline(tmp_path: Path) -> None:
    cb = GradientMonitor(window_epochs=0, window_steps=10, flush_every_n_steps=5, strict=True)
    trainer = fit(tmp_path, DigitsMLP(lr=0.1), [cb])
    ckpt = tmp_path / "g.ckpt"
    trainer.save_checkpoint(ckpt)
    state = torch.load(ckpt, weights_only=False)["callbacks"][cb.state_key]
    resumed = GradientMonitor(window_epochs=0, window_steps=10, flush_every_n_steps=5, strict=True)
    resumed.load_state_dict(state)
    assert resumed.window_closed
    assert resumed.watcher.level == cb.watcher.level
    assert resumed.watcher.step == 30
    assert resumed.series() == cb.series()


def test_resumed_fit_continues_the_watch(tmp_path: Path) -> None:
    cb = GradientMonitor(window_epochs=0, window_steps=10, flush_every_n_steps=5, strict=True)
    trainer = fit(tmp_path, DigitsMLP(lr=0.1), [cb])
    ckpt = tmp_path / "g.ckpt"
    trainer.save_checkpoint(ckpt)
    resumed = GradientMonitor(window_epochs=0, window_steps=10, flush_every_n_steps=5, strict=True)
    pl.seed_everything(0, verbose=False)
    train, _ = digits_loaders()
    trainer2 = make_trainer(tmp_path, [resumed], limit_train_batches=15, max_epochs=3,
                            limit_val_batches=0)
    trainer2.fit(DigitsMLP(lr=0.1), train, ckpt_path=str(ckpt))
    assert resumed.window_closed
    assert resumed.watcher.step == 45
    assert [s for s, _ in resumed.series()["grad_norm"]] == list(range(45))
    assert resumed.findings == []


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"on_spike": "stop"}, "on_spike"), ({"ratio_every_n_steps": 0}, "ratio_every_n_steps"),
    ({"window_steps": 0}, "window_steps"), ({"watch": 1}, "watch")])
def test_invalid_arguments_name_the_argument(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=f"`{name}`"):
        GradientMonitor(**kwargs)


class ManualTwoSteps(DigitsMLP):
    """Manual optimization, two optimizer steps per batch."""

    def __init__(self) -> None:
        super().__init__(lr=0.05)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        opt = self.optimizers()
        x, y = batch
        for xs, ys in ((x[:16], y[:16]), (x[16:], y[16:])):
            loss = F.cross_entropy(self(xs), ys)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss.detach()


def test_manual_optimization_two_steps_per_batch(tmp_path: Path) -> None:
    grad_cb = GradientMonitor(window_epochs=0, window_steps=10, flush_every_n_steps=7, strict=True)
    loss_cb = LossCurveMonitor(window_epochs=0, window_steps=25, flush_every_n_steps=7, strict=True)
    fit(tmp_path, ManualTwoSteps(), [grad_cb, loss_cb])
    assert len(grad_cb.series()["grad_norm"]) == 60  # 2 optimizer steps x 15 batches x 2 epochs
    assert grad_cb.findings == []
    assert [f.code for f in loss_cb.findings] == ["curve.healthy", "curve.no_validation"]


def test_diverging_fit_leaks_no_numpy_warning(tmp_path: Path) -> None:
    """SGD at lr 10 overflows to Inf (with Inf gradient norms) within two epochs; the library's
    own arithmetic on those numbers (per-layer norms, ratios, curve rules, the HTML plots) warns
    about nothing (the per-layer norms once made NaN of Inf x 0 in a matrix product)."""
    import warnings

    import numpy as np

    from lightning_triage import Triage

    pl.seed_everything(0, verbose=False)
    train, val = digits_loaders()
    triage = Triage(strict=True, report_dir=tmp_path)
    with warnings.catch_warnings(), np.errstate(divide="raise", over="raise", invalid="raise"):
        warnings.filterwarnings("error", message=".*encountered in", category=RuntimeWarning)
        make_trainer(tmp_path, [triage], max_epochs=2, limit_train_batches=None).fit(
            DigitsMLP(lr=10.0), train, val)
    report = triage.report.report
    assert report is not None and report["start_here"] == "curve.diverging"
    assert not [f for f in report["findings"] if f["code"] == "triage.check_error"]
    assert report["details"]["grad_layers"]["layers"]  # the per-layer norms were computed
