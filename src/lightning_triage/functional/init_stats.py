"""Frozen at initialization (stage 3, wiring): frozen layers that still hold what their
constructor drew.

Freezing is right for pretrained parts; a frozen part whose weights were never loaded or trained
(a leftover ``requires_grad_(False)``, an adapter library that freezes a new classification head)
is a fixed random projection: the rest of the model learns around it, slowly and worse. The two
look the same to the gradients; their values tell them apart. PyTorch's ``reset_parameters``
draws ``Linear``, ``Conv*`` and recurrent weights uniformly within a bound (``1/sqrt(fan_in)``,
``1/sqrt(hidden_size)``) and ``Embedding`` weights from N(0, 1); a trained or loaded tensor
leaves those distributions (it exceeds the bound, its moments move).

- :func:`uniform_at_init` / :func:`normal_at_init`: one tensor against one distribution;
- :func:`module_at_init`: a layer against its ``reset_parameters`` (``None``: a kind or size it
  cannot judge);
- :func:`frozen_at_init_verdict`: ``wiring.frozen_at_init``.

Example:
    >>> import torch
    >>> from torch import nn
    >>> _ = torch.manual_seed(0)
    >>> layer = nn.Linear(64, 32)
    >>> module_at_init(layer)
    True
    >>> with torch.no_grad():
    ...     _ = layer.weight.mul_(3.0)
    >>> module_at_init(layer)
    False
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from lightning_triage.functional.verdict import Verdict

#: Values a tensor needs before its moments say anything.
MIN_VALUES = 64
#: Values an ``Embedding`` table needs: its N(0, 1) draw is told from a trained table by its
#: moments only (no bound), which small tables leave loose.
MIN_NORMAL_VALUES = 4096
#: How many standard errors a moment may be off and still count as the initial draw.
Z = 6.0
#: Relative slack on a uniform bound (a bfloat16 copy rounds it by up to 2**-8).
BOUND_SLACK = 1 / 128
#: Frozen modules listed in a finding, at most.
MAX_LISTED = 12

_UNIFORM_LAYERS = (nn.Linear, nn.Bilinear, nn.modules.conv._ConvNd)


def uniform_at_init(t: Tensor, bound: float) -> bool | None:
    """Whether ``t`` is statistically a draw of U(-``bound``, ``bound``): within the bound,
    reaching near it, mean and second moment within :data:`Z` standard errors (``None``: fewer
    than :data:`MIN_VALUES` values).

    Example:
        >>> _ = torch.manual_seed(0)
        >>> uniform_at_init(torch.empty(1000).uniform_(-0.1, 0.1), 0.1)
        True
        >>> uniform_at_init(torch.randn(1000) * 0.05, 0.1)
        False
    """
    n = t.numel()
    if n < MIN_VALUES or bound <= 0:
        return None
    # the peak first, in the tensor's own dtype: trained or loaded weights almost always pass
    # the bound, and a large one is then never copied to float32
    peak = float(t.detach().abs().max())
    if not math.isfinite(peak) or peak > bound * (1 + BOUND_SLACK) \
            or peak < bound * (1 - min(0.5, 20.0 / n)):
        return False
    x = t.detach().float().flatten()
    mean, m2 = float(x.mean()), float(x.square().mean())
    return abs(mean) <= Z * bound / math.sqrt(3 * n) \
        and abs(m2 - bound ** 2 / 3) <= Z * math.sqrt(4 / 45) * bound ** 2 / math.sqrt(n)


def normal_at_init(t: Tensor, std: float = 1.0) -> bool | None:
    """Whether ``t`` is statistically a draw of N(0, ``std``²): mean, second and fourth moments
    within :data:`Z` standard errors (``None``: fewer than :data:`MIN_NORMAL_VALUES` values).

    Example:
        >>> _ = torch.manual_seed(0)
        >>> normal_at_init(torch.randn(5000)), normal_at_init(torch.randn(5000) * 0.8)
        (True, False)
    """
    n = t.numel()
    if n < MIN_NORMAL_VALUES:
        return None
    x = t.detach().float().flatten() / std
    if not bool(torch.isfinite(x).all()):
        return False
    mean, m2, m4 = float(x.mean()), float(x.square().mean()), float(x.pow(4).mean())
    root = math.sqrt(n)
    return abs(mean) <= Z / root and abs(m2 - 1) <= Z * math.sqrt(2) / root \
        and abs(m4 - 3) <= Z * math.sqrt(96) / root


def _within(t: Tensor | None, bound: float) -> bool:
    return t is None or t.numel() == 0 or float(t.detach().float().abs().max()) \
        <= bound * (1 + BOUND_SLACK)


def declared_init_std(model: nn.Module) -> float | None:
    """The standard deviation a model's configuration declares for its normal initialization
    (transformers' ``config.initializer_range``, 0.02 by default: ``_init_weights`` draws
    ``Linear`` and ``Embedding`` weights from N(0, std²), biases and the padding row at zero),
    ``None`` when no submodule declares one.

    Example:
        >>> declared_init_std(nn.Linear(2, 2)) is None
        True
    """
    for sub in model.modules():
        std = getattr(getattr(sub, "config", None), "initializer_range", None)
        if isinstance(std, float) and math.isfinite(std) and std > 0:
            return std
    return None


def _zero_or_none(t: Tensor | None) -> bool:
    return t is None or t.numel() == 0 or not bool(t.detach().any())


def module_at_init(module: nn.Module, normal_std: float | None = None) -> bool | None:
    """Whether ``module``'s own weights are what its ``reset_parameters`` draws: ``Linear``,
    ``Bilinear``, ``Conv*`` (weight uniform within ``1/sqrt(fan_in)``, bias within it too),
    recurrent layers (every tensor uniform within ``1/sqrt(hidden_size)``), ``Embedding``
    (N(0, 1), the padding row left out, at least :data:`MIN_NORMAL_VALUES` values). With
    ``normal_std`` (:func:`declared_init_std`), a ``Linear`` whose weight is a draw of
    N(0, ``normal_std``²) (at least :data:`MIN_NORMAL_VALUES` values; mean, second and fourth
    moments) and whose bias is zero, and an ``Embedding`` drawn from N(0, ``normal_std``²), are
    at their initialization too: trained or loaded weights leave those moments (their scale
    moves, their tails grow). ``None``: another kind of layer, lazy or meta parameters, or too
    few values to judge.

    Example:
        >>> module_at_init(nn.ReLU()) is None, module_at_init(nn.Linear(2, 2)) is None
        (True, True)
    """
    params = list(module.parameters(recurse=False))
    if not params or any(isinstance(p, nn.parameter.UninitializedParameter) or p.is_meta
                         for p in params):
        return None
    if isinstance(module, nn.Embedding):
        w = module.weight
        if module.padding_idx is not None:
            keep = torch.ones(w.shape[0], dtype=torch.bool, device=w.device)
            keep[module.padding_idx] = False
            w = w[keep]
        at_init = normal_at_init(w)
        if not at_init and normal_std is not None:
            return normal_at_init(w, normal_std)
        return at_init
    if isinstance(module, nn.RNNBase):
        bound = 1.0 / math.sqrt(module.hidden_size)
        verdicts = [uniform_at_init(p, bound) for p in params if p.numel() >= MIN_VALUES]
        if not verdicts or any(v is None for v in verdicts):
            return None
        return all(verdicts) and all(_within(p, bound) for p in params)
    if isinstance(module, _UNIFORM_LAYERS):
        weight = getattr(module, "weight", None)
        if not isinstance(weight, Tensor) or weight.dim() < 2:
            return None
        # `reset_parameters`' fan-in: dimension 1 times the receptive field (Bilinear: in1)
        fan_in = weight.size(1) if isinstance(module, nn.Bilinear) else \
            weight.size(1) * math.prod(weight.shape[2:])
        if fan_in <= 0:
            return None
        bound = 1.0 / math.sqrt(fan_in)
        at_init = uniform_at_init(weight, bound)
        if not at_init and normal_std is not None and isinstance(module, nn.Linear):
            normal = normal_at_init(weight, normal_std)
            return normal if not normal else _zero_or_none(module.bias)
        if not at_init:
            return at_init
        return _within(getattr(module, "bias", None), bound)
    return None


def _has_trainable_copy(module: nn.Module, trainable: Sequence[Tensor]) -> bool:
    """Whether a trainable tensor holds the same values as one of ``module``'s (an EMA teacher
    or a target network, copied from the trained model at the start)."""
    for p in module.parameters(recurse=False):
        for q in trainable:
            if q.shape == p.shape and q.dtype == p.dtype and q.device == p.device \
                    and bool(torch.equal(q.detach(), p.detach())):
                return True
    return False


def frozen_layers_at_init(model: nn.Module, trainable_ids: set[int],
                          max_modules: int = 4096) -> list[tuple[str, str, int]]:
    """The layers of ``model`` whose own parameters are all frozen (no id in ``trainable_ids``)
    and still at their default initialization (:func:`module_at_init`), without a trainable copy
    (an EMA or target network): ``(name, layer type, values)`` each, in ``named_modules`` order
    (at most ``max_modules`` layers judged).

    Example:
        >>> _ = torch.manual_seed(0)
        >>> net = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 10))
        >>> frozen_layers_at_init(net, {id(p) for p in net[1].parameters()})
        [('0', 'Linear', 2080)]
    """
    trainable = [p for p in model.parameters() if id(p) in trainable_ids]
    std = declared_init_std(model)
    found: list[tuple[str, str, int]] = []
    judged = 0
    for name, sub in model.named_modules():
        own = list(sub.parameters(recurse=False))
        if not own or any(id(p) in trainable_ids for p in own):
            continue
        judged += 1
        if judged > max_modules:
            break
        with torch.no_grad():
            if module_at_init(sub, std) and not _has_trainable_copy(sub, trainable):
                found.append((name, type(sub).__name__, sum(p.numel() for p in own)))
    return found


def frozen_at_init_verdict(step: int | None, modules: Sequence[tuple[str, str, int]],
                           frozen_numel: int, total_numel: int) -> Verdict:
    """``wiring.frozen_at_init``: frozen layers whose weights are still their random draw.

    Args:
        step: the global step of the first backward.
        modules: ``(name, layer type, values)`` of each frozen layer found at its initialization.
        frozen_numel: values of every frozen parameter.
        total_numel: values of every parameter.

    Example:
        >>> v = frozen_at_init_verdict(0, [("body.0", "Conv2d", 80)], 80, 1000)
        >>> v.code, v.layer, v.evidence["numel"]
        ('wiring.frozen_at_init', 'body.0', 80)
    """
    numel = sum(n for _, _, n in modules)
    listed = ", ".join(f"`{name or '(root)'}` ({kind})" for name, kind, _ in modules[:MAX_LISTED])
    more = f" and {len(modules) - MAX_LISTED} more" if len(modules) > MAX_LISTED else ""
    return Verdict(
        "wiring.frozen_at_init", step,
        f"{len(modules)} frozen layer(s) still hold the random values their constructor drew "
        f"({numel:,} values, {numel / max(total_numel, 1):.0%} of the model's; "
        f"{frozen_numel:,} values are frozen in all): {listed}{more}. Their weights are "
        "statistically the layer's default initialization (`reset_parameters`), not trained or "
        "loaded values: they will never learn.",
        layer=modules[0][0] if modules else None,
        evidence={"modules": [name for name, _, _ in modules[:MAX_LISTED * 10]],
                  "types": sorted({kind for _, kind, _ in modules}), "numel": numel,
                  "frozen_numel": frozen_numel, "total_numel": total_numel})


__all__ = ["MIN_NORMAL_VALUES", "MIN_VALUES", "declared_init_std", "frozen_at_init_verdict",
           "frozen_layers_at_init", "module_at_init", "normal_at_init", "uniform_at_init"]
