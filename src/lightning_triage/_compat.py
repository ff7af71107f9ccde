"""Every access to Lightning's and torchmetrics' internals, behind small named functions (private).

Written against Lightning 2.6.6 and torchmetrics 1.9 (what the test suite pins). Each function
says which internal it reads, what it falls back to where that internal is missing, and has a
test in ``tests/test_compat.py`` that fails when the fast path is not taken on the
pinned versions. No other module of the package reads a private Lightning or torchmetrics
attribute: ``tests/test_compat.py`` scans them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import lightning.pytorch as pl

try:  # not re-exported from `lightning.pytorch.utilities`: internal modules
    from lightning.pytorch.utilities.model_helpers import is_overridden as _lightning_is_overridden
except ImportError:  # pragma: no cover - the fallback is tested by patching this name
    _lightning_is_overridden = None  # type: ignore[assignment]
try:
    from lightning.pytorch.utilities.signature_utils import (
        is_param_in_hook_signature as _lightning_param_in_signature,
    )
except ImportError:  # pragma: no cover - the fallback is tested by patching this name
    _lightning_param_in_signature = None  # type: ignore[assignment]

#: ``trainer.precision`` values of fp16 mixed precision (a gradient scaler on CUDA).
FP16_AMP = ("16-mixed", "16", "16-mixed-amp")

#: Private attributes of ``LightningModule`` that a snapshot or copy of the module must leave
#: alone: references to the run's ``Trainer`` / ``Fabric`` (Lightning 2.6.6), not module state.
LIGHTNING_MODULE_REFERENCES = frozenset({"_trainer", "_fabric"})

#: Private attributes of a torchmetrics ``Metric`` that are state besides ``metric_state``
#: (torchmetrics 1.9): the update count, the cached ``compute()`` result, the last ``forward``.
METRIC_PRIVATE_STATE = ("_update_count", "_computed", "_forward_cache")


# ---------------------------------------------------------------------- the step counter
class StepCounter(Protocol):
    """Anything whose ``completed`` is the trainer's ``global_step``."""

    @property
    def completed(self) -> int: ...


class _GlobalStep:
    """The fallback counter: reads ``trainer.global_step`` (the public property) each time."""

    def __init__(self, trainer: pl.Trainer) -> None:
        self._trainer = trainer

    @property
    def completed(self) -> int:
        return self._trainer.global_step


def step_counter(trainer: pl.Trainer) -> StepCounter:
    """``trainer.global_step`` for a per-step hook, read in one attribute access.

    ``trainer.global_step`` is a chain of five properties, a cost that every training step pays
    for every read; this returns the progress counter that the chain ends at (checked against it
    now), or an object that reads the property where Lightning's loops differ. Resolve it again
    each epoch.

    Written against Lightning 2.6.6: ``trainer.fit_loop.epoch_loop`` then
    ``automatic_optimization.optim_progress.optimizer.step.total`` (automatic optimization) or
    ``manual_optimization.optim_step_progress.total`` (manual), a ``_ReadyCompletedTracker``.
    Fallback (another layout, or a counter that disagrees with ``global_step``): a
    :class:`_GlobalStep` reading the public property.
    """
    try:
        loop = trainer.fit_loop.epoch_loop
        module = trainer.lightning_module
        counter = (loop.automatic_optimization.optim_progress.optimizer.step.total
                   if module is None or module.automatic_optimization
                   else loop.manual_optimization.optim_step_progress.total)
        if isinstance(counter.completed, int) and counter.completed == trainer.global_step:
            return counter
    except AttributeError:
        pass
    return _GlobalStep(trainer)


def batches_completed(trainer: pl.Trainer) -> int:
    """The training batches the fit completed, each one call of the user's ``training_step``.

    Written against Lightning 2.6.6: ``trainer.fit_loop.epoch_loop.batch_progress.total``.
    Fallback (another layout): ``trainer.global_step``, the optimizer steps (fewer than the
    batches under gradient accumulation).
    """
    try:
        completed = trainer.fit_loop.epoch_loop.batch_progress.total.completed
        if isinstance(completed, int):
            return completed
    except AttributeError:
        pass
    return int(trainer.global_step)


# ---------------------------------------------------------------------- precision
def _precision_plugin(trainer: pl.Trainer) -> Any:
    """``trainer.precision_plugin`` (Lightning 2.6.6: the strategy's plugin), else the
    strategy's ``precision_plugin``, else ``None``."""
    plugin = getattr(trainer, "precision_plugin", None)
    if plugin is None:
        plugin = getattr(getattr(trainer, "strategy", None), "precision_plugin", None)
    return plugin


def grad_scaler(trainer: pl.Trainer) -> Any | None:
    """The run's gradient scaler (``torch.amp.GradScaler``), or ``None`` without one.

    Written against Lightning 2.6.6: the ``scaler`` attribute of the precision plugin
    (``MixedPrecision`` for ``16-mixed``; ``None`` for ``bf16-mixed``; absent on the other
    plugins). Fallback: ``None`` where the trainer has no precision plugin or the plugin no
    ``scaler``.
    """
    return getattr(_precision_plugin(trainer), "scaler", None)


def fp16_amp(trainer: pl.Trainer) -> bool:
    """Whether the run is fp16 mixed precision with a gradient scaler, whose skipped steps
    (non-finite gradients) are normal.

    Written against Lightning 2.6.6: a scaler on the precision plugin (:func:`grad_scaler`).
    Fallback, where no scaler is found: ``trainer.precision`` (public) in :data:`FP16_AMP` on a
    CUDA root device, where Lightning creates one.
    """
    if grad_scaler(trainer) is not None:
        return True
    return str(trainer.precision) in FP16_AMP and trainer.strategy.root_device.type == "cuda"


def _plugin_context(trainer: pl.Trainer, name: str) -> AbstractContextManager[Any]:
    """The precision plugin's context ``name`` (``nullcontext`` without a plugin or one that
    lacks it: full precision)."""
    context: Callable[[], AbstractContextManager[Any]] | None = getattr(
        _precision_plugin(trainer), name, None)
    return context() if context is not None else nullcontext()


def train_step_context(trainer: pl.Trainer) -> AbstractContextManager[Any]:
    """The context the run's ``training_step`` runs in (autocast under mixed precision).

    Written against Lightning 2.6.6: ``trainer.precision_plugin.train_step_context()``.
    Fallback, without a precision plugin: no context (``nullcontext``), full precision.
    """
    return _plugin_context(trainer, "train_step_context")


def forward_context(trainer: pl.Trainer) -> AbstractContextManager[Any]:
    """The context the run's ``forward`` runs in (autocast under mixed precision).

    Written against Lightning 2.6.6: ``trainer.precision_plugin.forward_context()``.
    Fallback, without a precision plugin: no context (``nullcontext``), full precision.
    """
    return _plugin_context(trainer, "forward_context")


# ---------------------------------------------------------------------- signatures and overrides
def _is_overridden_fallback(name: str, module: Any) -> bool:
    method = getattr(type(module), name, None)
    base = getattr(pl.LightningModule, name, None)
    if method is None:
        return False
    method = getattr(method, "__wrapped__", method)  # a decorated override (`@torch.no_grad`)
    return method is not base


def is_overridden(name: str, module: Any) -> bool:
    """Whether ``type(module)`` overrides the ``LightningModule`` method ``name``
    (``validation_step``...); ``False`` for ``module=None``.

    Written against Lightning 2.6.6: ``lightning.pytorch.utilities.model_helpers.is_overridden``
    (not re-exported from ``lightning.pytorch.utilities``). Fallback, where that import fails:
    the method found on the class is not ``LightningModule``'s own.
    """
    if module is None:
        return False
    if _lightning_is_overridden is not None:
        return bool(_lightning_is_overridden(name, module))
    return _is_overridden_fallback(name, module)


def _param_in_signature_fallback(hook: Callable[..., Any], param: str, min_args: int | None) -> bool:
    hook = getattr(hook, "__wrapped__", hook)
    spec = inspect.getfullargspec(hook)
    args = spec.args[1:]  # `self` (getfullargspec keeps it for bound methods too)
    return param in args or spec.varargs is not None or (min_args is not None and len(args) >= min_args)


def hook_takes(hook: Callable[..., Any], param: str, *, min_args: int | None = None) -> bool:
    """Whether Lightning passes ``param`` to ``hook``: it is named in the signature, the hook
    takes ``*args``, or it takes at least ``min_args`` arguments besides ``self``. The rule
    Lightning's loops use for ``training_step(batch, batch_idx)``:
    ``hook_takes(module.training_step, "batch_idx", min_args=2)``.

    Written against Lightning 2.6.6:
    ``lightning.pytorch.utilities.signature_utils.is_param_in_hook_signature`` (an internal
    module). Fallback, where that import fails: the same rule over ``inspect.getfullargspec``.
    """
    if _lightning_param_in_signature is not None:
        return bool(_lightning_param_in_signature(hook, param, min_args=min_args))
    return _param_in_signature_fallback(hook, param, min_args)


# ---------------------------------------------------------------------- hook dispatch
def skip_hook(callback: Any, name: str) -> None:
    """Have Lightning skip ``callback``'s hook ``name`` (until :func:`unskip_hooks`): the step
    then does not pay its dispatch.

    Written against Lightning 2.6.6: the trainer calls a callback's hook only when
    ``getattr(callback, name)`` is callable, so an instance attribute ``None`` hides the class's
    method. No fallback: ``tests/test_compat.py`` fails if a fit calls a skipped hook or
    breaks on one.
    """
    callback.__dict__[name] = None


def unskip_hooks(callback: Any, names: Iterable[str]) -> None:
    """Undo :func:`skip_hook` for ``names`` (the class's methods are seen again)."""
    for name in names:
        callback.__dict__.pop(name, None)


def training_step_args(module: Any, batch: Any, batch_idx: int) -> tuple[Any, ...]:
    """The arguments Lightning would pass to ``module.training_step`` for this batch:
    ``(batch, batch_idx)``, or ``(batch,)`` when the step takes no ``batch_idx``
    (:func:`hook_takes`, the loops' own rule)."""
    if hook_takes(module.training_step, "batch_idx", min_args=2):
        return batch, batch_idx
    return (batch,)


# ---------------------------------------------------------------------- modules and metrics
def share_trainer(copy: Any, original: Any) -> None:
    """Give a deep copy of a ``LightningModule`` the original's trainer reference, which
    ``LightningModule.__getstate__`` drops (the copy's ``self.trainer`` then works).

    Written against Lightning 2.6.6: the private ``_trainer`` attribute, copied as is (``None``
    stays ``None``; child modules are handled by the caller, one pair at a time). Fallback,
    where the original has no ``_trainer``: the public ``trainer`` property and setter, nothing
    when the original is not attached.
    """
    if "_trainer" in vars(original):
        copy._trainer = original._trainer
        return
    try:
        trainer = original.trainer
    except RuntimeError:  # not attached to a `Trainer`
        return
    copy.trainer = trainer


def metric_state(metric: Any) -> dict[str, Any]:
    """Everything that puts a torchmetrics ``Metric`` back where it was: its registered states
    (the public ``metric_state``) and the private update count, cached ``compute()`` result and
    last ``forward`` output. Values as they are (not copied); :func:`set_metric_state` writes
    them back.

    Written against torchmetrics 1.9: :data:`METRIC_PRIVATE_STATE`. Fallback: the private
    names a metric lacks are left out.
    """
    state = dict(metric.metric_state)
    state.update({k: getattr(metric, k) for k in METRIC_PRIVATE_STATE if hasattr(metric, k)})
    return state


def set_metric_state(metric: Any, state: dict[str, Any]) -> None:
    """Write back a :func:`metric_state` (``object.__setattr__``: no ``nn.Module`` bookkeeping,
    as torchmetrics' own ``_reduce_states``)."""
    for key, value in state.items():
        object.__setattr__(metric, key, value)


def forget_lightning_compile(module: Any) -> None:
    """Drop Lightning's record of a compile (``_compiler_ctx``, set when a LightningModule is
    passed to ``fit`` compiled) from ``module``: a probe's copy whose compiled methods were
    rebound to its own eager ones is not compiled."""
    if isinstance(vars(module).get("_compiler_ctx"), dict):
        module.__dict__["_compiler_ctx"] = None


# ---------------------------------------------------------------------- the loops' limits
def loop_limits(trainer: Any) -> list[tuple[Any, str, Any]]:
    """``(owner, name, value)`` of the stopping limits a user's step can write on the trainer's
    loops (``self.trainer.fit_loop.max_epochs = 1``), for a probe to put back.

    Written against Lightning 2.6.6: ``trainer.fit_loop`` (``max_epochs``, ``min_epochs``,
    ``max_batches``) and ``trainer.fit_loop.epoch_loop`` (``max_steps``, ``min_steps``), plain
    values. Fallback (another layout): the limits that are found; none when there is no fit
    loop.
    """
    fit_loop = getattr(trainer, "fit_loop", None)
    epoch_loop = getattr(fit_loop, "epoch_loop", None)
    plain = (bool, int, float, str, type(None))
    return [(owner, name, getattr(owner, name))
            for owner, names in ((fit_loop, ("max_epochs", "min_epochs", "max_batches")),
                                 (epoch_loop, ("max_steps", "min_steps")))
            if owner is not None
            for name in names if isinstance(getattr(owner, name, None), plain)]
