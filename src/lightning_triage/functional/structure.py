"""Structure probes: does an output mix examples, see later positions, see the targets, or rely
on silent broadcasting?

Pure functions over tensors, autograd graphs and forward functions (no Lightning). Exact
independence shows as an exactly zero gradient (autograd only connects what the computation
connects), so the tolerances below only absorb numerical dust such as a ``-1e9`` mask.

Example:
    >>> import torch
    >>> net = torch.nn.Linear(4, 3)
    >>> batch_mixing(net, torch.randn(6, 4)).mixing
    False
    >>> batch_mixing(lambda x: torch.log_softmax(net(x), dim=0), torch.randn(6, 4)).mixing
    True
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from lightning_triage.functional.collection import map_tensors

#: Relative gradient (or output change) below which two things count as independent.
DEFAULT_TOLERANCE = 1e-5


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _projection(shape: torch.Size, dtype: torch.dtype, device: torch.device, seed: int) -> Tensor:
    """A fixed random weighting (own generator: no global RNG consumed)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


def same_storage(a: Any, b: Any) -> bool:
    """Whether two tensors share memory (the same tensor, or a view of it).

    Example:
        >>> t = torch.arange(6)
        >>> same_storage(t.view(2, 3), t), same_storage(t.clone(), t)
        (True, False)
    """
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        return False
    if a is b:
        return True
    try:
        return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
                    and a.untyped_storage().data_ptr() != 0)
    except (RuntimeError, NotImplementedError):  # tensor subclasses without storage
        return False


def replace_tensor(batch: Any, old: Tensor, new: Tensor) -> Any:
    """Rebuild ``batch`` (tensors, dicts, lists, tuples, namedtuples, dataclasses) with the
    tensor ``old`` (by identity) replaced by ``new``.

    Example:
        >>> x, y = torch.zeros(2), torch.ones(2)
        >>> out = replace_tensor({"x": x, "y": [y], "id": "a"}, y, torch.full((2,), 5.0))
        >>> out["y"][0].tolist(), out["x"] is x, out["id"]
        ([5.0, 5.0], True, 'a')
    """
    return map_tensors(lambda t: new if t is old else t, batch)


# ---------------------------------------------------------------------------------------------
# batch independence
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchDependence:
    """How much example ``example``'s output depends on the other examples' inputs.

    ``ratio`` is the gradient norm reaching the other examples over the one reaching the
    example itself (``inf`` when only the others are reached); ``worst_example`` is the other
    example that receives the largest gradient.

    Example:
        >>> dep = batch_mixing(lambda x: x - x.mean(dim=0), torch.randn(8, 4))  # mixes the batch
        >>> dep.mixing, dep.conclusive, dep.worst_example is not None
        (True, True, True)
        >>> batch_mixing(lambda x: 2 * x, torch.randn(8, 4)).ratio
        0.0
    """

    example: int
    own_grad_norm: float
    other_grad_norm: float
    ratio: float
    worst_example: int | None
    mixing: bool
    conclusive: bool


def example_dependence(output: Tensor, leaf: Tensor, *, example: int = 0,
                       tolerance: float = DEFAULT_TOLERANCE, retain_graph: bool = False,
                       seed: int = 0) -> BatchDependence:
    """Gradient of one example's output w.r.t. every example's input (dim 0 of both).

    ``output`` must be computed from ``leaf`` (a tensor with ``requires_grad``).
    """
    n = leaf.shape[0]
    weights = _projection(output[example].shape, output.dtype, output.device, seed)
    (grad,) = torch.autograd.grad((output[example] * weights).sum(), leaf,
                                  retain_graph=retain_graph, allow_unused=True)
    if grad is None or n < 2:
        return BatchDependence(example, 0.0, 0.0, 0.0, None, False, False)
    per_example = grad.detach().double().reshape(n, -1).norm(dim=1)
    own = float(per_example[example])
    others = per_example.clone()
    others[example] = 0.0
    other = float(others.norm())
    worst = int(others.argmax()) if other > 0 else None
    ratio = other / own if own > 0 else (math.inf if other > 0 else 0.0)
    conclusive = own > 0 or other > 0
    return BatchDependence(example, own, other, ratio, worst, ratio > tolerance, conclusive)


def pairwise_output(output: Tensor, leaf: Tensor, *, example: int = 0, column: int = 1,
                    tolerance: float = DEFAULT_TOLERANCE, retain_graph: bool = False) -> bool:
    """Whether an ``(N, N, ...)`` output is a pairwise score between examples by design (a
    similarity matrix with in-batch negatives): ``output[example, column]`` depends on the
    inputs of ``example`` and ``column`` only, not on the other examples.

    Example:
        >>> x = torch.randn(5, 3, requires_grad=True)
        >>> pairwise_output(x @ x.T, x), pairwise_output(torch.log_softmax(x @ x.T, dim=0), x)
        (True, False)
    """
    n = leaf.shape[0]
    if n < 3 or output.dim() < 2 or output.shape[0] != n or output.shape[1] != n:
        return False
    (grad,) = torch.autograd.grad(output[example, column].sum(), leaf, retain_graph=retain_graph,
                                  allow_unused=True)
    if grad is None:
        return False
    per_example = grad.detach().double().reshape(n, -1).norm(dim=1)
    pair = float(per_example[[example, column]].norm())
    rest = per_example.clone()
    rest[[example, column]] = 0.0
    return pair > 0 and float(rest.norm()) <= tolerance * pair


def batch_mixing(forward: Callable[[Tensor], Tensor], inputs: Tensor, *, example: int = 0,
                 tolerance: float = DEFAULT_TOLERANCE) -> BatchDependence:
    """Whether ``forward``'s output for ``example`` depends on other examples' ``inputs``.

    Args:
        forward: maps a floating batch (examples on dim 0) to outputs (examples on dim 0).
        inputs: a floating batch of at least two examples.
        example: the example whose output is differentiated.
        tolerance: gradient ratio above which the output counts as mixed.

    Example:
        >>> bn = torch.nn.BatchNorm1d(4)
        >>> batch_mixing(bn, torch.randn(8, 4)).mixing  # training mode: batch statistics
        True
        >>> batch_mixing(bn.eval(), torch.randn(8, 4)).mixing
        False
    """
    leaf = inputs.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        output = forward(leaf)
    return example_dependence(output, leaf, example=example, tolerance=tolerance)


# ---------------------------------------------------------------------------------------------
# causality
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CausalDependence:
    """Which later input positions an output position depends on (sequence on dim 1).

    Example:
        >>> first = causal_leak(lambda h: h.flip(1).cumsum(1).flip(1), torch.randn(2, 6, 4))[0]
        >>> first.position, first.future_positions, first.leak
        (0, [1, 2, 3, 4, 5], True)
    """

    position: int
    future_positions: list[int]
    past_grad_norm: float
    future_grad_norm: float
    ratio: float
    leak: bool
    conclusive: bool


def position_dependence(output: Tensor, leaf: Tensor, position: int, *, example: int = 0,
                        tolerance: float = DEFAULT_TOLERANCE, retain_graph: bool = False,
                        seed: int = 1) -> CausalDependence:
    """Gradient of ``output[example, position]`` w.r.t. ``leaf[example, :]``, split into the
    positions up to ``position`` and those after it (dim 1 is the sequence of both)."""
    target = output[example, position]
    weights = _projection(target.shape, output.dtype, output.device, seed + position)
    (grad,) = torch.autograd.grad((target * weights).sum(), leaf, retain_graph=retain_graph,
                                  allow_unused=True)
    if grad is None:
        return CausalDependence(position, [], 0.0, 0.0, 0.0, False, False)
    per_position = grad[example].detach().double().reshape(leaf.shape[1], -1).norm(dim=1)
    past = float(per_position[: position + 1].norm())
    future_part = per_position[position + 1:]
    future = float(future_part.norm())
    scale = past + future
    ratio = future / scale if scale > 0 else 0.0
    leaking = [position + 1 + int(i) for i in torch.nonzero(future_part > tolerance * scale).flatten()]
    return CausalDependence(position, leaking, past, future, ratio, ratio > tolerance, scale > 0)


def probe_positions(length: int) -> list[int]:
    """The output positions the causal probe differentiates: the first, the middle and the
    second to last (each must not see any later position).

    Example:
        >>> probe_positions(8)
        [0, 4, 6]
    """
    return sorted({p for p in (0, length // 2, length - 2) if 0 <= p < length - 1})


def causal_leak(forward: Callable[[Tensor], Tensor], inputs: Tensor, *,
                positions: Sequence[int] | None = None,
                tolerance: float = DEFAULT_TOLERANCE) -> list[CausalDependence]:
    """Probe whether outputs at position ``t`` depend on inputs at positions ``> t``.

    Args:
        forward: maps a floating ``(N, T, ...)`` batch to ``(N, T, ...)`` outputs.
        inputs: the floating batch (e.g. token embeddings), sequence on dim 1.
        positions: output positions to probe (default :func:`probe_positions`).
        tolerance: gradient share above which a position counts as seen.

    Example:
        >>> x = torch.randn(2, 6, 4)
        >>> [r.leak for r in causal_leak(lambda h: h.cumsum(dim=1), x)]
        [False, False, False]
        >>> [r.future_positions for r in causal_leak(lambda h: h.flip(1).cumsum(1).flip(1), x)][0]
        [1, 2, 3, 4, 5]
    """
    leaf = inputs.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        output = forward(leaf)
    chosen = list(positions) if positions is not None else probe_positions(leaf.shape[1])
    return [position_dependence(output, leaf, p, tolerance=tolerance,
                                retain_graph=i < len(chosen) - 1)
            for i, p in enumerate(chosen)]


def is_next_token(inputs: Tensor | None, targets: Tensor | None, ignore_index: int = -100) -> bool:
    """Whether the targets are the inputs shifted by one position (next-token prediction):
    ``targets[:, :-1] == inputs[:, 1:]`` wherever the target is not ``ignore_index``.

    Example:
        >>> seq = torch.randint(0, 10, (4, 9))
        >>> is_next_token(seq[:, :-1], seq[:, 1:]), is_next_token(seq[:, :-1], seq[:, :-1].flip(1))
        (True, False)
    """
    if inputs is None or targets is None or inputs.shape != targets.shape:
        return False
    if inputs.dim() != 2 or inputs.shape[1] < 2:
        return False
    if inputs.is_floating_point() or targets.is_floating_point():
        return False
    shifted_targets, shifted_inputs = targets[:, :-1], inputs[:, 1:]
    kept = shifted_targets != ignore_index
    if not bool(kept.any()):
        return False
    return bool((shifted_targets[kept] == shifted_inputs[kept]).all())


def labels_are_inputs(inputs: Tensor | None, targets: Tensor | None,
                      ignore_index: int = -100) -> bool:
    """Whether the targets are the inputs themselves (``labels = input_ids``, the convention of
    a language model that shifts inside its loss), ``ignore_index`` only at a padded end.

    A masked-LM batch (``ignore_index`` scattered, masked inputs) is not.

    Example:
        >>> ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]])
        >>> labels_are_inputs(ids, ids.masked_fill(ids == 0, -100))
        True
        >>> labels_are_inputs(ids, torch.tensor([[-100, 6, -100, -100], [8, -100, -100, -100]]))
        False
    """
    if inputs is None or targets is None or inputs.shape != targets.shape:
        return False
    if inputs.dim() != 2 or inputs.shape[1] < 2 or inputs.is_floating_point() \
            or targets.is_floating_point():
        return False
    kept = targets != ignore_index
    if not bool(kept.any()) or not bool((targets[kept] == inputs[kept]).all()):
        return False
    ignored = (~kept).long()
    # no ignored position, or one padded end per row: never back from ignored to kept (or the
    # reverse) along a row
    return bool((ignored[:, 1:] >= ignored[:, :-1]).all() or (ignored[:, 1:] <= ignored[:, :-1]).all())


def target_shift(inputs: Tensor, target: Tensor, ignore_index: int = -100) -> int | None:
    """By how many positions a target tensor given to a loss leads the inputs: ``1`` when
    ``target[:, t] == inputs[:, t + 1]`` (next-token: the labels were shifted), ``0`` when it is
    the inputs themselves, ``2`` when it leads by two (labels shifted twice), ``None`` for none
    of these (``ignore_index`` entries skipped; a flattened target is read as ``(N, -1)``).

    Example:
        >>> ids = torch.tensor([[5, 6, 7, 8], [1, 2, 3, 4]])
        >>> target_shift(ids, ids[:, 1:].reshape(-1)), target_shift(ids, ids), target_shift(ids, ids.flip(1))
        (1, 0, None)
        >>> target_shift(ids, ids[:, 2:])
        2
    """
    n, length = inputs.shape[:2]
    if target.is_floating_point() or target.numel() == 0 or target.numel() % n:
        return None
    rows = target.reshape(n, -1)
    for shift in (1, 0, 2):
        span = min(rows.shape[1], length - shift)
        part, seen = rows[:, :span], inputs[:, shift:shift + span].to(rows.device)
        kept = part != ignore_index
        if span > 0 and bool(kept.any()) and bool((part[kept] == seen[kept]).all()):
            return shift
    return None


# ---------------------------------------------------------------------------------------------
# target leak
# ---------------------------------------------------------------------------------------------
def aligned_start(output_shape: Sequence[int], target_shape: Sequence[int]) -> int | None:
    """For sequence targets and outputs with ``L <= T`` positions on dim 1, the first target
    position the output predicts (``T - L``); ``None`` when not sequence-aligned.

    Sequences are token targets ``(N, T)`` with outputs ``(N, L)`` or ``(N, L, V)``, and
    feature sequences ``(N, T, F)`` with outputs ``(N, L, F)``. Output position 0 then predicts
    target ``T - L`` and may depend (teacher forcing) on the targets before it, never on that one
    or later ones.

    Example:
        >>> aligned_start((4, 7, 16), (4, 8)), aligned_start((4, 10), (4,))
        (1, None)
        >>> aligned_start((4, 3, 8, 8), (4, 8, 8))  # segmentation maps: not a sequence
    """
    if len(target_shape) == 2:
        if len(output_shape) not in (2, 3):
            return None
    elif len(target_shape) == 3:
        if len(output_shape) != 3 or output_shape[2] != target_shape[2]:
            return None
    else:
        return None
    if target_shape[1] < 2:
        return None
    if output_shape[0] != target_shape[0] or not 1 <= output_shape[1] <= target_shape[1]:
        return None
    return int(target_shape[1] - output_shape[1])


def redraw_targets(targets: Tensor, start: int | None = None, seed: int = 0) -> Tensor | None:
    """New targets drawn from the targets' own values: a fixed permutation of the values (all of
    them, or positions ``>= start`` on dim 1 for sequences). ``None`` when every value is equal
    (nothing to redraw).

    Example:
        >>> y = torch.arange(6)
        >>> new = redraw_targets(y)
        >>> sorted(new.tolist()) == y.tolist(), bool((new != y).any())
        (True, True)
    """
    gen = torch.Generator().manual_seed(seed)
    region = targets if start is None else targets[:, start:]
    flat = region.reshape(-1)
    if flat.numel() < 2 or bool((flat == flat[0]).all()):
        return None
    for attempt in range(5):
        perm = torch.randperm(flat.numel(), generator=gen).to(flat.device)
        shuffled = flat[perm]
        if attempt == 4 or bool((shuffled != flat).float().mean() > 0.5):
            break
    new = targets.clone()
    if start is None:
        new.copy_(shuffled.reshape(targets.shape))
    else:
        new[:, start:] = shuffled.reshape(region.shape)
    return new


@dataclass(frozen=True)
class OutputChange:
    """How much an output changed between two runs of the same forward.

    Example:
        >>> change = output_change(torch.zeros(2, 4), torch.tensor([[0.0, 0, 0, 0], [0, 0, 0, 2]]))
        >>> change.changed, change.max_abs_diff, change.fraction_changed
        (True, 2.0, 0.125)
    """

    changed: bool
    max_abs_diff: float
    relative_diff: float
    fraction_changed: float
    compared: str
    shape_before: list[int]
    shape_after: list[int]


def output_change(before: Tensor, after: Tensor, *, positions: slice | None = None,
                  tolerance: float = DEFAULT_TOLERANCE) -> OutputChange:
    """Compare two outputs (optionally only ``[:, positions]``); a different shape is a change.

    Example:
        >>> a = torch.ones(2, 3)
        >>> output_change(a, a.clone()).changed, output_change(a, a + 1).max_abs_diff
        (False, 1.0)
    """
    shapes = list(before.shape), list(after.shape)
    if before.shape != after.shape:
        return OutputChange(True, math.inf, math.inf, 1.0, "shape", *shapes)
    compared = "all"
    if positions is not None:
        before, after = before[:, positions], after[:, positions]
        compared = f"positions {positions.start or 0}..{(positions.stop or 0) - 1} of dim 1"
    diff = (after.detach().double() - before.detach().double()).abs()
    if diff.numel() == 0:
        return OutputChange(False, 0.0, 0.0, 0.0, compared, *shapes)
    max_diff = float(diff.max())
    scale = float(before.detach().double().abs().max())
    relative = max_diff / scale if scale > 0 else (math.inf if max_diff > 0 else 0.0)
    fraction = float((diff > tolerance * max(scale, 1e-12)).double().mean())
    return OutputChange(relative > tolerance, max_diff, relative, fraction, compared, *shapes)


# ---------------------------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------------------------
def broadcast_mismatch(prediction_shape: Sequence[int],
                       target_shape: Sequence[int]) -> list[int] | None:
    """The broadcast shape when ``prediction - target`` would silently grow beyond both shapes
    (e.g. ``(N, 1)`` with ``(N,)`` gives ``(N, N)``), else ``None``.

    Example:
        >>> broadcast_mismatch((8, 1), (8,)), broadcast_mismatch((8,), (8,)), broadcast_mismatch((8, 3), (1,))
        ([8, 8], None, None)
    """
    try:
        result = torch.broadcast_shapes(torch.Size(prediction_shape), torch.Size(target_shape))
    except RuntimeError:
        return None
    if result.numel() > max(math.prod(prediction_shape), math.prod(target_shape)):
        return list(result)
    return None


_SIZE_WARNING = re.compile(r"target size \((?:torch\.Size\()?\[?([\d, ]*)\]?\)?\) that is different "
                           r"to the input size \((?:torch\.Size\()?\[?([\d, ]*)\]?\)?\)")


def parse_size_warning(message: str) -> tuple[list[int], list[int]] | None:
    """``(input_shape, target_shape)`` from torch's "Using a target size ... that is different to
    the input size ..." loss warning, else ``None``.

    Example:
        >>> parse_size_warning("Using a target size (torch.Size([32])) that is different to the "
        ...                    "input size (torch.Size([32, 1])). This will likely lead to ...")
        ([32, 1], [32])
    """
    match = _SIZE_WARNING.search(message)
    if match is None:
        return None

    def dims(text: str) -> list[int]:
        return [int(d) for d in text.replace(" ", "").split(",") if d]

    return dims(match.group(2)), dims(match.group(1))


_ELEMENTWISE = {
    F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.soft_margin_loss,
    F.poisson_nll_loss, F.gaussian_nll_loss,
    torch.sub, torch.subtract, torch.add, torch.mul, torch.multiply, torch.div, torch.divide,
    torch.eq, torch.ne,
    Tensor.sub, Tensor.add, Tensor.mul, Tensor.div, Tensor.eq, Tensor.ne,
    Tensor.__sub__, Tensor.__rsub__, Tensor.__add__, Tensor.__radd__, Tensor.__mul__,
    Tensor.__rmul__, Tensor.__truediv__, Tensor.__rtruediv__, Tensor.__eq__, Tensor.__ne__,
}


_LOSSES = {
    F.cross_entropy, F.nll_loss, F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss,
    F.binary_cross_entropy, F.binary_cross_entropy_with_logits, F.kl_div, F.poisson_nll_loss,
    F.gaussian_nll_loss, F.soft_margin_loss, F.multilabel_soft_margin_loss, F.multi_margin_loss,
    F.multilabel_margin_loss,
}


def _ignore_index(func: Any, args: Any, kwargs: Mapping[str, Any]) -> int | None:
    """The ``ignore_index`` a ``cross_entropy``/``nll_loss`` call used (its 5th argument)."""
    if func not in (F.cross_entropy, F.nll_loss):
        return None
    value = kwargs.get("ignore_index", args[4] if len(args) > 4 else -100)
    return value if isinstance(value, int) else None


@dataclass
class BroadcastEvent:
    """One elementwise operation between a prediction and the targets that broadcast."""

    op: str
    prediction_shape: list[int]
    target_shape: list[int]
    result_shape: list[int]


class LossWatch(TorchFunctionMode):
    """A torch function mode that watches what the code does with the targets.

    It records elementwise operations (``-``, ``F.mse_loss``...) between the targets (or tensors
    computed only from them, such as ``y.float()``) and another tensor whose shapes broadcast to
    something larger than both (``events``), the predictions given to loss functions with
    the targets (``loss_inputs``: ``(function name, tensor)``, graph kept; ``loss_targets``: the
    target tensors they were given, as derived from the targets), and how often the
    targets were used as targets (``target_uses``: given to a loss function, or combined
    elementwise with a tensor that requires grad, such as ``pred - y``).

    Example:
        >>> y = torch.randn(8)
        >>> with LossWatch(y) as watch:
        ...     _ = ((torch.randn(8, 1) - y.float()) ** 2).mean()
        >>> [(e.prediction_shape, e.target_shape, e.result_shape) for e in watch.events]
        [([8, 1], [8], [8, 8])]
    """

    def __init__(self, targets: Tensor, max_events: int = 8) -> None:
        super().__init__()
        self.targets = targets
        self.max_events = max_events
        self.events: list[BroadcastEvent] = []
        self._derived: dict[int, Tensor] = {}
        self.loss_inputs: list[tuple[str, Tensor]] = []
        self.loss_targets: list[Tensor] = []
        #: the ``ignore_index`` each loss call used (``None``: a loss without one)
        self.loss_ignore: list[int | None] = []
        self.target_uses = 0

    def _is_derived(self, t: Tensor) -> bool:
        return id(t) in self._derived or same_storage(t, self.targets)

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
        if not tensors:
            return result
        derived = [self._is_derived(t) for t in tensors]
        if all(derived):
            for out in (result if isinstance(result, (list, tuple)) else (result,)):
                if isinstance(out, Tensor) and len(self._derived) < 10_000:
                    self._derived[id(out)] = out  # keep a reference: ids stay unique
            return result
        to_loss = func in _LOSSES and any(derived)
        against_prediction = (func in _ELEMENTWISE and len(tensors) >= 2
                              and derived[0] != derived[1]
                              and (tensors[1] if derived[0] else tensors[0]).requires_grad)
        if to_loss or against_prediction:
            self.target_uses += 1
        if func in _LOSSES and len(tensors) >= 2 and any(derived[1:]) and not derived[0] \
                and len(self.loss_inputs) < self.max_events:
            self.loss_inputs.append((getattr(func, "__name__", str(func)), tensors[0]))
            target = next(t for t, d in zip(tensors[1:], derived[1:], strict=True) if d)
            self.loss_targets.append(target.detach())
            self.loss_ignore.append(_ignore_index(func, args, kwargs))
        if func in _ELEMENTWISE and len(tensors) >= 2 and any(derived[:2]) \
                and not all(derived[:2]) and len(self.events) < self.max_events:
            target, prediction = (tensors[0], tensors[1]) if derived[0] else (tensors[1], tensors[0])
            grown = broadcast_mismatch(prediction.shape, target.shape)
            if grown is not None:
                self.events.append(BroadcastEvent(getattr(func, "__name__", str(func)),
                                                  list(prediction.shape), list(target.shape),
                                                  grown))
        return result


__all__ = [
    "DEFAULT_TOLERANCE",
    "BatchDependence",
    "BroadcastEvent",
    "CausalDependence",
    "LossWatch",
    "OutputChange",
    "aligned_start",
    "batch_mixing",
    "broadcast_mismatch",
    "causal_leak",
    "example_dependence",
    "is_next_token",
    "labels_are_inputs",
    "output_change",
    "pairwise_output",
    "parse_size_warning",
    "position_dependence",
    "probe_positions",
    "redraw_targets",
    "replace_tensor",
    "same_storage",
    "target_shift",
]
