"""The gradient norms' watch (stage 8, grad): which of the gradient verdicts become findings over
a run, and what a spike after the window means, free of Lightning.

A caller (``GradientMonitor``, or a plain PyTorch loop) reads every step's per-parameter gradient
norms, their total and the loss, in chunks (host arrays), classifies the first-epochs window
with :func:`~lightning_triage.functional.gradients.classify_gradients` and watches the totals
with a :class:`~lightning_triage.functional.spikes.SpikeWatch`. A :class:`GradientWatch` keeps
the context and decides:

- :meth:`GradientWatch.window`: the window's verdicts to report now (a spike only once the steps
  that tell whether a loss spike followed it have been read);
- :meth:`GradientWatch.observe` and :meth:`GradientWatch.events`: the last chunks (the context of
  a spike), the per-parameter level of healthy steps, the explosions after the window
  (:func:`~lightning_triage.functional.gradients.explosion_verdict`), the spikes held until
  their context is read;
- :meth:`GradientWatch.resolve`: those spikes as verdicts (which layer jumped first, whether the
  loss followed, a suggested clip value);
- :meth:`GradientWatch.admit`: each verdict once, one explosion per window, at most about 200.

The caller emits what these return; the rules are those of
:mod:`~lightning_triage.functional.gradients`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from lightning_triage.functional.gradients import (
    GradThresholds,
    explosion_verdict,
    jumped_first,
    loss_spike_after,
    module_name,
    spike_verdict,
    suggest_clip,
)
from lightning_triage.functional.spikes import SpikeEvent
from lightning_triage.functional.verdict import Verdict

#: Reported keys past which verdicts are dropped (the counts keep going).
MAX_REPORTED = 200
#: Spikes after the window held at once until their context is read.
MAX_PENDING = 16
#: Steps of context kept before a spike (at most this plus one chunk).
CONTEXT_STEPS = 64


class GradientWatch:
    """What the gradient norms showed over a run, and what of it to report.

    Example:
        >>> watch = GradientWatch()
        >>> spike = Verdict("grad.spike", 98, "a spike")  # the loss after it not read yet
        >>> [v.code for v in watch.window([spike], last_step=100, thresholds=GradThresholds())]
        []
        >>> explode = [Verdict("grad.exploding", 40, "norms grow"),
        ...            Verdict("grad.exploding", 60, "still growing")]
        >>> [v.step for v in watch.admit(explode, after_window=False, held=[])]
        [40]
    """

    def __init__(self) -> None:
        #: ``(code, step)`` of every verdict reported
        self.reported: set[tuple[str, int | None]] = set()
        self.counts = {"spikes_after_window": 0, "explosions_after_window": 0}
        #: the per-parameter gradient norm of healthy steps (a running median)
        self.layer_base: np.ndarray | None = None
        self._pending: list[SpikeEvent] = []
        # the last chunks (steps, totals, per-parameter norms, losses): context of a spike
        self._recent: deque[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = deque()

    # ------------------------------------------------------------------ window
    def window(self, verdicts: Sequence[Verdict], *, last_step: int,
               thresholds: GradThresholds) -> list[Verdict]:
        """The window's verdicts so far that can be judged now: a spike only when the
        ``follow_steps`` after it (whether a loss spike followed) are read (``last_step``)."""
        last = last_step - thresholds.follow_steps
        return [v for v in verdicts if v.code != "grad.spike" or (v.step or 0) <= last]

    # ------------------------------------------------------------------ after the window
    def observe(self, steps: Sequence[int], totals: np.ndarray, per: np.ndarray,
                loss: np.ndarray) -> None:
        """Keep a chunk (its steps, total norms, per-parameter norms, losses) as the context
        of the spikes to come (at least :data:`CONTEXT_STEPS` steps, at most that plus one
        chunk)."""
        self._recent.append((np.asarray(steps), totals, per, loss))
        while len(self._recent) > 1 and \
                sum(c[0].size for c in self._recent) - self._recent[0][0].size >= CONTEXT_STEPS:
            self._recent.popleft()

    def events(self, events: Sequence[SpikeEvent], steps: list[int], totals: np.ndarray,
               per: np.ndarray, *, ring: Sequence[float] | np.ndarray, after_window: bool,
               thresholds: GradThresholds) -> list[Verdict]:
        """What the spike watch saw in a chunk: the healthy steps update the per-parameter
        level; after the window, spikes are counted and held for :meth:`resolve`, and the
        explosions returned.

        Args:
            events: the spike watch's events in the chunk.
            steps: the chunk's steps.
            totals: its total norms.
            per: its per-parameter norms (one row per step).
            ring: the spike watch's recent values (for the suggested clip value).
            after_window: the window is over and the run is watched.
            thresholds: the gradient thresholds (``growth``).
        """
        finite = np.isfinite(totals)
        healthy = finite & ~np.isin(steps, [e.step for e in events])
        if healthy.any():
            med = np.median(per[healthy], axis=0)
            self.layer_base = med if self.layer_base is None else 0.5 * (self.layer_base + med)
        if not after_window:
            return []
        out: list[Verdict] = []
        for e in events:
            if e.kind == "spike":
                self.counts["spikes_after_window"] += 1
                if len(self._pending) < MAX_PENDING:
                    self._pending.append(e)
            elif e.kind in ("sustained", "nonfinite"):
                clip = suggest_clip(ring) if e.kind == "sustained" else None
                verdict = explosion_verdict(e, totals, steps.index(e.step) if e.step in steps else 0,
                                            clip=clip, growth=thresholds.growth)
                if verdict is not None:
                    self.counts["explosions_after_window"] += 1
                    out.append(verdict)
        return out

    def resolve(self, names: Sequence[str], *, ring: Sequence[float] | np.ndarray, final: bool,
                thresholds: GradThresholds, clip_val: float | None) -> list[Verdict]:
        """The held spikes whose context is read (all of them when ``final``) as verdicts:
        whether a loss spike followed, which layer jumped first, a suggested clip value.

        Args:
            names: every parameter's name, in the order of the per-parameter norms.
            ring: the spike watch's recent values.
            final: the run ends: resolve every held spike with what was read.
            thresholds: the gradient thresholds (``follow_steps``, ``clip_quantile``).
            clip_val: the user's ``gradient_clip_val``, if any.
        """
        if not self._pending or not self._recent:
            return []
        th = thresholds
        steps = np.concatenate([c[0] for c in self._recent])
        last = int(steps[-1])
        keep: list[SpikeEvent] = []
        out: list[Verdict] = []
        for e in self._pending:
            if e.step + th.follow_steps > last and not final:
                keep.append(e)
                continue
            where = np.nonzero(steps == e.step)[0]
            if where.size == 0:
                continue
            i = int(where[0])
            loss = np.concatenate([c[3] for c in self._recent])
            followed = loss_spike_after(loss, i, th.follow_steps)
            modules = [module_name(n) for n in names]
            first = first_row = None
            ratios: dict[str, float] = {}
            if self.layer_base is not None:
                mat = np.concatenate([c[2] for c in self._recent])
                first, first_row, ratios = jumped_first(mat, modules, i, self.layer_base)
            out.append(spike_verdict(e, clip=suggest_clip(ring, th.clip_quantile),
                                     followed=followed, first_layer=first,
                                     first_step=None if first_row is None else int(steps[first_row]),
                                     layer_ratios=ratios, after_window=True,
                                     follow_steps=th.follow_steps, clip_val=clip_val))
        self._pending = keep
        return out

    # ------------------------------------------------------------------ reporting
    def admit(self, verdicts: Sequence[Verdict], *, after_window: bool,
              held: Collection[str]) -> list[Verdict]:
        """The verdicts to report: each ``(code, step)`` once, one ``grad.exploding`` in the
        window (``held``: the codes of the findings the caller holds), at most about
        :data:`MAX_REPORTED`."""
        held = list(held)
        out: list[Verdict] = []
        for v in verdicts:
            key = (v.code, v.step)
            if key in self.reported or len(self.reported) > MAX_REPORTED:
                continue
            if v.code == "grad.exploding" and not after_window and v.code in held:
                continue
            self.reported.add(key)
            held.append(v.code)
            out.append(v)
        return out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Plain picklable state (the context of pending spikes is not kept)."""
        return {"counts": dict(self.counts), "reported": [list(k) for k in self.reported],
                "layer_base": None if self.layer_base is None else self.layer_base.tolist()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (missing keys keep their defaults)."""
        self.counts.update(state.get("counts", {}))
        self.reported = {(str(c), None if s is None else int(s))
                         for c, s in state.get("reported", [])}
        base = state.get("layer_base")
        self.layer_base = None if base is None else np.asarray(base, dtype=np.float64)


__all__ = ["CONTEXT_STEPS", "MAX_PENDING", "MAX_REPORTED", "GradientWatch"]
