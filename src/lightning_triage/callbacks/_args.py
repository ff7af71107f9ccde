"""Validation of the callbacks' arguments (private): one error type, one message shape.

Every helper raises :class:`~lightning_triage.errors.TriageConfigError` with a message that names
the argument, shows the value and says what is allowed: "`max_steps` must be an integer >= 2,
got 0." Inside :func:`aliases` (used by :class:`~lightning_triage.Triage` while it builds its
checks) the argument is named as the user spelled it: ``Triage(overfit_max_steps=0)`` says
`overfit_max_steps`, not the check's own `max_steps`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Union

from lightning_triage.errors import TriageConfigError

#: One argument of a check as the ``Triage`` bundle passes it (``TriageCallback.bundle_args``):
#: the name of the bundle's argument, or a function of all the bundle's arguments.
BundleArg = Union[str, Callable[[Mapping[str, Any]], Any]]  # noqa: UP007 (a runtime alias)
#: The monitors' cap on their window in the bundle (``max_window_steps``), raised to
#: ``window_steps`` when that is larger: ``Triage`` has no ``max_window_steps`` of its own.
BUNDLE_MAX_WINDOW_STEPS = 5000


def passes(*names: str) -> dict[str, BundleArg]:
    """``bundle_args`` for arguments the bundle passes under the same name.

    Example:
        >>> passes("task", "num_classes")
        {'task': 'task', 'num_classes': 'num_classes'}
    """
    return {name: name for name in names}


def bundle_window_cap(args: Mapping[str, Any]) -> int:
    """The monitors' ``max_window_steps`` in the bundle (see :data:`BUNDLE_MAX_WINDOW_STEPS`)."""
    steps = args["window_steps"]
    return max(BUNDLE_MAX_WINDOW_STEPS, steps) if isinstance(steps, int) else BUNDLE_MAX_WINDOW_STEPS


_ALIASES: ContextVar[Mapping[str, str] | None] = ContextVar("lightning_triage_arg_aliases",
                                                           default=None)


@contextmanager
def aliases(**names: str) -> Iterator[None]:
    """Name the checks' arguments by the caller's names in the errors raised inside, e.g.
    ``aliases(max_steps="overfit_max_steps")``."""
    token = _ALIASES.set({**(_ALIASES.get() or {}), **names})
    try:
        yield
    finally:
        _ALIASES.reset(token)


def arg(name: str) -> str:
    """``name`` as the user spelled it (its alias inside :func:`aliases`)."""
    return (_ALIASES.get() or {}).get(name, name)


def fail(name: str, value: Any, allowed: str) -> TriageConfigError:
    """The error for argument ``name``: "`name` must be <allowed>, got <value>."."""
    shown = arg(name)
    return TriageConfigError(f"`{shown}` must be {allowed}, got {value!r}.", argument=shown,
                             value=value)


def check_bool(name: str, value: Any) -> None:
    """``value`` is a bool."""
    if not isinstance(value, bool):
        raise fail(name, value, "True or False")


def check_int(name: str, value: Any, low: int | None = None, high: int | None = None, *,
              optional: bool = False) -> None:
    """``value`` is an integer (not a bool) in ``[low, high]`` (or ``None`` when ``optional``)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) \
            or (low is not None and value < low) or (high is not None and value > high):
        if low is None:
            allowed = "an integer" if high is None else f"an integer <= {high}"
        else:
            allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise fail(name, value, allowed + (" or None" if optional else ""))


def check_number(name: str, value: Any, low: float | None = None, high: float | None = None, *,
                 low_open: bool = True, high_open: bool = True, unit: str = "") -> None:
    """``value`` is a real number (not a bool, not NaN) between ``low`` and ``high`` (open
    bounds unless told), e.g. ``check_number("tolerance", t, 0, 1)`` for (0, 1): "`tolerance`
    must be in (0, 1), got 1.0."."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if ok:
        return
    what = f"a number of {unit} " if unit else ""
    if low is not None and high is not None:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise fail(name, value, f"{what}in {interval}")
    if low is not None:
        raise fail(name, value, f"{what}{'>' if low_open else '>='} {low:g}")
    if high is not None:
        raise fail(name, value, f"{what}{'<' if high_open else '<='} {high:g}")
    raise fail(name, value, what.strip() or "a number")


def check_choice(name: str, value: Any, choices: Collection[Any]) -> None:
    """``value`` is one of ``choices``."""
    if value not in choices:
        raise fail(name, value, f"one of {tuple(choices)}")


def check_causal(value: Any) -> None:
    """``causal`` is True (always probe causality), False (never) or None (when the batch is
    next-token data)."""
    if value is not None and not isinstance(value, bool):
        raise fail("causal", value, "True (always probe), False (never) or None (when the batch "
                                    "is next-token data)")


def check_batch_key(name: str, value: Any) -> None:
    """``value`` names a batch entry: a key or attribute name, an index, a callable or None."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int))) \
            and not callable(value):
        raise fail(name, value, "a key or attribute name, an index, a callable `batch -> tensor` "
                                "or None")


def check_batch_keys(**keys: Any) -> None:
    """Each argument (name=value) names a batch entry (:func:`check_batch_key`): the one check of
    the ``input_key``/``target_key`` arguments (and the like) the constructors share.

    Example:
        >>> check_batch_keys(input_key="x", target_key=1)
        >>> check_batch_keys(target_key=2.5)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_triage.errors.TriageConfigError: `target_key` must be a key ... or None, got 2.5.
    """
    for name, value in keys.items():
        check_batch_key(name, value)


def check_callable(name: str, value: Any, signature: str) -> None:
    """``value`` is a callable (described by ``signature``) or None."""
    if value is not None and not callable(value):
        raise fail(name, value, f"a callable `{signature}` or None")


def _stable(value: Any) -> Any:
    """A value whose repr is the same in every process (a callable by its qualified name)."""
    if callable(value):
        return getattr(value, "__qualname__", type(value).__qualname__)
    return value


def state_key_of(callback: Any, names: Collection[str]) -> str:
    """The ``state_key`` of ``callback``: its class name, followed (as Lightning's
    ``EarlyStopping`` does) by the arguments among ``names`` that differ from their defaults, so
    two instances that differ there keep separate states in a checkpoint, and an instance with
    the defaults reads checkpoints written before there were such keys."""
    params = inspect.signature(type(callback).__init__).parameters
    given = {}
    for name in names:
        value = getattr(callback, name)
        default = params[name].default if name in params else inspect.Parameter.empty
        if default is inspect.Parameter.empty or value != default:
            given[name] = _stable(value)
    if not given:
        return type(callback).__qualname__
    return f"{type(callback).__qualname__}{given!r}"
