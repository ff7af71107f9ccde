"""Random draws: which random functions a piece of code calls, dropout told apart from the rest.

Objectives such as diffusion (a fresh noise and timestep per step), masked modelling (a fresh
mask) or a VAE (a sampled latent) draw random numbers in their step on purpose; dropout draws
them because its layer is in training mode. A :class:`DrawWatch` records both kinds while the
code runs, by the name of the function called, so a check can tell "the objective samples" from
"dropout is on". It only observes: every call runs as it is, with the same arguments.

Example:
    >>> import torch
    >>> import torch.nn.functional as F
    >>> with DrawWatch() as watch:
    ...     noise = torch.randn(4, 3)
    ...     _ = F.dropout(noise, p=0.5, training=True)
    ...     _ = F.dropout(noise, p=0.5, training=False)
    >>> watch.draws, watch.dropouts
    (['randn'], ['dropout'])
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

#: The dropout functions (they draw only when called in training mode).
DROPOUTS: frozenset[Any] = frozenset({
    F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
    torch.dropout, torch.alpha_dropout, torch.feature_dropout, torch.feature_alpha_dropout,
})
_TORCH_DROPOUTS: frozenset[Any] = frozenset({
    torch.dropout, torch.alpha_dropout, torch.feature_dropout, torch.feature_alpha_dropout})
#: ``scaled_dot_product_attention``'s positional index of ``dropout_p``.
SDPA_DROPOUT_ARG = 4

#: Functions and tensor methods that draw from a random generator (by ``__name__``).
RANDOM_FUNCTIONS: frozenset[str] = frozenset({
    "rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm",
    "normal", "bernoulli", "multinomial", "poisson", "binomial", "_standard_gamma",
    "_sample_dirichlet", "normal_", "uniform_", "bernoulli_", "random_", "exponential_",
    "geometric_", "log_normal_", "cauchy_", "rrelu", "rrelu_", "gumbel_softmax",
})
#: At most this many names are kept per list.
MAX_NAMES = 64


def _name(func: Any) -> str:
    return str(getattr(func, "__name__", func))


def _training(kwargs: dict[str, Any], args: tuple[Any, ...], position: int) -> bool:
    """The ``training`` flag of an ``F.dropout*`` call (``True`` when not given)."""
    value = kwargs.get("training", args[position] if len(args) > position else True)
    return bool(value)


def is_active_dropout(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a call of ``func`` with these arguments drops (a dropout in training mode with
    ``p > 0``, or attention with ``dropout_p > 0``).

    Example:
        >>> x = torch.ones(3)
        >>> is_active_dropout(F.dropout, (x,), {"p": 0.1, "training": True})
        True
        >>> is_active_dropout(F.dropout, (x, 0.1, False), {})
        False
        >>> is_active_dropout(torch.add, (x, x), {})
        False
    """
    if func in DROPOUTS:
        if func in _TORCH_DROPOUTS:  # torch.dropout(input, p, train)
            p = kwargs.get("p", args[1] if len(args) > 1 else 0.0)
            return bool(kwargs.get("train", args[2] if len(args) > 2 else False)) and float(p) > 0
        p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
        return _training(kwargs, args, 2) and float(p) > 0
    if func is F.scaled_dot_product_attention:
        p = kwargs.get("dropout_p", args[SDPA_DROPOUT_ARG] if len(args) > SDPA_DROPOUT_ARG else 0.0)
        return float(p) > 0
    return False


class DrawWatch(TorchFunctionMode):
    """A torch function mode that records the random draws of the code it wraps.

    ``draws`` names the random functions called (``randn``, ``randint``, ``normal_``...) other
    than dropout; ``dropouts`` names the dropout calls that dropped (training mode, ``p > 0``,
    attention with ``dropout_p > 0``). Neither changes any call.

    Example:
        >>> with DrawWatch() as watch:
        ...     t = torch.randint(0, 10, (4,))
        ...     _ = torch.empty(3).uniform_()
        >>> watch.draws
        ['randint', 'uniform_']
        >>> watch.sampled
        True
    """

    def __init__(self) -> None:
        super().__init__()
        self.draws: list[str] = []
        self.dropouts: list[str] = []

    @property
    def sampled(self) -> bool:
        """Whether the code drew random numbers other than dropout."""
        return bool(self.draws)

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = _name(func)
        if is_active_dropout(func, tuple(args), kwargs):
            if len(self.dropouts) < MAX_NAMES:
                self.dropouts.append(name)
        elif name in RANDOM_FUNCTIONS and func not in DROPOUTS and len(self.draws) < MAX_NAMES:
            self.draws.append(name)
        return func(*args, **kwargs)


def draws_of(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, DrawWatch]:
    """Call ``fn(*args, **kwargs)`` under a :class:`DrawWatch`; return its result and the watch.

    Example:
        >>> out, watch = draws_of(lambda n: torch.rand(n).sum(), 3)
        >>> watch.draws
        ['rand']
    """
    with DrawWatch() as watch:
        out = fn(*args, **kwargs)
    return out, watch


__all__ = ["DROPOUTS", "RANDOM_FUNCTIONS", "SDPA_DROPOUT_ARG", "DrawWatch", "draws_of",
           "is_active_dropout"]
