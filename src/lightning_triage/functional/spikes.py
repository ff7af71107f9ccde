"""Spike and divergence detection over a stream of numbers, with bounded memory.

:class:`SpikeWatch` keeps robust running statistics of a series over a ring of recent accepted
values (the level: the median of the most recent ones; the spread: from the step-to-step
differences, so a falling curve does not inflate it) and reports, step by step:

- ``"spike"``: a value far above the running level (``value > level + z * spread``,
  ``value > ratio * level`` and ``value - level > min_jump``); the spike is not added to the
  baseline, so one bad batch does not move it;
- ``"sustained"``: ``patience`` outliers in a row: the level itself moved up (a late divergence
  when it keeps rising); the baseline is then rebuilt from the new values;
- ``"nonfinite"``: a NaN/Inf value (the first of a run of them).

The baseline is refreshed every ``refresh`` steps, and values may be fed in chunks of any size
(the result does not depend on the chunking): the monitors feed it chunks they moved from the
device, a script feeds it a metrics CSV column. Memory is ``O(window)`` for any run length.

Example:
    >>> watch = SpikeWatch(warmup=8, window=32)
    >>> values = [1.0 + 0.01 * (i % 3) for i in range(40)]
    >>> values[30] = 9.0
    >>> [(e.kind, e.step, round(e.level, 2)) for e in watch.update(values)]
    [('spike', 30, 1.01)]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

EventKind = Literal["spike", "sustained", "nonfinite"]

#: Scale factor from the median absolute deviation to a standard deviation (normal data).
MAD_TO_STD = 1.4826


@dataclass(frozen=True)
class SpikeEvent:
    """One event of a :class:`SpikeWatch`.

    Attributes:
        kind: ``"spike"``, ``"sustained"`` or ``"nonfinite"``.
        step: the step of the event (the first outlier step for ``"sustained"``).
        value: the value at that step (for ``"sustained"``: the median of the outliers).
        level: the running median before the event.
        spread: the robust spread before the event, from the step-to-step differences of the
            baseline values: the larger of their MAD and their 95th percentile, both scaled to
            a standard deviation of the values (the upper tail covers heavy-tailed noise).
        ratio: ``value / level`` (``inf`` for a zero level or a non-finite value).
        confirmed_step: the step at which the event was decided (``step + patience - 1`` for
            ``"sustained"``, ``step`` otherwise).

    Example:
        >>> event = detect_spikes([2.0, 2.1, 1.9, 2.0] * 10 + [30.0], warmup=8)[0]
        >>> event.kind, event.step, event.value, round(event.ratio)
        ('spike', 40, 30.0, 15)
    """

    kind: EventKind
    step: int
    value: float
    level: float
    spread: float
    ratio: float
    confirmed_step: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _median(values: np.ndarray) -> float:
    """``np.median`` of a non-empty 1-d array, without its overhead (called once per refresh)."""
    lo, hi = (values.size - 1) // 2, values.size // 2
    part = np.partition(values, (lo, hi))
    return 0.5 * (float(part[lo]) + float(part[hi]))


def robust_level(values: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """``(median, spread)`` of the finite ``values``; spread = 1.4826 * MAD (0 if empty).

    Example:
        >>> robust_level([1.0, 2.0, 3.0, 100.0])
        (2.5, 1.4826)
    """
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return math.nan, 0.0
    med = float(np.median(arr))
    return med, float(MAD_TO_STD * np.median(np.abs(arr - med)))


class SpikeWatch:
    """Robust running statistics of a series and the spikes, level shifts and NaN/Inf in it.

    Args:
        window: how many recent accepted values make the baseline.
        warmup: values accepted without detection at the start (and after a rebuild).
        refresh: the baseline (median, spread) is recomputed every ``refresh`` steps.
        z: a spike is more than ``z`` robust standard deviations above the level...
        ratio: ...and more than ``ratio`` times the level...
        min_jump: ...and more than ``min_jump`` above it (absolute units of the series).
        patience: that many outliers in a row make a ``"sustained"`` event (level shift).
        min_spread_frac: the spread is at least this fraction of the level (guards a
            perfectly flat baseline, where any change would be infinitely many deviations).

    Raises:
        ValueError: for non-positive sizes or thresholds.

    Example:
        Fed step by step (or in chunks) while training; the watch keeps a bounded window:

        >>> watch = SpikeWatch(warmup=8)
        >>> watch.update([2.0, 2.1, 1.9, 2.0] * 10)
        []
        >>> [(e.kind, e.step) for e in watch.update([2.0, 30.0, 2.0])]
        [('spike', 41)]
        >>> [(e.kind, e.step) for e in watch.update([float("nan")])]
        [('nonfinite', 43)]
    """

    def __init__(self, *, window: int = 128, warmup: int = 16, refresh: int = 32, z: float = 8.0,
                 ratio: float = 2.0, min_jump: float = 0.0, patience: int = 8,
                 min_spread_frac: float = 0.01) -> None:
        for name, value in (("window", window), ("warmup", warmup), ("refresh", refresh),
                            ("patience", patience)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        if warmup > window:
            raise ValueError(f"`warmup` ({warmup}) must be <= `window` ({window}).")
        checks = (("z", z, z > 0, "> 0"), ("ratio", ratio, ratio >= 1, ">= 1"),
                  ("min_jump", min_jump, min_jump >= 0, ">= 0"),
                  ("min_spread_frac", min_spread_frac, min_spread_frac >= 0, ">= 0"))
        for arg, given, ok, allowed in checks:
            if not ok:
                raise ValueError(f"`{arg}` must be {allowed}, got {given!r}.")
        self.window = window
        self.warmup = warmup
        self.refresh = refresh
        self.z = z
        self.ratio = ratio
        self.min_jump = min_jump
        self.patience = patience
        self.min_spread_frac = min_spread_frac
        self.level_span = min(32, window)
        self.reset()

    def reset(self) -> None:
        """Forget everything (a fresh baseline)."""
        self._buf = np.zeros(self.window, dtype=np.float64)
        self._filled = 0
        self._pos = 0
        self.step = 0  # the step of the next value
        self.accepted = 0  # values accepted since the last rebuild
        self.level = math.nan
        self.spread = 0.0
        self._since_refresh = 0
        self._outliers: list[float] = []  # the current run of outliers (at most `patience`)
        self._outlier_start = -1
        self._in_nonfinite = False
        self.counts = {"spike": 0, "sustained": 0, "nonfinite": 0}

    # ------------------------------------------------------------------ baseline
    @property
    def ready(self) -> bool:
        """Whether the baseline is warmed up (spikes can be detected)."""
        return self.accepted >= self.warmup and math.isfinite(self.level)

    def threshold(self) -> float:
        """The smallest value that counts as a spike now (``inf`` while warming up)."""
        if not self.ready:
            return math.inf
        spread = max(self.spread, self.min_spread_frac * abs(self.level))
        return max(self.level + self.z * spread, self.ratio * self.level if self.level > 0
                   else -math.inf, self.level + self.min_jump)

    @property
    def ring(self) -> np.ndarray:
        """The accepted values the baseline is computed from (oldest first)."""
        if self._filled < self.window:
            return self._buf[: self._filled].copy()
        return np.concatenate([self._buf[self._pos:], self._buf[: self._pos]])

    def _refresh(self) -> None:
        ring = self.ring  # oldest first
        n = ring.size
        self._since_refresh = 0
        if n == 0:
            self.level, self.spread = math.nan, 0.0
            return
        # the level: median of the most recent values (tracks a falling curve)
        self.level = _median(ring[-self.level_span:])
        if n < 3:
            self.spread = 0.0
            return
        # the spread from step-to-step differences: insensitive to the trend of the curve;
        # the upper tail of |diff| widens it for heavy-tailed noise (small noisy batches)
        d = np.diff(ring)
        q = min(d.size - 1, math.ceil(0.95 * (d.size - 1)))
        mad_spread = MAD_TO_STD * _median(np.abs(d - _median(d))) / math.sqrt(2)
        tail = float(np.partition(np.abs(d), q)[q]) / (1.96 * math.sqrt(2))
        self.spread = max(mad_spread, tail)

    def _accept_many(self, values: np.ndarray) -> None:
        """Accept values that do not cross a refresh point or the end of the warmup."""
        if values.size == 1:
            self._buf[self._pos] = values[0]
        else:
            self._buf[(self._pos + np.arange(values.size)) % self.window] = values
        self._pos = (self._pos + values.size) % self.window
        self._filled = min(self.window, self._filled + values.size)
        self.accepted += values.size
        self._since_refresh += values.size
        if self._since_refresh >= self.refresh or self.accepted == self.warmup:
            self._refresh()

    def _accept(self, value: float) -> None:
        self._accept_many(np.array([value]))

    # ------------------------------------------------------------------ updates
    def update(self, values: Sequence[float] | np.ndarray, start_step: int | None = None
               ) -> list[SpikeEvent]:
        """Feed the next ``values`` (one per step); return the events they raised.

        ``start_step`` sets the step of the first value (default: continue the count).
        """
        if start_step is not None:
            self.step = int(start_step)
        events: list[SpikeEvent] = []
        arr = np.asarray(values, dtype=np.float64).reshape(-1)
        i = 0
        while i < arr.size:
            if not self.ready or self._outliers or self._in_nonfinite:
                events.extend(self._one(float(arr[i])))
                i += 1
                continue
            # fast path: a block of values judged against the current baseline
            n = min(arr.size - i, self.refresh - self._since_refresh)
            block = arr[i:i + n]
            bad = ~np.isfinite(block) | (block > self.threshold())
            if bad.any():
                n = int(np.argmax(bad))  # values before the first outlier are all accepted
            if n:
                self._accept_many(block[:n])
            self.step += n
            i += n
            if n < block.size:
                events.extend(self._one(float(arr[i])))
                i += 1
        return events

    def update_finite(self, values: Sequence[float] | np.ndarray, steps: Sequence[int]
                      ) -> list[SpikeEvent]:
        """Feed only the finite runs of ``values`` (at ``steps``), each run from its own step:
        the steps a gradient scaler skips (non-finite gradients under fp16) are not events.

        Example:
            >>> watch = SpikeWatch(warmup=4)
            >>> watch.update_finite([1.0, float("inf"), 1.1, 0.9], [0, 1, 2, 3])
            []
            >>> watch.step
            4
        """
        events: list[SpikeEvent] = []
        arr = np.asarray(values, dtype=np.float64).reshape(-1)
        start = None
        for i in range(arr.size + 1):
            ok = i < arr.size and bool(np.isfinite(arr[i]))
            if ok and start is None:
                start = i
            elif not ok and start is not None:
                events += self.update(arr[start:i], start_step=steps[start])
                start = None
        return events

    def _one(self, value: float) -> list[SpikeEvent]:
        step = self.step
        self.step += 1
        if not math.isfinite(value):
            if self._in_nonfinite:
                return []
            self._in_nonfinite = True
            self.counts["nonfinite"] += 1
            return [SpikeEvent("nonfinite", step, value, self.level, self.spread, math.inf, step)]
        self._in_nonfinite = False
        if not self.ready:
            self._accept(value)
            return []
        if value <= self.threshold():
            self._outliers = []
            self._accept(value)
            return []
        self._outliers.append(value)
        events: list[SpikeEvent] = []
        if len(self._outliers) == 1:
            self._outlier_start = step
            self.counts["spike"] += 1
            events.append(SpikeEvent("spike", step, value, self.level, self.spread,
                                     self._ratio(value), step))
        if len(self._outliers) >= self.patience:
            med = float(np.median(self._outliers))
            self.counts["sustained"] += 1
            events.append(SpikeEvent("sustained", self._outlier_start, med, self.level,
                                     self.spread, self._ratio(med), step))
            # the level moved: rebuild the baseline from the new values
            outliers = self._outliers
            self._filled = self._pos = 0
            self.accepted = 0
            self._outliers = []
            for v in outliers:
                self._accept(v)
            self._refresh()
        return events

    def _ratio(self, value: float) -> float:
        return value / self.level if self.level > 0 else math.inf

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Plain picklable state (a resumed run keeps its baseline)."""
        return {"ring": self.ring.tolist(), "step": self.step, "accepted": self.accepted,
                "level": self.level, "spread": self.spread, "since_refresh": self._since_refresh,
                "outliers": list(self._outliers), "outlier_start": self._outlier_start,
                "in_nonfinite": self._in_nonfinite, "counts": dict(self.counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (missing keys keep their defaults)."""
        self.reset()
        ring = np.asarray(state.get("ring", []), dtype=np.float64)[-self.window:]
        self._buf[: ring.size] = ring
        self._filled = ring.size
        self._pos = ring.size % self.window
        self.step = int(state.get("step", 0))
        self.accepted = int(state.get("accepted", len(self.ring)))
        self.level = float(state.get("level", math.nan))
        self.spread = float(state.get("spread", 0.0))
        self._since_refresh = int(state.get("since_refresh", 0))
        self._outliers = [float(v) for v in state.get("outliers", [])]
        self._outlier_start = int(state.get("outlier_start", -1))
        self._in_nonfinite = bool(state.get("in_nonfinite", False))
        self.counts.update(state.get("counts", {}))

    def state_size(self) -> int:
        """How many numbers the state holds (bounded by ``window + patience + a few``)."""
        return self._filled + len(self._outliers) + len(self.counts) + 8


def grew_before(values: Sequence[float] | np.ndarray, i: int, reference: float,
                ratio: float = 10.0, lookback: int = 8) -> bool:
    """Whether a finite value among the ``lookback`` before index ``i`` exceeds ``ratio`` times
    ``reference``: a NaN/Inf that follows such growth is a divergence; one out of the blue is a
    numerics bug (left to the numerics stage).

    Example:
        >>> grew_before([2.3, 125.0, 1e5, float("inf")], 3, reference=2.3)
        True
        >>> grew_before([2.3, 0.5, 0.4, float("nan")], 3, reference=2.3)
        False
    """
    arr = np.asarray(values, dtype=np.float64)[max(0, i - lookback):i]
    arr = arr[np.isfinite(arr)]
    return bool(arr.size) and reference > 0 and float(arr.max()) > ratio * reference


def detect_spikes(values: Sequence[float] | np.ndarray, *, steps: Sequence[int] | None = None,
                  **kwargs: Any) -> list[SpikeEvent]:
    """Run a fresh :class:`SpikeWatch` (``kwargs`` are its arguments) over ``values``.

    ``steps`` relabels the events' steps (e.g. the global steps of a metrics CSV).

    Example:
        >>> vals = [2.0, 2.1, 1.9, 2.0] * 10 + [30.0] + [2.0] * 5
        >>> [(e.kind, e.step) for e in detect_spikes(vals, warmup=8)]
        [('spike', 40)]
    """
    events = SpikeWatch(**kwargs).update(values, start_step=0)
    if steps is None:
        return events
    return [SpikeEvent(e.kind, int(steps[e.step]), e.value, e.level, e.spread, e.ratio,
                       int(steps[e.confirmed_step])) for e in events]


__all__ = ["MAD_TO_STD", "SpikeEvent", "SpikeWatch", "detect_spikes", "grew_before",
           "robust_level"]
