"""A probe on a copy of the user's module: :func:`probe_module` deep-copies the LightningModule
(the trainer, its loggers, callbacks and datamodule shared, not copied) or, when a copy would
not fit in memory, runs on the live module under :func:`~lightning_triage.probing.snapshot.
isolated`."""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn.parameter import is_lazy
from torch.optim import Optimizer

from lightning_triage._compat import share_trainer
from lightning_triage.functional.objective import unwatched
from lightning_triage.probing.compiled import eager, rebind_compiled, shared_compile_state
from lightning_triage.probing.snapshot import isolated
from lightning_triage.probing.state import (
    ProbeUnavailableError,
    _hook_dicts,
    _is_ours,
    _noop,
    quiet_loggers,
    rng_state,
    set_rng_state,
    shared_objects,
    trainer_state,
)

#: A copy is made when its estimated bytes are at most this fraction of the free memory of the
#: device holding the parameters (the rest is left for the probe's activations).
COPY_MEMORY_FRACTION = 0.5


# ---------------------------------------------------------------------- memory
def _attribute_tensors(module: nn.Module) -> Iterator[Tensor]:
    """Tensors kept in plain attributes of the submodules (directly or in lists, tuples and
    dicts: hidden states, caches, EMA lists, metric states)."""
    for sub in module.modules():
        for value in vars(sub).values():
            items = value.values() if isinstance(value, dict) else \
                value if isinstance(value, (list, tuple)) else (value,)
            for item in items:
                if isinstance(item, Tensor):
                    yield item


def module_bytes(module: nn.Module) -> int:
    """Bytes of the module's parameters, buffers and attribute tensors (each counted once).

    Example:
        >>> module_bytes(nn.Linear(10, 10))  # 110 float32 values
        440
    """
    seen: set[int] = set()
    total = 0
    for t in (*module.parameters(), *module.buffers(), *_attribute_tensors(module)):
        if id(t) not in seen and not is_lazy(t):
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def free_bytes(device: torch.device) -> int | None:
    """Free memory of ``device`` in bytes (host RAM for the CPU), ``None`` when unknown."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[0])
        if device.type == "cpu":
            import psutil

            return int(psutil.virtual_memory().available)
    except Exception:
        return None
    return None


def _device_of(module: nn.Module) -> torch.device:
    for t in (*module.parameters(), *module.buffers()):
        return t.device
    return torch.device("cpu")


def _storage(t: Tensor) -> tuple[str, int] | None:
    """The device and address of ``t``'s storage (``None``: no storage to share, such as a
    sparse tensor or an empty one)."""
    try:
        ptr = int(t.untyped_storage().data_ptr())
    except Exception:  # sparse, nested, meta, lazy: nothing a copy can share this way
        return None
    return (str(t.device), ptr) if ptr else None


def _tensors(module: nn.Module, optimizers: Sequence[Optimizer]) -> Iterator[tuple[str, Tensor]]:
    """Every parameter, buffer, attribute tensor and optimizer-state tensor, with a name."""
    yield from (("parameter " + n, t) for n, t in module.named_parameters(remove_duplicate=False))
    yield from (("buffer " + n, t) for n, t in module.named_buffers(remove_duplicate=False))
    yield from (("attribute tensor", t) for t in _attribute_tensors(module))
    for i, opt in enumerate(optimizers):
        for group in opt.param_groups:
            yield from ((f"optimizer {i} parameter", p) for p in group["params"]
                        if isinstance(p, Tensor))
        for state in opt.state.values():
            items = state.values() if isinstance(state, dict) else ()
            yield from ((f"optimizer {i} state", t) for t in items if isinstance(t, Tensor))


class SharedStorageError(Exception):
    """A copy of the module shares a tensor's storage with the original (a ``__deepcopy__``
    that returns ``self``, a submodule shared with an object the copy does not copy)."""


def check_no_shared_storage(module: nn.Module, optimizers: Sequence[Optimizer],
                            twin: nn.Module, twin_optimizers: Sequence[Optimizer]) -> None:
    """Raise :class:`SharedStorageError` when any parameter, buffer, attribute tensor or
    optimizer-state tensor of the copy shares its storage with one of the original's.

    Example:
        >>> net = nn.Linear(2, 2)
        >>> twin = copy.deepcopy(net)
        >>> check_no_shared_storage(net, [], twin, [])
        >>> twin.bias = net.bias
        >>> try:
        ...     check_no_shared_storage(net, [], twin, [])
        ... except SharedStorageError as err:
        ...     print(err)
        the copy's parameter bias shares its storage with the model
    """
    ours = {ptr for _, t in _tensors(module, optimizers) if (ptr := _storage(t)) is not None}
    for name, t in _tensors(twin, twin_optimizers):
        if _storage(t) in ours:
            raise SharedStorageError(f"the copy's {name} shares its storage with the model")


def _strip_our_hooks(module: nn.Module) -> None:
    """Remove the triage callbacks' forward/backward hooks the copy inherited: they must not
    record probe data as the real run's."""
    for sub in module.modules():
        dicts = _hook_dicts(sub)
        removed = {k for d in dicts for k, fn in d.items() if callable(fn) and _is_ours(fn)}
        for d in dicts:
            for k in removed:
                d.pop(k, None)


@contextmanager
def without_our_hooks(module: nn.Module) -> Iterator[None]:
    """Suspend the triage callbacks' module and parameter hooks on ``module`` inside the block
    (a probe in place must not record probe data as the real run's); every hook dict is put
    back as it was, in its order."""
    saved: list[tuple[dict[Any, Any], dict[Any, Any]]] = []
    try:
        for sub in module.modules():
            dicts = _hook_dicts(sub)
            removed = {k for d in dicts for k, fn in d.items() if callable(fn) and _is_ours(fn)}
            for p in sub._parameters.values():
                for name in ("_backward_hooks", "_post_accumulate_grad_hooks"):
                    d = getattr(p, name, None)
                    if isinstance(d, dict) and any(_is_ours(fn) for fn in d.values()):
                        saved.append((d, dict(d)))
                        for k in [k for k, fn in d.items() if _is_ours(fn)]:
                            del d[k]
            if not removed:
                continue
            for d in dicts:
                if any(k in d for k in removed):
                    saved.append((d, dict(d)))
                    for k in removed:
                        d.pop(k, None)
        yield
    finally:
        for d, items in saved:
            d.clear()
            d.update(items)


def _copy_param_hooks(original: nn.Module, twin: nn.Module) -> None:
    """Parameters lose their tensor hooks when deep-copied: re-register the user's ones."""
    for p, q in zip(original.parameters(), twin.parameters(), strict=False):
        for fn in list((getattr(p, "_backward_hooks", None) or {}).values()):
            if not _is_ours(fn):
                q.register_hook(fn)
        for fn in list((getattr(p, "_post_accumulate_grad_hooks", None) or {}).values()):
            if not _is_ours(fn):
                q.register_post_accumulate_grad_hook(fn)


def copy_optimizer(optimizer: Optimizer, memo: dict[int, Any]) -> Optimizer:
    """A deep copy of ``optimizer`` through ``memo`` (map its parameters there to choose the
    copy's), with empty state, keeping the attributes ``Optimizer.__getstate__`` leaves out.
    Its constructor is not run again (no side effects such as gradient hooks twice).

    Example:
        >>> w = nn.Parameter(torch.ones(2))
        >>> opt = torch.optim.SGD([w], lr=0.1)
        >>> twin = copy_optimizer(opt, {id(w): w})
        >>> twin.param_groups[0]["params"][0] is w, twin.param_groups[0] is opt.param_groups[0]
        (True, False)
    """
    memo[id(optimizer.state)] = defaultdict(dict)
    twin = copy.deepcopy(optimizer, memo)
    for key, value in vars(optimizer).items():
        if key not in vars(twin) and not callable(value):
            twin.__dict__[key] = copy.deepcopy(value, memo)
    return twin


def copy_module(trainer: pl.Trainer | None, module: nn.Module,
                optimizers: Sequence[Optimizer] = ()) -> tuple[nn.Module, list[Optimizer]]:
    """A deep copy of ``module`` and of ``optimizers`` (jointly: the copies' param groups hold
    the copy's parameters, with empty optimizer state), for a probe.

    The trainer, loggers, callbacks, datamodule, dataloaders and datasets are shared, not
    copied; the triage callbacks' hooks are not carried over; ``self.log`` of the copy is a
    no-op; ``self.optimizers()`` and ``self.lr_schedulers()`` of the copy return copies.

    Example:
        >>> net = nn.Linear(2, 2)
        >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
        >>> twin, (twin_opt,) = copy_module(None, net, [opt])
        >>> twin.weight is net.weight, twin_opt.param_groups[0]["params"][0] is twin.weight
        (False, True)
    """
    memo: dict[int, Any] = {id(o): o for o in (*shared_objects(trainer, module),
                                                *shared_compile_state(module))}
    for opt in optimizers:
        memo.pop(id(opt), None)
    twin_opts = []
    for opt in optimizers:
        trial = dict(memo)  # a failed copy leaves half-built objects in its memo
        try:
            twin_opts.append(copy_optimizer(opt, trial))
        except Exception:  # an attribute of its own that cannot be copied: leave it out
            trial = dict(memo)
            twin_opts.append(copy.deepcopy(opt, trial))
        memo.update(trial)
    schedulers = [cfg.scheduler for cfg in trainer.lr_scheduler_configs] if trainer else []
    twin, twin_scheds = copy.deepcopy((module, schedulers), memo)
    # checked before anything below touches the copy: a shared submodule is the user's
    check_no_shared_storage(module, optimizers, twin, twin_opts)
    rebind_compiled(twin, memo)
    for original, sub in zip(module.modules(), twin.modules(), strict=True):
        if isinstance(sub, pl.LightningModule) and isinstance(original, pl.LightningModule):
            share_trainer(sub, original)  # dropped by LightningModule.__getstate__
    _strip_our_hooks(twin)
    _copy_param_hooks(module, twin)
    if isinstance(twin, pl.LightningModule):
        object.__setattr__(twin, "log", _noop)
        object.__setattr__(twin, "log_dict", _noop)

        def twin_optimizers(use_pl_optimizer: bool = True) -> Any:
            return twin_opts[0] if len(twin_opts) == 1 else twin_opts

        def twin_schedulers() -> Any:
            if not twin_scheds:
                return None
            return twin_scheds[0] if len(twin_scheds) == 1 else twin_scheds

        object.__setattr__(twin, "optimizers", twin_optimizers)
        object.__setattr__(twin, "lr_schedulers", twin_schedulers)
    return twin, twin_opts


@dataclass
class Probe:
    """What :func:`probe_module` hands to a probe."""

    #: the module to run the user's code on (a copy, or the live module under a snapshot)
    module: Any
    #: the user's optimizers as ``module`` sees them (copies for a copy)
    optimizers: list[Optimizer]
    #: ``"copy"`` or ``"in place"`` (and why)
    how: str

    @property
    def copied(self) -> bool:
        return self.how == "copy"


@contextmanager
def probe_module(trainer: pl.Trainer | None, module: nn.Module,
                 optimizers: Sequence[Optimizer] = (), *, factor: float = 2.0,
                 force_in_place: bool = False) -> Iterator[Probe]:
    """Run a probe on a copy of ``module`` (or, when it would not fit or would share a tensor's
    storage with the original, on the live module under a complete snapshot); every global
    RNG, the trainer's loggers and the trainer's public state (:func:`~lightning_triage.
    probing.state.trainer_state`) are untouched afterwards.

    Args:
        trainer: the run's trainer (shared with the copy), or ``None``.
        module: the user's module.
        optimizers: the user's optimizers (copied with the module, empty state).
        factor: the probe needs about ``factor`` times the module's bytes (the copy, its
            gradients, a probe optimizer's state); a copy is made when that is at most
            :data:`COPY_MEMORY_FRACTION` of the device's free memory.
        force_in_place: skip the copy (tests).

    Raises:
        ProbeUnavailableError: neither a copy nor a snapshot fits in memory.
    """
    size = module_bytes(module)
    device = _device_of(module)
    free = free_bytes(device)
    how = "copy"
    twin: tuple[nn.Module, list[Optimizer]] | None = None
    if force_in_place:
        how = "in place (forced)"
    elif free is not None and factor * size > COPY_MEMORY_FRACTION * free:
        how = (f"in place: a copy needs about {factor * size / 2**20:.0f} MiB, "
               f"{free / 2**20:.0f} MiB free on {device.type}")
    else:
        saved = rng_state()  # a `__deepcopy__` of the user's may draw random numbers
        try:
            twin = copy_module(trainer, module, optimizers)
        except SharedStorageError as exc:
            how = f"in place: {exc}"
        except Exception as exc:
            how = f"in place: the module could not be copied ({type(exc).__name__}: {exc})"
        finally:
            set_rng_state(saved)
    if twin is None and any(is_lazy(t) for t in (*module.parameters(), *module.buffers())):
        raise ProbeUnavailableError(
            f"the module has lazy parameters not yet initialized and could not be copied ({how})")
    if twin is None and free is not None and size > COPY_MEMORY_FRACTION * free:
        raise ProbeUnavailableError(
            f"the module's {size / 2**20:.0f} MiB of parameters and buffers fit neither a copy "
            f"nor a snapshot in the {free / 2**20:.0f} MiB free on {device.type}")
    saved = rng_state()
    try:
        # the probe's steps are not the user's step: a watch of the step does not see them
        with quiet_loggers(trainer), trainer_state(trainer), eager(), unwatched():
            if twin is not None:
                yield Probe(twin[0], twin[1], how)
            else:
                with isolated(module, optimizers, trainer=trainer), without_our_hooks(module):
                    yield Probe(module, list(optimizers), how)
    finally:
        set_rng_state(saved)


