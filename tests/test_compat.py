"""The one place for Lightning and torchmetrics internals (``_compat.py``).

Each fast path has a test that fails when it is not taken on the pinned versions (Lightning
2.6.6, the installed torchmetrics), and each fallback a test of its own. The scan at the end
fails on any private Lightning or torchmetrics access outside ``_compat.py``.
"""

from __future__ import annotations

import ast
import copy
import warnings
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import torchmetrics
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loops.progress import _ReadyCompletedTracker
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.utilities import model_helpers, signature_utils
from torch import nn

from lightning_triage import _compat
from lightning_triage._compat import (
    LIGHTNING_MODULE_REFERENCES,
    METRIC_PRIVATE_STATE,
    _GlobalStep,
    forward_context,
    fp16_amp,
    grad_scaler,
    hook_takes,
    is_overridden,
    loop_limits,
    metric_state,
    set_metric_state,
    share_trainer,
    skip_hook,
    step_counter,
    train_step_context,
    training_step_args,
    unskip_hooks,
)
from tests.helpers import make_trainer
from tests.probe_models import Classifier, ManualClassifier, digits


def quiet_trainer(**kwargs: Any) -> pl.Trainer:
    return pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                      accelerator="cpu", **kwargs)


# ---------------------------------------------------------------------- step counter
class CompareSteps(Callback):
    """Reads the step counter at every per-step hook against ``trainer.global_step``."""

    def __init__(self) -> None:
        self.pairs: list[tuple[int, int]] = []
        self.counter: Any = None
        self.counters: list[Any] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.counter = step_counter(trainer)
        self.counters.append(self.counter)

    def _compare(self, trainer: pl.Trainer, *args: Any) -> None:
        self.pairs.append((self.counter.completed, trainer.global_step))

    on_train_batch_start = on_before_optimizer_step = on_train_batch_end = _compare


@pytest.mark.parametrize("model", [Classifier, ManualClassifier])
def test_step_counter_is_the_loops_progress_counter(tmp_path: Path, model: type) -> None:
    train, _ = digits()
    spy = CompareSteps()
    make_trainer(tmp_path, [spy], max_epochs=2, accumulate_grad_batches=1).fit(model(), train)
    assert len(spy.pairs) > 20
    assert all(a == b for a, b in spy.pairs)
    assert spy.pairs[-1][1] == 8  # 4 batches x 2 epochs: the counter moved with the steps
    # the fast path: the loop's own progress tracker, not the property fallback
    assert len(spy.counters) == 2
    assert all(type(c) is _ReadyCompletedTracker for c in spy.counters), [type(c) for c in spy.counters]


def test_step_counter_falls_back_where_the_loops_differ() -> None:
    class Loopless:  # a trainer whose loops lack the progress counter
        fit_loop = None
        lightning_module = None
        global_step = 5

    counter = step_counter(Loopless())  # type: ignore[arg-type]
    assert isinstance(counter, _GlobalStep)
    assert counter.completed == 5


def test_step_counter_falls_back_when_the_counter_disagrees() -> None:
    total = SimpleNamespace(completed=3)
    step = SimpleNamespace(total=total)
    loop = SimpleNamespace(automatic_optimization=SimpleNamespace(
        optim_progress=SimpleNamespace(optimizer=SimpleNamespace(step=step))))
    trainer = SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=loop), lightning_module=None,
                              global_step=4)
    assert isinstance(step_counter(trainer), _GlobalStep)  # type: ignore[arg-type]
    trainer.global_step = 3
    assert step_counter(trainer) is total  # type: ignore[arg-type]


def test_step_counter_outside_fit() -> None:
    trainer = quiet_trainer()
    counter = step_counter(trainer)
    assert type(counter) is _ReadyCompletedTracker
    assert counter.completed == trainer.global_step == 0


# ---------------------------------------------------------------------- precision
def fp16_plugin() -> tuple[MixedPrecision, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # disabled without CUDA, still an object
        scaler = torch.amp.GradScaler("cuda")
    return MixedPrecision("16-mixed", "cpu", scaler=scaler), scaler


def test_grad_scaler_is_the_precision_plugins() -> None:
    plugin, scaler = fp16_plugin()
    trainer = quiet_trainer(plugins=[plugin])
    assert trainer.precision_plugin is plugin
    assert grad_scaler(trainer) is scaler
    assert fp16_amp(trainer)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_no_grad_scaler(precision: str) -> None:
    trainer = quiet_trainer(precision=precision)
    assert grad_scaler(trainer) is None
    assert not fp16_amp(trainer)


def test_precision_fallbacks_without_a_plugin() -> None:
    cuda = SimpleNamespace(root_device=torch.device("cuda", 0))
    trainer = SimpleNamespace(precision="16-mixed", strategy=cuda)  # no precision plugin anywhere
    assert grad_scaler(trainer) is None  # type: ignore[arg-type]
    assert fp16_amp(trainer)  # type: ignore[arg-type]  # Lightning makes a scaler there
    trainer.strategy = SimpleNamespace(root_device=torch.device("cpu"))
    assert not fp16_amp(trainer)  # type: ignore[arg-type]
    # the strategy's plugin where the trainer has none
    plugin, scaler = fp16_plugin()
    trainer.strategy = SimpleNamespace(root_device=torch.device("cpu"), precision_plugin=plugin)
    assert grad_scaler(trainer) is scaler  # type: ignore[arg-type]
    for context in (train_step_context, forward_context):
        with context(trainer):  # type: ignore[arg-type]
            assert torch.is_autocast_enabled("cpu")
    bare = SimpleNamespace(strategy=SimpleNamespace())
    for context in (train_step_context, forward_context):
        with context(bare):  # type: ignore[arg-type]
            assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("context", [train_step_context, forward_context])
def test_precision_contexts_are_the_plugins(context: Any) -> None:
    # the fast path: bf16 autocast on the CPU from the plugin (the fallback is no context)
    with context(quiet_trainer(precision="bf16-mixed")):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with context(quiet_trainer(precision="32-true")):
        assert not torch.is_autocast_enabled("cpu")


# ---------------------------------------------------------------------- signatures, overrides
class WithValidation(pl.LightningModule):
    def training_step(self, batch: Any) -> Any:
        return None

    @torch.no_grad()
    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        return None


def test_is_overridden_uses_lightnings() -> None:
    assert _compat._lightning_is_overridden is model_helpers.is_overridden  # the fast path
    module = WithValidation()
    assert is_overridden("validation_step", module)
    assert is_overridden("training_step", module)
    assert not is_overridden("test_step", module)
    assert not is_overridden("validation_step", pl.LightningModule())
    assert not is_overridden("validation_step", None)


def test_is_overridden_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_compat, "_lightning_is_overridden", None)
    module = WithValidation()
    assert is_overridden("validation_step", module)  # decorated: unwrapped, still an override
    assert is_overridden("training_step", module)
    assert not is_overridden("test_step", module)
    assert not is_overridden("validation_step", pl.LightningModule())
    assert not is_overridden("no_such_method", module)
    assert not is_overridden("validation_step", None)


class Steps:
    def one(self, batch: Any) -> None: ...

    def two(self, batch: Any, batch_idx: int) -> None: ...

    def renamed(self, batch: Any, i: int) -> None: ...

    def star(self, *args: Any) -> None: ...

    def kw(self, batch: Any, **kwargs: Any) -> None: ...


HOOKS = ["one", "two", "renamed", "star", "kw"]


def test_hook_takes_uses_lightnings() -> None:
    assert _compat._lightning_param_in_signature is signature_utils.is_param_in_hook_signature
    steps = Steps()
    got = {n: hook_takes(getattr(steps, n), "batch_idx", min_args=2) for n in HOOKS}
    assert got == {"one": False, "two": True, "renamed": True, "star": True, "kw": False}
    assert not hook_takes(steps.renamed, "batch_idx")


@pytest.mark.parametrize("min_args", [None, 2])
def test_hook_takes_fallback_agrees(monkeypatch: pytest.MonkeyPatch, min_args: int | None) -> None:
    steps = Steps()
    expected = {n: hook_takes(getattr(steps, n), "batch_idx", min_args=min_args) for n in HOOKS}
    monkeypatch.setattr(_compat, "_lightning_param_in_signature", None)
    got = {n: hook_takes(getattr(steps, n), "batch_idx", min_args=min_args) for n in HOOKS}
    assert got == expected
    assert hook_takes(WithValidation().validation_step, "batch_idx")  # through the decorator


# ---------------------------------------------------------------------- modules and metrics
class CountsBatchEnds(Callback):
    def __init__(self) -> None:
        self.calls = 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.calls += 1


def test_a_skipped_hook_is_not_called_and_comes_back() -> None:
    counter = CountsBatchEnds()
    skip_hook(counter, "on_train_batch_end")
    quiet_trainer(max_steps=3, enable_checkpointing=False, callbacks=[counter]).fit(Classifier(), *digits())
    assert counter.calls == 0  # Lightning skipped it, and the fit did not break on it
    unskip_hooks(counter, ["on_train_batch_end"])
    quiet_trainer(max_steps=3, enable_checkpointing=False, callbacks=[counter]).fit(Classifier(), *digits())
    assert counter.calls == 3


class NoBatchIdx(Classifier):
    def training_step(self, batch: Any) -> torch.Tensor:  # type: ignore[override]
        return self.loss(batch)


class StarArgs(Classifier):
    def training_step(self, *args: Any) -> torch.Tensor:  # type: ignore[override]
        assert len(args) == 2, args  # Lightning passes the batch index to `*args`
        return self.loss(args[0])


@pytest.mark.parametrize(("model", "expected"), [(Classifier, 2), (NoBatchIdx, 1), (StarArgs, 2)])
def test_training_step_args_are_the_loops(model: type, expected: int) -> None:
    assert len(training_step_args(model(), "batch", 7)) == expected
    # the real loop agrees: a fit through the same step works
    quiet_trainer(max_steps=2, enable_checkpointing=False).fit(model(), *digits())


@pytest.mark.parametrize("model", [NoBatchIdx, StarArgs])
def test_the_probes_call_training_step_as_the_loop_does(model: type) -> None:
    from lightning_triage import OverfitBatchCheck, StructureProbe

    probes = [StructureProbe(strict=True), OverfitBatchCheck(strict=True)]
    quiet_trainer(max_steps=2, enable_checkpointing=False, callbacks=list(probes)).fit(model(), *digits())
    codes = [f.code for p in probes for f in p.findings]
    assert "structure.probe_skipped" not in codes and "triage.check_error" not in codes, codes


def test_lightning_module_references_exist() -> None:
    # the names a snapshot of the module must leave alone are still the module's attributes
    assert LIGHTNING_MODULE_REFERENCES.issubset(vars(pl.LightningModule()))


def test_share_trainer_sets_the_private_reference() -> None:
    trainer = quiet_trainer()
    module = WithValidation()
    module.trainer = trainer
    twin = copy.deepcopy(module)
    assert "_trainer" in vars(module)  # the fast path's attribute
    assert twin._trainer is None  # dropped by `LightningModule.__getstate__`
    share_trainer(twin, module)
    assert twin.trainer is trainer
    share_trainer(twin, WithValidation())  # an unattached original: `None` as it is
    assert twin._trainer is None


def test_share_trainer_fallback() -> None:
    trainer = quiet_trainer()

    class Holder:  # no `_trainer` attribute: the public property and setter
        def __init__(self, value: Any) -> None:
            self.value = value

        @property
        def trainer(self) -> Any:
            if self.value is None:
                raise RuntimeError("not attached")
            return self.value

        @trainer.setter
        def trainer(self, value: Any) -> None:
            self.value = value

    twin = Holder("untouched")
    share_trainer(twin, Holder(trainer))
    assert twin.trainer is trainer
    share_trainer(twin, Holder(None))  # not attached: nothing
    assert twin.trainer is trainer


def test_metric_state_holds_the_private_counters() -> None:
    metric = torchmetrics.MeanMetric()
    metric.update(torch.tensor([1.0, 3.0]))
    assert metric.compute() == 2.0
    state = metric_state(metric)
    assert set(METRIC_PRIVATE_STATE) <= set(state)  # the fast path: every private name found
    assert set(metric.metric_state) <= set(state)
    assert state["_update_count"] == 1
    saved = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    metric.update(torch.tensor([10.0]))
    assert metric.update_count == 2
    set_metric_state(metric, saved)
    assert metric.update_count == 1
    assert metric.compute() == 2.0


def test_metric_state_fallback_leaves_missing_names_out() -> None:
    bare = SimpleNamespace(metric_state={"total": 1}, _update_count=3)
    assert metric_state(bare) == {"total": 1, "_update_count": 3}


def test_loop_limits_are_the_fit_loops() -> None:
    trainer = quiet_trainer(max_epochs=3, max_steps=7)
    found = {name: value for _, name, value in loop_limits(trainer)}
    assert found["max_epochs"] == 3 and found["max_steps"] == 7  # the fast path
    assert {"min_epochs", "max_batches", "min_steps"} <= set(found)
    assert loop_limits(SimpleNamespace()) == []  # another layout: nothing to put back


# ---------------------------------------------------------------------- the scan
SRC = Path(__file__).resolve().parents[1] / "src" / "lightning_triage"
COMPAT = SRC / "_compat.py"
LIGHTNING_PACKAGES = ("lightning", "pytorch_lightning", "lightning_fabric", "torchmetrics")
#: Lightning modules that are not public API, whatever the names they hold.
PRIVATE_MODULES = ("lightning.pytorch.utilities.signature_utils",
                   "lightning.pytorch.utilities.model_helpers", "lightning.pytorch.loops",
                   "lightning.pytorch.trainer.connectors", "lightning.pytorch.trainer.states")
#: Public-looking names that lead into Lightning's loops and plugins.
INTERNAL_NAMES = frozenset({
    "fit_loop", "epoch_loop", "validate_loop", "test_loop", "predict_loop", "val_loop",
    "optim_progress", "optim_step_progress", "batch_progress", "epoch_progress",
    "manual_optimization", "precision_plugin", "train_step_context", "forward_context",
    "val_step_context", "test_step_context", "predict_step_context",
})

#: (file, name) pairs still to replace with `_compat` functions in files other helpers were
#: refactoring when `_compat.py` was written. Empty it as they are replaced; a stale entry fails.
ALLOWED: frozenset[tuple[str, str]] = frozenset()


def lightning_private_names() -> frozenset[str]:
    """The private attribute names of Lightning's and torchmetrics' objects as installed (the
    trainer, its strategy, plugin and loops, a module, a metric), less ``nn.Module``'s own.

    torch's internals (``sub._parameters``, ``p._backward_hooks``, ``torch._foreach_norm``) are
    not flagged: they are torch's API surface, not Lightning's or torchmetrics', and out of
    this scan's scope."""
    trainer = quiet_trainer()
    objects = [trainer, trainer.strategy, trainer.precision_plugin, trainer.fit_loop,
               trainer.fit_loop.epoch_loop, pl.LightningModule(), torchmetrics.MeanMetric()]
    names = {k for obj in objects for k in vars(obj) if k.startswith("_") and not k.startswith("__")}
    return frozenset(names - set(vars(nn.Module())))


def _private_module(module: str) -> bool:
    return module.split(".")[0] in LIGHTNING_PACKAGES and (
        any(part.startswith("_") for part in module.split("."))
        or any(module == m or module.startswith(m + ".") for m in PRIVATE_MODULES))


def scan(tree: ast.AST, private: frozenset[str]) -> list[tuple[int, str]]:
    """``(line, name)`` of each private Lightning/torchmetrics access in a module: an attribute
    (not on ``self``/``cls`` for underscore names: ours), a string naming one (``getattr``,
    attribute lists), an import of a private name or from a private module."""
    hits: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if node.attr in INTERNAL_NAMES or (node.attr in private and not own):
                hits.append((node.lineno, node.attr))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in private or node.value in INTERNAL_NAMES:
                hits.append((node.lineno, node.value))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _private_module(node.module):
                hits.append((node.lineno, node.module))
            elif node.module.split(".")[0] in LIGHTNING_PACKAGES:
                hits += [(node.lineno, a.name) for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            hits += [(node.lineno, a.name) for a in node.names if _private_module(a.name)]
    return hits


def test_scan_flags_what_it_should() -> None:
    private = lightning_private_names()
    assert {"_trainer", "_fabric", "_update_count", "_computed", "_forward_cache",
            "_logger_connector", "_results"} <= private
    assert not {"_parameters", "_buffers", "_modules"} & private  # torch's: not flagged
    code = """
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature
from lightning.pytorch.utilities import _something
import lightning.pytorch.loops.progress
from lightning.pytorch.callbacks import Callback
n = trainer.fit_loop.epoch_loop.batch_progress
sub._trainer = original._trainer
self._trainer = trainer
getattr(metric, "_update_count")
trainer.precision_plugin.train_step_context()
module._parameters, self._steps, state["_handles"]
"""
    names = Counter(name for _, name in scan(ast.parse(code), private))
    assert names == Counter({
        "lightning.pytorch.utilities.signature_utils": 1, "_something": 1,
        "lightning.pytorch.loops.progress": 1, "fit_loop": 1, "epoch_loop": 1,
        "batch_progress": 1, "_trainer": 2, "_update_count": 1, "precision_plugin": 1,
        "train_step_context": 1})


def test_no_lightning_internals_outside_compat() -> None:
    private = lightning_private_names()
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(SRC.rglob("*.py")):
        if path == COMPAT:
            continue
        rel = path.relative_to(SRC).as_posix()
        for line, name in scan(ast.parse(path.read_text(encoding="utf-8")), private):
            found.setdefault((rel, name), []).append(line)
    unexpected = {k: v for k, v in found.items() if k not in ALLOWED}
    assert not unexpected, (
        "private Lightning/torchmetrics access outside _compat.py "
        f"(add a named function there): {unexpected}")
    stale = ALLOWED - set(found)
    assert not stale, f"replaced: remove from ALLOWED in {Path(__file__).name}: {sorted(stale)}"


# ---------------------------------------------------------------- torch's privates
def test_foreach_norms_is_the_one_call_of_torchs_fused_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_triage import _torch_compat
    from lightning_triage._torch_compat import foreach_norms

    callers = sorted(path.relative_to(SRC).as_posix() for path in SRC.rglob("*.py")
                     if path.name != "_torch_compat.py" and any(
                         isinstance(node, ast.Attribute) and node.attr == "_foreach_norm"
                         for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))))
    assert callers == []
    tensors = [torch.tensor([3.0, -4.0]), torch.ones(4, dtype=torch.float16), torch.zeros(0)]
    calls: list[int] = []
    fused = torch._foreach_norm

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_norm", counted)
    fast = foreach_norms(tensors, 2, dtype=torch.float32)
    assert calls == [1]  # the fast path on the pinned torch
    monkeypatch.delattr(torch, "_foreach_norm")
    slow = foreach_norms(tensors, 2, dtype=torch.float32)
    assert [float(n) for n in fast] == [float(n) for n in slow] == [5.0, 2.0, 0.0]
    assert [float(n) for n in _torch_compat.foreach_norms(tensors[:1], float("inf"))] == [4.0]


def test_exit_function_mode_is_the_one_reader_of_the_mode_stack() -> None:
    from lightning_triage._torch_compat import exit_function_mode
    from lightning_triage.functional.draws import DrawWatch

    callers = sorted(path.relative_to(SRC).as_posix() for path in SRC.rglob("*.py")
                     if path.name != "_torch_compat.py" and any(
                         isinstance(node, ast.Attribute) and node.attr in (
                             "_pop_mode", "_push_mode", "_get_current_function_mode_stack")
                         for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))))
    assert callers == []
    a, b = DrawWatch(), DrawWatch()
    a.__enter__()
    b.__enter__()
    exit_function_mode(a)  # the fast path: b stays, a leaves from under it
    assert torch.overrides._get_current_function_mode_stack() == [b]
    exit_function_mode(a)  # not on the stack: nothing happens
    exit_function_mode(b)
    assert torch.overrides._get_current_function_mode_stack() == []
