from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn

from lightning_triage import PaddingProbe, Triage
from tests.callbacks.padding_models import (
    CausalLM,
    EncoderClassifier,
    LSTMClassifier,
    PaddedClassifier,
    dict_loader,
    lm_loader,
)
from tests.helpers import codes, loader, make_trainer


def _fit(tmp_path: Path, model: pl.LightningModule, data: Any, **probe_args: Any) -> PaddingProbe:
    pl.seed_everything(0, verbose=False)
    probe = PaddingProbe(strict=True, **probe_args)
    make_trainer(tmp_path, [probe], limit_train_batches=2).fit(model, data)
    return probe


@pytest.mark.parametrize("mask_name", ["attention_mask", "key_padding_mask"])
def test_classifier_that_ignores_the_mask_is_caught_at_its_attention(tmp_path: Path,
                                                                      mask_name: str) -> None:
    probe = _fit(tmp_path, PaddedClassifier(use_mask=False, mask_name=mask_name),
                 dict_loader(mask_name=mask_name))
    assert codes(probe.findings) == {"structure.padding_leak"}
    finding = probe.findings[0]
    assert finding.layer == "block.attn"
    assert finding.severity == "warning" and finding.global_step == 0
    kinds = {p["perturbation"] for p in finding.evidence["perturbations"]}
    assert kinds == {"content", "amount"}
    assert all(p["relative_diff"] > 1e-2 for p in finding.evidence["perturbations"])
    assert finding.evidence["mask"] == f"batch['{mask_name}']"
    assert "`block.attn`" in finding.message
    assert probe.check_status()["status"] == "failed"


@pytest.mark.parametrize("mask_name", ["attention_mask", "key_padding_mask"])
def test_classifier_that_applies_the_mask_is_silent(tmp_path: Path, mask_name: str) -> None:
    probe = _fit(tmp_path, PaddedClassifier(use_mask=True, mask_name=mask_name),
                 dict_loader(mask_name=mask_name))
    assert probe.findings == []
    status = probe.check_status()
    assert status["status"] == "passed" and "no leak" in status["detail"]
    assert probe.results["forward_passes"] == 4  # twice as is, other content, more padding


@pytest.mark.parametrize(("make", "layer"), [
    (lambda: EncoderClassifier(use_mask=False), "enc.layers.0.self_attn"),
    (lambda: EncoderClassifier(use_mask=True), None),
    (lambda: EncoderClassifier(use_mask=True, token_level=True), None),
    (lambda: LSTMClassifier(use_mask=False), "rnn"),
    (lambda: LSTMClassifier(use_mask=True), None),
], ids=["encoder_no_mask", "encoder_mask", "encoder_mask_tokens", "lstm_padded", "lstm_packed"])
def test_torch_encoders_and_packed_rnns(tmp_path: Path, make: Any, layer: str | None) -> None:
    probe = _fit(tmp_path, make(), dict_loader())
    if layer is None:  # nn.TransformerEncoder's nested-tensor fast path, packed sequences
        assert probe.findings == [] and probe.check_status()["status"] == "passed"
    else:
        assert codes(probe.findings) == {"structure.padding_leak"}
        assert probe.findings[0].layer == layer


def test_left_padded_causal_lm_that_ignores_the_padding_is_caught(tmp_path: Path) -> None:
    probe = _fit(tmp_path, CausalLM(use_mask=False), lm_loader("left"))
    assert codes(probe.findings) == {"structure.padding_leak"}
    finding = probe.findings[0]
    assert finding.layer == "block.attn"
    assert finding.evidence["side"] == "left"
    assert "ignore_index" in finding.evidence["mask"]


def test_right_padded_causal_lm_is_silent_the_causal_mask_hides_the_pads(tmp_path: Path) -> None:
    probe = _fit(tmp_path, CausalLM(use_mask=False), lm_loader("right"))
    assert probe.findings == []
    assert probe.check_status()["status"] == "passed"
    assert probe.results["side"] == "right"


def test_left_padded_causal_lm_that_masks_the_pads_is_silent(tmp_path: Path) -> None:
    probe = _fit(tmp_path, CausalLM(use_mask=True), lm_loader("left"))
    assert probe.findings == []
    assert probe.check_status()["status"] == "passed"


def test_no_mask_the_probe_does_not_run_and_says_why(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    data = loader(torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g),
                  batch_size=16)

    class MLP(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 3)

        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    probe = _fit(tmp_path, MLP(), data)
    assert probe.findings == []
    status = probe.check_status()
    assert status["status"] == "skipped"
    assert "no padding mask" in status["detail"]


def test_masks_with_other_names(tmp_path: Path) -> None:
    probe = _fit(tmp_path / "a", PaddedClassifier(use_mask=False, mask_name="keep"),
                 dict_loader(mask_name="keep"))  # found by its padding pattern
    assert codes(probe.findings) == {"structure.padding_leak"}
    probe = _fit(tmp_path / "b", PaddedClassifier(use_mask=False, mask_name="keep"),
                 dict_loader(mask_name="keep"), padding_mask_key="keep")
    assert codes(probe.findings) == {"structure.padding_leak"}
    probe = _fit(tmp_path / "c", PaddedClassifier(use_mask=True, mask_name="keep"),
                 dict_loader(mask_name="keep"), padding_mask_key="keep")
    assert probe.findings == [] and probe.ran


def test_a_nondeterministic_model_is_skipped_with_an_info_finding(tmp_path: Path) -> None:
    class Drifting(PaddedClassifier):
        """Its output moves with a counter kept on the class, which a copy of the module
        shares (state out of the probe's reach): two runs differ. ``self.calls`` counts the
        live module's own calls."""

        drift = 0

        def __init__(self) -> None:
            super().__init__(use_mask=True)
            self.calls = 0

        def forward(self, ids: Tensor, pad: Tensor) -> Tensor:
            self.calls += 1
            type(self).drift += 1
            return super().forward(ids, pad) + 0.1 * type(self).drift

    model = Drifting()
    probe = _fit(tmp_path, model, dict_loader())
    assert codes(probe.findings) == {"structure.probe_skipped"}
    assert probe.findings[0].severity == "info"
    assert "different outputs for the same batch" in probe.findings[0].message
    assert model.calls == 2  # the live module ran its two training steps only: the probe used a copy


def test_the_live_module_and_the_batch_are_untouched(tmp_path: Path) -> None:
    pl.seed_everything(0, verbose=False)
    model = PaddedClassifier(use_mask=False)
    seen: list[dict[str, Tensor]] = []

    class Keep(pl.Callback):
        def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 batch: Any, batch_idx: int) -> None:
            seen.append({k: v.clone() for k, v in batch.items()})

        def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                               outputs: Any, batch: Any, batch_idx: int) -> None:
            for k, v in batch.items():
                assert torch.equal(v, seen[-1][k]), k
            assert pl_module.training

    probe = PaddingProbe(strict=True)
    make_trainer(tmp_path, [probe, Keep()], limit_train_batches=2).fit(model, dict_loader())
    assert probe.has_finding("structure.padding_leak") and len(seen) == 2


def _weights_after(tmp_path: Path, callbacks: list[Any], make: Any, data: Any) -> dict[str, Tensor]:
    pl.seed_everything(0, verbose=False)
    model = make()
    make_trainer(tmp_path, callbacks, limit_train_batches=4, max_epochs=2).fit(model, data)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("which", ["classifier", "lm_left"])
def test_zero_interference(tmp_path: Path, which: str) -> None:
    if which == "classifier":
        def make() -> pl.LightningModule:
            return PaddedClassifier(use_mask=False)

        def data() -> Any:
            return dict_loader()
    else:
        def make() -> pl.LightningModule:
            return CausalLM(use_mask=False)

        def data() -> Any:
            return lm_loader("left")
    probe = PaddingProbe(strict=True)
    with_probe = _weights_after(tmp_path / "a", [probe], make, data())
    without = _weights_after(tmp_path / "b", [], make, data())
    assert probe.has_finding("structure.padding_leak")
    assert with_probe.keys() == without.keys()
    for key in without:
        assert torch.equal(with_probe[key], without[key]), key


def test_triage_bundle_runs_the_padding_probe(tmp_path: Path) -> None:
    triage = Triage(strict=True, verbose=False, report_dir=tmp_path, overfit=False)
    pl.seed_everything(0, verbose=False)
    make_trainer(tmp_path, [triage], limit_train_batches=2).fit(PaddedClassifier(use_mask=False),
                                                                dict_loader())
    report = triage.report.report
    assert report is not None
    assert "structure.padding_leak" in codes(report)
    check = next(c for c in report["checks"] if c["check"] == "PaddingProbe")
    assert check["status"] == "failed" and "ms" in check["detail"]
    assert isinstance(triage.check("PaddingProbe"), PaddingProbe)
    assert Triage(padding_mask_key="m").check("PaddingProbe").padding_mask_key == "m"  # type: ignore[attr-defined]


def test_state_round_trip_and_argument_validation() -> None:
    probe = PaddingProbe()
    probe.results = {"status": "ok", "mask": "batch['attention_mask']"}
    restored = PaddingProbe()
    restored.load_state_dict(pickle.loads(pickle.dumps(probe.state_dict())))
    assert restored.results == probe.results
    with pytest.raises(ValueError, match="`padding_mask_key`"):
        PaddingProbe(padding_mask_key=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`max_examples`"):
        PaddingProbe(max_examples=0)
    with pytest.raises(ValueError, match="`tolerance`"):
        PaddingProbe(tolerance=2.0)
    with pytest.raises(ValueError, match="`forward_fn`"):
        PaddingProbe(forward_fn=3)  # type: ignore[arg-type]


def test_a_module_that_cannot_be_copied_is_probed_in_place_and_restored(tmp_path: Path) -> None:
    import threading

    pl.seed_everything(0, verbose=False)
    model = PaddedClassifier(use_mask=False)
    lock = threading.Lock()  # not deep-copyable
    model.lock = lock
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probe = PaddingProbe(strict=True)
    make_trainer(tmp_path, [probe], limit_train_batches=1, max_epochs=1).fit(
        model, dict_loader())
    assert str(probe.results["isolation"]).startswith("in place: the module could not be copied")
    assert probe.has_finding("structure.padding_leak")
    assert model.lock is lock
    pl.seed_everything(0, verbose=False)
    bare = PaddedClassifier(use_mask=False)
    assert all(torch.equal(before[k], v) for k, v in bare.state_dict().items())
    make_trainer(tmp_path / "bare", [], limit_train_batches=1, max_epochs=1).fit(
        bare, dict_loader())
    for key, value in bare.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


class TupleClassifier(PaddedClassifier):
    """Batches ``(input_ids, attention_mask, labels)``."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:  # type: ignore[override]
        ids, mask, labels = batch
        return torch.nn.functional.cross_entropy(self(ids, mask == 0), labels)


@pytest.mark.parametrize("use_mask", [False, True])
def test_tuple_batches_with_an_unnamed_mask(tmp_path: Path, use_mask: bool) -> None:
    data = dict_loader().dataset
    tuples = loader(data.ids, data.mask, data.labels, batch_size=16)
    probe = _fit(tmp_path, TupleClassifier(use_mask=use_mask), tuples)
    assert probe.results["mask"] == "batch[1]"
    assert codes(probe.findings) == (set() if use_mask else {"structure.padding_leak"})


class RankPadding(torch.utils.data.Dataset):
    """Right-padded token batches on rank 0; on rank 1 the mask marks position 1 of every row
    as padding (no padded end: no amount-of-padding pass there)."""

    def __init__(self) -> None:
        self.base = dict_loader().dataset

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        item = dict(self.base[i])
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        if rank == 1:
            mask = torch.ones_like(item["attention_mask"])
            mask[1] = 0
            item["attention_mask"] = mask
        return item


class GatheringClassifier(PaddedClassifier):
    """Holds a collective in `training_step`: every rank must run the same probe passes."""

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        self.all_gather(loss.detach())
        return loss


@pytest.mark.timeout(180)
def test_ddp_ranks_run_the_same_passes(tmp_path: Path) -> None:
    """The copy's `training_step` holds a collective; rank 1 cannot run the more-padding pass,
    so rank 0 skips it too, and nothing hangs."""
    from torch.utils.data import DataLoader

    from tests.helpers import fit_ddp_spawn

    train = DataLoader(RankPadding(), batch_size=8)
    triage = Triage(report_dir=tmp_path, strict=True, verbose=False, overfit=False,
                    padding_mask_key="attention_mask")
    fit_ddp_spawn(lambda: make_trainer(tmp_path, [triage], strategy="ddp_spawn", devices=2,
                                       limit_train_batches=2, use_distributed_sampler=True),
                  GatheringClassifier(use_mask=False), train)
    report = json.loads((tmp_path / "triage_report.json").read_text())
    leaks = {f["rank"]: f for f in report["findings"] if f["code"] == "structure.padding_leak"}
    assert sorted(leaks) == [0, 1]
    for f in leaks.values():
        assert [p["perturbation"] for p in f["evidence"]["perturbations"]] == ["content"]
    assert leaks[0]["evidence"]["side"] == "right" and leaks[1]["evidence"]["side"] is None


def test_an_unknown_maximum_length_on_an_accelerator_allows_no_longer_pass() -> None:
    """Off the CPU an index past a position table is a device-side assert (the process loses
    the device), not an exception: without a declared maximum length the longer pass is off."""
    room = PaddingProbe._room
    assert room(nn.Linear(2, 2), torch.zeros(2, 5)) == (None, "")  # type: ignore[arg-type]
    assert room(nn.Linear(2, 2), torch.zeros(2, 5, device="meta"))[0] == 0  # type: ignore[arg-type]
    declared = nn.Linear(2, 2)
    declared.max_seq_len = 8  # type: ignore[assignment]
    assert room(declared, torch.zeros(2, 5, device="meta")) == (  # type: ignore[arg-type]
        3, "the model takes at most 8 positions")
