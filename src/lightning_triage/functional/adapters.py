"""Parameter-efficient fine-tuning: adapters, their zero-initialized partners, the frozen base.

Low-rank adapters (peft's LoRA) start their output projection ``lora_B`` at zero, so the
gradient of the input projection ``lora_A`` is exactly zero at the first step by design and
non-zero once ``lora_B`` has moved. Any adapter whose output projection starts at zero behaves
the same way (a zero-initialized gate, ReZero's scalar). These pure functions name the pairs so
that the wiring, gradient and contract checks read such a model the way it is meant:

- :func:`lora_layers`: peft ``LoraLayer`` modules, when ``peft`` is imported (read from
  ``sys.modules``: no import of ours).
- :func:`zero_partners`: for parameters whose gradient is exactly zero, the all-zero
  parameters beside them that received a non-zero gradient (the partner that explains it).
- :func:`adapter_layer_of`: the adapter layer each adapter parameter belongs to (the LoRA
  layer, for per-layer gradient norms that read ``lora_A`` and ``lora_B`` together).
- :func:`peft_base_params`: the frozen parameters of a peft-tuned model, which must stay fixed.

Example:
    >>> import torch
    >>> from torch import nn
    >>> class Adapter(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.down, self.up = nn.Linear(4, 2, bias=False), nn.Linear(2, 4, bias=False)
    ...         nn.init.zeros_(self.up.weight)
    ...     def forward(self, x):
    ...         return x + self.up(self.down(x))
    >>> net = nn.Sequential(Adapter(), nn.Linear(4, 1))
    >>> net(torch.randn(3, 4)).sum().backward()
    >>> zero_partners(net, ["0.down.weight"], nonzero_grad={"0.up.weight", "1.weight"})
    {'0.down.weight': ['0.up.weight']}
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterable
from typing import Any

from torch import nn

from lightning_triage.functional.tensors import any_nonzero

#: How many module levels above a parameter's own module a zero-valued partner is looked for
#: when the model has no peft layer there (``block.adapter.down.weight`` finds
#: ``block.adapter.up.weight`` one level up, ``block.gate`` two levels up).
PARTNER_LEVELS = 2


def _lora_layer_class() -> type | None:
    """peft's ``LoraLayer`` when peft is imported (a model cannot hold one otherwise)."""
    if "peft" not in sys.modules:
        return None
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # pragma: no cover - a peft without LoRA
        return None
    return LoraLayer


def _peft_model_classes() -> tuple[type, ...]:
    if "peft" not in sys.modules:
        return ()
    found: list[type] = []
    try:
        from peft import PeftModel

        found.append(PeftModel)
    except ImportError:  # pragma: no cover
        pass
    try:
        from peft.tuners.tuners_utils import BaseTuner

        found.append(BaseTuner)
    except ImportError:  # pragma: no cover
        pass
    return tuple(found)


def lora_layers(module: nn.Module) -> dict[str, Any]:
    """The peft ``LoraLayer`` modules of ``module`` by name (empty without peft).

    Example:
        >>> lora_layers(nn.Linear(2, 2))
        {}
    """
    cls = _lora_layer_class()
    if cls is None:
        return {}
    return {name: m for name, m in module.named_modules() if isinstance(m, cls)}


def _lora_pairs(module: nn.Module) -> dict[str, list[str]]:
    """``lora_A`` (and ``lora_embedding_A``) parameter -> its ``lora_B`` partner(s), per
    adapter, for every peft LoRA layer."""
    pairs: dict[str, list[str]] = {}
    for name, layer in lora_layers(module).items():
        prefix = f"{name}." if name else ""
        for a_attr, b_attr in (("lora_A", "lora_B"), ("lora_embedding_A", "lora_embedding_B")):
            a_dict, b_dict = getattr(layer, a_attr, None), getattr(layer, b_attr, None)
            if a_dict is None or b_dict is None:
                continue
            for adapter in list(a_dict.keys()):
                if adapter not in b_dict:
                    continue
                a, b = a_dict[adapter], b_dict[adapter]
                if isinstance(a, nn.Module) and isinstance(b, nn.Module):
                    a_names = [f"{prefix}{a_attr}.{adapter}.{n}" for n, _ in a.named_parameters()]
                    b_names = [f"{prefix}{b_attr}.{adapter}.{n}" for n, _ in b.named_parameters()]
                else:  # ParameterDict entries (embedding LoRA)
                    a_names, b_names = [f"{prefix}{a_attr}.{adapter}"], [f"{prefix}{b_attr}.{adapter}"]
                for a_name in a_names:
                    pairs[a_name] = b_names
    return pairs


def _ancestors(param: str, levels: int) -> list[str]:
    """The module prefixes of a parameter name from its own module up ``levels`` more, never
    the root: ``a.b.c.weight`` -> ``["a.b.c", "a.b", "a"]`` for ``levels=2``."""
    parts = param.split(".")[:-1]
    out = []
    for k in range(len(parts), max(len(parts) - levels - 1, 0), -1):
        out.append(".".join(parts[:k]))
    return out


def zero_partners(module: nn.Module, zero_grad: Iterable[str], nonzero_grad: Collection[str],
                  zero_valued: Collection[str] | None = None) -> dict[str, list[str]]:
    """For each parameter whose gradient was exactly zero, the partners that explain it: all-zero
    trainable parameters beside it whose own gradient was not zero.

    A partner is the ``lora_B`` of the same peft LoRA layer and adapter for a ``lora_A``; for
    any other parameter, an all-zero parameter within :data:`PARTNER_LEVELS` module levels
    above its own module (an adapter's zero-initialized output projection, a zero gate). The
    parameter's gradient should turn non-zero once the partner has moved: a caller confirms
    that on a later step instead of reporting it now.

    Args:
        module: the model.
        zero_grad: names of the parameters whose gradient was exactly zero.
        nonzero_grad: names of the parameters whose gradient had a non-zero value.
        zero_valued: names of the parameters that were all zero when the gradients were
            computed (read before the optimizer step moved them); ``None`` reads the
            candidates' current values (one host sync per candidate).

    Returns:
        ``{name: [partner names]}`` for the ``zero_grad`` parameters that have a partner.
    """
    params = dict(module.named_parameters())
    pairs = _lora_pairs(module)

    def all_zero(name: str) -> bool:
        if zero_valued is not None:
            return name in zero_valued
        p = params.get(name)
        if p is None or not p.numel():
            return False
        flag = any_nonzero(p.detach())
        return flag is not None and not bool(flag)

    candidates = [n for n in nonzero_grad if n in params and params[n].requires_grad]
    cache: dict[str, bool] = {}
    out: dict[str, list[str]] = {}
    for name in zero_grad:
        if name in pairs:
            found = [b for b in pairs[name] if b in nonzero_grad
                     and cache.setdefault(b, all_zero(b))]
        else:
            scopes = _ancestors(name, PARTNER_LEVELS)
            found = []
            for scope in scopes:
                found = [c for c in candidates if c.startswith(scope + ".") and c != name
                         and cache.setdefault(c, all_zero(c))]
                if found:
                    break
        if found:
            out[name] = sorted(found)
    return out


def adapter_layer_of(module: nn.Module) -> dict[str, str]:
    """Parameter name -> the peft LoRA layer it belongs to, for the adapter parameters
    (``lora_A``, ``lora_B`` and their embedding forms); empty without peft.

    Per-layer gradient norms that read the pair together see the layer's gradient: ``lora_A``
    alone is tiny while ``lora_B`` is still near its zero start, by design.
    """
    out: dict[str, str] = {}
    for name, layer in lora_layers(module).items():
        prefix = f"{name}." if name else ""
        for attr in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"):
            part = getattr(layer, attr, None)
            if isinstance(part, nn.Module):
                for pname, _ in part.named_parameters():
                    out[f"{prefix}{attr}.{pname}"] = name
    return out


def peft_base_params(module: nn.Module) -> set[str]:
    """Names of the frozen parameters inside a peft-tuned model (a ``PeftModel`` or a peft
    tuner): its base, which must not change while the adapters train. Empty without peft."""
    classes = _peft_model_classes()
    if not classes:
        return set()
    out: set[str] = set()
    for name, m in module.named_modules():
        if isinstance(m, classes):
            prefix = f"{name}." if name else ""
            out.update(prefix + n for n, p in module.get_submodule(name).named_parameters()
                       if not p.requires_grad)
    return out


def uses_adapters(module: nn.Module) -> bool:
    """Whether ``module`` holds a peft-tuned model (a PEFT fine-tune of a pretrained base)."""
    classes = _peft_model_classes()
    return bool(classes) and any(isinstance(m, classes) for m in module.modules())


__all__ = [
    "PARTNER_LEVELS",
    "adapter_layer_of",
    "lora_layers",
    "peft_base_params",
    "uses_adapters",
    "zero_partners",
]
