"""What a probe must leave as it found it outside the module: every global RNG, the trainer's
loggers, the module's ``self.log``; the objects a probe shares with the run (never copied); the
errors a probe reports (the user's code failing, no memory for a probe)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader, Dataset

from lightning_triage._compat import loop_limits

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


# ---------------------------------------------------------------------- the trainer's state
@contextmanager
def trainer_state(trainer: pl.Trainer | None) -> Iterator[None]:
    """Put back what the user's ``training_step``/``validation_step`` run by a probe can write
    on the shared trainer: every public plain attribute (``should_stop``, ``limit_*_batches``,
    ``val_check_interval``, ``accumulate_grad_batches``, ``gradient_clip_val`` ...), the
    stopping limits of the fit loop, the trainer's ``state``, the ``callbacks`` list and the
    ``callback_metrics`` dict (same objects, contents put back).

    Example:
        >>> trainer = pl.Trainer(logger=False, enable_progress_bar=False)
        >>> with trainer_state(trainer):
        ...     trainer.should_stop = True
        ...     trainer.limit_val_batches = 0
        >>> trainer.should_stop, trainer.limit_val_batches
        (False, 1.0)
    """
    if trainer is None:
        yield
        return
    plain = (bool, int, float, str, type(None))
    attrs = {k: v for k, v in vars(trainer).items()
             if not k.startswith("_") and isinstance(v, plain)}
    loops = loop_limits(trainer)
    state = getattr(trainer, "state", None)
    state_items = dict(vars(state)) if state is not None and hasattr(state, "__dict__") else {}
    callbacks = getattr(trainer, "callbacks", None)
    saved_callbacks = list(callbacks) if isinstance(callbacks, list) else None
    metrics: Any = None
    saved_metrics: dict[str, Any] = {}
    with suppress(Exception):
        metrics = trainer.callback_metrics
        saved_metrics = dict(metrics)
    try:
        yield
    finally:
        for key, value in attrs.items():
            with suppress(Exception):
                setattr(trainer, key, value)
        for owner, name, value in loops:
            with suppress(Exception):
                setattr(owner, name, value)
        for key, value in state_items.items():
            with suppress(Exception):
                setattr(state, key, value)
        if saved_callbacks is not None and isinstance(callbacks, list):
            callbacks[:] = saved_callbacks
            with suppress(Exception):
                trainer.__dict__["callbacks"] = callbacks
        if isinstance(metrics, dict):
            metrics.clear()
            metrics.update(saved_metrics)


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


def _is_ours(fn: Any) -> bool:
    fn = getattr(fn, "func", fn)  # functools.partial
    fn = getattr(fn, "__func__", fn)  # bound method
    return str(getattr(fn, "__module__", "") or "").startswith("lightning_triage")


def _hook_dicts(module: nn.Module) -> list[dict[Any, Any]]:
    return [v for k, v in vars(module).items() if "hooks" in k and isinstance(v, dict)]


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

