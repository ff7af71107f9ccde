"""Run probes on the user's model without changing the run.

Probes (overfit one batch, structure and leak probes, numerics replays) execute the user's own
code on a real batch. :func:`isolated` snapshots everything such a probe can touch and puts it
back afterwards, so that a seeded run's weights are bit-identical with and without the probes.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.optim import Optimizer


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


@contextmanager
def silenced_logging(module: nn.Module) -> Iterator[None]:
    """Swallow ``self.log``/``self.log_dict`` calls of a LightningModule inside the block."""
    patched = [name for name in ("log", "log_dict") if hasattr(module, name)]
    for name in patched:
        object.__setattr__(module, name, _noop)
    try:
        yield
    finally:
        for name in patched:
            module.__dict__.pop(name, None)


@contextmanager
def isolated(module: nn.Module, optimizers: Sequence[Optimizer] = ()) -> Iterator[None]:
    """Snapshot and restore what a probe may change.

    Restored on exit (also on error): parameter and buffer values (in place, so optimizers keep
    their references), ``.grad`` of every parameter, the train/eval flag of every submodule,
    the state of ``optimizers``, and the RNG states of torch (CPU and CUDA), numpy and
    ``random``. ``self.log`` calls inside the block are swallowed.

    Example:
        >>> net = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
        >>> before = net[0].weight.clone()
        >>> with isolated(net):
        ...     _ = net.eval()
        ...     with torch.no_grad():
        ...         _ = net[0].weight.add_(1.0)
        >>> bool(torch.equal(net[0].weight, before)), net.training
        (True, True)
    """
    params = {name: p.detach().clone() for name, p in module.named_parameters()}
    grads = {name: None if p.grad is None else p.grad.detach().clone()
             for name, p in module.named_parameters()}
    buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
    modes = {name: m.training for name, m in module.named_modules()}
    opt_states = [copy.deepcopy(opt.state_dict()) for opt in optimizers]
    torch_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    np_rng = np.random.get_state()
    py_rng = random.getstate()
    try:
        with silenced_logging(module):
            yield
    finally:
        with torch.no_grad():
            for name, p in module.named_parameters():
                if name in params:
                    p.copy_(params[name])
                    saved = grads[name]
                    p.grad = None if saved is None else saved.clone()
            for name, b in module.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])
        for name, m in module.named_modules():
            if name in modes:
                m.training = modes[name]
        for opt, state in zip(optimizers, opt_states, strict=True):
            opt.load_state_dict(state)
        torch.set_rng_state(torch_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        np.random.set_state(np_rng)
        random.setstate(py_rng)


def step_loss(output: Any) -> Tensor | None:
    """The scalar loss in a ``training_step`` output (a tensor or a dict with ``"loss"``)."""
    loss = output.get("loss") if isinstance(output, Mapping) else output
    if isinstance(loss, Tensor) and loss.numel() == 1:
        return loss
    return None
