"""Compiled modules under the probes, with a counting backend that compiles nothing (fast, no C
compiler needed): a copy runs its own weights, never the original's compiled wrappers; probes
add no graph to the user's cache; hooks go only where dynamo does not trace them. The same
promises with inductor: tests/realmodels/test_compile.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.utilities.compile import from_compiled
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_triage import NonFiniteTracer, Triage
from lightning_triage.functional.compiled import compiled_parts, traced_by_compile
from lightning_triage.functional.hooks import HeadCapture
from lightning_triage.probing import copy_module, probe_module
from lightning_triage.probing.compiled import eager
from lightning_triage.testing import CountingBackend
from tests.probe_models import digits, mlp
from tests.realmodels.models import problems, quiet_trainer


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Scale(nn.Module):
    """A module of user code (dynamo skips torch.nn's own modules when compiled in place)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.w


def test_eager_adds_no_graph_and_no_recompile() -> None:
    backend = CountingBackend("eager")
    f = torch.compile(Scale(), backend=backend)
    f(torch.ones(4, 3))
    assert backend.graphs == 1
    with eager(), torch.no_grad():  # another batch size, grad mode and a hook: all new guards
        f(torch.ones(7, 3))
        f._orig_mod.register_forward_hook(lambda *_: None).remove()
    assert (backend.graphs, backend.calls) == (1, 1)
    f(torch.ones(4, 3))
    assert (backend.graphs, backend.calls) == (1, 2)  # the user's graph is still used


def test_a_copy_of_a_module_compiled_in_place_runs_its_own_weights() -> None:
    net = Scale()
    net.compile(backend=CountingBackend("eager"))
    twin, _ = copy_module(None, nn.Sequential(net))
    with torch.no_grad():
        twin[0].w.fill_(2.0)
    with eager():
        assert twin(torch.ones(1, 3)).tolist() == [[2.0, 2.0, 2.0]]
    assert net.w.tolist() == [1.0, 1.0, 1.0]


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.scale = Scale()

    def forward(self, x: Tensor) -> Tensor:
        return self.scale(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self(batch).sum()


def test_a_copy_of_a_lightning_module_compiled_before_fit_runs_its_own_code() -> None:
    backend = CountingBackend("eager")
    module = from_compiled(torch.compile(Tiny(), backend=backend))  # what `fit` does with it
    assert compiled_parts(module) == [""] and "" in traced_by_compile(module)
    twin, _ = copy_module(None, module)
    with torch.no_grad():
        twin.scale.w.fill_(3.0)
    with eager():
        assert twin(torch.ones(1, 3)).tolist() == [[3.0, 3.0, 3.0]]
        assert float(twin.training_step(torch.ones(1, 3), 0).detach()) == 9.0
    assert backend.graphs == 0 and module.scale.w.tolist() == [1.0, 1.0, 1.0]
    assert twin._compiler_ctx is None and module._compiler_ctx is not None


def test_probe_module_runs_eagerly() -> None:
    backend = CountingBackend("eager")
    model = nn.Sequential(torch.compile(Scale(), backend=backend))
    model(torch.ones(2, 3))
    with probe_module(None, model) as probe:
        probe.module.eval()
        probe.module(torch.ones(5, 3))
    assert (backend.graphs, backend.calls) == (1, 1)


def test_head_capture_hooks_only_outside_compiled_code() -> None:
    backend = CountingBackend("eager")
    model = nn.Sequential(nn.Linear(3, 3), torch.compile(Scale(), backend=backend))
    capture = HeadCapture()
    capture.start(model, targets=None)
    assert len(model[1]._orig_mod._forward_hooks) == 0  # traced: none there
    assert len(model[1]._forward_hooks) == 1  # the wrapper's hooks run around the graph
    model(torch.ones(2, 3))
    output, _ = capture.finish()
    assert output is not None and output.shape == (2, 3) and not capture.traced
    whole = Scale()
    whole.compile(backend=backend)
    capture.start(whole, targets=None)
    assert capture.traced and len(whole._forward_hooks) == 0
    capture.close()


class Digits(pl.LightningModule):
    def __init__(self, backend: CountingBackend, **options: Any) -> None:
        super().__init__()
        self.net = torch.compile(mlp(), backend=backend, **options)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


@pytest.mark.parametrize("options", [{}, {"fullgraph": True}, {"dynamic": True}],
                         ids=["default", "fullgraph", "dynamic"])
def test_triage_adds_no_graph_to_a_compiled_fit(tmp_path: Path, options: dict[str, Any]) -> None:
    # `fullgraph=True` fails the user's step on any graph break: a hook of ours traced there would
    runs = []
    for callbacks in ([], [Triage(report_dir=tmp_path, strict=True, verbose=False,
                                  overfit_time_budget=120.0)]):
        torch._dynamo.reset()
        backend = CountingBackend("eager")
        pl.seed_everything(0, verbose=False)
        model = Digits(backend, **options)
        quiet_trainer(tmp_path, callbacks, max_epochs=1, limit_train_batches=5,
                      limit_val_batches=1).fit(model, *digits())
        runs.append((backend.graphs, backend.calls,
                     torch.cat([p.detach().flatten() for p in model.parameters()])))
        if callbacks:
            report = callbacks[0].report.report
            assert report is not None and problems(report) == []
            assert {c["check"]: c["status"] for c in report["checks"]}["OverfitBatchCheck"] == "passed"
    (graphs, calls, bare), (graphs_t, calls_t, watched) = runs
    assert (graphs, calls) == (graphs_t, calls_t) == (2, 6)  # train and val graphs; 5 + 1 calls
    assert torch.equal(bare, watched)


class NaNOnCall:
    """A backend whose compiled code returns NaN on its ``bad``-th call (a fused-kernel bug the
    eager form does not have)."""

    def __init__(self, bad: int) -> None:
        self.bad, self.calls = bad, 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Tensor]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            self.calls += 1
            out = gm.forward(*args)
            if self.calls == self.bad:
                return [t * float("nan") if isinstance(t, Tensor) and t.is_floating_point() else t
                        for t in out]
            return out

        return run


def test_a_nan_only_the_compiled_code_makes_is_found_and_the_reason_named(tmp_path: Path) -> None:
    tracer = NonFiniteTracer(strict=True)
    model = Digits(CountingBackend("eager"))
    model.net = torch.compile(mlp(), backend=NaNOnCall(bad=4))
    quiet_trainer(tmp_path, [tracer], max_epochs=1, limit_train_batches=6,
                  limit_val_batches=0).fit(model, digits()[0])
    found = [f for f in tracer.findings if f.code == "numerics.nonfinite_detected"]
    assert len(found) == 1 and found[0].global_step == 3, [f.code for f in tracer.findings]
    assert "compiled code of `net`" in found[0].message
