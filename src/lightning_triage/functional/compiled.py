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


__all__ = ["DYNAMO_WRAPPED", "compiled_parts", "dynamo_type", "holds_compiled", "optimized_module_type",
           "traced_by_compile"]
