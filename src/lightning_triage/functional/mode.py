"""Train/eval mode: which layers behave differently in training mode."""

from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd


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


__all__ = ["mode_sensitive_in_training"]
