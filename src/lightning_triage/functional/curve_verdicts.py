"""Stage 7 (curve): the verdicts the loss-curve check adds beside the window's classification
(:func:`~lightning_triage.functional.curve.classify_curve`), with this run's numbers.

- :func:`late_event_verdict`: a spike or a divergence of the training loss after the
  first-epochs window (``curve.loss_spike``, ``curve.diverging``);
- :func:`validation_verdict`: the window could not show overfitting, for lack of validation
  losses (``curve.no_validation``, ``curve.sparse_validation``; info).

The advice is each code's registry hint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightning_triage.functional.spikes import SpikeEvent, grew_before
from lightning_triage.functional.verdict import Verdict


def late_event_verdict(event: SpikeEvent, steps: Sequence[int], values: Sequence[float],
                       diverge_ratio: float) -> Verdict | None:
    """A :class:`~lightning_triage.functional.spikes.SpikeEvent` of the training loss after the
    first-epochs window, as a verdict.

    Args:
        event: the event.
        steps: the steps of the recent training losses.
        values: those losses.
        diverge_ratio: how far the loss must have grown before a non-finite value for it to be a
            divergence (see :func:`~lightning_triage.functional.spikes.grew_before`).

    Returns:
        ``curve.loss_spike`` for a spike; ``curve.diverging`` for a rise that stays, or a
        non-finite loss after the loss grew; ``None`` for a sustained fall and for a NaN/Inf out
        of the blue (the numerics stage locates it).

    Example:
        >>> e = SpikeEvent("spike", 900, 30.0, 2.0, 0.1, 15.0, 900)
        >>> late_event_verdict(e, [], [], 3.0).message[:62]
        'loss spike at step 900 (after the first-epochs window): 30, 15'
        >>> e = SpikeEvent("nonfinite", 900, float("nan"), 2.0, 0.1, float("inf"), 900)
        >>> late_event_verdict(e, [899, 900], [2.0, float("nan")], 3.0) is None  # out of the blue
        True
    """
    if event.kind == "spike":
        code = "curve.loss_spike"
        message = (f"loss spike at step {event.step} (after the first-epochs window): "
                   f"{event.value:.4g}, {event.ratio:.1f}x the running level {event.level:.4g} "
                   f"(robust std {event.spread:.3g}).")
    elif event.kind == "sustained":
        if not event.value > event.level:
            return None
        code = "curve.diverging"
        message = (f"the loss rose from a running level of {event.level:.4g} to "
                   f"{event.value:.4g} ({event.ratio:.1f}x) at step {event.step} and stayed there "
                   f"(confirmed at step {event.confirmed_step}): late divergence.")
    else:
        i = list(steps).index(event.step) if event.step in steps else 0
        if not grew_before(values, i, event.level, diverge_ratio):
            return None
        code = "curve.diverging"
        message = (f"the training loss became {event.value} at step {event.step} (after the "
                   f"first-epochs window; running level before: {event.level:.4g}).")
    return Verdict(code, event.step, message,
                   evidence={"step": event.step, "value": event.value,
                             "level_before": event.level, "spread": event.spread,
                             "ratio": event.ratio, "kind": event.kind,
                             "confirmed_step": event.confirmed_step, "after_window": True})


@dataclass(frozen=True)
class ValidationSeen:
    """What a fit showed of its validation, for :func:`validation_verdict`.

    Attributes:
        runs: validation runs in the fit (sanity check excluded).
        losses: validation losses found in the fit.
        in_window: validation losses inside the first-epochs window.
        window_steps: training steps in the window.
        epochs: training epochs run so far (``current_epoch``).
        module: the LightningModule's class name.
        has_validation_step: the module overrides ``validation_step``.
        limit_val_batches_zero: ``limit_val_batches=0``.
        has_val_loader: a validation dataloader was given.
        check_val_every_n_epoch: the trainer's setting.
        val_check_interval: the trainer's setting (as written).
    """

    runs: int
    losses: int
    in_window: int
    window_steps: int
    epochs: int
    module: str = "LightningModule"
    has_validation_step: bool = True
    limit_val_batches_zero: bool = False
    has_val_loader: bool = True
    check_val_every_n_epoch: int | None = 1
    val_check_interval: int | float | str = 1.0


def _no_loss_reason(seen: ValidationSeen) -> str:
    if seen.runs:
        return (f"validation ran {seen.runs} time(s) but no loss was found: return it from "
                "`validation_step`, log `val_loss`, or pass `val_key=`")
    if not seen.has_validation_step:
        return f"`{seen.module}` has no `validation_step`"
    if seen.limit_val_batches_zero:
        return "`limit_val_batches=0`"
    if not seen.has_val_loader:
        return "no validation dataloader was given"
    return (f"validation never ran in {seen.epochs + 1} epoch(s) (`check_val_every_n_epoch` = "
            f"{seen.check_val_every_n_epoch}, `val_check_interval` = {seen.val_check_interval})")


def validation_verdict(seen: ValidationSeen, needed: int) -> Verdict | None:
    """Whether the window could judge overfitting, for lack of validation losses.

    Args:
        seen: what the fit showed of its validation.
        needed: the validation losses the overfitting rule needs inside the window.

    Returns:
        ``curve.no_validation`` when the fit has no validation loss (the reason in the
        message and ``evidence["reason"]``), ``curve.sparse_validation`` when fewer than
        ``needed`` fell inside the window and validation ran less often than once per epoch,
        else ``None``; ``step`` is ``None`` (the current step).

    Example:
        >>> v = validation_verdict(ValidationSeen(0, 0, 0, 120, 2, "Net", False), 3)
        >>> v.code, v.evidence["reason"]
        ('curve.no_validation', '`Net` has no `validation_step`')
        >>> validation_verdict(ValidationSeen(1, 1, 1, 120, 4), 3).code
        'curve.sparse_validation'
        >>> validation_verdict(ValidationSeen(4, 4, 1, 120, 3), 3) is None  # once per epoch
        True
    """
    if seen.runs == 0 or not seen.losses:
        why = _no_loss_reason(seen)
        return Verdict(
            "curve.no_validation", None,
            f"No validation loss in this fit ({why}): overfitting cannot be seen; the curve "
            f"verdict rests on the training loss of {seen.window_steps} steps alone.",
            evidence={"reason": why, "validation_runs": seen.runs,
                      "window_steps": seen.window_steps})
    if seen.in_window < needed and seen.runs < seen.epochs:
        # rarer than once per epoch (once per epoch is the norm: not worth a note)
        return Verdict(
            "curve.sparse_validation", None,
            f"Only {seen.in_window} validation loss(es) inside the first-epochs window of "
            f"{seen.window_steps} steps ({seen.runs} validation run(s) in the fit): the "
            f"overfitting rule needs at least {needed}.",
            evidence={"validation_in_window": seen.in_window, "validation_runs": seen.runs,
                      "needed": needed, "window_steps": seen.window_steps,
                      "check_val_every_n_epoch": seen.check_val_every_n_epoch,
                      "val_check_interval": str(seen.val_check_interval)})
    return None


__all__ = ["ValidationSeen", "late_event_verdict", "validation_verdict"]
