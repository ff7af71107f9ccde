"""Temporary module hooks for probes: registered for one forward, always removed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn
from torch.nn.modules.loss import _Loss


class LastOutput:
    """The output of the last module (other than loss modules) whose forward returned."""

    def __init__(self) -> None:
        self.module_name: str | None = None
        self.output: Tensor | None = None


def _first_float_tensor(output: Any) -> Tensor | None:
    if isinstance(output, Tensor):
        return output
    if isinstance(output, (list, tuple)):
        for item in output:
            if isinstance(item, Tensor) and item.is_floating_point():
                return item
    if isinstance(output, dict):
        for key in ("logits", "output", "out", "pred", "preds", "y_hat"):
            if isinstance(output.get(key), Tensor):
                return output[key]
    if hasattr(output, "logits") and isinstance(output.logits, Tensor):
        return output.logits
    return None


@contextmanager
def capture_last_output(module: nn.Module) -> Iterator[LastOutput]:
    """Record the output of the last module that finished its forward inside the block.

    The outermost module called by the user's code finishes last, so this is the model's head
    output whether ``training_step`` calls ``self(x)``, ``self.net(x)`` or a bare layer. Loss
    modules (``nn.CrossEntropyLoss`` ...) and 0-d outputs (losses) are ignored. Hooks are
    removed when the block exits.

    Example:
        >>> import torch
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> with capture_last_output(net) as captured:
        ...     _ = nn.functional.cross_entropy(net(torch.randn(5, 4)), torch.zeros(5, dtype=torch.long))
        >>> captured.output.shape
        torch.Size([5, 3])
    """
    captured = LastOutput()
    handles = []

    def make_hook(name: str) -> Any:
        def hook(mod: nn.Module, args: Any, output: Any) -> None:
            tensor = _first_float_tensor(output)
            # a 0-d output is a loss, e.g. Lightning's DDP wrapper redirects the LightningModule's
            # forward to `training_step`: keep the head's output seen before it
            if tensor is not None and tensor.ndim > 0:
                captured.module_name = name
                captured.output = tensor.detach()

        return hook

    try:
        for name, sub in module.named_modules():
            if not isinstance(sub, _Loss):
                handles.append(sub.register_forward_hook(make_hook(name)))
        yield captured
    finally:
        for handle in handles:
            handle.remove()
