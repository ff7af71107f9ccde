"""Unregistered parameters (stage 3, wiring): tensors that train the loss but that the module
does not own.

A layer kept in a plain Python ``list``, ``dict`` or ``tuple`` attribute (or a weight kept as a
plain tensor attribute) takes part in every forward and in the loss, but ``nn.Module`` does not
register it: ``parameters()`` (so the optimizer), ``.to(device)``, ``state_dict()`` and the
checkpoints all miss it. The rules here find such tensors from the loss's autograd graph alone
(read, never changed):

- :func:`graph_leaves`: the leaf tensors the loss's graph accumulates gradients into (its
  ``AccumulateGrad`` nodes);
- :func:`locate_tensors`: where a module keeps tensors it does not register (the attribute path,
  ``blocks[2].weight``);
- :func:`unregistered_verdict`: ``wiring.unregistered_params``.

Example:
    >>> import torch
    >>> from torch import nn
    >>> class Net(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.head = nn.Linear(3, 1)
    ...         self.blocks = [nn.Linear(3, 3)]
    ...     def forward(self, x):
    ...         return self.head(self.blocks[0](x))
    >>> net = Net()
    >>> loss = net(torch.ones(2, 3)).sum()
    >>> owned = {id(p) for p in net.parameters()}
    >>> stray = [t for t in graph_leaves(loss) if id(t) not in owned]
    >>> sorted(locate_tensors(net, {id(t) for t in stray}).values())
    ['blocks[0].bias', 'blocks[0].weight']
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from lightning_triage.functional.verdict import Verdict

#: Autograd nodes walked in one graph, at most (a bound on the cost for huge graphs).
MAX_NODES = 200_000
#: How deep :func:`locate_tensors` follows nested containers and modules kept in them.
MAX_DEPTH = 4
#: Values :func:`locate_tensors` looks at, at most (a module that keeps a data set in a list).
MAX_VISITS = 100_000
#: Paths listed in a finding, at most.
MAX_LISTED = 20
#: ``nn.Module`` attributes that hold what it registers (walked by ``named_modules`` already).
_REGISTRIES = frozenset({"_parameters", "_buffers", "_modules"})


def graph_leaves(loss: Tensor, max_nodes: int = MAX_NODES) -> list[Tensor]:
    """The leaf tensors the backward of ``loss`` accumulates a gradient into: the ``variable``
    of every ``AccumulateGrad`` node reachable from ``loss.grad_fn`` (each tensor once, in the
    order found). Reads the graph only.

    Example:
        >>> import torch
        >>> w = torch.ones(2, requires_grad=True)
        >>> [t is w for t in graph_leaves((w * 3).sum())]
        [True]
    """
    root = getattr(loss, "grad_fn", None)
    if root is None:
        return []
    leaves: dict[int, Tensor] = {}
    seen = {id(root)}
    stack: list[Any] = [root]
    while stack and len(seen) <= max_nodes:
        node = stack.pop()
        variable = getattr(node, "variable", None)
        if isinstance(variable, Tensor):
            leaves.setdefault(id(variable), variable)
        for nxt, _ in getattr(node, "next_functions", ()) or ():
            if nxt is not None and id(nxt) not in seen:
                seen.add(id(nxt))
                stack.append(nxt)
    return list(leaves.values())


def _items(value: Any) -> Iterable[tuple[str, Any]]:
    """The items of a plain container, each with the suffix that names it (``[2]``, ``['a']``)."""
    if isinstance(value, Mapping):
        return ((f"[{k!r}]", v) for k, v in list(value.items()))
    if isinstance(value, (list, tuple)):
        return ((f"[{i}]", v) for i, v in enumerate(value))
    return ()


def locate_tensors(module: nn.Module, ids: set[int], max_depth: int = MAX_DEPTH) -> dict[int, str]:
    """Where ``module`` keeps the tensors whose ``id`` is in ``ids`` without registering them:
    ``id -> attribute path`` (``blocks[2].weight``, ``encoder.heads['a'].bias``, ``scale``).

    Walks the plain attributes of every registered submodule: ``list``/``tuple``/``dict`` values
    (nested up to ``max_depth``), the modules they hold (their parameters and buffers, and their
    own plain attributes) and plain tensor attributes, :data:`MAX_VISITS` values at most.
    Tensors not found are left out.

    Example:
        >>> import torch
        >>> m = nn.Module()
        >>> m.heads = {"a": nn.Linear(2, 2)}
        >>> w = m.heads["a"].weight
        >>> locate_tensors(m, {id(w)})[id(w)]
        "heads['a'].weight"
    """
    found: dict[int, str] = {}
    visited: set[int] = set()
    budget = [MAX_VISITS]

    def visit(value: Any, path: str, depth: int) -> None:
        if len(found) == len(ids) or depth > max_depth or id(value) in visited \
                or budget[0] <= 0:
            return
        budget[0] -= 1
        if isinstance(value, Tensor):
            if id(value) in ids:
                found.setdefault(id(value), path)
            return
        if not isinstance(value, (nn.Module, Mapping, list, tuple)):
            return
        visited.add(id(value))
        if isinstance(value, nn.Module):
            for name, t in (*value.named_parameters(), *value.named_buffers()):
                if id(t) in ids:
                    found.setdefault(id(t), f"{path}.{name}")
            attributes(value, path, depth + 1)
            return
        for suffix, item in _items(value):
            visit(item, f"{path}{suffix}", depth + 1)

    def attributes(owner: nn.Module, prefix: str, depth: int) -> None:
        for attr, value in list(vars(owner).items()):
            if attr not in _REGISTRIES:
                visit(value, f"{prefix}.{attr}" if prefix else attr, depth)

    for name, sub in module.named_modules():
        visited.add(id(sub))
        attributes(sub, name, 0)
    return found


def unregistered_verdict(step: int | None, paths: Sequence[str], unlocated: int, numel: int,
                         in_optimizer: bool) -> Verdict:
    """``wiring.unregistered_params``: tensors that receive gradients from the loss but are not
    parameters (nor buffers) of the LightningModule.

    Args:
        step: the global step of the first backward.
        paths: where the module keeps them (attribute paths), sorted.
        unlocated: how many more are ``nn.Parameter`` objects found in no attribute.
        numel: their values in all.
        in_optimizer: every one of them is in an optimizer's param group (they train, but
            ``state_dict`` and ``.to()`` miss them): a warning, not an error.

    Example:
        >>> v = unregistered_verdict(0, ["blocks[0].weight", "blocks[0].bias"], 0, 2080, False)
        >>> v.code, v.severity, v.evidence["containers"]
        ('wiring.unregistered_params', 'error', ['blocks'])
    """
    count = len(paths) + unlocated
    listed = ", ".join(f"`{p}`" for p in paths[:MAX_LISTED])
    more = f" (and {len(paths) - MAX_LISTED} more)" if len(paths) > MAX_LISTED else ""
    where = f": {listed}{more}" if paths else ""
    if unlocated:
        where += (f"{'; ' if paths else ': '}{unlocated} `nn.Parameter` tensor(s) found in no "
                  "attribute of the module")
    fate = ("every optimizer holds them, so they train, but `state_dict()`, the checkpoints and "
            "`.to(device)` miss them" if in_optimizer else
            "no optimizer updates them (they keep their initial values), and `state_dict()`, "
            "the checkpoints and `.to(device)` miss them")
    containers = sorted({p.split("[", 1)[0] for p in paths if "[" in p})
    return Verdict(
        "wiring.unregistered_params", step,
        f"{count} tensor(s) ({numel:,} values) require grad and get gradients from the loss at "
        f"step {step}, but are not parameters of the LightningModule{where}: {fate}.",
        severity="warning" if in_optimizer else "error",
        evidence={"paths": list(paths[:MAX_LISTED * 10]), "num_tensors": count,
                  "unlocated": unlocated, "numel": numel, "containers": containers,
                  "in_optimizer": in_optimizer})


__all__ = ["MAX_DEPTH", "MAX_NODES", "graph_leaves", "locate_tensors", "unregistered_verdict"]
