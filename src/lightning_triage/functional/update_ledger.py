"""The update contracts' ledger (stage 3, wiring): the bookkeeping and the decisions of the
first steps, free of Lightning.

A caller (``UpdateContractCheck``, or a plain PyTorch loop) reads the norm of every parameter,
and of its gradient, at a few points of each training batch, and feeds them to an
:class:`UpdateLedger` as :class:`Reading` values (host numbers):

- ``"start"``: the start of the batch (parameter norms);
- ``"backward"``: at a backward, before it adds to any gradient (gradient norms; parameter
  norms at the batch's first backward only): a gradient zeroed in place since the optimizer's
  previous step reads ``0`` there;
- ``"pre"``: before an optimizer's step (parameter and gradient norms, the learning rate);
- ``"post"``: after an optimizer's step (parameter norms);
- ``"end"``: the end of the batch (parameter norms).

:meth:`UpdateLedger.close_batch` turns one batch's readings into the events of the contracts
(zeroing, stepping, changes outside the step) and returns the verdicts decided at once
(``wiring.optimizer_not_stepping``); :meth:`UpdateLedger.finish` returns the verdicts of the
window (``wiring.grads_not_zeroed``, ``wiring.params_changed_outside_step``,
``wiring.frozen_params_changed``). The rules are those of :mod:`~lightning_triage.functional.update`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from lightning_triage.functional.update import (
    FORWARD,
    STALLED_STEPS,
    Change,
    GradState,
    StepRecord,
    frozen_change_verdict,
    outside_change_verdicts,
    stepping_verdict,
    zeroing_verdict,
)
from lightning_triage.functional.verdict import Verdict

ReadingKind = Literal["start", "backward", "pre", "post", "end"]


def differs(a: float, b: float) -> bool:
    """Whether two norms differ (NaN equals NaN: a parameter that stays non-finite did not
    change; that is the numerics stage's finding).

    Example:
        >>> differs(1.0, 1.5), differs(float("nan"), float("nan"))
        (True, False)
    """
    return a != b and not (math.isnan(a) and math.isnan(b))


@dataclass(frozen=True)
class Reading:
    """The norms read at one point of a training batch.

    Attributes:
        kind: where in the batch (``"start"``, ``"backward"``, ``"pre"``, ``"post"``, ``"end"``).
        opt: the optimizer's index for ``"pre"`` and ``"post"``, else ``None``.
        step: the global step.
        norms: every parameter's norm (empty for a backward after the batch's first: gradients
            only).
        grads: every parameter's gradient norm (``0`` for ``None``) at ``"backward"`` and
            ``"pre"``, else ``None``.
        lr: the optimizer's largest learning rate (``"pre"``).
        renewed: at ``"pre"``, the parameters whose gradient is another tensor than at the
            optimizer's previous step: it was set to ``None`` (zeroed) in between, evidence
            of zeroing when no backward was read in between (a caller that cannot hook the
            backward).
    """

    kind: ReadingKind
    opt: int | None
    step: int
    norms: Sequence[float]
    grads: Sequence[float] | None = None
    lr: float = 0.0
    renewed: frozenset[int] = frozenset()


class UpdateLedger:
    """What the first steps showed about the update, and what it means.

    Args:
        names: every parameter's name, in the order of the readings.
        sizes: every parameter's number of values, by name.
        init: every parameter's norm at the start of the window.
        optimizers: how each optimizer is named in messages (``"optimizer 0 (SGD)"``).
        renormed: parameters that the forward renormalizes on purpose
            (``nn.Embedding(max_norm=...)``): a change in the forward is expected.
        pinned: names of parameters that must never change (a peft model's frozen base).

    Example:
        >>> ledger = UpdateLedger(["w"], {"w": 4}, [1.0], ["optimizer 0 (SGD)"])
        >>> ledger.membership([[0]], [True])
        >>> for step in range(3):  # never zeroed: the gradient keeps growing
        ...     _ = ledger.close_batch([
        ...         Reading("start", None, step, [1.0 + step]),
        ...         Reading("backward", None, step, [1.0 + step], [float(step)]),
        ...         Reading("pre", 0, step, [1.0 + step], [step + 1.0], lr=0.1),
        ...         Reading("post", 0, step, [2.0 + step]),
        ...         Reading("end", None, step + 1, [2.0 + step])], start_step=step)
        >>> [(v.code, v.step) for v in ledger.finish()]
        [('wiring.grads_not_zeroed', 1)]
    """

    def __init__(self, names: Sequence[str], sizes: Mapping[str, int], init: Sequence[float],
                 optimizers: Sequence[str], *, renormed: Collection[int] = (),
                 pinned: Collection[str] = ()) -> None:
        self.names = list(names)
        self.sizes = dict(sizes)
        self.init = list(init)
        self.optimizers = list(optimizers)
        self.renormed = set(renormed)
        self.pinned = set(pinned)
        n = len(self.optimizers)
        self.opt_params: list[list[int]] = [[] for _ in range(n)]
        self.frozen: set[int] = set()
        self._dirty: list[set[int]] = [set() for _ in range(n)]
        self._after_val: set[int] = set()
        self._zeroing: list[tuple[list[int], list[bool], list[str]]] = [([], [], [])
                                                                        for _ in range(n)]
        self.records: list[list[StepRecord]] = [[] for _ in range(n)]
        self._stalled: set[int] = set()
        self.changes: list[Change] = []
        self.frozen_changes: list[Change] = []
        self.seen: dict[str, int] = {}
        self._last_end: list[float] | None = None

    # ------------------------------------------------------------------ recording
    def membership(self, opt_params: Sequence[Sequence[int]], trainable: Sequence[bool], *,
                   at_step: bool = False) -> None:
        """Which parameters each optimizer holds and which are frozen.

        Args:
            opt_params: for each optimizer, the indices of the parameters it holds.
            trainable: for each parameter, whether it has ``requires_grad`` and an optimizer
                holds it.
            at_step: read at an optimizer step rather than the batch start: parameters are
                frozen at the batch start only (``toggle_optimizer`` freezes the other
                optimizers' for a while); one trainable by the step (unfrozen, or its param
                group added, in a batch-start hook) is no longer frozen.
        """
        self.opt_params = [sorted(set(ps)) for ps in opt_params]
        if at_step:
            self.frozen -= {i for i in self.frozen if trainable[i]}
        else:
            self.frozen = {i for i, t in enumerate(trainable) if not t}

    def validation(self) -> None:
        """A validation run: Lightning zeroes the gradients before it, so the next step of each
        optimizer is clean whatever the user's code does (no evidence either way)."""
        self._after_val = set(range(len(self.optimizers)))

    def close_batch(self, readings: Sequence[Reading], *, start_step: int,
                    counted_lr: float | None = None) -> list[Verdict]:
        """Record one training batch's readings, in the order they were taken.

        Args:
            readings: the batch's readings, from its ``"start"`` to its ``"end"``.
            start_step: the global step when the batch started.
            counted_lr: under automatic optimization, when the loop counted an optimizer step
                for this batch, the first optimizer's learning rate (a step counted without
                reaching ``optimizer.step()`` stalls); else ``None``.

        Returns:
            The ``wiring.optimizer_not_stepping`` verdicts decided by this batch.
        """
        self._zeroing_events(readings)
        verdicts = self._stepping_events(readings, start_step, counted_lr)
        self._change_events(readings)
        self._last_end = list(readings[-1].norms)
        return verdicts

    # ------------------------------------------------------------------ events
    def _zeroing_events(self, readings: Sequence[Reading]) -> None:
        for r in readings:
            grads = r.grads
            if grads is None:
                continue
            if r.kind == "backward":
                for dirty in self._dirty:
                    dirty.difference_update({i for i in dirty if grads[i] == 0.0})
            elif r.kind == "pre" and r.opt is not None:
                stale = [i for i in self._dirty[r.opt] if grads[i] != 0.0 and i not in r.renewed]
                self._dirty[r.opt] = set(self.opt_params[r.opt])
                if r.opt in self._after_val:
                    self._after_val.discard(r.opt)
                    continue
                steps, clean, names = self._zeroing[r.opt]
                steps.append(r.step)
                clean.append(not stale)
                if stale and not names:
                    names.extend(self.names[i] for i in sorted(stale))

    def _stepping_events(self, readings: Sequence[Reading], start_step: int,
                         counted_lr: float | None) -> list[Verdict]:
        pres = [k for k, r in enumerate(readings) if r.kind == "pre"]
        for k in pres:
            r = readings[k]
            assert r.opt is not None
            after = next(v.norms for v in readings[k + 1:] if v.norms)  # the end has norms
            mine = self.opt_params[r.opt]
            g = [r.grads[i] for i in mine] if r.grads is not None else []
            state: GradState = "nonfinite" if any(not math.isfinite(x) for x in g) else \
                "ok" if any(x > 0 for x in g) else "none"
            moved = any(differs(r.norms[i], after[i]) for i in mine)
            self.records[r.opt].append(StepRecord(r.step, True, state, moved, r.lr))
        if not pres and counted_lr is not None and self.opt_params:
            before, after = readings[0].norms, readings[-1].norms
            moved = any(differs(before[i], after[i]) for i in self.opt_params[0])
            self.records[0].append(StepRecord(start_step, False, "ok", moved, counted_lr))
        verdicts = []
        for opt, records in enumerate(self.records):
            if opt not in self._stalled and len(records) >= STALLED_STEPS \
                    and all(r.stalled for r in records[-STALLED_STEPS:]):
                verdict = stepping_verdict(self.optimizers[opt], records)
                if verdict is not None:
                    self._stalled.add(opt)
                    verdicts.append(verdict)
        return verdicts

    def _phase(self, prev: Reading | None, point: Reading) -> str:
        if prev is None:
            return "between batches"
        if prev.kind == "start":
            return FORWARD
        if prev.kind == "backward":
            return "between the backward and the optimizer step" if point.kind == "pre" \
                else "after the backward"
        name = self.optimizers[prev.opt] if prev.opt is not None else "?"
        return f"during the step of {name}" if prev.kind == "pre" else f"after the step of {name}"

    def _change_events(self, readings: Sequence[Reading]) -> None:
        pairs: list[tuple[Reading | None, Sequence[float], Reading, Sequence[float]]] = []
        if self._last_end is not None:
            pairs.append((None, self._last_end, readings[0], readings[0].norms))
        last: Reading | None = None
        for r in readings:
            if not r.norms:  # a later backward of the batch: gradients only
                continue
            if last is not None:
                pairs.append((last, last.norms, r, r.norms))
            last = r
        for prev, before, point, after in pairs:
            phase = self._phase(prev, point)
            allowed = set(self.opt_params[prev.opt]) if prev is not None \
                and prev.kind == "pre" and prev.opt is not None else set()
            self.seen[phase] = self.seen.get(phase, 0) + 1
            expected = self.renormed if phase == FORWARD else set()
            changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True))
                       if differs(a, b) and i not in expected]
            frozen = [i for i in changed if i in self.frozen]
            outside = [i for i in changed if i not in self.frozen and i not in allowed]
            for group, into in ((frozen, self.frozen_changes), (outside, self.changes)):
                if group:
                    into.append(self._change(point.step, phase, group, before, after))

    def _change(self, step: int, phase: str, idx: list[int], before: Sequence[float],
                after: Sequence[float]) -> Change:
        rel = max(abs(after[i] - before[i]) / max(abs(before[i]), 1e-12) for i in idx)
        toward = sum(abs(after[i] - self.init[i]) for i in idx) < \
            0.5 * sum(abs(before[i] - self.init[i]) for i in idx)
        return Change(step, phase, tuple(self.names[i] for i in idx), rel, toward)

    # ------------------------------------------------------------------ decisions
    @property
    def steps(self) -> int:
        """The optimizer steps recorded so far (all optimizers)."""
        return sum(len(r) for r in self.records)

    def finish(self) -> list[Verdict]:
        """The verdicts of the window: gradients not zeroed (per optimizer), trainable
        parameters changed outside the step (per phase), frozen parameters that changed."""
        verdicts: list[Verdict] = []
        for opt, (steps, clean, stale) in enumerate(self._zeroing):
            universe = {self.names[i]: self.sizes[self.names[i]] for i in self.opt_params[opt]}
            verdict = zeroing_verdict(self.optimizers[opt], steps, clean, stale, universe)
            verdicts += [verdict] if verdict is not None else []
        trainable = {n: s for i, (n, s) in enumerate(self.sizes.items()) if i not in self.frozen}
        verdicts += outside_change_verdicts(self.changes, self.seen, trainable)
        frozen = frozen_change_verdict(self.frozen_changes, self.sizes, self.seen, self.pinned)
        return [*verdicts, *([frozen] if frozen is not None else [])]


__all__ = ["Reading", "ReadingKind", "UpdateLedger", "differs"]
