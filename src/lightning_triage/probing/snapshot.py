"""The in-place snapshot: everything a probe on the live module can change, saved, and put
back into the same objects (:func:`isolated`)."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from lightning_triage._compat import LIGHTNING_MODULE_REFERENCES
from lightning_triage.probing.state import (
    _SHARED_TYPES,
    _hook_dicts,
    rng_state,
    set_rng_state,
    shared_objects,
    silenced_logging,
)

#: Containers longer than this are snapshotted shallowly (their items are not saved one by one).
MAX_SNAPSHOT_ITEMS = 10_000
#: Nesting depth of attribute values the in-place snapshot saves item by item.
MAX_SNAPSHOT_DEPTH = 4


# ---------------------------------------------------------------------- the in-place snapshot
#: Attributes of ``nn.Module`` that the snapshot handles itself (or must not touch).
_MODULE_INTERNALS = frozenset({"_parameters", "_buffers", "_modules", "training",
                               "_non_persistent_buffers_set"}) | LIGHTNING_MODULE_REFERENCES


@dataclass
class _Saved:
    obj: Any
    kind: str
    data: Any = None


def _save_state(value: Any) -> _Saved | None:
    """The snapshot of a tensor, a generator or an array (``None`` for anything else)."""
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
    return None


def _save(value: Any, skip: set[int], depth: int = 0) -> _Saved:
    """A snapshot of ``value`` that :func:`_restore` puts back, into the same objects where it
    can (containers and tensors keep their identity)."""
    if id(value) in skip or isinstance(value, (nn.Module, *_SHARED_TYPES)):
        return _Saved(value, "atom")
    state = _save_state(value)
    if state is not None:
        return state
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


def _restore_state(saved: _Saved) -> Any:
    """Put back a tensor, a generator or an array; returns the value to store."""
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
        if obj.shape != data.shape:
            return data
        obj[...] = data
    return obj


_STATE_KINDS = frozenset({"tensor", "generator", "np_state", "np_generator", "random", "ndarray"})


def _restore(saved: _Saved) -> Any:
    """Put ``saved`` back; returns the value to store where it was found."""
    obj, kind, data = saved.obj, saved.kind, saved.data
    if kind in _STATE_KINDS:
        return _restore_state(saved)
    if kind == "list":
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
        self.errors: list[Exception] = []

    def _attempt(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # keep going: the other steps still restore
            self.errors.append(exc)

    def _put_param(self, sub: nn.Module, name: str, p: Tensor | None) -> None:
        sub._parameters[name] = p  # type: ignore[assignment]
        if p is None or id(p) not in self.values:
            return
        data, grad = self.values[id(p)]
        value = _put_tensor(p, data)
        if value is not p:
            p.data = value
        p.grad = None if grad is None else grad.clone()

    @staticmethod
    def _put_buffer(sub: nn.Module, name: str, b: Tensor | None, data: Tensor | None) -> None:
        if b is None or data is None:
            sub._buffers[name] = None
        else:  # replaced or resized (a bank grown with torch.cat): reassign the saved one
            sub._buffers[name] = _put_tensor(b, data)

    def _put_attrs(self, sub: nn.Module, saved: list[tuple[str, _Saved]]) -> None:
        keep = {k for k, _ in saved} | _MODULE_INTERNALS
        for k in [k for k in vars(sub) if k not in keep and "hooks" not in k]:
            del sub.__dict__[k]  # created by the probe
        for k, s in saved:
            self._attempt(lambda k, s: sub.__dict__.__setitem__(k, _restore(s)), k, s)

    @staticmethod
    def _put_optimizer(opt: Optimizer, groups: list[dict[str, Any]],
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

    @staticmethod
    def _put_children(sub: nn.Module, names: dict[str, nn.Module | None]) -> None:
        sub._modules.clear()
        sub._modules.update(names)

    def restore(self) -> list[Exception]:
        """Put everything back, attempting every step even when one fails."""
        self.errors = []
        attempt = self._attempt
        for sub, name, p in self.params:
            attempt(self._put_param, sub, name, p)
        for sub, name, b, data in self.buffers:
            attempt(self._put_buffer, sub, name, b, data)
        for sub, names in self.children:
            attempt(self._put_children, sub, names)
        known = {(id(sub), name) for sub, name, _, _ in self.buffers}
        for sub in self.module.modules():
            for name in [n for n in sub._buffers if (id(sub), n) not in known]:
                attempt(sub._buffers.pop, name)  # created by the probe
        for sub, saved in self.attrs:
            attempt(self._put_attrs, sub, saved)
        for sub, mode in self.modes:
            attempt(setattr, sub, "training", mode)
        for entry in self.opts:
            attempt(self._put_optimizer, *entry)
        attempt(set_rng_state, self.rng)
        return self.errors


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

