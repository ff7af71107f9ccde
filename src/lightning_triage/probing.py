"""Run probes on the user's model without changing the run.

Probes (overfit one batch, structure and leak probes, numerics replays) execute the user's own
code on a real batch. :func:`probe_module` runs them on a deep copy of the LightningModule (the
trainer, its loggers, callbacks and datamodule shared, not copied), so everything the module
holds (attributes, flags, hidden states, metrics, lists, generators, caches) stays with the
copy. When a copy would not fit in memory it falls back to :func:`isolated`: a complete
snapshot of the live module, always fully restored. While a probe runs the trainer's loggers
receive nothing and ``self.log`` is swallowed; side effects outside the module (files, prints)
still happen.
"""

from __future__ import annotations

import copy
import random
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor, nn
from torch.nn.parameter import is_lazy
from torch.optim import Optimizer
from torch.utils.data import DataLoader, Dataset

from lightning_triage.functional.batch import BatchKey, split_batch

#: A copy is made when its estimated bytes are at most this fraction of the free memory of the
#: device holding the parameters (the rest is left for the probe's activations).
COPY_MEMORY_FRACTION = 0.5
#: Containers longer than this are snapshotted shallowly (their items are not saved one by one).
MAX_SNAPSHOT_ITEMS = 10_000
#: Nesting depth of attribute values the in-place snapshot saves item by item.
MAX_SNAPSHOT_DEPTH = 4

#: Objects a module may hold that are shared with the probe's copy, never copied.
_SHARED_TYPES: tuple[type, ...] = (pl.Trainer, Logger, Callback, pl.LightningDataModule,
                                   DataLoader, Dataset, Optimizer)


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


class UserCodeError(Exception):
    """The user's code raised inside a probe; ``__cause__`` is the original exception."""

    @property
    def original(self) -> BaseException:
        return self.__cause__ if self.__cause__ is not None else self

    def describe(self, limit: int = 200) -> str:
        """``"ValueError: message"`` of the original exception, cut at ``limit`` characters."""
        exc = self.original
        text = str(exc)
        text = text if len(text) <= limit else text[:limit] + "..."
        return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ProbeUnavailableError(Exception):
    """Neither a copy nor an in-place snapshot of the module fits in memory (the message says
    why): the probe is skipped."""


@contextmanager
def user_code() -> Iterator[None]:
    """Mark a block that runs the user's code: its exceptions become :class:`UserCodeError`.

    Example:
        >>> try:
        ...     with user_code():
        ...         raise ValueError("bad batch")
        ... except UserCodeError as err:
        ...     err.describe()
        'ValueError: bad batch'
    """
    try:
        yield
    except UserCodeError:
        raise
    except Exception as exc:
        raise UserCodeError(exc) from exc


# ---------------------------------------------------------------------- RNG
@dataclass
class RngState:
    """The global random states: torch (CPU and every initialized CUDA device), numpy, ``random``."""

    torch_cpu: Tensor
    cuda: list[Tensor] | None
    numpy: Any
    python: Any


def rng_state() -> RngState:
    """Capture every global RNG state (restore it with :func:`set_rng_state`)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return RngState(torch.get_rng_state(), cuda, np.random.get_state(), random.getstate())


def set_rng_state(state: RngState) -> None:
    """Put every global RNG back to ``state``.

    Example:
        >>> saved = rng_state()
        >>> a = (torch.rand(1).item(), float(np.random.rand()), random.random())
        >>> set_rng_state(saved)
        >>> a == (torch.rand(1).item(), float(np.random.rand()), random.random())
        True
    """
    torch.set_rng_state(state.torch_cpu)
    if state.cuda is not None:
        torch.cuda.set_rng_state_all(state.cuda)
    np.random.set_state(state.numpy)
    random.setstate(state.python)


# ---------------------------------------------------------------------- quiet loggers
class _Null:
    """Swallows every attribute access and call (a quiet logger's ``experiment``)."""

    def __getattr__(self, name: str) -> _Null:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> _Null:
        return self

    def __getitem__(self, key: Any) -> _Null:
        return self


_NULL = _Null()
_QUIET: dict[type, type] = {}


def _quiet_class(cls: type) -> type:
    if cls not in _QUIET:
        names = {n for n in dir(cls) if n.startswith("log_")}
        names |= {"save", "finalize", "after_save_checkpoint"}
        body: dict[str, Any] = {n: _noop for n in names if callable(getattr(cls, n, None))}
        body["experiment"] = property(lambda self: _NULL)
        body["__slots__"] = ()
        body["__module__"] = cls.__module__
        _QUIET[cls] = type(cls.__name__, (cls,), body)
    return _QUIET[cls]


@contextmanager
def quiet_loggers(trainer: pl.Trainer | None) -> Iterator[None]:
    """The trainer's loggers receive nothing inside the block: ``log_*`` calls, ``save`` and
    ``experiment`` (also direct ``self.logger.log_metrics`` calls from the user's code) are
    swallowed; other attributes (``name``, ``version``, ``log_dir``) read as usual."""
    swapped: list[tuple[Any, type]] = []
    try:
        for logger in list(trainer.loggers) if trainer is not None else []:
            cls = type(logger)
            try:
                logger.__class__ = _quiet_class(cls)
            except TypeError:  # an object layout that cannot be subclassed: left as is
                continue
            swapped.append((logger, cls))
        yield
    finally:
        for logger, cls in swapped:
            logger.__class__ = cls


@contextmanager
def silenced_logging(module: nn.Module) -> Iterator[None]:
    """Swallow ``self.log``/``self.log_dict`` calls of a LightningModule inside the block."""
    patched = [name for name in ("log", "log_dict") if hasattr(module, name)]
    for name in patched:
        object.__setattr__(module, name, _noop)
    try:
        yield
    finally:
        for name in patched:
            module.__dict__.pop(name, None)


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


# ---------------------------------------------------------------------- the copy
def _is_ours(fn: Any) -> bool:
    fn = getattr(fn, "func", fn)  # functools.partial
    fn = getattr(fn, "__func__", fn)  # bound method
    return str(getattr(fn, "__module__", "") or "").startswith("lightning_triage")


def _hook_dicts(module: nn.Module) -> list[dict[Any, Any]]:
    return [v for k, v in vars(module).items() if "hooks" in k and isinstance(v, dict)]


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


def shared_objects(trainer: pl.Trainer | None, module: nn.Module) -> list[Any]:
    """Objects a probe's copy shares with the run: the trainer, its loggers, callbacks,
    datamodule and optimizers, and any such object (or a dataloader or dataset) the module
    keeps in an attribute."""
    found: list[Any] = []
    if trainer is not None:
        found += [trainer, trainer.strategy, *trainer.loggers, *getattr(trainer, "callbacks", []),
                  *trainer.optimizers]
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is not None:
            found.append(datamodule)
    for sub in module.modules():
        for value in vars(sub).values():
            items = value if isinstance(value, (list, tuple)) else (value,)
            found += [v for v in items if isinstance(v, _SHARED_TYPES)]
    return found


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
    memo: dict[int, Any] = {id(o): o for o in shared_objects(trainer, module)}
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
    for original, sub in zip(module.modules(), twin.modules(), strict=True):
        if isinstance(sub, pl.LightningModule) and isinstance(original, pl.LightningModule):
            sub._trainer = original._trainer  # dropped by LightningModule.__getstate__
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
    """Run a probe on a copy of ``module`` (or, when it would not fit, on the live module under
    a complete snapshot); every global RNG and the trainer's loggers are untouched afterwards.

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
        with quiet_loggers(trainer):
            if twin is not None:
                yield Probe(twin[0], twin[1], how)
            else:
                with isolated(module, optimizers, trainer=trainer), without_our_hooks(module):
                    yield Probe(module, list(optimizers), how)
    finally:
        set_rng_state(saved)



@contextmanager
def eval_copy(trainer: pl.Trainer, module: nn.Module, rng: RngState | None, *,
              factor: float = 2.0) -> Iterator[Probe]:
    """:func:`probe_module` for one pass of a differential probe: a fresh copy (or the live
    module under a snapshot) in eval mode, with every global RNG set to ``rng`` (when given), so
    that paired passes start from the same state."""
    with probe_module(trainer, module, trainer.optimizers, factor=factor) as probe:
        probe.module.eval()
        if rng is not None:
            set_rng_state(rng)
        yield probe


def run_user_step(trainer: pl.Trainer, module: Any, batch: Any,
                  forward_fn: Callable[[Any, Any], Any] | None = None) -> Any:
    """The user's ``training_step`` (or ``forward_fn(module, batch)``) on ``batch``, in the run's
    precision context as the real step; its exceptions become :class:`UserCodeError`."""
    with trainer.precision_plugin.train_step_context(), user_code():
        if forward_fn is not None:
            return forward_fn(module, batch)
        return module.training_step(batch, 0)

# ---------------------------------------------------------------------- the in-place snapshot
#: Attributes of ``nn.Module`` that the snapshot handles itself (or must not touch).
_MODULE_INTERNALS = frozenset({"_parameters", "_buffers", "_modules", "training",
                               "_non_persistent_buffers_set", "_trainer", "_fabric"})


@dataclass
class _Saved:
    obj: Any
    kind: str
    data: Any = None


def _save(value: Any, skip: set[int], depth: int = 0) -> _Saved:
    """A snapshot of ``value`` that :func:`_restore` puts back, into the same objects where it
    can (containers and tensors keep their identity)."""
    if id(value) in skip or isinstance(value, (nn.Module, *_SHARED_TYPES)):
        return _Saved(value, "atom")
    if isinstance(value, Tensor):
        return _Saved(value, "tensor", value.detach().clone())
    if isinstance(value, torch.Generator):
        return _Saved(value, "generator", value.get_state())
    if isinstance(value, np.random.RandomState):
        return _Saved(value, "np_state", value.get_state())
    if isinstance(value, np.random.Generator):
        return _Saved(value, "np_generator", copy.deepcopy(value.bit_generator.state))
    if isinstance(value, random.Random):
        return _Saved(value, "random", value.getstate())
    if isinstance(value, np.ndarray):
        return _Saved(value, "ndarray", value.copy())
    deep = depth < MAX_SNAPSHOT_DEPTH
    if isinstance(value, list):
        if deep and len(value) <= MAX_SNAPSHOT_ITEMS:
            return _Saved(value, "list", [_save(v, skip, depth + 1) for v in value])
        return _Saved(value, "list_shallow", list(value))
    if isinstance(value, tuple):
        if deep and len(value) <= MAX_SNAPSHOT_ITEMS:
            return _Saved(value, "tuple", [_save(v, skip, depth + 1) for v in value])
        return _Saved(value, "atom")
    if isinstance(value, dict):
        if deep and len(value) <= MAX_SNAPSHOT_ITEMS:
            return _Saved(value, "dict", [(k, _save(v, skip, depth + 1))
                                          for k, v in value.items()])
        return _Saved(value, "dict_shallow", dict(value))
    if isinstance(value, (set, bytearray)):
        return _Saved(value, "copy", copy.copy(value))
    if (deep and hasattr(value, "__dict__") and not isinstance(value, type)
            and not callable(value) and type(value).__module__ != "builtins"):
        return _Saved(value, "object", [(k, _save(v, skip, depth + 1))
                                        for k, v in vars(value).items()])
    return _Saved(value, "atom")


def _put_tensor(obj: Tensor, data: Tensor) -> Tensor:
    """``obj`` with the saved values (untouched when equal, so no version bump), or ``data``
    itself when the probe changed ``obj``'s size, dtype or device (to be reassigned)."""
    if obj.shape != data.shape or obj.dtype != data.dtype or obj.device != data.device:
        return data
    if not torch.equal(obj, data):
        with torch.no_grad():
            obj.copy_(data)
    return obj


def _restore(saved: _Saved) -> Any:
    """Put ``saved`` back; returns the value to store where it was found."""
    obj, kind, data = saved.obj, saved.kind, saved.data
    if kind == "tensor":
        return _put_tensor(obj, data)
    if kind in ("generator", "np_state"):
        obj.set_state(data)
    elif kind == "np_generator":
        obj.bit_generator.state = data
    elif kind == "random":
        obj.setstate(data)
    elif kind == "ndarray":
        if obj.shape == data.shape:
            obj[...] = data
        else:
            return data
    elif kind == "list":
        obj[:] = [_restore(s) for s in data]
    elif kind == "list_shallow":
        obj[:] = data
    elif kind == "tuple":
        for s in data:
            _restore(s)  # tuples are immutable: put their items' contents back
    elif kind in ("dict", "dict_shallow"):
        items = [(k, _restore(s)) for k, s in data] if kind == "dict" else list(data.items())
        obj.clear()
        obj.update(items)
    elif kind == "copy":
        obj.clear()
        obj.update(data) if isinstance(obj, set) else obj.extend(data)
    elif kind == "object":
        keep = {k for k, _ in data}
        for k in [k for k in vars(obj) if k not in keep]:
            delattr(obj, k)
        for k, s in data:
            setattr(obj, k, _restore(s))
    return obj


class _Snapshot:
    """Everything a probe on the live module can change, and how to put it back."""

    def __init__(self, module: nn.Module, optimizers: Sequence[Optimizer],
                 trainer: pl.Trainer | None) -> None:
        self.module = module
        self.optimizers = list(optimizers)
        skip = {id(o) for o in shared_objects(trainer, module)}
        self.params: list[tuple[nn.Module, str, Tensor | None]] = []
        self.values: dict[int, tuple[Tensor, Tensor | None]] = {}
        self.buffers: list[tuple[nn.Module, str, Tensor | None, Tensor | None]] = []
        self.children: list[tuple[nn.Module, dict[str, nn.Module | None]]] = []
        self.attrs: list[tuple[nn.Module, list[tuple[str, _Saved]]]] = []
        self.modes: list[tuple[nn.Module, bool]] = []
        with torch.no_grad():
            for sub in module.modules():
                for name, p in sub._parameters.items():
                    self.params.append((sub, name, p))
                    if p is not None and id(p) not in self.values:
                        grad = None if p.grad is None else p.grad.detach().clone()
                        self.values[id(p)] = (p.detach().clone(), grad)
                    if p is not None:
                        skip.add(id(p))
                for name, b in sub._buffers.items():
                    self.buffers.append((sub, name, b, None if b is None else b.detach().clone()))
                    if b is not None:
                        skip.add(id(b))
            for sub in module.modules():
                self.children.append((sub, dict(sub._modules)))
                self.modes.append((sub, sub.training))
                hook_ids = {id(d) for d in _hook_dicts(sub)}
                self.attrs.append((sub, [(k, _save(v, skip)) for k, v in vars(sub).items()
                                         if k not in _MODULE_INTERNALS and id(v) not in hook_ids]))
        self.opts = []
        for opt in self.optimizers:
            groups = opt.param_groups
            contents = [(g, [(k, _save(v, set(), 2)) for k, v in g.items() if k != "params"],
                         g["params"], list(g["params"])) for g in groups]
            state = opt.state
            saved_state = [(p, _save(s, skip | {id(x) for x in self.values}, 1))
                           for p, s in state.items()]
            self.opts.append((opt, groups, list(groups), contents, state, saved_state))
        self.rng = rng_state()

    def restore(self) -> list[Exception]:
        """Put everything back, attempting every step even when one fails."""
        errors: list[Exception] = []

        def attempt(fn: Callable[..., Any], *args: Any) -> None:
            try:
                fn(*args)
            except Exception as exc:  # keep going: the other steps still restore
                errors.append(exc)

        def put_param(sub: nn.Module, name: str, p: Tensor | None) -> None:
            sub._parameters[name] = p  # type: ignore[assignment]
            if p is None or id(p) not in self.values:
                return
            data, grad = self.values[id(p)]
            value = _put_tensor(p, data)
            if value is not p:
                p.data = value
            p.grad = None if grad is None else grad.clone()

        def put_buffer(sub: nn.Module, name: str, b: Tensor | None, data: Tensor | None) -> None:
            if b is None or data is None:
                sub._buffers[name] = None
            else:  # replaced or resized (a bank grown with torch.cat): reassign the saved one
                sub._buffers[name] = _put_tensor(b, data)

        def put_attrs(sub: nn.Module, saved: list[tuple[str, _Saved]]) -> None:
            keep = {k for k, _ in saved} | _MODULE_INTERNALS
            for k in [k for k in vars(sub) if k not in keep and "hooks" not in k]:
                del sub.__dict__[k]  # created by the probe
            for k, s in saved:
                attempt(lambda k, s: sub.__dict__.__setitem__(k, _restore(s)), k, s)

        def put_optimizer(opt: Optimizer, groups: list[dict[str, Any]],
                          group_list: list[dict[str, Any]], contents: list[Any], state: Any,
                          saved_state: list[tuple[Tensor, _Saved]]) -> None:
            # the same list and the same dict objects: a warm-up that cached them keeps working
            opt.__dict__["param_groups"] = groups
            groups[:] = group_list
            for g, items, params, members in contents:
                g.clear()
                params[:] = members
                g["params"] = params
                for k, v in items:
                    g[k] = _restore(v)
            opt.__dict__["state"] = state
            state.clear()
            for p, s in saved_state:
                state[p] = _restore(s)

        def put_children(sub: nn.Module, names: dict[str, nn.Module | None]) -> None:
            sub._modules.clear()
            sub._modules.update(names)

        for sub, name, p in self.params:
            attempt(put_param, sub, name, p)
        for sub, name, b, data in self.buffers:
            attempt(put_buffer, sub, name, b, data)
        for sub, names in self.children:
            attempt(put_children, sub, names)
        known = {(id(sub), name) for sub, name, _, _ in self.buffers}
        for sub in self.module.modules():
            for name in [n for n in sub._buffers if (id(sub), n) not in known]:
                attempt(sub._buffers.pop, name)  # created by the probe
        for sub, saved in self.attrs:
            attempt(put_attrs, sub, saved)
        for sub, mode in self.modes:
            attempt(setattr, sub, "training", mode)
        for entry in self.opts:
            attempt(put_optimizer, *entry)
        attempt(set_rng_state, self.rng)
        return errors


@contextmanager
def isolated(module: nn.Module, optimizers: Sequence[Optimizer] = (),
             trainer: pl.Trainer | None = None) -> Iterator[None]:
    """Snapshot the live module and put everything back afterwards (also on error).

    Restored: parameters (the same objects, values copied back, or reassigned when the probe
    changed their size) and their ``.grad``; buffers (a buffer the probe resized or replaced,
    such as a feature bank grown with ``torch.cat``, is reassigned); the submodules; the
    attributes of every submodule (flags, counters, lists, dicts, tensors, hidden states,
    torchmetrics states, ``torch``/numpy/``random`` generators, nested items; attributes the
    probe created are deleted); train/eval flags; the optimizers' state and hyperparameters,
    into the same ``param_groups`` list and dicts; every global RNG. Every step is attempted
    even when one fails (the first error is raised after). ``self.log`` calls inside the block
    are swallowed. Extra memory: one copy of the parameters, their gradients, the buffers, the
    attribute tensors and the optimizer state, on their devices.

    Example:
        >>> net = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
        >>> net.register_buffer("bank", torch.zeros(2, 3))
        >>> net.seen = []
        >>> before = net[0].weight.clone()
        >>> with isolated(net):
        ...     _ = net.eval()
        ...     net.seen.append(1)
        ...     net.bank = torch.cat([net.bank, torch.ones(1, 3)])
        ...     with torch.no_grad():
        ...         _ = net[0].weight.add_(1.0)
        >>> bool(torch.equal(net[0].weight, before)), net.training, net.seen, tuple(net.bank.shape)
        (True, True, [], (2, 3))
    """
    snapshot = _Snapshot(module, optimizers, trainer)
    try:
        with silenced_logging(module):
            yield
    finally:
        errors = snapshot.restore()
        if errors:
            raise errors[0]


def step_loss(output: Any) -> Tensor | None:
    """The scalar loss in a ``training_step`` output (a tensor or a dict with ``"loss"``)."""
    loss = output.get("loss") if isinstance(output, Mapping) else output
    if isinstance(loss, Tensor) and loss.numel() == 1:
        return loss
    return None


def copy_first_examples(batch: Any, keep: int, input_key: BatchKey | None = None,
                        target_key: BatchKey | None = None) -> Any:
    """A copy of ``batch`` (tensors cloned, detached) with at most ``keep`` examples.

    The number of examples is the input tensor's first dimension (the input as
    :func:`~lightning_triage.functional.batch.split_batch` finds it); tensors and lists of that
    length are cut, everything else is kept whole.

    Example:
        >>> import torch
        >>> batch = {"x": torch.zeros(5, 2), "y": torch.arange(5), "ids": list("abcde")}
        >>> small = copy_first_examples(batch, 3, input_key="x")
        >>> small["x"].shape[0], small["y"].tolist(), small["ids"]
        (3, [0, 1, 2], ['a', 'b', 'c'])
    """
    inputs = split_batch(batch, input_key, target_key).inputs
    n = None if inputs is None or inputs.dim() == 0 else inputs.shape[0]
    cut_to = None if n is None or n <= keep else keep

    def cut(t: Tensor) -> Tensor:
        if cut_to is not None and t.dim() > 0 and t.shape[0] == n:
            t = t[:cut_to]
        return t.detach().clone()

    def cut_list(v: list[Any]) -> list[Any]:
        return v[:cut_to] if cut_to is not None and len(v) == n else list(v)

    copied = apply_to_collection(batch, Tensor, cut)
    return apply_to_collection(copied, list, cut_list, wrong_dtype=None) if cut_to else copied
