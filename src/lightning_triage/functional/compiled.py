"""Which parts of a module run compiled code (``torch.compile``), and so where a hook would be
traced into the user's graph instead of running beside it.

A hook registered on a module that runs inside a compiled region is traced by dynamo: the
user's graph changes (it guards on the number of hooks, recompiles when it changes, and
computes the hook inside the graph). Hooks on the ``OptimizedModule`` wrapper that
``torch.compile(sub)`` returns run outside the graph, around it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: The attribute dynamo sets on a function it wraps (``torch.compile(fn)``) to the function.
DYNAMO_WRAPPED = "_torchdynamo_orig_callable"


def dynamo_type(name: str) -> type | None:
    """A class of ``torch._dynamo.eval_frame`` (``None`` where dynamo or the class is missing)."""
    eval_frame = getattr(getattr(torch, "_dynamo", None), "eval_frame", None)
    found = getattr(eval_frame, name, None)
    return found if isinstance(found, type) else None


def optimized_module_type() -> type | None:
    """``OptimizedModule``, what ``torch.compile(module)`` returns (``None`` without dynamo)."""
    return dynamo_type("OptimizedModule")


def _compiled_itself(sub: nn.Module) -> bool:
    """``sub.compile()`` was called, or ``sub`` keeps a compiled method of its own (Lightning
    compiles ``forward`` and the ``*_step`` methods of a LightningModule compiled before
    ``fit``): its own hooks run inside the graph."""
    return getattr(sub, "_compiled_call_impl", None) is not None or any(
        callable(v) and hasattr(v, DYNAMO_WRAPPED) for v in vars(sub).values())


def compiled_parts(module: nn.Module) -> list[str]:
    """Names (as ``named_modules()`` gives them, ``""`` for ``module`` itself) of the submodules
    that run compiled code: ``torch.compile(sub)`` wrappers, ``sub.compile()``, a LightningModule
    compiled before ``fit``, a compiled method kept in an attribute.

    Example:
        >>> compiled_parts(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
        []
        >>> compiled_parts(nn.Sequential(torch.compile(nn.Linear(2, 2))))
        ['0']
    """
    optimized = optimized_module_type()
    return [name for name, sub in module.named_modules()
            if (optimized is not None and isinstance(sub, optimized)) or _compiled_itself(sub)]


def traced_by_compile(module: nn.Module) -> set[str]:
    """Names of the submodules whose hooks dynamo would trace: everything inside a
    ``torch.compile(sub)`` wrapper (the wrapper's own hooks run outside), and a module that is
    compiled itself with everything inside it.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), torch.compile(nn.Sequential(nn.ReLU())))
        >>> sorted(traced_by_compile(net))
        ['1._orig_mod', '1._orig_mod.0']
        >>> plain = nn.Linear(2, 2)
        >>> plain.compile()
        >>> traced_by_compile(plain)
        {''}
    """
    optimized = optimized_module_type()
    roots: list[str] = []  # names whose subtree (the name included) is traced
    for name, sub in module.named_modules():
        if optimized is not None and isinstance(sub, optimized):
            roots.append(f"{name}._orig_mod" if name else "_orig_mod")
        elif _compiled_itself(sub):
            roots.append(name)
    if "" in roots:
        return {name for name, _ in module.named_modules()}
    return {name for name, _ in module.named_modules()
            if any(name == r or name.startswith(r + ".") for r in roots)}


def holds_compiled(value: Any) -> bool:
    """Whether ``value`` is a function ``torch.compile`` wrapped."""
    return callable(value) and hasattr(value, DYNAMO_WRAPPED)


#: Packages whose code is not the user's (their classes and functions are not read).
_LIBRARY_ROOTS = ("torch", "lightning", "pytorch_lightning", "lightning_fabric",
                  "torchmetrics", "builtins", "abc", "typing")
#: How deep :func:`compiled_functions` follows the user's helpers (a step calling a helper that
#: calls a compiled function is two levels).
MAX_DEPTH = 3


def _library(obj: Any) -> bool:
    root = str(getattr(obj, "__module__", "") or "").split(".", 1)[0]
    return root in _LIBRARY_ROOTS


def _names(code: Any) -> set[str]:
    """The global and attribute names a code object (and the code nested in it) refers to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names(const)
    return names


def _functions_of(cls: type) -> list[Any]:
    out = []
    for klass in cls.__mro__:
        if _library(klass):
            continue
        for value in vars(klass).values():
            out.append(getattr(value, "__func__", value))  # staticmethod, classmethod
    return out


def compiled_functions(module: nn.Module) -> list[str]:
    """The functions ``torch.compile`` wrapped that the module's own code can call: a compiled
    method or attribute of a module class, or a compiled function its methods (or the helpers
    they call, :data:`MAX_DEPTH` levels) name as a global or a closure variable. Read from the
    code, nothing is called. Such a function runs under dynamo, which traces any torch function
    mode active when it is called into the graph it compiles (and guards on it), so a watch of
    the step would change the user's compiled code.

    Example:
        >>> ce = torch.compile(torch.nn.functional.cross_entropy)
        >>> class Net(nn.Linear):
        ...     def loss(self, x, y):
        ...         return ce(self(x), y)
        >>> compiled_functions(Net(2, 2)), compiled_functions(nn.Linear(2, 2))
        (['ce'], [])
    """
    found: dict[str, None] = {}
    seen: set[int] = set()

    def visit(fn: Any, depth: int) -> None:
        if id(fn) in seen or depth > MAX_DEPTH:
            return
        seen.add(id(fn))
        if holds_compiled(fn):
            found[str(getattr(fn, "__name__", None) or getattr(
                getattr(fn, DYNAMO_WRAPPED, None), "__name__", "a compiled function"))] = None
            return
        code = getattr(fn, "__code__", None)
        if code is None or _library(fn):
            return
        scope = getattr(fn, "__globals__", {})
        named = [(name, scope[name]) for name in _names(code) if name in scope]
        named += [("", c.cell_contents) for c in (getattr(fn, "__closure__", None) or ())
                  if _has_contents(c)]
        for name, value in named:
            if name and holds_compiled(value):
                found[name] = None
            elif callable(value) and not isinstance(value, type):
                visit(value, depth + 1)

    classes: set[type] = set()
    for sub in module.modules():
        own = [v for v in vars(sub).values() if hasattr(v, "__code__")]  # functions kept
        if type(sub) not in classes:
            classes.add(type(sub))
            own += _functions_of(type(sub))
        for fn in own:
            if holds_compiled(fn):
                found[getattr(fn, "__name__", "a compiled method")] = None
            elif callable(fn):
                visit(fn, 0)
    return list(found)


def _has_contents(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


__all__ = ["DYNAMO_WRAPPED", "MAX_DEPTH", "compiled_functions", "compiled_parts", "dynamo_type",
           "holds_compiled", "optimized_module_type", "traced_by_compile"]
