"""StructureProbe on real `Trainer.fit` runs: each structure bug caught, healthy models silent."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path
from typing import Any, NamedTuple

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader

from lightning_triage import StructureProbe, Triage
from tests.callbacks.structure_models import (
    CNN,
    MLP,
    DecoderLM,
    DictClassifier,
    DictDataset,
    Seq2Seq,
    V,
    next_token_loader,
    pair_loader,
)
from tests.helpers import codes, fit_ddp_spawn, loader, make_trainer, seeds, stage_codes

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


def fit(tmp_path: Path, model: pl.LightningModule, train: DataLoader, probe: StructureProbe | None = None,
        seed: int = 0, **kwargs: Any) -> StructureProbe:
    probe = probe if probe is not None else StructureProbe(strict=True)
    pl.seed_everything(seed, verbose=False)
    kwargs.setdefault("limit_train_batches", 2)
    make_trainer(tmp_path, [probe], **kwargs).fit(model, train)
    return probe


def classification(n: int = 64, n_in: int = 8, classes: int = 4) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return loader(torch.randn(n, n_in, generator=g), torch.randint(0, classes, (n,), generator=g),
                  batch_size=16)


def regression(n: int = 64) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return loader(torch.randn(n, 8, generator=g), torch.randn(n, generator=g), batch_size=16)


def the(probe: StructureProbe, code: str) -> Any:
    found = [f for f in probe.findings if f.code == code]
    assert len(found) == 1, [f.code for f in probe.findings]
    return found[0]


def assert_silent(probe: StructureProbe) -> None:
    assert stage_codes(probe.findings, "structure") == set(), [f.message for f in probe.findings]
    status = probe.check_status()
    assert status["status"] == "passed", status
    assert "ms" in status["detail"]


# ----------------------------------------------------------------------------- batch mixing
def test_log_softmax_over_batch_dim_is_batch_mixing(tmp_path: Path) -> None:
    probe = fit(tmp_path, MLP(softmax_dim=0), classification())
    finding = the(probe, "structure.batch_mixing")
    assert finding.severity == "error"
    assert "nll_loss" in finding.message
    assert "`training_step` code after the model" in finding.message
    assert finding.layer is None
    assert finding.evidence["other_grad_norm"] > 0.01 * finding.evidence["own_grad_norm"]
    assert probe.check_status()["status"] == "failed"


class SoftmaxInForward(MLP):
    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        return torch.log_softmax(self.net(x), dim=0)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.nll_loss(self(x), y)


def test_log_softmax_over_batch_dim_inside_forward(tmp_path: Path) -> None:
    probe = fit(tmp_path, SoftmaxInForward(), classification())
    finding = the(probe, "structure.batch_mixing")
    assert "`SoftmaxInForward.forward` itself" in finding.message
    assert finding.evidence["first_module"] == ""


@pytest.mark.parametrize("make", [MLP, CNN, lambda: MLP(dropout=0.3)], ids=["mlp", "cnn_bn", "mlp_dropout"])
def test_healthy_classifiers_are_silent(tmp_path: Path, make: Any) -> None:
    model = make()
    train = classification()
    if isinstance(model, CNN):
        g = torch.Generator().manual_seed(0)
        train = loader(torch.randn(64, 1, 8, 8, generator=g), torch.randint(0, 3, (64,), generator=g),
                       batch_size=16)
    probe = fit(tmp_path, model, train)
    assert_silent(probe)
    assert probe.results["batch_mixing"] == "ok"
    assert probe.results["target_leak"] == "ok"


def test_dict_batch_with_string_ids_and_loss_modules_is_silent(tmp_path: Path) -> None:
    probe = fit(tmp_path, DictClassifier(), DataLoader(DictDataset(), batch_size=16))
    assert_silent(probe)
    assert probe.results["head"]["module"] == "classifier"
    assert probe.results["target_leak"] == "ok"


# ----------------------------------------------------------------------------- causal leak
def test_future_mask_with_causal_true_is_causal_leak(tmp_path: Path) -> None:
    probe = fit(tmp_path, DecoderLM(mask="future"), next_token_loader(),
                StructureProbe(causal=True, strict=True))
    finding = the(probe, "structure.causal_leak")
    assert finding.evidence["reason"] == "`causal=True`"
    assert finding.evidence["position"] == 0
    assert finding.evidence["future_positions"] == list(range(1, 8))
    assert "tok" in finding.evidence["probe_input"]
    assert finding.layer == "blocks.layers.0.self_attn"  # the first module that sees the future


@pytest.mark.parametrize("seed", seeds())
def test_correct_causal_lm_without_argument_is_probed_and_silent(tmp_path: Path, seed: int) -> None:
    """The honest control of the leak tests: same data, same budget, loss stays at ln V."""
    pl.seed_everything(seed, verbose=False)
    model = DecoderLM(mask="causal", lr=1e-2)
    probe = fit(tmp_path, model, next_token_loader(n=2048, batch_size=32), limit_train_batches=64,
                seed=seed)
    assert_silent(probe)
    assert probe.results["causal"].startswith("ok (next-token data")
    print("causal control", seed, sum(model.losses[-16:]) / 16 / math.log(V))
    assert sum(model.losses[-16:]) / 16 > 0.95 * math.log(V)


@pytest.mark.parametrize("seed", seeds())
def test_encoder_attending_to_future_caught_from_next_token_data(tmp_path: Path, seed: int) -> None:
    """No `causal` argument: the data is next-token, so the probe runs and finds the encoder's
    view of the future; trained on pure random tokens the leak drives the loss far below ln V."""
    pl.seed_everything(seed, verbose=False)
    probe = StructureProbe(strict=True)
    model = Seq2Seq(decoder_input="shifted", lr=1e-2)
    fit(tmp_path, model, next_token_loader(n=2048, batch_size=32), probe, limit_train_batches=64,
        seed=seed)
    print("encoder future", seed, sum(model.losses[-16:]) / 16 / math.log(V))
    finding = the(probe, "structure.causal_leak")
    assert "next-token data" in finding.evidence["reason"]
    assert finding.evidence["future_positions"][0] == finding.evidence["position"] + 1
    assert finding.layer == "transformer.encoder.layers.0.self_attn"
    assert "structure.target_leak" not in codes(probe.findings)  # decoder input is shifted
    assert sum(model.losses[-16:]) / 16 < 0.5 * math.log(V)


def test_causal_false_disables_the_auto_probe(tmp_path: Path) -> None:
    probe = fit(tmp_path, DecoderLM(mask="future"), next_token_loader(),
                StructureProbe(causal=False, strict=True))
    assert "causal" not in probe.results
    assert stage_codes(probe.findings, "structure") == set()


# ----------------------------------------------------------------------------- target leak
@pytest.mark.parametrize("seed", seeds())
def test_decoder_fed_unshifted_targets_is_target_leak(tmp_path: Path, seed: int) -> None:
    pl.seed_everything(seed, verbose=False)
    probe = StructureProbe(strict=True)
    model = Seq2Seq(decoder_input="targets", lr=1e-2)
    fit(tmp_path, model, pair_loader("random", n=2048, batch_size=32), probe, limit_train_batches=64,
        seed=seed)
    print("target leak", seed, sum(model.losses[-16:]) / 16 / math.log(V))
    finding = the(probe, "structure.target_leak")
    assert finding.evidence["compared"].startswith("positions 0..0")
    assert finding.evidence["max_abs_diff"] > 1e-3
    assert "Seq2Seq" in finding.message
    # inputs and targets are independent random tokens: only the leak explains this loss
    assert sum(model.losses[-16:]) / 16 < 0.25 * math.log(V)


def test_teacher_forcing_with_shifted_targets_is_silent(tmp_path: Path) -> None:
    probe = fit(tmp_path, Seq2Seq(decoder_input="shifted"), pair_loader("reverse"))
    assert_silent(probe)
    assert probe.results["target_leak"] == "ok"
    assert "causal" not in probe.results  # reversed targets are not next-token data


def test_label_as_feature_is_target_leak(tmp_path: Path) -> None:
    probe = fit(tmp_path, MLP(label_feature=True), classification())
    finding = the(probe, "structure.target_leak")
    assert finding.evidence["compared"] == "all"
    assert finding.evidence["fraction_changed"] > 0.1


# ----------------------------------------------------------------------------- shapes
def test_mse_between_n1_and_n_is_shape_mismatch(tmp_path: Path) -> None:
    probe = fit(tmp_path, MLP(regression=True, squeeze=False), regression())
    finding = the(probe, "structure.shape_mismatch")
    assert finding.evidence["prediction_shape"] == [16, 1]
    assert finding.evidence["target_shape"] == [16]
    assert finding.evidence["broadcast_shape"] == [16, 16]
    warned = finding.evidence["framework_warnings"]
    assert warned
    assert "target size" in warned[0]["message"]


class ManualMSE(MLP):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return ((self(x) - y.float()) ** 2).mean()  # (N, 1) - (N,) -> (N, N), no warning


def test_hand_written_broadcast_is_shape_mismatch(tmp_path: Path) -> None:
    probe = fit(tmp_path, ManualMSE(regression=True), regression())
    finding = the(probe, "structure.shape_mismatch")
    assert finding.evidence["framework_warnings"] == []
    assert finding.evidence["broadcast_shape"] == [16, 16]


def test_healthy_regressor_is_silent(tmp_path: Path) -> None:
    assert_silent(fit(tmp_path, MLP(regression=True), regression()))


# ----------------------------------------------------------------------------- forward discovery
class Manual(MLP):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        opt = self.optimizers()
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss


def test_manual_optimization_skips_with_info_or_uses_forward_fn(tmp_path: Path) -> None:
    probe = fit(tmp_path, Manual(), classification())
    skipped = the(probe, "structure.probe_skipped")
    assert skipped.severity == "info"
    assert "forward_fn" in skipped.message
    assert probe.detail.startswith("skipped:")
    assert probe.check_status()["status"] == "skipped"  # the status agrees with the detail

    probe = fit(tmp_path, Manual(), classification(),
                StructureProbe(forward_fn=lambda module, batch: module(batch[0]), strict=True))
    assert_silent(probe)
    assert probe.results["batch_mixing"] == "ok"


def test_shape_trace_is_json_and_survives_checkpoint_state(tmp_path: Path) -> None:
    probe = fit(tmp_path, DecoderLM(), next_token_loader())
    trace = probe.shape_trace
    assert trace[0]["module"] == "tok"
    assert trace[0]["outputs"][0]["shape"] == [16, 8, 32]
    assert any(e["module"] == "head" and e["outputs"][0]["shape"] == [16, 8, V] for e in trace)
    json.dumps(probe.state_dict())
    restored = StructureProbe()
    restored.load_state_dict(pickle.loads(pickle.dumps(probe.state_dict())))
    assert restored.shape_trace == trace
    assert restored.results == probe.results


# ----------------------------------------------------------------------------- zero interference
def _weights_after(tmp_path: Path, callbacks: list[Any], make: Any, train: DataLoader) -> dict[str, Tensor]:
    pl.seed_everything(0, verbose=False)
    model = make()
    make_trainer(tmp_path, callbacks, limit_train_batches=4, max_epochs=2).fit(model, train)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("which", ["mlp_dropout", "cnn_bn", "seq2seq"])
def test_zero_interference(tmp_path: Path, which: str) -> None:
    if which == "cnn_bn":
        def make() -> pl.LightningModule:
            return CNN()

        def data() -> DataLoader:
            g = torch.Generator().manual_seed(0)
            return loader(torch.randn(64, 1, 8, 8, generator=g), torch.randint(0, 3, (64,), generator=g),
                          batch_size=16, shuffle=True)
    elif which == "mlp_dropout":
        def make() -> pl.LightningModule:
            return MLP(dropout=0.5)

        def data() -> DataLoader:
            g = torch.Generator().manual_seed(0)
            return loader(torch.randn(64, 8, generator=g), torch.randint(0, 4, (64,), generator=g),
                          batch_size=16, shuffle=True)
    else:
        def make() -> pl.LightningModule:
            return Seq2Seq(decoder_input="targets")

        def data() -> DataLoader:
            return pair_loader("random")
    probe = StructureProbe(strict=True)
    with_probe = _weights_after(tmp_path / "a", [probe], make, data())
    without = _weights_after(tmp_path / "b", [], make, data())
    assert probe.ran
    # a leak is confirmed by a determinism control (the same batch once more)
    assert probe.results["forward_passes"] == (4 if which == "seq2seq" else 3)
    assert with_probe.keys() == without.keys()
    for key in without:
        assert torch.equal(with_probe[key], without[key]), key


# ----------------------------------------------------------------------------- bundle
def test_triage_bundle_runs_the_probe_with_its_causal_flag(tmp_path: Path) -> None:
    triage = Triage(causal=True, strict=True, verbose=False, report_dir=tmp_path)
    pl.seed_everything(0, verbose=False)
    make_trainer(tmp_path, [triage], limit_train_batches=2).fit(DecoderLM(mask="future"), next_token_loader())
    report = triage.report.report
    assert report is not None
    assert "structure.causal_leak" in codes(report)
    check = next(c for c in report["checks"] if c["check"] == "StructureProbe")
    assert check["status"] == "failed"
    assert "ms" in check["detail"]
    assert isinstance(triage.check("StructureProbe"), StructureProbe)


def test_argument_validation() -> None:
    with pytest.raises(ValueError, match="`max_examples`"):
        StructureProbe(max_examples=1)
    with pytest.raises(ValueError, match="`causal`"):
        StructureProbe(causal="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`forward_fn`"):
        StructureProbe(forward_fn=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`tolerance`"):
        StructureProbe(tolerance=0.0)


# ----------------------------------------------------------------------------- robustness
class FixedBatch(MLP):
    """Code that only works with the loader's batch size (the probe uses at most 16 examples)."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x.view(32, 8)), y)


def test_model_error_in_probe_is_info_and_run_goes_on(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    train = loader(torch.randn(64, 8, generator=g), torch.randint(0, 4, (64,), generator=g), batch_size=32)
    model = FixedBatch()
    probe = fit(tmp_path, model, train, StructureProbe(strict=False))
    skipped = the(probe, "structure.probe_skipped")
    assert "RuntimeError" in skipped.message
    assert "max_examples" in skipped.message
    assert len(model.losses) == 2  # training went on
    assert probe.check_status()["status"] == "skipped"  # the status agrees with the detail
    probe = fit(tmp_path, FixedBatch(), train, StructureProbe(max_examples=32, strict=True))
    assert_silent(probe)


@pytest.mark.parametrize("mask", ["causal", "future"])
def test_under_bf16_mixed_precision(tmp_path: Path, mask: str) -> None:
    probe = fit(tmp_path, DecoderLM(mask=mask), next_token_loader(), precision="bf16-mixed")
    if mask == "causal":
        assert_silent(probe)
    else:
        assert the(probe, "structure.causal_leak").evidence["position"] == 0


# ----------------------------------------------------------------------------- multi-input designs
class SimCLR(MLP):
    """In-batch negatives: each view is scored against every other one by design."""

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        z = F.normalize(self.net(x), dim=1)
        return z @ z.T / 0.5 - 1e4 * torch.eye(x.shape[0])

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        (x,) = batch
        n = x.shape[0] // 2
        partner = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
        return F.cross_entropy(self(x), partner)


def test_pairwise_scores_with_in_batch_negatives_are_not_batch_mixing(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    probe = fit(tmp_path, SimCLR(), loader(torch.randn(64, 8, generator=g), batch_size=16))
    said = the(probe, "structure.batch_mixing")  # said at info: coupled on purpose
    assert said.severity == "info" and said.evidence["by_design"] is True
    assert said.evidence["score_matrix"] == "the output of `SimCLR`"
    assert probe.check_status()["status"] == "passed"
    assert probe.results["batch_mixing"].startswith("ok: the output of `SimCLR` is an example-by-example")


class Siamese(MLP):
    """Batches `(x1, x2, same)`: the second tensor is an input, not the targets."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x1, x2, same = batch
        distance = (self.net(x1) - self.net(x2)).pow(2).sum(1)
        return F.binary_cross_entropy_with_logits(1.0 - distance, same)


def test_second_input_tensor_is_not_mistaken_for_targets(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    train = loader(torch.randn(64, 8, generator=g), torch.randn(64, 8, generator=g),
                   torch.randint(0, 2, (64,), generator=g).float(), batch_size=16)
    probe = fit(tmp_path, Siamese(), train)
    assert_silent(probe)
    assert probe.results["target_leak"].startswith("skipped: the batch tensor taken as targets")


def test_time_budget_skips_the_costly_runs(tmp_path: Path) -> None:
    probe = fit(tmp_path, MLP(label_feature=True), classification(),
                StructureProbe(time_budget=1e-9, strict=True))
    skipped = the(probe, "structure.probe_skipped")
    assert "time_budget" in skipped.message
    assert probe.results["forward_passes"] == 1
    assert "target_leak" not in probe.results
    with pytest.raises(ValueError, match="`time_budget`"):
        StructureProbe(time_budget=0)


class Mixup(MLP):
    """Mixes examples on purpose in `training_step`, before the model."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        perm = torch.randperm(x.shape[0])
        logp = torch.log_softmax(self(0.7 * x + 0.3 * x[perm]), dim=1)
        return 0.7 * F.nll_loss(logp, y) + 0.3 * F.nll_loss(logp, y[perm])


def test_mixup_before_the_model_is_not_batch_mixing(tmp_path: Path) -> None:
    probe = fit(tmp_path, Mixup(), classification())
    assert_silent(probe)
    assert probe.results["probe_input"].startswith("the input of `Mixup`")
    assert probe.results["target_leak"] == "ok"


def test_gradient_accumulation_healthy_lm_is_silent(tmp_path: Path) -> None:
    probe = fit(tmp_path, DecoderLM(), next_token_loader(), accumulate_grad_batches=2, limit_train_batches=4)
    assert_silent(probe)
    assert probe.results["causal"].startswith("ok")


class Pair(NamedTuple):
    features: Tensor
    target: Tensor


class PairDataset(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(64, 8, generator=g), torch.randn(64, generator=g)

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> Pair:
        return Pair(self.x[i], self.y[i])


class PairRegressor(MLP):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return F.mse_loss(self(batch.features).squeeze(-1), batch.target)


def test_namedtuple_batches_are_probed_and_silent(tmp_path: Path) -> None:
    probe = fit(tmp_path, PairRegressor(regression=True), DataLoader(PairDataset(), batch_size=16))
    assert_silent(probe)
    assert probe.results["target_leak"] == "ok"
    assert probe.results["batch_mixing"] == "ok"


def test_triage_default_is_automatic_causality() -> None:
    assert Triage().check("StructureProbe").causal is None  # type: ignore[attr-defined]
    assert Triage(causal=True).check("StructureProbe").causal is True  # type: ignore[attr-defined]


class OneHotLM(DecoderLM):
    """Tokens turned into floats by code (no embedding module): the probe differentiates w.r.t.
    the input of the first module called on floats."""

    def __init__(self, mask: str) -> None:
        super().__init__(mask=mask)
        self.proj = torch.nn.Linear(V, 32)

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[1]
        full = torch.full((t, t), float("-inf"))
        mask = torch.triu(full, 1) if self.mask == "causal" else torch.tril(full, -1)
        h = self.proj(F.one_hot(x, V).float()) + self.pos(torch.arange(t))
        return self.head(self.blocks(h, mask=mask))


@pytest.mark.parametrize("mask", ["causal", "future"])
def test_one_hot_tokens_without_embedding_module(tmp_path: Path, mask: str) -> None:
    probe = fit(tmp_path, OneHotLM(mask), next_token_loader())
    assert probe.results["probe_input"].startswith("the input of `proj`")
    if mask == "causal":
        assert_silent(probe)
    else:
        assert the(probe, "structure.causal_leak").layer == "blocks.layers.0.self_attn"


# ----------------------------------------------------------------------------- DDP
class Gathering(MLP):
    """Holds a collective in `training_step`: every rank must run the same probe passes."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.all_gather(loss.detach())
        return loss


class RankTargets(torch.utils.data.Dataset):
    """Random targets on rank 0, all equal (nothing to redraw) on rank 1."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(64, 8, generator=g), torch.randint(0, 4, (64,), generator=g)

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        return self.x[i], self.y[i] if rank == 0 else torch.tensor(2)


@pytest.mark.timeout(180)
def test_ddp_ranks_take_the_same_passes(tmp_path: Path) -> None:
    """Rank 1 sees all-equal targets (nothing to redraw), rank 0 does not: the target-leak pass
    is skipped on both, the gradient pass runs on both, and nothing hangs."""
    train = DataLoader(RankTargets(), batch_size=16)
    fit_ddp_spawn(lambda: make_trainer(
        tmp_path, [Triage(report_dir=tmp_path, strict=True, verbose=False)], strategy="ddp_spawn",
        devices=2, limit_train_batches=2, use_distributed_sampler=True), Gathering(), train)
    report = json.loads((tmp_path / "triage_report.json").read_text())
    check = next(c for c in report["checks"] if c["check"] == "StructureProbe")
    assert check["status"] == "passed", check
    assert "target_leak skipped: another rank could not run it" in check["detail"]
    assert "batch_mixing ok" in check["detail"]
    assert not [f for f in report["findings"] if f["code"].startswith("structure.")]
