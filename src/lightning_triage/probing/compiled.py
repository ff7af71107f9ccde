"""The user's compiled graphs are the user's: probes run eagerly, copies run their own code.

``torch.compile`` keeps its graphs per code object, guarded on what a call sees (shapes, the
``training`` flag, grad mode, hooks). A probe that calls a compiled module on a copy, in eval
mode, under ``no_grad`` or with another batch size adds graphs to the *user's* cache, pushes
it past ``torch._dynamo.config.recompile_limit`` (after which dynamo silently runs that code
eagerly for the rest of the process) and can mark the batch dimension dynamic (another graph,
other rounding). So every probe runs under :func:`eager` (dynamo's ``force_eager`` stance: no
compilation, no cache lookup, no guard), and a copy made for a probe calls its own code, never
the original module's compiled wrappers (:func:`rebind_compiled`). Which submodules a hook on
the live model must avoid: :func:`lightning_triage.functional.compiled.traced_by_compile`.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from lightning_triage._compat import forget_lightning_compile
from lightning_triage.functional.compiled import DYNAMO_WRAPPED, dynamo_type, holds_compiled


def _is_dynamo_context(value: Any) -> bool:
    context = dynamo_type("_TorchDynamoContext")
    return context is not None and isinstance(value, context)


def shared_compile_state(module: nn.Module) -> list[Any]:
    """Dynamo's objects the module holds (the compile contexts of its wrappers): a copy shares
    them instead of deep-copying the compiler's configuration."""
    found = []
    for sub in module.modules():
        for value in vars(sub).values():
            items = value.values() if isinstance(value, dict) else (value,)
            found += [v for v in items if _is_dynamo_context(v)]
    return found


def rebind_compiled(twin: nn.Module, memo: dict[int, Any]) -> None:
    """In a deep copy made through ``memo``, make every compiled wrapper that the copy inherited
    as an attribute call the copy's own method, eagerly. A deep copy keeps functions as they
    are, so ``sub.compile()``'s ``_compiled_call_impl`` and the compiled ``forward`` and
    ``*_step`` that Lightning sets on a LightningModule compiled before ``fit`` would otherwise
    run the *original* module (its weights, its graphs) when the copy is called.

    Example:
        >>> import copy
        >>> net = nn.Linear(2, 2)
        >>> net.compile()
        >>> memo = {}
        >>> twin = copy.deepcopy(net, memo)
        >>> rebind_compiled(twin, memo)
        >>> twin._compiled_call_impl is None
        True
    """
    for sub in twin.modules():
        if getattr(sub, "_compiled_call_impl", None) is not None:
            sub._compiled_call_impl = None  # the copy runs eagerly
        for name, value in list(vars(sub).items()):
            if not holds_compiled(value):
                continue
            inner = getattr(value, DYNAMO_WRAPPED)
            owner = getattr(inner, "__self__", None)
            if isinstance(inner, types.MethodType) and id(owner) in memo:
                sub.__dict__[name] = types.MethodType(inner.__func__, memo[id(owner)])
        forget_lightning_compile(sub)


@contextmanager
def eager() -> Iterator[None]:
    """Run the block with every ``torch.compile`` directive ignored (dynamo's ``force_eager``
    stance): nothing is compiled, no cached graph is looked up, no guard is evaluated, so the
    user's graphs and their recompile counts are exactly as the block found them.

    Example:
        >>> f = torch.compile(lambda x: x + 1)
        >>> with eager():
        ...     f(torch.zeros(1)).tolist()
        [1.0]
    """
    set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    if set_stance is None:  # torch < 2.6 has no stance: dynamo's global switch
        with torch._dynamo.config.patch(disable=True):
            yield
        return
    with set_stance("force_eager"):
        yield


__all__ = ["eager", "rebind_compiled", "shared_compile_state"]
