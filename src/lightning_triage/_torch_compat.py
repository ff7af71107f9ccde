"""Every use of torch's private functions, behind small named functions (private).

The torch-side twin of :mod:`lightning_triage._compat` (which reads Lightning's internals and
imports Lightning): this module imports torch alone, so the functional core may use it. Each
function says which private it calls and what it falls back to where that private is missing;
``tests/test_compat.py`` holds that no other module calls them and that the fast path is taken
on the pinned torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def foreach_norms(tensors: Sequence[Tensor], ord: float = 2,
                  dtype: torch.dtype | None = None) -> list[Tensor]:
    """The ``ord``-norm of each tensor, as 0-dim tensors on their devices (no host sync).

    One multi-tensor kernel, ``torch._foreach_norm`` (what ``clip_grad_norm_`` uses); a loop of
    :func:`torch.linalg.vector_norm` where it is missing (``dtype``: each tensor cast first).
    Errors of the kernel (a sparse or complex tensor it cannot read, a ``dtype`` narrower than
    a tensor's) reach the caller.

    Example:
        >>> [float(n) for n in foreach_norms([torch.tensor([3.0, 4.0]), torch.ones(4)])]
        [5.0, 2.0]
        >>> [float(n) for n in foreach_norms([torch.tensor([1.0, -3.0])], float("inf"))]
        [3.0]
    """
    fused = getattr(torch, "_foreach_norm", None)
    if fused is not None:
        return list(fused(list(tensors), ord, dtype=dtype))
    return [torch.linalg.vector_norm(t if dtype is None else t.to(dtype), ord) for t in tensors]


def exit_function_mode(mode: object) -> None:
    """Take ``mode`` (a ``TorchFunctionMode`` entered with ``__enter__``) off the torch function
    mode stack, wherever it is: modes entered after it (another watch started and not yet
    stopped) stay, in their order.

    ``torch.overrides._get_current_function_mode_stack``, ``_pop_mode`` and ``_push_mode``;
    without them, ``mode.__exit__`` (which pops the top of the stack).

    Example:
        >>> from torch.overrides import TorchFunctionMode
        >>> a, b = TorchFunctionMode(), TorchFunctionMode()
        >>> _ = a.__enter__(); _ = b.__enter__()
        >>> exit_function_mode(a)
        >>> torch.overrides._get_current_function_mode_stack() == [b]
        True
        >>> exit_function_mode(b)
    """
    overrides = torch.overrides
    stack_of = getattr(overrides, "_get_current_function_mode_stack", None)
    pop, push = getattr(overrides, "_pop_mode", None), getattr(overrides, "_push_mode", None)
    if stack_of is None or pop is None or push is None:
        mode.__exit__(None, None, None)  # type: ignore[attr-defined]
        return
    stack = list(stack_of())
    if not any(m is mode for m in stack):
        return
    above = []
    while True:
        top = pop()
        if top is mode:
            break
        above.append(top)
    for m in reversed(above):
        push(m)


__all__ = ["exit_function_mode", "foreach_norms"]
