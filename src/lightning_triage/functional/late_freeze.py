"""Late freezing (stage 3, wiring): parameters trainable at the first batch, frozen later after
optimizer steps moved them. The bookkeeping and the decision, free of Lightning.

A :class:`LateFreezeWatch` is armed at the first training batch with the trainable parameters
(and their norms then); :meth:`LateFreezeWatch.check` reads only their ``requires_grad`` flags
until one flips, then measures how far the newly frozen ones had moved and returns the
``wiring.frozen_late`` verdict (:func:`~lightning_triage.functional.update.late_freeze_verdict`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from lightning_triage.functional.update import late_freeze_verdict, tensor_norms
from lightning_triage.functional.verdict import Verdict

#: The trainable values copied (to the host) at the first batch, at most, to say how far
#: parameters frozen later had moved (``||w - w0|| / ||w0||``); above it, the change of their
#: norms (a lower bound).
LATE_SNAPSHOT_VALUES = 4_000_000


def running_norms(module: nn.Module) -> Tensor:
    """The norms of a layer's running mean and running variance (``0`` where it has none).

    Example:
        >>> running_norms(nn.BatchNorm1d(4)).tolist()  # mean 0, variance 1
        [0.0, 2.0]
    """
    return tensor_norms([getattr(module, "running_mean", None),
                         getattr(module, "running_var", None)])


class LateFreezeWatch:
    """Watch the parameters trainable at the first batch for a later freeze.

    Args:
        names: the watched parameters' names.
        params: the parameters (read, never written).
        base: their norms at the first batch.
        sizes: every parameter of the model and its number of values (for naming).
        step: the global step of the first batch.
        module: the model, to find the running-statistics layers whose parameters are all
            watched (their statistics are reported with the freeze).
        snapshot_limit: copy the watched values to the host when they hold at most this many
            (exact distances), else compare norms.

    Example:
        >>> net = nn.Linear(2, 2)
        >>> named = dict(net.named_parameters())
        >>> watch = LateFreezeWatch(list(named), list(named.values()),
        ...                         tensor_norms(list(named.values())).tolist(),
        ...                         {n: p.numel() for n, p in named.items()}, 0)
        >>> with torch.no_grad():
        ...     _ = net.weight.mul_(1.5)
        >>> watch.check(3) is None  # still trainable
        True
        >>> _ = net.requires_grad_(False)
        >>> watch.check(3).code
        'wiring.frozen_late'
    """

    def __init__(self, names: Sequence[str], params: Sequence[Tensor], base: Sequence[float],
                 sizes: Mapping[str, int], step: int, *, module: nn.Module | None = None,
                 snapshot_limit: int = LATE_SNAPSHOT_VALUES) -> None:
        self.names = list(names)
        self.params = list(params)
        self.base = list(base)
        self.sizes = dict(sizes)
        self.step = step
        self.done = False
        #: training steps of the first epoch (a freeze after more is a schedule)
        self.first_epoch_steps: int | None = None
        self._snapshot: list[Tensor] | None = None
        if sum(int(p.numel()) for p in self.params) <= snapshot_limit:
            self._snapshot = [p.detach().to("cpu", copy=True) for p in self.params]
        self._bn: list[tuple[str, nn.Module, float, set[str]]] = []
        watched = set(self.names)
        for name, m in (module.named_modules() if module is not None else ()):
            own = {f"{name}.{n}" if name else n for n, _ in m.named_parameters(recurse=False)}
            if own and own <= watched and getattr(m, "running_mean", None) is not None:
                self._bn.append((name, m, float(running_norms(m).sum()), own))

    def epoch_end(self, step: int) -> None:
        """The first training epoch ended at ``step``."""
        if self.first_epoch_steps is None:
            self.first_epoch_steps = step - self.step

    def check(self, step: int) -> Verdict | None:
        """Whether watched parameters are frozen (``requires_grad=False``) at ``step``, after
        optimizer steps that moved them. Host-side flags only until one flips; then one read
        of their norms and the verdict, once.

        Returns:
            The ``wiring.frozen_late`` verdict (``None`` when no frozen parameter had moved);
            ``None`` while none is frozen. Parameters frozen before any step are frozen from
            the start: they are no longer watched.
        """
        if self.done:
            return None
        frozen = [i for i, p in enumerate(self.params) if not p.requires_grad]
        if not frozen:
            return None
        steps = step - self.step
        if steps <= 0:  # frozen before any step: frozen from the start, nothing lost
            keep = [i for i in range(len(self.params)) if i not in set(frozen)]
            self.names = [self.names[i] for i in keep]
            self.params = [self.params[i] for i in keep]
            self.base = [self.base[i] for i in keep]
            return None
        self.done = True
        snap, self._snapshot = self._snapshot, None
        # how far each moved relative to its starting norm (a tensor that started at zero, a
        # bias, relative to the largest starting norm among them): ||w - w0|| from the host
        # snapshot, else the change of the norm (a lower bound)
        scale = max((self.base[i] for i in frozen), default=0.0) or 1.0
        if snap is not None:
            dist = [float(torch.linalg.vector_norm(
                self.params[i].detach().to("cpu").double() - snap[i].double())) for i in frozen]
        else:
            now = tensor_norms([self.params[i] for i in frozen]).tolist()
            dist = [abs(n - self.base[i]) for i, n in zip(frozen, now, strict=True)]
        moved = {self.names[i]: d / (self.base[i] or scale) for i, d in zip(frozen, dist,
                                                                             strict=True)}
        stats = {}
        for name, m, base, own in self._bn:
            if own <= set(moved):
                cur = float(running_norms(m).sum())
                stats[name] = abs(cur - base) / base if base > 0 else float(cur > 0)
        deliberate = self.first_epoch_steps is not None and steps > self.first_epoch_steps
        return late_freeze_verdict(moved, step, self.sizes, steps_trained=steps,
                                   running_stats=stats, deliberate=deliberate,
                                   exact=snap is not None)


__all__ = ["LATE_SNAPSHOT_VALUES", "LateFreezeWatch", "running_norms"]
