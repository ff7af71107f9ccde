"""Bounded ``(step, value)`` series: memory stays flat whatever the run's length."""

from __future__ import annotations

from collections.abc import Iterable


class BoundedSeries:
    """Keep at most ``max_points`` points of a series by decimation.

    When full, every other point is dropped and the sampling stride doubles, so the kept points
    stay evenly spread over the whole run.

    Example:
        >>> s = BoundedSeries(max_points=4)
        >>> for step in range(10):
        ...     s.append(step, float(step))
        >>> s.to_list()
        [[0, 0.0], [4, 4.0], [8, 8.0]]
    """

    def __init__(self, max_points: int = 1000) -> None:
        if max_points < 2:
            raise ValueError(f"`max_points` must be >= 2, got {max_points}.")
        self.max_points = max_points
        self.stride = 1
        self._seen = 0
        self.points: list[list[float]] = []

    def append(self, step: int, value: float) -> None:
        if self._seen % self.stride == 0:
            self.points.append([int(step), float(value)])
            if len(self.points) >= self.max_points:
                self.points = self.points[::2]
                self.stride *= 2
        self._seen += 1

    def extend(self, steps: Iterable[int], values: Iterable[float]) -> None:
        """:meth:`append` each ``(step, value)`` pair."""
        for step, value in zip(steps, values, strict=True):
            self.append(step, value)

    def to_list(self) -> list[list[float]]:
        return [list(p) for p in self.points]

    def __len__(self) -> int:
        return len(self.points)

    def state_dict(self) -> dict[str, object]:
        return {"max_points": self.max_points, "stride": self.stride, "seen": self._seen,
                "points": self.to_list()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.stride = int(state.get("stride", 1))  # type: ignore[call-overload]
        self._seen = int(state.get("seen", 0))  # type: ignore[call-overload]
        self.points = [list(p) for p in state.get("points", [])]  # type: ignore[attr-defined]
