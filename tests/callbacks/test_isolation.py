"""The probes never change or break the run they watch: each test is a seeded `Trainer.fit` with
and without `Triage()` on a model that keeps state the probes could touch (hidden states, flags,
generators, resized buffers, cached param groups, metrics, lists, direct logger calls), and
asserts bit-identical weights and buffers, equal user-side state and no false finding. Where a
copy matters, the same run is also made with the copy ruled out (the in-place snapshot)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.demos.lstm import LightningLSTM, SequenceSampler, SimpleLSTM
from lightning.pytorch.loggers import Logger
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from lightning_triage import Triage, probing
from lightning_triage.callbacks.base import collect_checks
from lightning_triage.findings import Finding
from tests.helpers import WATCHES, assert_ran_and_passed, make_trainer, seeds

MODES = ["copy", "in_place"]


# ----------------------------------------------------------------------------- harness
def _findings(triage: Triage) -> list[Finding]:
    return [f for c in collect_checks([triage]) for f in c.findings]


def _problems(triage: Triage) -> dict[str, str]:
    return {f.code: f.message for f in _findings(triage) if f.is_problem}


def _force(mode: str, monkeypatch: pytest.MonkeyPatch, holder: dict[str, nn.Module]) -> None:
    """Rule the copy out ("in_place"): free memory reported as 3x the module's bytes, which
    fits a snapshot (1x) but not a copy (2x for the structure probe, 4x for the overfit probe)."""
    if mode == "in_place":
        monkeypatch.setattr(probing.isolation, "free_bytes",
                            lambda device: 3 * probing.module_bytes(holder["model"]))


def _run(tmp_path: Path, make: Any, data: Any, triage: Triage | None, seed: int = 0,
         **trainer_kwargs: Any) -> tuple[pl.LightningModule, pl.Trainer]:
    pl.seed_everything(seed, verbose=False)
    model = make()
    holder = trainer_kwargs.pop("holder", None)
    if holder is not None:
        holder["model"] = model
    kwargs: dict[str, Any] = dict(max_epochs=2, limit_train_batches=4)
    kwargs.update(trainer_kwargs)
    trainer = make_trainer(tmp_path, [triage] if triage is not None else [], **kwargs)
    trainer.fit(model, data())
    return model, trainer


def _assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].shape == sb[key].shape, key
        assert torch.equal(sa[key], sb[key]), key


def _compare(tmp_path: Path, make: Any, data: Any, mode: str = "copy",
             monkeypatch: pytest.MonkeyPatch | None = None, seed: int = 0,
             **trainer_kwargs: Any) -> tuple[pl.LightningModule, pl.LightningModule, Triage]:
    """Fit with and without `Triage()`; the weights and buffers must be bit-identical."""
    holder: dict[str, nn.Module] = {}
    if monkeypatch is not None:
        _force(mode, monkeypatch, holder)
    triage = Triage(verbose=False, report_dir=tmp_path / "report")
    with_triage, _ = _run(tmp_path / "a", make, data, triage, seed, holder=holder,
                          **trainer_kwargs)
    without, _ = _run(tmp_path / "b", make, data, None, seed, **trainer_kwargs)
    _assert_same_weights(with_triage, without)
    assert "triage.check_error" not in _problems(triage), _problems(triage)
    if mode == "in_place":
        isolation = [f.evidence["isolation"] for f in _findings(triage)
                     if f.code.startswith("overfit.") and "isolation" in f.evidence]
        assert isolation and all(i.startswith("in place") for i in isolation), isolation
    return with_triage, without, triage


def _blobs(n: int = 64, seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(n, 8, generator=g) * 0.5 + F.one_hot(y, 8).float() * 2
    return x, y


def blob_loader() -> DataLoader:
    return DataLoader(TensorDataset(*_blobs()), batch_size=16, shuffle=True,
                      generator=torch.Generator().manual_seed(0))


class Net(pl.LightningModule):
    """A small classifier; subclasses add the state under test."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4))

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


# ----------------------------------------------------------------------------- Lightning's LSTM
class DemoLSTM(LightningLSTM):
    """Lightning's demo LSTM (its `training_step` keeps `self.hidden` between batches), with a
    smaller `SimpleLSTM` (the demo's class) so the test runs in seconds, and no download."""

    def __init__(self) -> None:
        super().__init__(vocab_size=16)
        self.model = SimpleLSTM(vocab_size=16, ninp=256, nhid=256, nlayers=2)

    def prepare_data(self) -> None:
        pass


def tokens_loader(seed: int = 0, vocab: int = 16, sequences: int = 160,
                  length: int = 12) -> DataLoader:
    """Next-token pairs cut from one random token stream, in the demo's sequential order."""
    g = torch.Generator().manual_seed(seed)
    stream = torch.randint(0, vocab, (sequences * length + 1,), generator=g)
    dataset = TensorDataset(stream[:-1].view(sequences, length), stream[1:].view(sequences, length))
    return DataLoader(dataset, batch_sampler=SequenceSampler(dataset, batch_size=20))


@pytest.mark.parametrize("seed", seeds())
def test_lightning_demo_lstm_trains_as_without_and_its_explosion_is_reported(
        tmp_path: Path, seed: int) -> None:
    # SGD at lr 20 without clipping: on these data the loss grows >10x within the first epoch
    # and stays there (measured: 20-50x the step-0 loss from step ~8 on, seeds 0-2)
    with_triage, without, triage = _compare(
        tmp_path, DemoLSTM, lambda: tokens_loader(seed), seed=seed, max_epochs=3,
        limit_train_batches=8)
    assert with_triage.hidden is None and without.hidden is None  # reset by the demo per epoch
    problems = _problems(triage)
    assert "structure.target_leak" not in problems and "structure.causal_leak" not in problems
    assert "curve.diverging" in problems, problems  # seeds 0-2: with overfit.failed, grad.*


class StatefulGRU(pl.LightningModule):
    """A healthy stateful RNN: the hidden state carries over between batches (truncated
    backpropagation: detached each step), gradients clipped by the Trainer."""

    def __init__(self, vocab: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 32)
        self.rnn = nn.GRU(32, 64, batch_first=True)
        self.head = nn.Linear(64, vocab)
        self.hidden: Tensor | None = None

    def forward(self, x: Tensor, hidden: Tensor | None) -> tuple[Tensor, Tensor]:
        out, hidden = self.rnn(self.embed(x), hidden)
        return self.head(out), hidden

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        hidden = None if self.hidden is None else self.hidden.detach()
        logits, self.hidden = self(x, hidden)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        self.log("train_loss", loss)
        return loss

    def on_train_epoch_end(self) -> None:
        self.hidden = None

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=3e-3)


def markov_loader(seed: int = 0, vocab: int = 16, sequences: int = 160,
                  length: int = 12) -> DataLoader:
    """A learnable stream: each token is the previous plus one with probability 0.9, else
    random."""
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(sequences * length + 1, generator=g) < 0.9
    noise = torch.randint(0, vocab, (sequences * length + 1,), generator=g)
    stream = torch.zeros(sequences * length + 1, dtype=torch.long)
    for i in range(1, len(stream)):
        stream[i] = (stream[i - 1] + 1) % vocab if keep[i] else noise[i]
    dataset = TensorDataset(stream[:-1].view(sequences, length), stream[1:].view(sequences, length))
    return DataLoader(dataset, batch_sampler=SequenceSampler(dataset, batch_size=20))


def test_healthy_stateful_rnn_with_clipping_stays_silent(tmp_path: Path) -> None:
    _, _, triage = _compare(tmp_path, StatefulGRU, markov_loader, max_epochs=3,
                            limit_train_batches=8, gradient_clip_val=1.0)
    assert _problems(triage) == {}
    assert triage.report.report is not None
    assert_ran_and_passed(triage.report.report, *WATCHES, "GradientWiringCheck", "OverfitBatchCheck")


# ----------------------------------------------------------------------------- one-time state
class ActNorm(nn.Module):
    """Data-dependent initialization: a Python flag set on the first forward."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(features))
        self.log_scale = nn.Parameter(torch.zeros(features))
        self.initialized = False
        self.init_batch_size = 0

    def forward(self, x: Tensor) -> Tensor:
        if not self.initialized:
            with torch.no_grad():
                self.loc.copy_(-x.mean(0))
                self.log_scale.copy_(-torch.log(x.std(0) + 1e-6))
            self.initialized = True
            self.init_batch_size = x.shape[0]
        return (x + self.loc) * torch.exp(self.log_scale)


class ActNormNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.norm = ActNorm(8)

    def forward(self, x: Tensor) -> Tensor:
        return self.body(self.norm(x))


@pytest.mark.parametrize("mode", MODES)
def test_data_dependent_init_flag_is_left_to_the_real_run(tmp_path: Path, mode: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with_triage, without, _ = _compare(tmp_path, ActNormNet, blob_loader, mode, monkeypatch)
    assert with_triage.norm.initialized and with_triage.norm.init_batch_size == 16
    assert without.norm.init_batch_size == 16


class NoisyNet(Net):
    """Owns a `torch.Generator`, and augments with numpy and `random` in `training_step`."""

    def __init__(self) -> None:
        super().__init__()
        self.gen = torch.Generator().manual_seed(123)
        self.rng = np.random.default_rng(5)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        x = x + 0.3 * torch.randn(x.shape, generator=self.gen)
        x = x + torch.from_numpy(np.random.normal(0, 0.3, x.shape)).float()
        x = x * (0.8 + 0.4 * random.random())
        x = x + torch.from_numpy(self.rng.normal(0, 0.1, x.shape)).float()
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss


@pytest.mark.parametrize("mode", MODES)
def test_model_generators_and_numpy_random_augmentation(tmp_path: Path, mode: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    with_triage, without, triage = _compare(tmp_path, NoisyNet, blob_loader, mode, monkeypatch)
    assert torch.equal(with_triage.gen.get_state(), without.gen.get_state())
    assert with_triage.rng.bit_generator.state == without.rng.bit_generator.state
    assert "structure.target_leak" not in _problems(triage)
    probe = next(c for c in collect_checks([triage]) if type(c).__name__ == "StructureProbe")
    assert probe.results["target_leak"] == "ok"


class LeakyNoisyNet(NoisyNet):
    """A real target leak behind the same augmentation: still found (the passes are paired)."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        x = x + 0.3 * torch.randn(x.shape, generator=self.gen)
        x = x + torch.from_numpy(np.random.normal(0, 0.3, x.shape)).float()
        x = x + F.one_hot(y, 8).float()  # the labels reach the features
        return F.cross_entropy(self(x), y)


def test_target_leak_behind_augmentation_is_still_found(tmp_path: Path) -> None:
    _, _, triage = _compare(tmp_path, LeakyNoisyNet, blob_loader)
    assert "structure.target_leak" in _problems(triage)


class FreshNoiseNet(Net):
    """Stochastic beyond the probe's reach: noise seeded from the operating system."""

    def forward(self, x: Tensor) -> Tensor:
        g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
        return self.body(x + torch.randn(x.shape, generator=g))


def test_nondeterministic_forward_skips_the_leak_probe_with_a_reason(tmp_path: Path) -> None:
    # (a run that differs from itself: nothing to compare with a run without Triage)
    triage = Triage(verbose=False, report_dir=tmp_path / "report")
    make_trainer(tmp_path, [triage], max_epochs=1).fit(FreshNoiseNet(), blob_loader())
    assert "structure.target_leak" not in _problems(triage)
    assert "triage.check_error" not in _problems(triage)
    skipped = [f for f in _findings(triage) if f.code == "structure.probe_skipped"]
    assert any("different outputs" in f.message for f in skipped), [f.message for f in skipped]


# ----------------------------------------------------------------------------- resized state
class BankNet(Net):
    """A feature bank buffer grown with `torch.cat` in `training_step` (changes size)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("bank", torch.zeros(0, 4))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        self.bank = torch.cat([self.bank, logits.detach()])[-40:]
        return F.cross_entropy(logits, y) + 0.0 * self.bank.mean()


@pytest.mark.parametrize("mode", MODES)
def test_feature_bank_that_changes_size(tmp_path: Path, mode: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    with_triage, without, _ = _compare(tmp_path, BankNet, blob_loader, mode, monkeypatch)
    assert with_triage.bank.shape == without.bank.shape == (40, 4)
    # dropout stayed on in the real run (train/eval flags restored after every probe)
    assert with_triage.body[2].training


class WarmupNet(Net):
    """A warm-up that caches `optimizer.param_groups` and writes the lr every step."""

    def on_train_start(self) -> None:
        self.groups = self.trainer.optimizers[0].param_groups
        self.lrs: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        for group in self.groups:
            group["lr"] = 1e-2 * min(1.0, (self.global_step + 1) / 5)
        self.lrs.append(float(self.trainer.optimizers[0].param_groups[0]["lr"]))
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("mode", MODES)
def test_warmup_caching_param_groups(tmp_path: Path, mode: str,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with_triage, without, _ = _compare(tmp_path, WarmupNet, blob_loader, mode, monkeypatch)
    assert with_triage.lrs == without.lrs == [1e-2 * min(1.0, (s + 1) / 5) for s in range(8)]
    assert with_triage.groups is with_triage.trainer.optimizers[0].param_groups


# ----------------------------------------------------------------------------- user-side state
class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        return x


class BookkeepingNet(Net):
    """torchmetrics, `training_step_outputs`, counters (module and submodule), an EMA list."""

    def __init__(self) -> None:
        super().__init__()
        self.counter = Counter()
        self.accuracy = MulticlassAccuracy(num_classes=4)
        self.training_step_outputs: list[Tensor] = []
        self.steps_seen = 0
        self.ema = [p.detach().clone() for p in self.parameters()]
        self.epoch_accuracy: list[float] = []

    def forward(self, x: Tensor) -> Tensor:
        return self.body(self.counter(x))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.accuracy.update(logits, y)
        self.training_step_outputs.append(loss.detach())
        self.steps_seen += 1
        with torch.no_grad():
            for e, p in zip(self.ema, self.parameters(), strict=True):
                e.mul_(0.9).add_(p.detach(), alpha=0.1)
        return loss

    def on_train_epoch_end(self) -> None:
        self.epoch_accuracy.append(float(self.accuracy.compute()))
        self.accuracy.reset()


@pytest.mark.parametrize("mode", MODES)
def test_metrics_lists_counters_and_ema(tmp_path: Path, mode: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    with_triage, without, triage = _compare(tmp_path, BookkeepingNet, blob_loader, mode,
                                            monkeypatch)
    assert with_triage.steps_seen == without.steps_seen == 8
    assert with_triage.counter.calls == without.counter.calls == 8
    assert len(with_triage.training_step_outputs) == 8
    assert all(torch.equal(a, b) for a, b in zip(with_triage.training_step_outputs,
                                                  without.training_step_outputs, strict=True))
    assert with_triage.epoch_accuracy == without.epoch_accuracy
    assert all(torch.equal(a, b) for a, b in zip(with_triage.ema, without.ema, strict=True))
    # the report says how many `training_step` calls the probes made
    overfit = next(f for f in _findings(triage) if f.code.startswith("overfit."))
    assert overfit.evidence["training_step_calls"] >= 2
    probe = next(c for c in collect_checks([triage]) if type(c).__name__ == "StructureProbe")
    assert probe.results["user_code_calls"] == probe.results["forward_passes"] >= 3
    assert "`training_step` calls" in probe.detail


class RowLogger(Logger):
    """Keeps every row it receives."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "rows"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, {k: float(v) for k, v in metrics.items()}))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


class DirectLoggingNet(Net):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        assert self.logger is not None
        self.logger.log_metrics({"direct": float(loss)}, step=self.global_step)
        return loss


@pytest.mark.parametrize("mode", MODES)
def test_loggers_receive_nothing_from_the_probes(tmp_path: Path, mode: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    loggers = [RowLogger(), RowLogger()]
    runs = iter(loggers)

    def fit(path: Path, triage: Triage | None, holder: dict[str, nn.Module]) -> None:
        pl.seed_everything(0, verbose=False)
        holder["model"] = DirectLoggingNet()
        make_trainer(path, [triage] if triage else [], logger=next(runs), max_epochs=2,
                     log_every_n_steps=1).fit(holder["model"], blob_loader())

    holder: dict[str, nn.Module] = {}
    _force(mode, monkeypatch, holder)
    fit(tmp_path / "a", Triage(verbose=False, report_dir=tmp_path / "report"), holder)
    fit(tmp_path / "b", None, {})
    # the user's rows (the monitors add their own `triage/*` rows after the probes)
    with_triage, without = ([(step, row) for step, row in logger.rows
                             if not any(k.startswith("triage/") for k in row)]
                            for logger in loggers)
    assert len(with_triage) == len(without) == 16  # 8 direct rows, 8 `self.log` rows
    assert with_triage == without


# ----------------------------------------------------------------------------- user errors
class FailsAtStepZero(Net):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        raise ValueError("the user's own bug")


def test_user_exception_at_step_zero_is_raised_unchanged(tmp_path: Path) -> None:
    triage = Triage(verbose=False, report_dir=tmp_path / "report")
    with pytest.raises(ValueError, match="the user's own bug"):
        make_trainer(tmp_path, [triage]).fit(FailsAtStepZero(), blob_loader())
    found = _findings(triage)
    assert "triage.check_error" not in {f.code for f in found}
    skipped = {f.code: f.message for f in found if f.code in ("overfit.skipped",
                                                              "structure.probe_skipped")}
    assert set(skipped) == {"overfit.skipped", "structure.probe_skipped"}
    assert all("ValueError: the user's own bug" in m for m in skipped.values()), skipped


class FixedBatchNet(Net):
    """A hard-coded batch size: the probes' smaller batches fail in the user's code."""

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x.view(16, 8))


class LazyNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.LazyLinear(32), nn.ReLU(), nn.Linear(32, 4))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class ScriptedNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(torch.jit.script(nn.Linear(8, 32)), nn.ReLU(), nn.Linear(32, 4))


@pytest.mark.parametrize("make", [FixedBatchNet, LazyNet, ScriptedNet])
def test_unusual_models_get_no_check_error(tmp_path: Path, make: Any) -> None:
    _, _, triage = _compare(tmp_path, make, blob_loader)
    if make is FixedBatchNet:
        skipped = next(f for f in _findings(triage) if f.code == "overfit.skipped")
        assert "RuntimeError" in skipped.message and "shape" in skipped.message


# ----------------------------------------------------------------------------- the snapshot
def test_snapshot_attempts_every_restore_step(monkeypatch: pytest.MonkeyPatch) -> None:
    net = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    net.register_buffer("bank", torch.zeros(2))
    before = net[0].weight.clone()
    real = probing.snapshot._put_tensor

    def failing(obj: Tensor, data: Tensor) -> Tensor:
        if data.shape == (2,):
            raise RuntimeError("cannot restore the bank")
        return real(obj, data)

    monkeypatch.setattr(probing.snapshot, "_put_tensor", failing)
    state = torch.get_rng_state()
    def probe() -> None:
        with probing.isolated(net):
            net.eval()
            torch.rand(3)
            with torch.no_grad():
                net[0].weight.add_(1.0)

    with pytest.raises(RuntimeError, match="cannot restore the bank"):
        probe()
    assert torch.equal(net[0].weight, before)
    assert net.training and net[1].training
    assert torch.equal(torch.get_rng_state(), state)


def test_snapshot_restores_optimizer_into_the_same_groups() -> None:
    net = nn.Linear(3, 1)
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    net(torch.ones(2, 3)).sum().backward()
    opt.step()
    groups, group, state = opt.param_groups, opt.param_groups[0], opt.state
    exp_avg = opt.state[net.weight]["exp_avg"].clone()
    with probing.isolated(net, [opt]):
        opt.load_state_dict(torch.optim.Adam(net.parameters(), lr=5.0).state_dict())
        opt.step()
    assert opt.param_groups is groups and opt.param_groups[0] is group and opt.state is state
    assert group["lr"] == 0.1 and group["params"] == [net.weight, net.bias]
    assert torch.equal(opt.state[net.weight]["exp_avg"], exp_avg)


def test_copy_shares_the_trainer_and_drops_our_hooks(tmp_path: Path) -> None:
    seen: list[str] = []

    class Probe(pl.Callback):
        def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 batch: Any, batch_idx: int) -> None:
            if batch_idx:
                return
            ours = pl_module.body[0].register_forward_hook(probing._noop)
            theirs = pl_module.body[0].register_forward_hook(lambda *a: seen.append("user"))
            twin, (opt,) = probing.copy_module(trainer, pl_module, trainer.optimizers)
            seen.append(str(twin.trainer is trainer))
            seen.append(str(opt.param_groups[0]["params"][0] is twin.body[0].weight))
            hooks = twin.body[0]._forward_hooks.values()
            seen.append(str(probing._noop in hooks))
            ours.remove()
            theirs.remove()

    make_trainer(tmp_path, [Probe()], max_epochs=1, limit_train_batches=1).fit(Net(),
                                                                               blob_loader())
    assert seen == ["True", "True", "False"]


def test_in_place_probe_suspends_our_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    net = nn.Linear(3, 1)
    calls: list[str] = []

    def ours(*args: Any) -> None:
        calls.append("ours")

    def theirs(*args: Any) -> None:
        calls.append("theirs")

    ours.__module__ = "lightning_triage.callbacks.example"  # as if a triage check had set it
    net.register_forward_hook(ours)
    net.register_forward_hook(theirs)
    net.weight.register_post_accumulate_grad_hook(ours)
    monkeypatch.setattr(probing.isolation, "free_bytes", lambda device: 3 * probing.module_bytes(net))
    with probing.probe_module(None, net) as probe:
        assert probe.module is net and probe.how.startswith("in place")
        net(torch.ones(2, 3)).sum().backward()
    assert calls == ["theirs"]
    net(torch.ones(2, 3)).sum().backward()  # put back, in their order
    assert calls == ["theirs", "ours", "theirs", "ours"]


class NaNAtStepTwo(Net):
    """The loss turns NaN at step 2 (the tracer replays that step); counts its own calls."""

    def __init__(self) -> None:
        super().__init__()
        self.steps_seen = 0
        self.training_step_outputs: list[Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        self.steps_seen += 1
        loss = super().training_step(batch, batch_idx)
        if self.global_step == 2:
            loss = loss * float("nan")
        self.training_step_outputs.append(loss.detach())
        return loss


def test_nan_replay_leaves_user_state_alone(tmp_path: Path) -> None:
    def fit(path: Path, triage: Triage | None) -> NaNAtStepTwo:
        pl.seed_everything(0, verbose=False)
        model = NaNAtStepTwo()
        make_trainer(path, [triage] if triage else [], max_epochs=1).fit(model, blob_loader())
        return model

    triage = Triage(verbose=False, report_dir=tmp_path / "report", on_nonfinite="warn")
    with_triage, without = fit(tmp_path / "a", triage), fit(tmp_path / "b", None)
    assert "numerics.nonfinite_loss" in _problems(triage)
    tracer = next(c for c in collect_checks([triage]) if type(c).__name__ == "NonFiniteTracer")
    assert tracer.replay_calls >= 1 and "in replays" in tracer.detail
    assert with_triage.steps_seen == without.steps_seen == 4
    assert len(with_triage.training_step_outputs) == 4
    for a, b in zip(with_triage.state_dict().values(), without.state_dict().values(), strict=True):
        assert torch.equal(a.nan_to_num(1e9), b.nan_to_num(1e9))


def test_probes_skip_when_neither_copy_nor_snapshot_fits(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probing.isolation, "free_bytes", lambda device: 1024)  # 1 KiB free
    _, _, triage = _compare(tmp_path, Net, blob_loader)
    skipped = {f.code: f.message for f in _findings(triage)
               if f.code in ("overfit.skipped", "structure.probe_skipped")}
    assert set(skipped) == {"overfit.skipped", "structure.probe_skipped"}
    assert all("fit neither a copy nor a snapshot" in m for m in skipped.values()), skipped
