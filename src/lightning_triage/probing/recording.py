"""Module hooks recording one run of the user's code for a probe: a shape trace, the model's
head output, the module that embeds integer inputs, the first module called on floats
(:class:`ModuleRecorder`); every module call's input and output (:class:`CallTrace`); and hooks
that make what the model receives an autograd leaf (:func:`replace_input`,
:func:`replace_output`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn
from torch.nn.modules.loss import _Loss
from torch.utils.hooks import RemovableHandle

from lightning_triage.functional.eval_contracts import ModuleCall
from lightning_triage.functional.hooks import first_float_tensor, hooked
from lightning_triage.functional.structure import replace_tensor, same_storage
from lightning_triage.functional.tensors import dense

#: Shape-trace entries kept for the report (the rest are counted).
MAX_TRACE = 256
#: Module outputs examined (one backward pass each, at most) to name the first culprit.
MAX_LOCALIZE = 128


def _is_metric(module: nn.Module) -> bool:
    return any(cls.__module__.startswith("torchmetrics") for cls in type(module).__mro__)


def _describe(value: Any) -> list[dict[str, Any]]:
    """Shapes and dtypes of the tensors in a call's arguments or output (top level, lists)."""
    found: list[Tensor] = []

    def visit(v: Any, depth: int = 0) -> None:
        if isinstance(v, Tensor):
            found.append(v)
        elif depth < 2 and isinstance(v, (list, tuple)):
            for item in v:
                visit(item, depth + 1)
        elif depth < 2 and isinstance(v, Mapping):
            for item in v.values():
                visit(item, depth + 1)

    visit(value)
    return [{"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")} for t in found[:4]]


def _tensors(args: Any, kwargs: Mapping[str, Any]) -> list[Tensor]:
    out: list[Tensor] = []
    for v in (*args, *kwargs.values()):
        if isinstance(v, Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(t for t in v if isinstance(t, Tensor))
    return out


class ModuleRecorder:
    """Temporary forward hooks on every submodule for one run of the user's code: the shape
    trace, the model's head output (the last module call that returns a per-example floating
    tensor and is not a loss or metric), the first leaf module that embeds the integer inputs,
    and the first module called on a per-example floating tensor."""

    def __init__(self, n: int, inputs: Tensor, targets: Tensor | None, *, trace: bool,
                 keep_graph: bool) -> None:
        self.n = n
        self.inputs = inputs
        self.targets = targets
        self.trace_on = trace
        self.keep_graph = keep_graph
        self.trace: list[dict[str, Any]] = []
        self.calls = 0
        self.head_name: str | None = None
        self.head: Tensor | None = None
        self.embedding: str | None = None
        self.first_float_input: str | None = None
        #: per-example outputs in completion order (graph kept), to localize a problem
        self.outputs: list[tuple[str, Tensor]] = []

    def pre_hook(self, name: str) -> Any:
        def fn(mod: nn.Module, args: Any, kwargs: Any) -> None:
            if self.first_float_input is not None:
                return
            first = _first_tensor_arg(args, kwargs)
            if (first is not None and first.is_floating_point() and first.dim() >= 1
                    and first.shape[0] == self.n and not same_storage(first, self.targets)):
                self.first_float_input = name

        return fn

    def hook(self, name: str, module: nn.Module) -> Any:
        has_params = any(True for _ in module.parameters())
        is_leaf = not any(True for _ in module.children())
        loss_like = isinstance(module, _Loss) or _is_metric(module)

        def fn(mod: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            self.calls += 1
            if self.trace_on and len(self.trace) < MAX_TRACE:
                self.trace.append({"module": name or "<root>", "type": type(mod).__name__,
                                   "inputs": _describe((args, kwargs)), "outputs": _describe(output)})
            tensors = _tensors(args, kwargs)
            takes_targets = self.targets is not None and any(
                same_storage(t, self.targets) for t in tensors)
            takes_inputs = any(same_storage(t, self.inputs) for t in tensors)
            out = first_float_tensor(output)
            if out is None:
                return
            if (self.embedding is None and is_leaf and takes_inputs
                    and not self.inputs.is_floating_point()
                    and out.shape[: self.inputs.dim()] == self.inputs.shape):
                self.embedding = name
            if loss_like or (takes_targets and not has_params):
                return
            if self.keep_graph and not out.requires_grad:
                return  # e.g. a teacher/EMA model run under `no_grad`: not what is trained
            if out.dim() >= 1 and out.numel() > 1 and out.shape[0] == self.n:
                self.head_name = name
                self.head = out if self.keep_graph else out.detach().clone()
                if self.keep_graph and len(self.outputs) < MAX_LOCALIZE:
                    self.outputs.append((name, out))

        return fn

    def head_of(self, output: Any, n: int) -> tuple[str | None, Tensor | None]:
        """``(name, head output)``: the first per-example floating tensor of ``output`` (a
        ``forward_fn``'s output, named ``"<forward_fn>"``) when there is one, else the head the
        hooks recorded."""
        out = first_float_tensor(output) if output is not None else None
        if out is not None and out.dim() >= 1 and out.shape[0] == n:
            return "<forward_fn>", out if self.keep_graph else out.detach().clone()
        return self.head_name, self.head

    def first_showing(self, leaf: Tensor, shows: Callable[[Tensor], bool],
                      deadline: float) -> str | None:
        """The first module (in completion order) whose recorded output already shows a problem
        (``shows(output)``), looked for until ``deadline`` (``time.perf_counter()``)."""
        for name, out in self.outputs:
            if out is leaf or time.perf_counter() > deadline:
                continue
            try:
                if shows(out):
                    return name
            except RuntimeError:  # an output outside the leaf's graph or freed: skip it
                continue
        return None

    @contextmanager
    def attached(self, module: nn.Module) -> Iterator[ModuleRecorder]:
        def register(name: str, sub: nn.Module) -> Iterator[RemovableHandle]:
            yield sub.register_forward_hook(self.hook(name, sub), with_kwargs=True)
            yield sub.register_forward_pre_hook(self.pre_hook(name), with_kwargs=True)

        with hooked(module, register):  # a ScriptModule takes no hooks: it is not traced
            yield self


class CallTrace:
    """Temporary forward hooks recording, for every module call in completion order, its name,
    type, training flag and detached copies of its first floating input and output (at most
    ``max_calls`` calls): two passes are then compared call by call
    (:func:`~lightning_triage.functional.eval_contracts.first_divergence`)."""

    def __init__(self, max_calls: int = MAX_TRACE) -> None:
        self.max_calls = max_calls
        self.calls: list[ModuleCall] = []
        self._inputs: dict[int, list[Tensor | None]] = {}

    @contextmanager
    def attached(self, module: nn.Module) -> Iterator[CallTrace]:
        def pre(mod: nn.Module, args: Any, kwargs: Any) -> None:
            first = _first_tensor_arg(args, kwargs)
            keep = first is not None and first.is_floating_point()
            self._inputs.setdefault(id(mod), []).append(
                first.detach().clone() if keep and first is not None else None)

        def post(name: str) -> Any:
            def fn(mod: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
                stack = self._inputs.get(id(mod))
                inputs = stack.pop() if stack else None
                if len(self.calls) >= self.max_calls:
                    return
                out = first_float_tensor(output)
                self.calls.append(ModuleCall(name, type(mod).__name__, mod.training, inputs,
                                             None if out is None else out.detach().clone()))
            return fn

        def register(name: str, sub: nn.Module) -> Iterator[RemovableHandle]:
            yield sub.register_forward_pre_hook(pre, with_kwargs=True)
            yield sub.register_forward_hook(post(name), with_kwargs=True)

        try:
            with hooked(module, register):  # a ScriptModule takes no hooks: it is not traced
                yield self
        finally:
            self._inputs = {}


def _first_tensor_arg(args: Any, kwargs: Mapping[str, Any]) -> Tensor | None:
    for v in (*args, *kwargs.values()):
        if isinstance(v, Tensor):
            return dense(v)  # a fast path's nested input as its zero-padded form
    return None


@contextmanager
def replace_input(module: nn.Module, holder: dict[str, Tensor]) -> Iterator[None]:
    """Replace the first tensor argument of ``module``'s first call by a leaf tensor that
    requires grad (kept in ``holder["leaf"]``): what the model receives, after any mixing the
    training step does on purpose (mixup)."""

    def hook(mod: nn.Module, args: Any, kwargs: Any) -> Any:
        if "leaf" in holder:
            return None
        for i, v in enumerate(args):
            if isinstance(v, Tensor):
                holder["leaf"] = v.detach().clone().requires_grad_(True)
                return (*args[:i], holder["leaf"], *args[i + 1:]), kwargs
        for key, v in kwargs.items():
            if isinstance(v, Tensor):
                holder["leaf"] = v.detach().clone().requires_grad_(True)
                return args, {**kwargs, key: holder["leaf"]}
        return None

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def replace_output(module: nn.Module, inputs: Tensor, holder: dict[str, Tensor]) -> Iterator[None]:
    """Replace the output of ``module``'s (first) call on ``inputs`` by a leaf tensor that
    requires grad (kept in ``holder["leaf"]``): the probe then differentiates w.r.t. it."""

    def hook(mod: nn.Module, args: Any, kwargs: Any, output: Any) -> Any:
        if "leaf" in holder or not isinstance(output, Tensor):
            return None
        if not any(same_storage(t, inputs) for t in _tensors(args, kwargs)):
            return None
        holder["leaf"] = output.detach().clone().requires_grad_(True)
        return holder["leaf"]

    handle = module.register_forward_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


@dataclass
class LeafPlan:
    """What a gradient pass makes an autograd leaf, and how (:func:`plan_leaf`)."""

    #: for messages and evidence
    description: str
    #: the batch the pass runs on
    batch: Any
    #: the leaf itself when it is a tensor of the batch
    leaf: Tensor | None = None
    #: the module whose first call's input becomes the leaf (:func:`replace_input`)
    replace_in: nn.Module | None = None
    #: the module whose output on the inputs becomes the leaf (:func:`replace_output`)
    replace_out: nn.Module | None = None


def plan_leaf(module: nn.Module, batch: Any, inputs: Tensor,
              recorder: ModuleRecorder) -> LeafPlan | None:
    """What a gradient pass on ``batch`` (holding ``inputs``) makes an autograd leaf, from what
    ``recorder`` saw in a first run: the input of the first module called on the batch, the
    batch's float input, the output of the module that embeds integer inputs, or the input of
    the first module called on floats (integer inputs made floats by code); ``None``: nothing."""

    def label(name: str) -> str:
        return name or type(module).__name__

    first = recorder.first_float_input
    if inputs.is_floating_point() and first is not None:
        return LeafPlan(f"the input of `{label(first)}` (the first module called on the batch)",
                        batch, replace_in=module.get_submodule(first))
    if inputs.is_floating_point():
        leaf = inputs.detach().clone().requires_grad_(True)
        return LeafPlan("the batch's input tensor", replace_tensor(batch, inputs, leaf), leaf=leaf)
    if recorder.embedding is not None:
        name = recorder.embedding
        return LeafPlan(f"the output of `{label(name)}` (it embeds the integer inputs)", batch,
                        replace_out=module.get_submodule(name))
    if first is not None:
        return LeafPlan(f"the input of `{label(first)}` (the first module called on floats)",
                        batch, replace_in=module.get_submodule(first))
    return None


__all__ = ["MAX_LOCALIZE", "MAX_TRACE", "CallTrace", "LeafPlan", "ModuleRecorder", "plan_leaf",
           "replace_input",
           "replace_output"]
