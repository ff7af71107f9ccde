"""Stage 1 (data), data-parallel runs: do the ranks train on disjoint data that reshuffles?"""

from __future__ import annotations

from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from typing_extensions import override

from lightning_triage.callbacks._args import check_batch_keys, check_int
from lightning_triage.callbacks._shared import gather_objects, loader_name, train_loaders
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.functional.batch import BatchKey, locate_batch
from lightning_triage.functional.data.duplicates import example_fingerprints
from lightning_triage.functional.data.ranks import (
    RankBatches,
    SamplerInfo,
    describe_samplers,
    is_iterable_loader,
    partition_rule,
    reshuffle_rule,
    uneven_rule,
)


class RankDataCheck(TriageCallback):
    """Check that the ranks of a data-parallel run train on disjoint examples that reshuffle
    every epoch.

    Each rank fingerprints the examples of its first ``num_batches`` training batches (a 64-bit
    hash of each example's inputs, on the host: a few KB), once in the first epoch and once in
    the next, and the ranks exchange them in one collective each time (``all_gather_object``),
    with a description of the training loader's samplers (their class, ``shuffle``, ``seed``,
    ``rank``, ``num_replicas``, and whether Lightning reaches their ``set_epoch``). Every rank
    then applies the same rules; rank 0 records the findings. Afterwards the check is idle.

    Does nothing in a single process (``world_size == 1``). Silent on a loader that does not
    shuffle (its order never changes by design), on ranks that draw from disjoint shards, and
    on datasets whose own duplicates explain the overlap seen.

    At the start of training the ranks also exchange how many training batches their loaders
    hold per epoch (known for sized loaders): different counts end in a hang (the ranks with
    more wait for a gradient reduction the others never join) or in steps only some ranks take.

    Findings: ``data.ranks_same_data``, ``data.ranks_overlap``, ``data.order_not_reshuffled``,
    ``data.ranks_uneven_batches``. See ``docs/distributed.md``.

    Args:
        num_batches: training batches fingerprinted per rank, in the first epoch and the next.
        input_key: where the inputs are in a batch (as for :class:`BatchInspector`).
        target_key: where the targets are (tells the inputs apart from them).
        strict: raise internal errors instead of disabling the check.

    Raises:
        TriageConfigError: for ``num_batches`` below 1, or an ``input_key`` or
            ``target_key`` that is not a key, an index or a callable.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[RankDataCheck()])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.RankDataCheck
                  init_args: {num_batches: 4}
    """

    stage: ClassVar[str] = "data"
    codes: ClassVar[tuple[str, ...]] = ("data.ranks_same_data", "data.ranks_overlap",
                                        "data.order_not_reshuffled", "data.ranks_uneven_batches")
    bundle_args: ClassVar[dict[str, Any]] = {"input_key": "input_key",
                                              "target_key": "target_key"}

    def __init__(self, *, num_batches: int = 4, input_key: BatchKey | None = None,
                 target_key: BatchKey | None = None, strict: bool = False) -> None:
        super().__init__(strict=strict)
        check_int("num_batches", num_batches, 1)
        check_batch_keys(input_key=input_key, target_key=target_key)
        self.num_batches = num_batches
        self.input_key = input_key
        self.target_key = target_key
        self._loader = "train_dataloader"
        self._samplers: list[SamplerInfo] = []
        self._iterable = False
        self._phase = -1  # 0: collecting the first epoch, 1: the next, -1: nothing to do
        self._epoch = 0
        self._batches: list[list[int]] = []
        self._first: list[RankBatches] = []
        self._failed = False
        self._limit = num_batches  # the fewest batches per epoch of any rank

    @override
    def needs_hook(self, hook: str) -> bool:
        return hook == "on_train_batch_start" and self._phase >= 0 and not self.disabled

    # ------------------------------------------------------------------ hooks
    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # not `guarded` (nor the per-batch hooks): an error on one rank must not make it skip
        # the collective the other ranks take
        self._phase, self._first, self._batches, self._failed = -1, [], [], False
        if self.disabled:
            return
        if trainer.world_size < 2:
            self.mark_ran("a single process: no ranks to compare")  # as autocast under 32-true
            self.idle = True
            return
        try:
            loaders = list(train_loaders(trainer.train_dataloader))
            if loaders:
                keys, loader = loaders[0]
                self._loader = loader_name(keys) if len(loaders) > 1 else "train_dataloader"
                self._samplers = describe_samplers(loader)
                self._iterable = is_iterable_loader(loader)
        except Exception as exc:
            self._fail(exc)
        self._uneven(trainer)
        self._phase, self._epoch = 0, trainer.current_epoch
        self.idle = False
        self.mark_ran(f"{trainer.world_size} ranks: fingerprinting the first {self.num_batches} "
                      "training batches of each rank")

    @override
    @guarded
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._phase == 1 and trainer.current_epoch > self._epoch:  # epochs were skipped
            self._batches, self._epoch = [], trainer.current_epoch

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self._phase < 0 or self.disabled or trainer.current_epoch != self._epoch:
            return
        fingerprints: list[int] = []
        if not self._failed:
            try:
                fingerprints = self._fingerprints(batch)
            except Exception as exc:
                self._fail(exc)
        self._batches.append(fingerprints)  # counted even after a failure: same steps everywhere
        if len(self._batches) >= min(self.num_batches, self._limit):
            self._exchange(trainer)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # an epoch shorter than `num_batches`: exchange what was seen (every rank ends the epoch)
        if self._phase >= 0 and not self.disabled and trainer.current_epoch == self._epoch:
            self._exchange(trainer)

    # ------------------------------------------------------------------ work
    def _fail(self, exc: Exception) -> None:
        if self.strict:
            raise exc
        self._failed = True
        self.detail = f"could not fingerprint a batch: {type(exc).__name__}: {exc}"

    def _fingerprints(self, batch: Any) -> list[int]:
        x = locate_batch(batch, self.input_key, self.target_key).inputs
        if x is None or x.ndim == 0 or x.layout != torch.strided or x.is_nested:
            return []
        return example_fingerprints(x.detach())

    def _uneven(self, trainer: pl.Trainer) -> None:
        """The ranks' batch counts per epoch, exchanged at fit start (one small collective);
        the fingerprints are then exchanged at a batch every rank reaches."""
        try:
            count = float(trainer.num_training_batches)
        except Exception:  # unknown: not judged
            count = float("inf")
        counts = gather_objects(trainer, count)
        finite = [c for c in counts if c == c and c != float("inf")]
        self._limit = max(1, int(min(finite))) if finite else self.num_batches
        try:
            verdict = uneven_rule(self._loader, counts, step=trainer.global_step)
            if verdict is not None and trainer.is_global_zero:
                self.add_verdict(trainer, verdict)
        except Exception as exc:
            self.hook_failed(trainer, "on_train_start", exc)

    def _exchange(self, trainer: pl.Trainer) -> None:
        """The one collective of this phase, then the rules (the same on every rank)."""
        mine = None if self._failed else RankBatches(trainer.global_rank, self._batches,
                                                     self._samplers, self._iterable)
        ranks = gather_objects(trainer, mine)
        phase, self._phase = self._phase, -1
        if any(r is None for r in ranks):
            self.skip("skipped: a rank could not fingerprint its batches")
            self.idle = True
            return
        try:
            self._judge(trainer, phase, ranks)
        except Exception as exc:
            self.hook_failed(trainer, "on_train_batch_start", exc)
        if phase == 0 and not self.disabled and self._more_epochs(trainer):
            self._phase, self._first = 1, ranks
            self._epoch, self._batches = trainer.current_epoch + 1, []
        self.idle = self._phase < 0

    def _judge(self, trainer: pl.Trainer, phase: int, ranks: list[RankBatches]) -> None:
        if phase == 0:
            verdict = partition_rule(self._loader, ranks, trainer.global_step)
            self.detail = (f"{len(ranks)} ranks x {len(ranks[0].flat)} examples compared"
                           if ranks else self.detail)
        else:
            verdict = reshuffle_rule(self._loader, self._first, ranks, self._epoch,
                                     trainer.global_step)
            self.detail += f"; epoch {self._epoch} compared with the first"
        if verdict is not None and trainer.is_global_zero:
            self.add_verdict(trainer, verdict)

    @staticmethod
    def _more_epochs(trainer: pl.Trainer) -> bool:
        max_epochs = trainer.max_epochs
        return max_epochs is None or max_epochs < 0 or trainer.current_epoch + 1 < max_epochs

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(_batches=[], _first=[])
        return state


__all__ = ["RankDataCheck"]
