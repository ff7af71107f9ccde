"""Train/eval mode: which layers behave differently in training mode, and the stage's rule."""

from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

from lightning_triage.functional.verdict import Verdict

#: At most this many module names are listed in a verdict's evidence (8 in its message).
MAX_LISTED = 100


def mode_sensitive_in_training(module: nn.Module) -> list[str]:
    """Names of the dropout/batch-norm modules of ``module`` that are in training mode.

    Counted: dropout layers with ``p > 0``, batch-norm layers that track running statistics and
    ``nn.MultiheadAttention`` with attention dropout: the layers whose output differs between
    ``train()`` and ``eval()``.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2), nn.Dropout(0.1))
        >>> mode_sensitive_in_training(net)
        ['1', '2']
        >>> mode_sensitive_in_training(net.eval())
        []
    """
    found = []
    for name, sub in module.named_modules():
        if not sub.training:
            continue
        dropout = isinstance(sub, _DropoutNd) and sub.p > 0
        norm = isinstance(sub, _BatchNorm) and sub.track_running_stats
        attention = isinstance(sub, nn.MultiheadAttention) and sub.dropout > 0
        if dropout or norm or attention:
            found.append(name)
    return found


def train_mode_in_eval(module: nn.Module, step: int | None, *, phase: str = "validation",
                       when: str = "") -> Verdict | None:
    """``mode.train_mode_in_eval`` when mode-sensitive layers of ``module`` (see
    :func:`mode_sensitive_in_training`) are in training mode during ``phase``; ``None`` when
    none is. ``when`` says at which point of the phase it was seen.

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1)).eval()
        >>> train_mode_in_eval(net, 5) is None
        True
        >>> _ = net[1].train()  # a `.train()` call in a validation hook
        >>> v = train_mode_in_eval(net, 5, when="at the first batch")
        >>> v.code, v.layer, v.evidence["module_types"]
        ('mode.train_mode_in_eval', '1', ['Dropout'])
        >>> print(v.message)  # doctest: +NORMALIZE_WHITESPACE
        During validation (at the first batch), 1 mode-sensitive layer(s) were in training mode:
        `1` (Dropout).
    """
    names = mode_sensitive_in_training(module)
    if not names:
        return None
    listed = ", ".join(f"`{n}`" for n in names[:8]) + (
        f" and {len(names) - 8} more" if len(names) > 8 else "")
    kinds = sorted({type(m).__name__ for n, m in module.named_modules() if n in names})
    at = f" ({when})" if when else ""
    return Verdict(
        "mode.train_mode_in_eval", step,
        f"During {phase}{at}, {len(names)} mode-sensitive layer(s) were in training mode: "
        f"{listed} ({', '.join(kinds)}).",
        layer=names[0] or None,
        evidence={"modules": names[:MAX_LISTED], "num_modules": len(names),
                  "module_types": kinds},
    )


__all__ = ["mode_sensitive_in_training", "train_mode_in_eval"]
