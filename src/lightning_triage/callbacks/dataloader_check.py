"""Stage 1 (data): does the training loader deliver what it was configured to?"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import lightning.pytorch as pl
from lightning.fabric.utilities.seed import pl_worker_init_function
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_triage.callbacks._args import check_int
from lightning_triage.callbacks._shared import Keys, loader_name, train_loaders
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.functional.data.loader import (
    BatchSizes,
    LoaderSpec,
    loader_spec,
    short_batches_rule,
)
from lightning_triage.functional.data.rngs import find_rngs, shared_rng_rule

_loaders = train_loaders
_name = loader_name


def _part(batch: Any, keys: Keys) -> Any:
    """The part of a combined batch that the loader at ``keys`` delivered (``None``: not found,
    or an exhausted loader of ``CombinedLoader(mode="max_size")``)."""
    for key in keys:
        in_list = isinstance(key, int) and isinstance(batch, (list, tuple)) and key < len(batch)
        if not in_list and not (isinstance(batch, dict) and key in batch):
            return None
        batch = batch[key]
    return batch


def _user_worker_init_fn(loader: DataLoader[Any]) -> Any:
    """The loader's ``worker_init_fn`` unless it is Lightning's ``pl_worker_init_function``
    (``seed_everything(workers=True)``), which reseeds only the global generators."""
    fn = loader.worker_init_fn
    inner = fn.func if isinstance(fn, functools.partial) else fn
    return None if inner is pl_worker_init_function else fn


class DataLoaderCheck(TriageCallback):
    """Check the training loader's contract: batches of the configured size, workers that do
    not share one random generator.

    At the start of training, for each training ``DataLoader`` with ``num_workers > 0``, the
    dataset's attributes are walked (bounded, read-only: no property is called, the dataset is
    never iterated) for generator objects created in the main process (``numpy`` ``Generator``
    and ``RandomState``, ``random.Random``, ``torch.Generator``) that per-example code reads and
    nothing reseeds per worker: every worker would draw the same numbers. Then the first
    ``num_batches`` training batches are compared with the loader's ``batch_size``: a batch
    whose tensors all hold fewer examples, and that is not the loader's last, was cut after the
    sampler (a ``collate_fn`` that drops or merges examples). Afterwards the check is idle: no
    per-step cost.

    Silent on loaders without a ``batch_size`` (a ``batch_sampler``, a dataset that batches
    itself), on the last partial batch, on packed sequences, on the one partial batch per
    worker of an ``IterableDataset``, and on workers that reseed (``get_worker_info()`` or
    ``torch.initial_seed()`` in the dataset's code, or a ``worker_init_fn`` that names the
    generator's attribute; any other ``worker_init_fn`` lowers the finding to info).

    Findings: ``data.short_batches``, ``data.shared_worker_rng``. See ``docs/data.md``.

    Args:
        num_batches: training batches compared with the configured batch size (per fit).
        strict: raise internal errors instead of disabling the check.

    Raises:
        TriageConfigError: for ``num_batches`` below 1.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[DataLoaderCheck()])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.DataLoaderCheck
                  init_args: {num_batches: 4}
    """

    stage: ClassVar[str] = "data"
    codes: ClassVar[tuple[str, ...]] = ("data.short_batches", "data.shared_worker_rng")

    def __init__(self, *, num_batches: int = 4, strict: bool = False) -> None:
        super().__init__(strict=strict)
        check_int("num_batches", num_batches, 1)
        self.num_batches = num_batches
        self._specs: list[tuple[Keys, LoaderSpec, BatchSizes]] = []
        self._checked = 0

    def _reported(self, code: str, loader: str) -> bool:
        return any(f.code == code and f.evidence.get("loader") == loader for f in self.findings)

    # ------------------------------------------------------------------ hooks
    @override
    @guarded
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._specs, self._checked = [], 0
        loaders = list(_loaders(trainer.train_dataloader))
        for keys, loader in loaders:
            self._check_workers(trainer, _name(keys), loader)
            spec = loader_spec(_name(keys), loader)
            if spec is not None:
                self._specs.append((keys, spec, BatchSizes()))
        if not loaders:
            self.skip("no training `DataLoader` (another iterable) to check")
            self.idle = True
            return
        workers = sum(1 for _, loader in loaders if loader.num_workers > 0)
        self.mark_ran(f"{len(loaders)} training loader(s), {workers} with workers; "
                      f"{len(self._specs)} with a batch size to check")
        self.idle = not self._specs

    @override
    @guarded
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for _, _, seen in self._specs:
            seen.new_epoch()

    @override
    @guarded
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if not self._specs:
            return
        step = trainer.global_step
        for keys, spec, seen in self._specs:
            seen.add(spec, _part(batch, keys), batch_idx, step)
        self._checked += 1
        if self._checked >= self.num_batches:
            self._close(trainer)

    @override
    @guarded
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close(trainer)

    @override
    @guarded
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close(trainer)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        try:
            if not self.disabled:
                self._close(trainer)
        except Exception as exc:
            if self.strict:
                raise
            self._disable_after_error(trainer, "on_exception", exc)
        finally:
            super().on_exception(trainer, pl_module, exception)

    # ------------------------------------------------------------------ checks
    def _check_workers(self, trainer: pl.Trainer, name: str, loader: DataLoader[Any]) -> None:
        if loader.num_workers <= 0 or self._reported("data.shared_worker_rng", name):
            return
        verdict = shared_rng_rule(name, find_rngs(loader.dataset), num_workers=loader.num_workers,
                                  persistent=bool(loader.persistent_workers),
                                  worker_init_fn=_user_worker_init_fn(loader))
        if verdict is not None:
            self.add_verdict(trainer, verdict)

    def _close(self, trainer: pl.Trainer) -> None:
        """Judge the batches seen so far (once per fit), then go idle."""
        specs, self._specs = self._specs, []
        for _, spec, seen in specs:
            verdict = short_batches_rule(spec, seen)
            if verdict is not None and not self._reported(verdict.code, spec.name):
                self.add_verdict(trainer, verdict)
        self.idle = True

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(_specs=[], _checked=0)
        return state


__all__ = ["DataLoaderCheck"]
