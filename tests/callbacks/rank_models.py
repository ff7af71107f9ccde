"""Tiny data-parallel runs for the rank checks: each builds its training loader in the worker
(``train_dataloader``), where the rank is known, the way templates that shard by hand do."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, DistributedSampler, Sampler, Subset, TensorDataset

N, DIM, BATCH = 64, 8, 8
#: The batch of rank 0 whose loss spikes (``skip_spikes``), and the loss a step is skipped above.
SPIKE_BATCH, SPIKE_LOSS = 2, 3.0


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, DIM, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


class BucketBatchSampler(Sampler[list[int]]):
    """A custom batch sampler over a distributed sampler it keeps as ``base`` (Lightning calls
    ``set_epoch`` only on ``batch_sampler.sampler``: the order never changes) or as ``sampler``
    (reached: reshuffled)."""

    def __init__(self, inner: DistributedSampler[Any], batch_size: int, exposed: bool) -> None:
        if exposed:
            self.sampler = inner
        else:
            self.base = inner
        self.batch_size = batch_size

    def _inner(self) -> DistributedSampler[Any]:
        return getattr(self, "sampler", None) or self.base

    def __iter__(self) -> Iterator[list[int]]:
        indices = list(self._inner())
        for i in range(0, len(indices), self.batch_size):
            yield indices[i:i + self.batch_size]

    def __len__(self) -> int:
        return (len(self._inner()) + self.batch_size - 1) // self.batch_size


class RankNet(pl.LightningModule):
    """A small classifier with a batch norm.

    Args:
        loader: ``"default"`` (a shuffling loader Lightning shards), ``"unsharded"`` (the same
            shuffling loader on every rank: needs ``use_distributed_sampler=False``),
            ``"seeded_by_rank"`` / ``"seeded"`` (a custom batch sampler over a
            ``DistributedSampler`` seeded with the rank / with 0), with ``exposed`` saying
            whether Lightning reaches its ``set_epoch``; ``"uneven"`` (shards cut by hand, 5
            batches on rank 0, 4 on rank 1).
        perturb_at: the optimizer step after which rank 1 moves a weight outside the step.
        norm: with a batch norm (``SyncBatchNorm`` needs a GPU: a CPU twin leaves it out).
        sync_dist: log ``val_loss`` (monitored in some tests) and ``val_confidence`` (never
            monitored) with ``sync_dist`` (each rank validates its own shard).
        skip_spikes: ``"rank"`` skips the optimizer step when this rank's own loss spikes
            (a decision taken on one rank), ``"all"`` when any rank's does (decided through
            ``reduce_boolean_decision``: the fixed twin); the spike is an outlier batch on
            rank 0 at batch :data:`SPIKE_BATCH` (inputs times 100).
    """

    def __init__(self, loader: str = "default", exposed: bool = True,
                 perturb_at: int | None = None, norm: bool = True, sync_dist: bool = True,
                 skip_spikes: str | None = None) -> None:
        super().__init__()
        self.skip_spikes = skip_spikes
        self.net = nn.Sequential(nn.Linear(DIM, 16), nn.BatchNorm1d(16) if norm else nn.Identity(),
                                 nn.ReLU(), nn.Linear(16, 2))
        self.loader = loader
        self.exposed = exposed
        self.perturb_at = perturb_at
        self.sync_dist = sync_dist

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        if self.skip_spikes and self.global_rank == 0 and batch_idx == SPIKE_BATCH:
            x = x * 100.0  # an outlier batch on rank 0 only: its loss spikes there
        return F.cross_entropy(self.net(x), y)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any,
                       optimizer_closure: Any = None) -> None:
        if self.skip_spikes is None:
            return super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        loss = optimizer_closure()  # training_step and backward: the gradients are averaged
        spiked = bool(loss.detach() > SPIKE_LOSS)  # this rank's own loss
        if self.skip_spikes == "all":  # the fix: every rank takes the same decision
            spiked = self.trainer.strategy.reduce_boolean_decision(spiked, all=False)
        if not spiked:
            optimizer.step()
        return None

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=self.sync_dist)
        # nothing monitors it: unsynced, only what is shown is one rank's
        self.log("val_confidence", logits.softmax(-1).amax(-1).mean(), sync_dist=self.sync_dist)

    def val_dataloader(self) -> DataLoader[Any]:
        data = dataset()  # sharded by hand, whatever `use_distributed_sampler` says
        shard = DistributedSampler(data, num_replicas=self.trainer.world_size,
                                   rank=self.global_rank, shuffle=False)
        return DataLoader(data, batch_size=BATCH, sampler=shard)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.global_step == self.perturb_at and self.global_rank == 1:
            with torch.no_grad():
                self.net[0].bias.add_(0.01)  # an edit on one rank only: the replicas drift

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self) -> DataLoader[Any]:
        data = dataset()
        if self.loader == "uneven":  # shards cut by hand: 40 examples on rank 0, 32 on rank 1
            start, stop = (0, 40) if self.global_rank == 0 else (32, 64)
            return DataLoader(Subset(data, range(start, stop)), batch_size=BATCH)
        if self.loader in ("default", "unsharded"):
            return DataLoader(data, batch_size=BATCH, shuffle=True,
                              generator=torch.Generator().manual_seed(0))
        seed = self.global_rank if self.loader == "seeded_by_rank" else 0
        inner = DistributedSampler(data, num_replicas=self.trainer.world_size,
                                   rank=self.global_rank, shuffle=True, seed=seed)
        return DataLoader(data, batch_sampler=BucketBatchSampler(inner, BATCH, self.exposed))


class CrashingNet(RankNet):
    """Rank 1 alone: logits 50 times too large (`init.loss_above_chance`, seen only there),
    then an exception at batch :data:`CRASH_BATCH`."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        if self.global_rank != 1:
            return super().training_step(batch, batch_idx)
        if batch_idx == CRASH_BATCH:
            raise RuntimeError("rank 1 fails here")
        x, y = batch
        return F.cross_entropy(self.net(x) * 50.0, y)


#: The batch at which :class:`CrashingNet` raises on rank 1.
CRASH_BATCH = 2
