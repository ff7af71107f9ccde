"""Gradient wiring: which trainable parameters receive a gradient, and which optimizer updates them.

Pure functions over parameter names, sizes and gradients, usable from a plain PyTorch loop:
call :func:`inspect_gradients` after ``loss.backward()``. Results name *modules*, not one line
per tensor: when every parameter of a module is affected the module is named once
(:func:`group_by_module`).

Example:
    >>> import torch
    >>> from torch import nn
    >>> net = nn.ModuleDict({"encoder": nn.Linear(4, 8), "head": nn.Linear(8, 2)})
    >>> x = torch.randn(3, 4)
    >>> net["head"](net["encoder"](x).detach()).sum().backward()
    >>> result = inspect_gradients(net)
    >>> [g.module for g in result.no_grad]
    ['encoder']
    >>> result.no_grad[0].params
    ('encoder.weight', 'encoder.bias')
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from lightning_triage.functional.tensors import any_nonzero


@dataclass(frozen=True)
class ModuleGroup:
    """Parameters of one module that share a diagnosis.

    Attributes:
        module: the module's name as ``named_modules()`` gives it (``""`` is the whole model).
        params: the full names of the affected parameters.
        numel: how many values they hold.
        complete: every parameter of ``module`` (among those considered) is affected; when
            ``False`` only ``params`` are.

    Example:
        >>> sizes = {"encoder.weight": 2048, "encoder.bias": 64, "head.weight": 640, "head.bias": 10}
        >>> [g.describe() for g in group_by_module(["encoder.weight", "encoder.bias", "head.bias"], sizes)]
        ['`encoder` (all 2 tensors, 2,112 values)', '`bias` of `head` (1 tensor, 10 values)']
    """

    module: str
    params: tuple[str, ...]
    numel: int
    complete: bool

    def describe(self) -> str:
        """E.g. ``encoder`` (all 4 tensors, 2,112 values) or ``head.bias`` alone."""
        size = f"{len(self.params)} tensor{'s' if len(self.params) != 1 else ''}, {self.numel:,} values"
        if self.complete:
            name = "the whole model" if self.module == "" else f"`{self.module}`"
            return f"{name} (all {size})"
        leaves = ", ".join(f"`{p.rsplit('.', 1)[-1]}`" for p in self.params)
        where = f"`{self.module}`" if self.module else "the model"
        return f"{leaves} of {where} ({size})"


def _prefixes(name: str) -> list[str]:
    """Module prefixes of a parameter name, shortest first: ``a.b.w`` -> ``["", "a", "a.b"]``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts))]


def group_by_module(affected: Iterable[str], universe: Mapping[str, int]) -> list[ModuleGroup]:
    """Group the ``affected`` parameter names by the largest modules they cover completely.

    Args:
        affected: parameter names with a diagnosis (each should be a key of ``universe``).
        universe: every parameter name considered (e.g. all trainable ones) and its number of
            values; a module is *complete* when all its names in ``universe`` are affected.

    Returns:
        Groups in the order of ``universe``: a complete module is named once; the affected
        parameters of a module that is only partly affected are grouped under that module.

    Example:
        >>> universe = {"enc.0.weight": 8, "enc.0.bias": 2, "enc.1.weight": 4, "head.weight": 6,
        ...             "head.bias": 3}
        >>> [g.describe() for g in group_by_module(["enc.0.weight", "enc.0.bias", "enc.1.weight",
        ...                                         "head.bias"], universe)]
        ['`enc` (all 3 tensors, 14 values)', '`bias` of `head` (1 tensor, 3 values)']
    """
    hit = set(affected)
    sizes = dict(universe)
    for name in hit:
        sizes.setdefault(name, 0)
    order = list(sizes)

    total: dict[str, int] = {}
    covered: dict[str, int] = {}
    for name in order:
        for prefix in _prefixes(name):
            total[prefix] = total.get(prefix, 0) + 1
            covered[prefix] = covered.get(prefix, 0) + (name in hit)

    def complete(prefix: str) -> bool:
        return covered[prefix] == total[prefix]

    groups: dict[str, list[str]] = {}
    full: dict[str, bool] = {}
    for name in order:
        if name not in hit:
            continue
        key = next((p for p in _prefixes(name) if complete(p)), None)
        if key is None:  # only part of its module: group under the owning module
            key, is_full = name.rsplit(".", 1)[0] if "." in name else "", False
        else:
            is_full = True
        groups.setdefault(key, []).append(name)
        full[key] = full.get(key, True) and is_full
    return [ModuleGroup(key, tuple(names), sum(sizes[n] for n in names), full[key])
            for key, names in groups.items()]


def describe_groups(groups: Sequence[ModuleGroup], limit: int = 6) -> str:
    """Join group descriptions, at most ``limit`` of them, saying how many more there are.

    Example:
        >>> sizes = {"a.w": 5, "b.w": 5, "c.w": 5, "d.w": 5}
        >>> describe_groups(group_by_module(["a.w", "b.w", "c.w"], sizes), limit=2)
        '`a` (all 1 tensor, 5 values), `b` (all 1 tensor, 5 values) and 1 more module'
    """
    shown = ", ".join(g.describe() for g in groups[:limit])
    more = len(groups) - limit
    return shown + (f" and {more} more module{'s' if more != 1 else ''}" if more > 0 else "")


@dataclass(frozen=True)
class WiringResult:
    """What one backward pass says about the gradient wiring of a model.

    Attributes:
        trainable: trainable parameter names and sizes (``requires_grad=True``).
        frozen: frozen parameter names and sizes, grouped in :attr:`frozen_groups`.
        no_grad: groups of trainable parameters that received no gradient.
        zero_grad: groups of trainable parameters whose gradient is exactly zero everywhere.
        not_in_optimizer: groups of parameters that received a gradient but are in no
            optimizer param group (empty when the optimizers were not given).
        loss_detached: no trainable parameter received a gradient at all.

    Example:
        >>> result = analyze_wiring({"a.w": 4, "b.w": 2}, {"c.w": 3}, received={"a.w", "b.w"},
        ...                         nonzero={"a.w"})
        >>> result.healthy, [g.module for g in result.zero_grad], [g.module for g in result.frozen_groups]
        (False, ['b'], ['c'])
    """

    trainable: dict[str, int]
    frozen: dict[str, int]
    no_grad: list[ModuleGroup] = field(default_factory=list)
    zero_grad: list[ModuleGroup] = field(default_factory=list)
    not_in_optimizer: list[ModuleGroup] = field(default_factory=list)
    frozen_groups: list[ModuleGroup] = field(default_factory=list)
    loss_detached: bool = False

    @property
    def healthy(self) -> bool:
        """No parameter without gradient, with zero gradient or outside the optimizers."""
        return not (self.no_grad or self.zero_grad or self.not_in_optimizer or self.loss_detached)


def analyze_wiring(
    trainable: Mapping[str, int],
    frozen: Mapping[str, int],
    received: Collection[str],
    nonzero: Collection[str],
    in_optimizer: Collection[str] | None = None,
) -> WiringResult:
    """Diagnose the wiring from which parameters received a (non-zero) gradient.

    Args:
        trainable: names and sizes of the parameters with ``requires_grad=True``.
        frozen: names and sizes of the parameters with ``requires_grad=False``.
        received: names of the trainable parameters that received a gradient.
        nonzero: names of those whose gradient has at least one non-zero value.
        in_optimizer: names of the parameters held by some optimizer param group, or ``None``
            to skip that test.

    Example:
        >>> r = analyze_wiring({"a.w": 4, "b.w": 2}, {}, received={"b.w"}, nonzero={"b.w"},
        ...                    in_optimizer={"a.w"})
        >>> [g.module for g in r.no_grad], [g.module for g in r.not_in_optimizer]
        (['a'], ['b'])
    """
    got = set(received) & set(trainable)
    frozen_groups = group_by_module(frozen, {**trainable, **frozen}) if frozen else []
    if not got:
        return WiringResult(dict(trainable), dict(frozen), frozen_groups=frozen_groups,
                            loss_detached=True)
    no_grad = [n for n in trainable if n not in got]
    zero = [n for n in trainable if n in got and n not in nonzero]
    outside: list[str] = []
    if in_optimizer is not None:
        held = set(in_optimizer)
        outside = [n for n in trainable if n in got and n not in held]
    return WiringResult(
        dict(trainable), dict(frozen),
        no_grad=group_by_module(no_grad, trainable) if no_grad else [],
        zero_grad=group_by_module(zero, trainable) if zero else [],
        not_in_optimizer=group_by_module(outside, trainable) if outside else [],
        frozen_groups=frozen_groups,
    )


def inspect_gradients(module: nn.Module,
                      optimizers: Iterable[torch.optim.Optimizer] | None = None) -> WiringResult:
    """Diagnose the wiring of ``module`` from the ``.grad`` of its parameters after a backward.

    Call it after the first ``loss.backward()`` with gradients zeroed to ``None`` before it
    (``optimizer.zero_grad()`` does that by default).

    Args:
        module: the model.
        optimizers: if given, also report parameters that get gradients but are in none of
            their param groups.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        >>> net(torch.randn(3, 4)).sum().backward()
        >>> inspect_gradients(net).healthy
        True
        >>> net.zero_grad()
        >>> net[1](torch.randn(3, 4)).sum().backward()  # net[0] is skipped
        >>> [g.describe() for g in inspect_gradients(net, [torch.optim.SGD(net[1].parameters())]).no_grad]
        ['`0` (all 2 tensors, 20 values)']
    """
    trainable: dict[str, int] = {}
    frozen: dict[str, int] = {}
    received: set[str] = set()
    nonzero: set[str] = set()
    for name, p in module.named_parameters():
        if not p.requires_grad:
            frozen[name] = p.numel()
            continue
        trainable[name] = p.numel()
        if p.grad is not None:
            received.add(name)
            flag = any_nonzero(p.grad) if p.grad.numel() else None  # any layout
            if flag is None or bool(flag):  # empty or data-less: never "exactly zero"
                nonzero.add(name)
    held = None
    if optimizers is not None:
        ids = {id(p) for opt in optimizers for group in opt.param_groups for p in group["params"]}
        held = {name for name, p in module.named_parameters() if id(p) in ids}
    return analyze_wiring(trainable, frozen, received, nonzero, held)


__all__ = [
    "ModuleGroup",
    "WiringResult",
    "analyze_wiring",
    "describe_groups",
    "group_by_module",
    "inspect_gradients",
]
