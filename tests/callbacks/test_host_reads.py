"""Zero host reads per step on the accelerator path, proven on CPU: the bundle's per-step hooks
run under a function mode and a dispatch mode that count every read of a tensor's value on the
host (``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``bool``/``float``/``int`` of a
tensor, ``aten._local_scalar_dense``) and every data-dependent shape (``nonzero``...). On CPU
a read costs nothing, so the counting is the proof: on a GPU each is a synchronization."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from lightning_triage import ReplicaCheck, Triage
from lightning_triage._torch_compat import exit_function_mode
from tests.callbacks.test_step_path import Net, _data, _DeviceLike
from tests.helpers import loader, make_trainer

#: Tensor methods that read a value on the host (or move it there).
READS = frozenset({"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__",
                   "__index__", "__array__", "__complex__"})
#: Operators that read a value or whose output shape depends on the values.
SYNC_OPS = frozenset({"_local_scalar_dense", "nonzero", "masked_select", "_unique2",
                      "unique_consecutive", "unique_dim", "equal", "is_nonzero", "repeat_interleave"})


class HostReads(TorchFunctionMode):
    """Counts host reads while active (both levels: a method and the operator it runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self._dispatch = _SyncOps(self.counts)

    def __enter__(self) -> HostReads:
        super().__enter__()
        self._dispatch.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._dispatch.__exit__(*exc)
        # a hook it wraps may leave a mode above it on purpose (the step-0 objective watch,
        # started at the batch start, stopped at its end): leave from under it
        exit_function_mode(self)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in READS or (name == "to" and _to_host(args, kwargs or {})):
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


def _to_host(args: Any, kwargs: dict[str, Any]) -> bool:
    """``.to("cpu")`` written out (a ``torch.device`` is the run's own device on this forced
    path: on an accelerator it is the accelerator)."""
    return any(isinstance(t, str) and t.startswith("cpu") for t in (*args[1:], kwargs.get("device")))


class _SyncOps(TorchDispatchMode):
    def __init__(self, counts: Counter[str]) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if name in SYNC_OPS:
            self.counts[f"aten.{name}"] += 1
        return func(*args, **(kwargs or {}))


#: The steady state: after the first-epoch windows and the data stage's first batches (its
#: fingerprints of the first `fingerprint_batches` = 256 training batches are host reads, one
#: per batch, by design: a fit-start window, like the probes).
STEADY = 260
_HOOKS = ("on_train_batch_start", "on_before_backward", "on_after_backward",
          "on_before_optimizer_step", "on_before_zero_grad", "on_train_batch_end")


class CountedTriage(Triage):
    """The bundle, each per-step hook run under :class:`HostReads`; reads per optimizer step."""

    per_step: dict[int, Counter[str]]

    def counted(self, hook: str, trainer: pl.Trainer, *args: Any) -> None:
        mode = HostReads()
        with mode:
            getattr(super(), hook)(trainer, *args)
        if trainer.global_step >= STEADY:
            self.per_step.setdefault(trainer.global_step, Counter()).update(mode.counts)


for _hook in _HOOKS:
    def _make(hook: str) -> Any:
        def run(self: CountedTriage, trainer: pl.Trainer, *args: Any) -> None:
            self.counted(hook, trainer, *args)
        run.__name__ = hook
        return run
    setattr(CountedTriage, _hook, _make(_hook))


def test_the_accelerator_path_reads_nothing_between_flushes(tmp_path: Path) -> None:
    """With the device step path forced on CPU (as the step-path tests do) and deferred NaN
    checks, a steady-state step makes no host read; the flushes (every 20 steps here) read a
    few values in bulk, and the steps between them none. The rank checks are idle in a single
    process: their reads are counted by the next test."""
    pl.seed_everything(0, verbose=False)
    bundle = CountedTriage(window_epochs=1, window_steps=10, verbose=False, overfit=False,
                           strict=True, numerics_mode="deferred", numerics_check_every_n_steps=20)
    bundle.per_step = {}
    shared = _DeviceLike()
    for check in bundle.checks:
        if hasattr(check, "step_state"):
            check.step_state = shared  # type: ignore[attr-defined]
        if hasattr(check, "flush_every_n_steps"):
            check.flush_every_n_steps = 20  # type: ignore[attr-defined]
    trainer = make_trainer(tmp_path, [bundle], max_epochs=8, limit_train_batches=40,
                           limit_val_batches=0)
    trainer.fit(Net(), loader(*_data(), batch_size=16))
    steps = sorted(bundle.per_step)
    assert steps[0] == STEADY and steps[-1] >= 319
    reading = {s: dict(c) for s, c in bundle.per_step.items() if sum(c.values())}
    # reads happen only at the flushes (every 20 steps), none on the 57 steps between them
    assert set(reading) == {260, 280, 300, 320}, reading
    for counts in reading.values():  # per flush, as docs/distributed.md states: two bulk
        # transfers (the loss and gradient-norm buffers: `.cpu()` then `.numpy()` of each) and
        # two scalar reads (the deferred NaN flags), each seen as a method and as an operator
        assert counts["cpu"] <= 2 and counts["aten._local_scalar_dense"] <= 2, counts
        assert sum(counts.values()) <= 8, counts


def test_replica_check_reads_only_at_its_checks() -> None:
    """Between two checks the replica check does nothing (no collective, no host read); at a
    check: one gather and one read of whether any tensor differs."""
    net = torch.nn.Linear(4, 2)
    gathers = []

    def all_gather(t: torch.Tensor) -> torch.Tensor:
        gathers.append(t)
        return torch.stack([t, t.clone()])

    trainer = SimpleNamespace(world_size=2, global_step=0, global_rank=0, is_global_zero=True,
                              current_epoch=0, strategy=SimpleNamespace(all_gather=all_gather),
                              accumulate_grad_batches=1, optimizers=[])
    check = ReplicaCheck(check_every_n_steps=10, strict=True)
    check.on_train_start(trainer, net)  # type: ignore[arg-type]
    reads: dict[int, int] = {}
    for step in range(31):  # the batch that starts after `step` optimizer steps
        trainer.global_step = step
        with HostReads() as mode:
            check.on_train_batch_start(trainer, net, None, 0)  # type: ignore[arg-type]
        reads[step] = sum(mode.counts.values())
    assert len(gathers) == 1 + 4  # fit start, step 1, steps 10, 20, 30
    assert {s for s, n in reads.items() if n} == {1, 10, 20, 30}
    # the ranks' step counts, the `nonzero` of the differing tensors and its list
    assert max(reads.values()) <= 3
    assert not check.findings
