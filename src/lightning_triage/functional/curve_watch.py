"""The loss curve's watch (stage 7, curve): which of the curve's verdicts become findings over a
run, free of Lightning.

A caller (``LossCurveMonitor``, or a plain PyTorch loop) classifies the first-epochs window with
:func:`~lightning_triage.functional.curve.classify_curve` as the losses come, and watches the
loss after it with a :class:`~lightning_triage.functional.spikes.SpikeWatch`. A
:class:`CurveWatch` decides what of that to report:

- :meth:`CurveWatch.window`: the window's verdicts, each once (the classifier runs again on
  every flush), ``curve.healthy`` only while nothing else was found, one divergence and one
  overfitting verdict per window, no overfitting while the user memorizes a few batches on
  purpose (``Trainer(overfit_batches=...)``);
- :meth:`CurveWatch.late`: the loss spikes and divergences after the window
  (:func:`~lightning_triage.functional.curve_verdicts.late_event_verdict`), counted, each
  reported once, at most about 200;
- :meth:`CurveWatch.validation`: at the end of training, why the window could not show
  overfitting (:func:`~lightning_triage.functional.curve_verdicts.validation_verdict`), once.

The caller emits what these return; the rules are those of :mod:`~lightning_triage.functional.curve`
and :mod:`~lightning_triage.functional.curve_verdicts`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from lightning_triage.functional.curve import CurveThresholds
from lightning_triage.functional.curve_verdicts import (
    ValidationSeen,
    late_event_verdict,
    validation_verdict,
)
from lightning_triage.functional.spikes import SpikeEvent
from lightning_triage.functional.verdict import Verdict

#: Codes reported at most once per window, whatever the classifier says later.
ONCE_PER_WINDOW = ("curve.diverging", "curve.overfitting")
#: Reported keys past which late events are only counted.
MAX_REPORTED = 200


class CurveWatch:
    """What the loss curve showed over a run, and what of it to report.

    Example:
        >>> watch = CurveWatch()
        >>> first = [Verdict("curve.diverging", 40, "the loss climbs"),
        ...          Verdict("curve.healthy", None, "no shape")]
        >>> [v.code for v in watch.window(first, held=[])]  # healthy only while nothing else
        ['curve.diverging']
        >>> later = [Verdict("curve.diverging", 55, "still climbing"),
        ...          Verdict("curve.overfitting", 60, "val rises")]
        >>> [v.code for v in watch.window(later, held=["curve.diverging"], memorizing=True)]
        []
    """

    def __init__(self) -> None:
        #: ``(code, step)`` of every verdict reported (window and late events)
        self.reported: set[tuple[str, int | None]] = set()
        self.counts = {"spikes_after_window": 0, "divergences_after_window": 0}

    def window(self, verdicts: Sequence[Verdict], *, held: Collection[str],
               memorizing: bool = False) -> list[Verdict]:
        """The window's verdicts to report now.

        Args:
            verdicts: the classifier's verdicts on the window so far (or at its end).
            held: the codes of the findings the caller holds already (any, of any stage it
                reports).
            memorizing: the user memorizes a few batches on purpose (``overfit_batches``):
                overfitting is expected.

        Returns:
            The verdicts not reported before, in order.
        """
        held = list(held)
        out: list[Verdict] = []
        for v in verdicts:
            key = (v.code, v.step)
            if key in self.reported or (v.code == "curve.healthy" and held):
                continue
            if v.code in ONCE_PER_WINDOW and v.code in held:
                continue  # one divergence / overfitting verdict per window
            if v.code == "curve.overfitting" and memorizing:
                continue  # the user memorizes a few batches on purpose
            self.reported.add(key)
            held.append(v.code)
            out.append(v)
        return out

    def late(self, events: Sequence[SpikeEvent], steps: Sequence[int], values: Sequence[float],
             thresholds: CurveThresholds) -> list[Verdict]:
        """The loss spikes and divergences after the window to report, counted.

        Args:
            events: what the spike watch saw in this chunk.
            steps: the chunk's steps.
            values: its losses.
            thresholds: the curve's thresholds (``diverge_ratio``).
        """
        out: list[Verdict] = []
        for e in events:
            if len(self.reported) > MAX_REPORTED:
                break  # bounded: the counts keep going
            v = late_event_verdict(e, steps, values, thresholds.diverge_ratio)
            if v is None:
                continue
            self.counts["spikes_after_window" if v.code == "curve.loss_spike"
                        else "divergences_after_window"] += 1
            key = (v.code, e.step)
            if key in self.reported:
                continue
            self.reported.add(key)
            out.append(v)
        return out

    def validation(self, seen: ValidationSeen, *, held: Collection[str],
                   thresholds: CurveThresholds) -> Verdict | None:
        """At the end of training: why the window could not show overfitting (no validation,
        or too few runs inside it), for a window long enough to classify, once.

        Args:
            seen: what validation the run had.
            held: the codes of the findings the caller holds already.
            thresholds: the curve's thresholds (``min_steps``, ``overfit_confirm``).
        """
        if seen.window_steps < thresholds.min_steps or "curve.no_validation" in held \
                or "curve.sparse_validation" in held:
            return None
        needed = 1 + max(2, thresholds.overfit_confirm)  # the overfitting rule's minimum
        return validation_verdict(seen, needed)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Plain picklable state."""
        return {"counts": dict(self.counts), "reported": [list(k) for k in self.reported]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (missing keys keep their defaults)."""
        self.counts.update(state.get("counts", {}))
        self.reported = {(str(c), None if s is None else int(s))
                         for c, s in state.get("reported", [])}


__all__ = ["MAX_REPORTED", "ONCE_PER_WINDOW", "CurveWatch"]
