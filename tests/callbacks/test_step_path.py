"""The shared step path: the watches that stay on read the loss and the gradient norms once per
step inside the bundle, and still see what they saw alone (spikes, exact NaN replays)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_triage import GradientMonitor, LossCurveMonitor, NonFiniteTracer, Triage
from lightning_triage.callbacks._step import RowBuffer, StepState
from tests.helpers import assert_ran_and_passed, loader, make_trainer


def _data(n: int = 40 * 16, seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return x, (x[:, 0] > 0).long()


class Net(pl.LightningModule):
    """A small classifier; ``boost_at`` multiplies the loss (and so every gradient) by 1000 at
    one optimizer step: a one-step gradient spike."""

    def __init__(self, boost_at: int | None = None, lr: float = 1e-4) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
        self.boost_at = boost_at
        self.lr = lr

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        if self.global_step == self.boost_at:
            loss = loss * 1000.0
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class _Counting(Callback):
    """Counts per-step reads from the second epoch on (after the first-epochs windows)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on = False
        self.norms = 0
        self.losses = 0
        self.steps = 0
        foreach_norm = torch._foreach_norm
        note_loss = StepState.note_loss

        def counted_norm(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            ord_ = args[0] if args else kwargs.get("ord", 2)
            if self.on and ord_ == 2:
                self.norms += 1
            return foreach_norm(tensors, *args, **kwargs)

        def counted_loss(state: StepState, loss: Tensor) -> Any:  # every loss read
            if self.on:
                self.losses += 1
            return note_loss(state, loss)

        monkeypatch.setattr(torch, "_foreach_norm", counted_norm)
        monkeypatch.setattr(StepState, "note_loss", counted_loss)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.on = trainer.current_epoch >= 1

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.steps += self.on


def _fit(tmp_path: Path, callbacks: list[Callback], model: pl.LightningModule | None = None,
         epochs: int = 2, batches: int = 40) -> pl.Trainer:
    trainer = make_trainer(tmp_path, callbacks, max_epochs=epochs, limit_train_batches=batches,
                           limit_val_batches=0)
    trainer.fit(model or Net(), loader(*_data(), batch_size=16))
    return trainer


def test_the_bundle_reads_the_norms_and_the_loss_once_per_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counting = _Counting(monkeypatch)
    # the step path only: a remedy trial at the end of fit would replay steps of its own
    bundle = Triage(window_epochs=0, window_steps=10, verbose=False, overfit=False, strict=True,
                    verify_remedies=False)
    _fit(tmp_path, [bundle, counting])
    assert counting.steps == 40
    assert counting.norms == counting.steps  # one `_foreach_norm` per step for three checks
    assert counting.losses == counting.steps  # one loss read for the tracer and both watches
    assert bundle.step_state.norm_reads == 80  # both epochs, every step once


def test_standalone_watches_each_read_their_own(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    counting = _Counting(monkeypatch)
    gm = GradientMonitor(window_epochs=0, window_steps=10, strict=True)
    curve = LossCurveMonitor(window_epochs=0, window_steps=10, strict=True)
    tracer = NonFiniteTracer(strict=True)
    _fit(tmp_path, [gm, curve, tracer, counting])
    # alone, each callback stands on its own: the monitor and the tracer both read the norms
    assert counting.norms == 2 * counting.steps == 80
    assert counting.losses == 3 * counting.steps
    assert gm.step_state is not tracer.step_state


@pytest.mark.parametrize("boost_at", [47, 63])
def test_one_step_gradient_spike_is_seen_alone_and_in_the_bundle(tmp_path: Path,
                                                                 boost_at: int) -> None:
    def spikes(findings: Any) -> list[int]:
        return [f.global_step for f in findings if f.code == "grad.spike"
                and f.evidence.get("after_window")]

    gm = GradientMonitor(window_epochs=0, window_steps=20, strict=True)
    _fit(tmp_path / "alone", [gm], Net(boost_at), epochs=2)
    bundle = Triage(window_epochs=0, window_steps=20, verbose=False, overfit=False, strict=True)
    _fit(tmp_path / "bundle", [bundle], Net(boost_at), epochs=2)
    assert spikes(gm.findings) == [boost_at]
    assert spikes(bundle.check("GradientMonitor").findings) == [boost_at]
    # the tracer read the same norms: a finite spike is not a numerics event
    assert not bundle.check("NonFiniteTracer").findings


def test_healthy_run_is_silent_in_the_bundle(tmp_path: Path) -> None:
    bundle = Triage(window_epochs=0, window_steps=20, verbose=False, overfit=False, strict=True)
    _fit(tmp_path, [bundle], Net(lr=0.02), epochs=2)
    for name in ("GradientMonitor", "NonFiniteTracer"):
        assert not [f for f in bundle.check(name).findings if f.is_problem], name
        assert_ran_and_passed(bundle.check(name))
    curve = bundle.check("LossCurveMonitor")
    assert not [f for f in curve.findings if f.code in ("curve.loss_spike", "curve.diverging")]
    assert len(curve.series()["train_loss"]) == 80  # it read the loss of every step of 2 epochs


class _DeviceLike(StepState):
    """The accelerator path on CPU: values stay in tensors, no host read per step."""

    def bind(self, pl_module: nn.Module) -> list[nn.Parameter]:
        params = super().bind(pl_module)
        self.host = False
        return params

    def reset(self) -> None:
        super().reset()
        self.host = False


class Coin(nn.Module):
    """At the armed step, one of two branches goes infinite: which one depends on a random draw
    (the replay must restore the RNG to name the same module)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)
        self.armed = False
        self.draws: list[int] = []

    def forward(self, x: Tensor) -> Tensor:
        coin = int(torch.randint(0, 2, ()))
        if self.armed:
            self.draws.append(coin)
        h = self.a(x)
        if self.armed and coin == 0:
            h = h / 0.0 * torch.ones_like(h)
        h = self.b(h)
        if self.armed and coin == 1:
            h = h / 0.0 * torch.ones_like(h)
        return self.head(h)


class CoinNet(pl.LightningModule):
    def __init__(self, at: int) -> None:
        super().__init__()
        self.net = Coin()
        self.at = at

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        self.net.armed = self.global_step == self.at
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


# seeds whose armed draw (torch's CPU generator, the same on every machine) takes each branch:
# 0 and 5 blow up `net.a`'s output, 4 and 7 `net.b`'s; the assertion holds for either branch
@pytest.mark.parametrize(("seed", "device_like"), [(0, False), (4, False), (5, False),
                                                  (7, False), (0, True), (4, True)])
def test_nan_step_is_replayed_exactly_by_the_bundle(tmp_path: Path, seed: int,
                                                    device_like: bool) -> None:
    pl.seed_everything(seed, verbose=False)
    model = CoinNet(at=30)
    bundle = Triage(window_epochs=0, window_steps=10, verbose=False, overfit=False, strict=True)
    if device_like:  # the accelerator path's reads (a device total, one read per step)
        shared = _DeviceLike()
        for check in bundle.checks:
            if hasattr(check, "step_state"):
                check.step_state = shared  # type: ignore[attr-defined]
    _fit(tmp_path, [bundle], model, epochs=1)
    tracer = bundle.check("NonFiniteTracer")
    forward = [f for f in tracer.findings if f.code == "numerics.nonfinite_forward"]
    assert len(forward) == 1 and forward[0].global_step == 30
    # the replay ran on a copy of the module: the live module drew its coin once, at the real step
    assert tracer.replay_calls >= 1  # type: ignore[attr-defined]
    (first,) = model.net.draws
    # the replay drew the same coin: it names the module after the branch that blew up at the
    # real step (over the seeds both branches occur)
    assert forward[0].layer == ("net.b" if first == 0 else "net.head")


def test_step_state_handles_sparse_gradients() -> None:
    emb = nn.Embedding(10, 4, sparse=True)
    lin = nn.Linear(4, 1)
    module = nn.Sequential(emb, lin)
    module(torch.tensor([1, 3, 3])).sum().backward()
    state = StepState()
    state.bind(module)
    state.read_grads(0, None)
    dense = [emb.weight.grad.to_dense().norm().item(), lin.weight.grad.norm().item(),
             lin.bias.grad.norm().item()]
    assert state.norms == pytest.approx(dense, rel=1e-6)
    assert state.grads_finite()


def test_step_state_caches_per_step_and_optimizer() -> None:
    lin = nn.Linear(3, 2)
    lin(torch.ones(1, 3)).sum().backward()
    state = StepState()
    state.bind(lin)
    opt_a, opt_b = object(), object()
    state.read_grads(5, opt_a)
    state.read_grads(5, opt_a)
    assert state.norm_reads == 1
    state.read_grads(5, opt_b)
    state.read_grads(6, opt_a)
    assert state.norm_reads == 3
    assert lin.weight.grad is not None
    lin.weight.grad[0, 0] = float("nan")
    state.read_grads(7, opt_a)
    assert not state.grads_finite()


def test_step_state_reads_one_loss_per_output() -> None:
    state = StepState()
    out = {"loss": torch.tensor(2.5)}
    first = state.loss(out)
    assert state.loss(out) is first and first[1] == 2.5
    assert state.loss({"loss": torch.tensor(1.0)})[1] == 1.0
    assert state.loss({"other": 1}) == (None, None)


def test_row_buffer_is_bounded_over_many_flushes() -> None:
    buf = RowBuffer(3, capacity=100)
    for chunk in range(1000):  # 100,000 steps, flushed every 100
        for i in range(100):
            buf.rows[buf.next_row(chunk * 100 + i)] = [1.0, 2.0, float(i)]
        steps, rows = buf.take()
        assert len(steps) == 100 and rows.shape == (100, 3)
    assert buf.capacity == 100 and len(buf) == 0
    # a batch with more steps than room grows the buffer once and keeps every row in order
    for i in range(150):
        buf.rows[buf.next_row(i)] = [i, i, i]
    steps, rows = buf.take(120)
    assert steps == list(range(120)) and np.array_equal(rows[:, 0], np.arange(120.0))
    steps, rows = buf.take()
    assert steps == list(range(120, 150))


def test_step_state_hands_the_backward_loss_to_the_watches() -> None:
    state = StepState()
    state.automatic = True
    loss = torch.tensor(3.0, requires_grad=True) * 1.0
    noted = state.note_loss(loss)
    assert noted[1] == 3.0
    # automatic optimization: the step's output holds the same value; the noted read is used
    assert state.loss({"loss": torch.tensor(3.0)}) == noted
    # ... once: the next output is read from itself, and a skipped step (no output) has none
    assert state.loss({"loss": torch.tensor(5.0)})[1] == 5.0
    state.note_loss(loss)
    assert state.loss(None) == (None, None)
    manual = StepState()  # manual optimization: backward's loss may be anything; not reused
    manual.note_loss(loss)
    assert manual.loss({"loss": torch.tensor(5.0)})[1] == 5.0


def test_the_device_path_sees_the_same_spike_and_losses(tmp_path: Path) -> None:
    """The buffers and reads of accelerators (device tensors, totals at the flush, one host
    read per step for the tracer), run on CPU: the same findings and series as the host path."""
    runs = {}
    for name in ("host", "device"):
        pl.seed_everything(0, verbose=False)
        bundle = Triage(window_epochs=0, window_steps=20, verbose=False, overfit=False,
                        strict=True)
        if name == "device":
            shared = _DeviceLike()
            for check in bundle.checks:
                if hasattr(check, "step_state"):
                    check.step_state = shared  # type: ignore[attr-defined]
        _fit(tmp_path / name, [bundle], Net(boost_at=55), epochs=2)
        runs[name] = bundle
    host, device = runs["host"], runs["device"]
    assert isinstance(device.check("GradientMonitor")._buf.data, Tensor)  # type: ignore[attr-defined]
    for check in ("GradientMonitor", "LossCurveMonitor"):
        assert [(f.code, f.global_step) for f in device.check(check).findings] == \
            [(f.code, f.global_step) for f in host.check(check).findings]
    assert 55 in [f.global_step for f in device.check("GradientMonitor").findings
                  if f.code == "grad.spike"]
    for key in ("grad_norm",):
        a = np.array(host.check("GradientMonitor").series()[key])
        b = np.array(device.check("GradientMonitor").series()[key])
        assert a.shape == b.shape and np.allclose(a, b, rtol=1e-5)
    a = np.array(host.check("LossCurveMonitor").series()["train_loss"])
    b = np.array(device.check("LossCurveMonitor").series()["train_loss"])
    assert a.shape == b.shape and np.allclose(a, b, rtol=1e-5)
    assert not device.check("NonFiniteTracer").findings


class _HookProbe(Callback):
    """Records, at a steady-state step, which of the bundle's per-step hooks Lightning would call."""

    def __init__(self, bundle: Triage) -> None:
        self.bundle = bundle
        self.callable: dict[str, bool] = {}

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.current_epoch == 2 and not self.callable:
            self.callable = {hook: callable(getattr(self.bundle, hook)) for hook in (
                "on_train_batch_start", "on_before_backward", "on_after_backward",
                "on_before_optimizer_step", "on_before_zero_grad", "on_train_batch_end")}


def test_the_bundle_drops_per_step_hooks_with_nothing_to_do(tmp_path: Path) -> None:
    """Hooks no check needs in the steady state are not dispatched (Lightning skips a hook that
    is not callable), the others are; all are back after the fit and in a pickle."""
    bundle = Triage(window_epochs=1, window_steps=5, verbose=False, overfit=False)
    probe = _HookProbe(bundle)
    _fit(tmp_path, [bundle, probe], epochs=3)
    assert probe.callable == {"on_train_batch_start": True, "on_before_backward": True,
                              "on_after_backward": False, "on_before_optimizer_step": True,
                              "on_before_zero_grad": False, "on_train_batch_end": True}
    assert callable(bundle.on_after_backward) and callable(bundle.on_before_zero_grad)
    assert callable(pickle.loads(pickle.dumps(bundle)).on_before_zero_grad)
