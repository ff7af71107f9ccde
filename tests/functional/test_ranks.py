"""The rank rules of the functional core: data partition and reshuffling
(``functional/data/ranks.py``) and replica checksums (``functional/replicas.py``), without a
Trainer or a process group (the DDP fits are in ``tests/callbacks/test_ranks_ddp.py``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from lightning_triage.functional.data.ranks import (
    RankBatches,
    SamplerInfo,
    describe_samplers,
    partition_rule,
    reshuffle_rule,
)
from lightning_triage.functional.replicas import (
    checksums,
    differing,
    replica_entries,
    replicas_rule,
)

DATA = TensorDataset(torch.arange(64.0).reshape(32, 2))


def _ranks(*shards: list[int], samplers: list[list[SamplerInfo]] | None = None) -> list[RankBatches]:
    return [RankBatches(r, [shard[i:i + 4] for i in range(0, len(shard), 4)],
                        samplers[r] if samplers else [])
            for r, shard in enumerate(shards)]


def test_disjoint_shards_are_silent_and_shared_ones_are_named() -> None:
    assert partition_rule("dl", _ranks(list(range(16)), list(range(16, 32)))) is None
    same = partition_rule("dl", _ranks(list(range(16)), list(range(16))))
    assert same is not None and same.code == "data.ranks_same_data" and same.evidence["same_order"]
    shuffled = partition_rule("dl", _ranks(list(range(16)), list(range(16))[::-1]))
    assert shuffled is not None and not shuffled.evidence["same_order"]
    half = partition_rule("dl", _ranks(list(range(16)), list(range(8, 24))))
    assert half is not None and half.code == "data.ranks_overlap"
    assert half.evidence["overlapping"] == 16 and half.evidence["fraction"] == 0.5


def test_overlap_the_dataset_own_duplicates_explain_is_silent() -> None:
    # each rank's batches repeat their own examples as often as they meet the other rank's
    a = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]
    b = [100, 100, 101, 101, 102, 102, 103, 103, 104, 104, 105, 105, 106, 106, 0, 1]
    assert partition_rule("dl", _ranks(a, b)) is None
    constant = [7] * 16  # one repeated example on both ranks: nothing to compare
    assert partition_rule("dl", _ranks(constant, constant)) is None


def test_sampler_seeds_that_differ_by_rank_are_the_named_cause() -> None:
    samplers = [[SamplerInfo("sampler", "DistributedSampler", True, seed=r, rank=r, num_replicas=2)]
                for r in range(2)]
    v = partition_rule("dl", _ranks(list(range(16)), list(range(16, 32)), samplers=samplers))
    assert v is not None and v.code == "data.ranks_overlap" and v.evidence["seeds"] == [0, 1]
    assert "different seeds" in v.message


def test_same_data_names_the_sampler_that_is_not_rank_aware() -> None:
    samplers = describe_samplers(DataLoader(DATA, shuffle=True, batch_size=4))
    v = partition_rule("dl", _ranks(list(range(8)), list(range(8)), samplers=[samplers, samplers]))
    assert v is not None and "`sampler` (RandomSampler)" in v.message


def test_samplers_are_described_where_lightning_reaches_them_or_not() -> None:
    inner = DistributedSampler(DATA, num_replicas=2, rank=1, shuffle=True, seed=3)

    class Wrapper:  # a batch sampler that hides its distributed sampler from `set_epoch`
        def __init__(self) -> None:
            self.base = inner

        def __iter__(self) -> Any:
            return iter([list(inner)])

        def __len__(self) -> int:
            return 1

    infos = describe_samplers(DataLoader(DATA, batch_sampler=Wrapper()))  # type: ignore[arg-type]
    base = next(s for s in infos if s.path == "batch_sampler.base")
    assert (base.kind, base.shuffle, base.seed, base.rank, base.num_replicas) == \
        ("DistributedSampler", True, 3, 1, 2)
    assert base.has_set_epoch and not base.epoch_reached and base.rank_aware
    plain = describe_samplers(DataLoader(DATA, batch_size=4))
    assert [(s.path, s.kind, s.shuffle, s.epoch_reached) for s in plain] == [
        ("sampler", "SequentialSampler", False, True), ("batch_sampler", "BatchSampler", None, False)]


def test_an_order_repeated_across_epochs_is_reported_only_for_a_shuffling_sampler() -> None:
    hidden = [SamplerInfo("batch_sampler.base", "DistributedSampler", True, has_set_epoch=True)]
    first = _ranks(list(range(8)), list(range(8, 16)), samplers=[hidden, hidden])
    v = reshuffle_rule("dl", first, first, epoch=1)
    assert v is not None and v.code == "data.order_not_reshuffled"
    assert "only on `sampler` and `batch_sampler.sampler`" in v.message
    moved = _ranks(list(range(8))[::-1], list(range(8, 16))[::-1], samplers=[hidden, hidden])
    assert reshuffle_rule("dl", first, moved, epoch=1) is None
    sequential = [SamplerInfo("sampler", "SequentialSampler", False)]
    plain = _ranks(list(range(8)), list(range(8, 16)), samplers=[sequential, sequential])
    assert reshuffle_rule("dl", plain, plain, epoch=1) is None
    fixed = [SamplerInfo("sampler", "MySampler", True)]
    same = _ranks(list(range(8)), list(range(8, 16)), samplers=[fixed, fixed])
    v = reshuffle_rule("dl", same, same, epoch=2)
    assert v is not None and "fixed seed" in v.message


def test_replica_checksums_name_the_first_differing_tensor() -> None:
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    entries = replica_entries(net)
    names = [e.name for e in entries]
    assert names[:6] == ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"]
    assert {e.name for e in entries if e.batchnorm} == {"1.running_mean", "1.running_var",
                                                       "1.num_batches_tracked"}
    a = checksums(entries)
    assert a.dtype == torch.float64 and a.shape == (len(entries), 3)
    assert differing(torch.stack([a, a.clone()])) == []
    with torch.no_grad():
        net[2].bias.add_(1e-4)
        net[1].running_mean.add_(1.0)
    b = checksums(entries)
    rows = torch.stack([a, b])
    idx = differing(rows)
    assert [names[i] for i in idx] == ["2.bias", "1.running_mean"]
    verdicts = replicas_rule(entries, rows, idx, step=5, when="at step 5")
    assert [(v.code, v.layer, v.severity) for v in verdicts] == [
        ("wiring.replicas_differ", "2.bias", None), ("wiring.buffers_differ", "1.running_mean", "info")]
    assert verdicts[0].evidence["ranks_apart"] == [1]


def test_a_buffer_outside_batch_norm_that_differs_warns() -> None:
    net = nn.Linear(2, 2)
    net.register_buffer("ema", torch.zeros(2))
    entries = replica_entries(net)
    a = checksums(entries)
    net.ema.add_(1.0)  # type: ignore[operator]
    rows = torch.stack([a, checksums(entries)])
    (verdict,) = replicas_rule(entries, rows, differing(rows), step=1, when="after step 1")
    assert verdict.code == "wiring.buffers_differ" and verdict.severity is None
    assert verdict.layer == "ema"
    (synced,) = replicas_rule(entries, rows, differing(rows), step=1, when="after step 1",
                              rebroadcast=True)  # DDP overwrites it with rank 0's each forward
    assert synced.severity == "info" and "broadcast_buffers" in synced.message


def test_uneven_batch_counts_are_named_per_rank() -> None:
    from lightning_triage.functional.data.ranks import uneven_rule

    v = uneven_rule("dl", [5.0, 4.0], ranks=[0, 1])
    assert v is not None and v.code == "data.ranks_uneven_batches"
    assert v.evidence["batches"] == [5, 4] and "past batch 4" in v.message
    assert uneven_rule("dl", [4.0, 4.0]) is None
    assert uneven_rule("dl", [4.0, float("inf")]) is None  # an unsized loader is not judged


def test_a_monitored_metric_that_differs_between_ranks_is_named() -> None:
    from lightning_triage.functional.metric_sync import unsynced_rule

    monitored = {"val_loss": ["ModelCheckpoint", "EarlyStopping"], "val_acc": ["ModelCheckpoint"]}
    values = [{"val_loss": 0.5, "val_acc": 0.9}, {"val_loss": 0.7, "val_acc": 0.9}]
    (v,) = unsynced_rule(values, monitored, step=12)
    assert v.code == "mode.unsynced_metric" and v.evidence["metric"] == "val_loss"
    assert v.evidence["monitored_by"] == ["ModelCheckpoint", "EarlyStopping"]
    assert unsynced_rule([{"val_loss": 0.5}, {}], monitored, step=1) == []  # not logged everywhere


def test_replicas_apart_after_a_step_skipped_on_one_rank_name_the_step_counts() -> None:
    net = nn.Linear(2, 2)
    entries = replica_entries(net)
    a = checksums(entries)
    with torch.no_grad():
        net.weight.add_(0.1)
    rows = torch.stack([a, checksums(entries)])
    (v,) = replicas_rule(entries, rows, differing(rows), step=4, when="at step 4", steps=[3, 4])
    assert v.evidence["optimizer_steps"] == [3, 4]
    assert "ranks [0] skipped a step" in v.message and "reduce_boolean_decision" in v.message
    (same,) = replicas_rule(entries, rows, differing(rows), step=4, when="at step 4", steps=[4, 4])
    assert "skipped" not in same.message


def test_an_unmonitored_validation_metric_that_differs_is_info() -> None:
    from lightning_triage.functional.metric_sync import unsynced_rule

    values = [{"val_loss": 0.5, "val_f1": 0.6}, {"val_loss": 0.7, "val_f1": 0.8}]
    verdicts = unsynced_rule(values, {"val_loss": ["EarlyStopping"]}, step=3,
                             logged=["val_loss", "val_f1"])
    assert [(v.evidence["metric"], v.severity) for v in verdicts] == [
        ("val_loss", None), ("val_f1", "info")]  # monitored: the registry's warning
    assert verdicts[1].evidence["monitored_by"] == []
    assert unsynced_rule([{"val_f1": 0.6}, {"val_f1": 0.6}], {}, step=3, logged=["val_f1"]) == []
