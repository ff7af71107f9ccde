"""Random generators that DataLoader workers would share.

Each worker of a ``DataLoader(num_workers > 0)`` gets a copy of the dataset as the main process
holds it. PyTorch reseeds the *global* generators in every worker, and again every epoch
(``random``, ``torch`` and, since PyTorch 1.9, ``numpy.random``), but not a generator object
the dataset (or a transform it holds) owns: ``np.random.default_rng(0)``,
``np.random.RandomState``, ``random.Random``, ``torch.Generator``. Every worker then starts
from the same state and draws the same numbers, and with non-persistent workers the same again
every epoch (the main process's copy never advances). Lightning's
``seed_everything(workers=True)`` reseeds the global generators only.

:func:`find_rngs` walks the dataset's attributes without side effects: instance and class
``__dict__`` entries (never properties or ``__getattr__``), lists, tuples and dicts of bounded
size, ``functools.partial`` arguments, bound methods and closures, at bounded depth. A generator
counts only when code that runs per example reads it (a method of its owner reachable from
``__getitem__``, ``__iter__``, ``__call__`` or ``forward`` names the attribute: not a generator
used only in ``__init__`` or in a ``set_epoch`` the main process calls), and no method on the
path asks ``get_worker_info()`` or ``torch.initial_seed()`` (code that reseeds per worker).
"""

from __future__ import annotations

import functools
import itertools
import random
import types
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lightning_triage.functional.verdict import Verdict

#: Generator types a dataset may own, with the names messages use.
RNG_TYPES: tuple[tuple[type, str], ...] = (
    (np.random.Generator, "numpy.random.Generator"),
    (np.random.RandomState, "numpy.random.RandomState"),
    (np.random.BitGenerator, "numpy.random.BitGenerator"),
    (random.Random, "random.Random"),
    (torch.Generator, "torch.Generator"),
)
#: Names in code that reseeds per worker.
WORKER_AWARE = frozenset({"get_worker_info", "initial_seed"})
#: The methods a worker runs per example (a dataset's, a transform's, a module's).
PER_EXAMPLE = ("__getitem__", "__getitems__", "__iter__", "__next__", "__call__", "forward")
#: Methods that run once in the main process, not per example.
SETUP_METHODS = frozenset({"__init__", "__new__", "__post_init__", "__init_subclass__",
                           "__repr__", "__str__", "__getstate__", "__setstate__", "__reduce__",
                           "__reduce_ex__", "__eq__", "__hash__"})
MAX_DEPTH = 5
MAX_NODES = 2000
#: The walk stops after this many generators.
MAX_FOUND = 64
MAX_ITEMS = 32
_LEAVES = (str, bytes, int, float, complex, bool, type(None), Tensor, np.ndarray, type,
           types.ModuleType)


@dataclass(frozen=True)
class SharedRng:
    """A generator found by :func:`find_rngs`.

    Attributes:
        path: where it is, from the dataset (``"dataset.transform.rng"``).
        kind: its type (``"numpy.random.Generator"``).
        attribute: the attribute name code reads it by (the last attribute on its path), which
            a ``worker_init_fn`` that reseeds it would name.
    """

    path: str
    kind: str
    attribute: str


def _rng_kind(value: Any) -> str | None:
    if isinstance(value, random.SystemRandom):  # draws from the OS: nothing to share
        return None
    if value is torch.default_generator or _global_state(value):
        return None  # reseeded in every worker by PyTorch
    for cls, name in RNG_TYPES:
        if isinstance(value, cls):
            return name
    return None


def _global_state(value: Any) -> bool:
    """Whether ``value`` is the state behind ``random``'s or ``numpy.random``'s functions."""
    return value is getattr(random.random, "__self__", None) or \
        value is getattr(np.random.random, "__self__", None)


def _user_classes(cls: type) -> list[type]:
    """``cls`` and its bases whose methods are user code (not torch's, numpy's or builtins')."""
    return [c for c in cls.__mro__
            if c.__module__.split(".")[0] not in ("builtins", "torch", "numpy", "typing", "abc")]


def _code_names(code: types.CodeType, depth: int = 0) -> set[str]:
    names = set(code.co_names) | set(code.co_freevars)
    if depth < 4:
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                names |= _code_names(const, depth + 1)
    return names


def _function(value: Any) -> types.FunctionType | None:
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    return value if isinstance(value, types.FunctionType) else None


def method_names(obj: Any) -> frozenset[str] | None:
    """The names that code of ``obj``'s own classes run per example reads: the methods
    reachable (through ``self.<method>``) from the entry points in :data:`PER_EXAMPLE`, or, for
    a class with none (a helper whose methods others call), every method but
    :data:`SETUP_METHODS`. ``None`` when those classes define no method."""
    code = _class_code(type(obj))  # type: ignore[arg-type]  # mypy: `type` is not Hashable
    return None if code is None else code[0]


def _worker_aware(obj: Any) -> bool:
    """Whether any method of ``obj``'s own classes names :data:`WORKER_AWARE` code."""
    code = _class_code(type(obj))  # type: ignore[arg-type]
    return code is not None and bool(code[1] & WORKER_AWARE)


@functools.lru_cache(maxsize=256)
def _class_code(cls: type) -> tuple[frozenset[str], frozenset[str]] | None:
    """``(names read per example, names read by any method)`` (see :func:`method_names`)."""
    methods: dict[str, types.FunctionType] = {}
    for c in _user_classes(cls):
        for name, value in vars(c).items():
            fn = _function(value)
            if fn is not None and name not in methods:
                methods[name] = fn
    if not methods:
        return None
    every = frozenset().union(*(_code_names(fn.__code__) for fn in methods.values()))
    todo = [n for n in PER_EXAMPLE if n in methods] or \
        [n for n in methods if n not in SETUP_METHODS]
    done: set[str] = set()
    reads: set[str] = set()
    while todo:
        name = todo.pop()
        if name in done:
            continue
        done.add(name)
        names = _code_names(methods[name].__code__)
        reads |= names
        todo += [n for n in names & methods.keys() if n not in done and n not in SETUP_METHODS]
    return frozenset(reads), every


def callable_names(fn: Any) -> set[str]:
    """The names a callable's code reads (a function, a ``functools.partial``, a bound method or
    an object with ``__call__``); empty when it has no Python code.

    Example:
        >>> def seed_worker(worker_id):
        ...     info = get_worker_info()
        ...     info.dataset.rng = None
        >>> "rng" in callable_names(functools.partial(seed_worker))
        True
    """
    if isinstance(fn, functools.partial):
        return callable_names(fn.func)
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if isinstance(code, types.CodeType):
        return _code_names(code)
    call = next((vars(cls)["__call__"] for cls in type(fn).__mro__ if "__call__" in vars(cls)),
                None)
    code = getattr(call, "__code__", None)
    return _code_names(code) if isinstance(code, types.CodeType) else set()


def _key_label(key: Any) -> str:
    """A dict key as a path shows it: ``repr`` for plain keys only (a user class's ``__repr__``
    may raise, or be slow)."""
    return repr(key) if isinstance(key, (str, bytes, int, float, bool, type(None))) \
        else f"<{type(key).__name__}>"


def _children(obj: Any, path: str) -> Iterator[tuple[str, str | None, Any]]:
    """``(path, attribute name or None, value)`` of what ``obj`` holds, without side effects."""
    if isinstance(obj, (list, tuple)):  # the base class's iterator: no overridden method runs
        items = list.__iter__(obj) if isinstance(obj, list) else tuple.__iter__(obj)
        for i, item in enumerate(itertools.islice(items, MAX_ITEMS)):
            yield f"{path}[{i}]", None, item
    elif isinstance(obj, dict):
        for key, item in itertools.islice(dict.items(obj), MAX_ITEMS):
            yield f"{path}[{_key_label(key)}]", None, item
    elif isinstance(obj, functools.partial):
        for i, item in enumerate(obj.args[:MAX_ITEMS]):
            yield f"{path}.args[{i}]", None, item
        for key, item in list(obj.keywords.items())[:MAX_ITEMS]:
            yield f"{path}.keywords[{key!r}]", None, item
        yield f"{path}.func", None, obj.func
    elif isinstance(obj, types.MethodType):
        yield path, None, obj.__self__
    elif isinstance(obj, types.FunctionType):
        cells = obj.__closure__ or ()
        for name, cell in zip(obj.__code__.co_freevars, cells, strict=False):
            try:
                yield f"{path}.<locals>.{name}", None, cell.cell_contents
            except ValueError:  # an empty cell
                continue
    else:
        yield from _attributes(obj, path)


def _attributes(obj: Any, path: str) -> Iterator[tuple[str, str | None, Any]]:
    try:
        attrs = dict(vars(obj))
    except TypeError:  # no instance `__dict__`
        attrs = {}
    if isinstance(obj, nn.Module):  # submodules by their names, as `named_modules` gives them
        modules = attrs.pop("_modules", None) or {}
        attrs.update({str(k): v for k, v in modules.items()})
    for i, (key, value) in enumerate(attrs.items()):
        if i >= MAX_ITEMS * 4:
            break
        yield f"{path}.{key}", str(key), value
    for cls in _user_classes(type(obj)):  # generators kept on the class (shared by every instance)
        for key, value in vars(cls).items():
            if key not in attrs and _rng_kind(value) is not None:
                yield f"{path}.{key}", key, value


@dataclass
class _Node:
    value: Any
    path: str
    depth: int
    owner: Any  # the nearest object on the path with methods of its own (None: none yet)
    attribute: str | None  # the attribute of `owner` the path goes through
    worker_aware: bool  # some method on the path names `get_worker_info`/`initial_seed`


def find_rngs(dataset: Any, *, root: str = "dataset") -> list[SharedRng]:
    """The generator objects that ``dataset`` owns and that per-example code reads, which
    DataLoader workers would share (see the module docstring for what is walked and when a
    generator counts). Breadth first: the shortest path to each generator.

    Example:
        >>> import numpy as np
        >>> class Noisy:
        ...     def __init__(self):
        ...         self.rng = np.random.default_rng(0)
        ...     def __getitem__(self, i):
        ...         return self.rng.normal()
        >>> find_rngs(Noisy())
        [SharedRng(path='dataset.rng', kind='numpy.random.Generator', attribute='rng')]
    """
    found: list[SharedRng] = []
    seen: set[int] = set()
    queue = deque([_Node(dataset, root, 0, None, None, False)])
    while queue and len(seen) < MAX_NODES and len(found) < MAX_FOUND:
        node = queue.popleft()
        if id(node.value) in seen:
            continue
        seen.add(id(node.value))
        names = method_names(node.value)
        owner, aware = node.owner, node.worker_aware or _worker_aware(node.value)
        if node.depth >= MAX_DEPTH:
            continue
        for path, attribute, value in _children(node.value, node.path):
            kind = _rng_kind(value)
            if kind is not None:
                found.extend(_counted(node, names, attribute, path, kind, aware))
                continue
            if isinstance(value, _LEAVES) or id(value) in seen:
                continue
            if names is not None and attribute is not None:
                queue.append(_Node(value, path, node.depth + 1, node.value, attribute, aware))
            else:
                queue.append(_Node(value, path, node.depth + 1, owner, node.attribute, aware))
    return found


def _counted(node: _Node, names: frozenset[str] | None, attribute: str | None, path: str, kind: str,
             aware: bool) -> list[SharedRng]:
    """The generator at ``path`` as a finding, when per-example code reads it."""
    if aware:
        return []
    if isinstance(node.value, types.FunctionType):  # a closure: the function reads it
        return [SharedRng(path, kind, path.rsplit(".", 1)[-1])]
    owner_names: frozenset[str] | None
    name: str | None
    if names is not None and attribute is not None:
        owner_names, name = names, attribute
    else:
        owner_names = method_names(node.owner) if node.owner is not None else None
        name = node.attribute
    if owner_names is not None and name is not None and name not in owner_names:
        return []  # only setup code reads it (a fixed split, data drawn once)
    return [SharedRng(path, kind, attribute or name or path.rsplit(".", 1)[-1])]


def shared_rng_rule(loader: str, rngs: list[SharedRng], *, num_workers: int, persistent: bool,
                    worker_init_fn: Callable[..., Any] | None) -> Verdict | None:
    """``data.shared_worker_rng``: a loader with workers whose dataset owns generators.

    Args:
        loader: how the message names the loader.
        rngs: what :func:`find_rngs` found in its dataset.
        num_workers: the loader's ``num_workers`` (``0``: nothing is shared).
        persistent: the loader's ``persistent_workers``.
        worker_init_fn: the user's ``worker_init_fn`` (Lightning's
            ``pl_worker_init_function``, which reseeds only the global generators, passed as
            ``None``). With one, the finding is info (it may reseed them in a way this cannot
            see), and nothing is reported when its code names every generator's attribute.

    Example:
        >>> rng = SharedRng("dataset.rng", "numpy.random.Generator", "rng")
        >>> v = shared_rng_rule("train_dataloader", [rng], num_workers=4, persistent=False,
        ...                     worker_init_fn=None)
        >>> v.code, v.severity, v.evidence["paths"]
        ('data.shared_worker_rng', 'warning', ['dataset.rng'])
    """
    if num_workers <= 0 or not rngs:
        return None
    named = callable_names(worker_init_fn) if worker_init_fn is not None else set()
    rngs = [r for r in rngs if r.attribute not in named]
    if not rngs:
        return None
    listed = ", ".join(f"`{r.path}` ({r.kind})" for r in rngs[:4]) + (
        f" and {len(rngs) - 4} more" if len(rngs) > 4 else "")
    epochs = "" if persistent else ", and draw the same numbers again every epoch"
    if worker_init_fn is None:
        setup = "without a `worker_init_fn`"
    else:
        what = getattr(worker_init_fn, "__name__", type(worker_init_fn).__name__)
        setup = f"with a `worker_init_fn` (`{what}`) that does not name the attribute"
    return Verdict(
        "data.shared_worker_rng", None,
        f"The training loader `{loader}` runs {num_workers} worker processes {setup}, and its "
        f"dataset owns {'a random generator' if len(rngs) == 1 else 'random generators'} created "
        f"in the main process: {listed}. Every worker "
        f"starts from a copy of the same state, so the workers draw identical random "
        f"numbers{epochs}.",
        severity="info" if worker_init_fn is not None else "warning",
        evidence={"loader": loader, "paths": [r.path for r in rngs][:16],
                  "kinds": [r.kind for r in rngs][:16], "num_workers": num_workers,
                  "persistent_workers": persistent,
                  "worker_init_fn": worker_init_fn is not None})


__all__ = ["MAX_DEPTH", "MAX_FOUND", "MAX_ITEMS", "MAX_NODES", "PER_EXAMPLE", "RNG_TYPES",
           "SETUP_METHODS", "WORKER_AWARE", "SharedRng", "callable_names", "find_rngs",
           "method_names", "shared_rng_rule"]
