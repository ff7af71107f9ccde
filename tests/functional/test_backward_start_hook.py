"""``backward_start_hook``: once per backward, before any gradient reaches ``.grad``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from lightning_triage.functional.hooks import backward_start_hook


def _without_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch < 2.3: ``register_multi_grad_hook`` has no ``mode``."""
    real = torch.autograd.graph.register_multi_grad_hook

    def old(tensors: Any, fn: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise TypeError("register_multi_grad_hook() got an unexpected keyword argument")
        return real(tensors, fn)

    monkeypatch.setattr(torch.autograd.graph, "register_multi_grad_hook", old)


@pytest.mark.parametrize("torch_2_2", [False, True])
def test_reads_the_gradients_each_backward_started_from(monkeypatch: pytest.MonkeyPatch,
                                                        torch_2_2: bool) -> None:
    if torch_2_2:
        _without_mode(monkeypatch)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    params = list(model.parameters())
    frozen = nn.Parameter(torch.ones(3), requires_grad=False)
    seen: list[list[float]] = []
    handle = backward_start_hook([*params, frozen], lambda: seen.append(
        [0.0 if p.grad is None else p.grad.abs().sum().item() for p in params]))
    x = torch.randn(5, 4)
    model(x).sum().backward()
    model(x).sum().backward()  # accumulates: starts from the first backward's gradients
    for p in params:
        p.grad.zero_()  # zeroed in place: the same tensors
    model(x).sum().backward()
    inputs = torch.randn(5, 4, requires_grad=True)
    torch.autograd.grad(model(inputs).sum(), inputs)  # reaches no parameter's `.grad`
    assert len(seen) == 3
    assert seen[0] == [0.0] * 4 and seen[2] == [0.0] * 4
    assert all(v > 0 for v in seen[1])
    handle.remove()
    model(x).sum().backward()
    assert len(seen) == 3
