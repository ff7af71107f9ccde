"""Temporary module hooks for probes (registered for one forward, always removed), and a
once-per-backward gradient hook for the checks of the first steps."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.loss import _Loss
from torch.utils.hooks import RemovableHandle

from lightning_triage.functional.compiled import traced_by_compile
from lightning_triage.functional.tensors import dense, is_plain


class LastOutput:
    """The output of the last module (other than loss modules) whose forward returned."""

    def __init__(self) -> None:
        self.module_name: str | None = None
        self.output: Tensor | None = None


def first_float_tensor(output: Any) -> Tensor | None:
    """The prediction tensor in a model output: the tensor itself, the first floating tensor
    of a tuple/list, ``logits``/``output``/``pred``... of a dict or an object.

    Example:
        >>> import torch
        >>> first_float_tensor((torch.zeros(2, 3), torch.ones(1))).shape
        torch.Size([2, 3])
    """
    found = _first_float(output)
    # a nested tensor (a fast path's layer output) as its zero-padded strided form
    return None if found is None else dense(found)


def _first_float(output: Any) -> Tensor | None:
    if isinstance(output, Tensor):
        return output if output.is_floating_point() else None
    if isinstance(output, (list, tuple)):
        for item in output:
            if isinstance(item, Tensor) and item.is_floating_point():
                return item
        return None
    if isinstance(output, Mapping):
        for key in ("logits", "output", "out", "pred", "preds", "prediction", "y_hat"):
            value = output.get(key)
            if isinstance(value, Tensor) and value.is_floating_point():
                return value
        return None
    logits = getattr(output, "logits", None)
    if isinstance(logits, Tensor) and logits.is_floating_point():
        return logits
    return None


HookWrapper = Callable[[Callable[..., None]], Callable[..., None]]


@contextmanager
def hooked(module: nn.Module,
           register: Callable[[str, nn.Module], Iterable[RemovableHandle]], *,
           skip: tuple[type[nn.Module], ...] = (),
           exclude: Collection[str] = ()) -> Iterator[None]:
    """Hooks on every submodule of ``module`` for the block, all removed when it exits.

    ``register(name, submodule)`` registers the hooks of one submodule and yields their
    handles. Submodules of a ``skip`` type or named in ``exclude`` are left out, and so are
    those that take no hooks (a ``ScriptModule`` raises ``RuntimeError``: its calls are seen
    from its parent).

    Example:
        >>> import torch
        >>> net, seen = nn.Sequential(nn.Linear(2, 2), nn.ReLU()), []
        >>> def register(name, sub):
        ...     yield sub.register_forward_hook(lambda *_: seen.append(name))
        >>> with hooked(net, register):
        ...     _ = net(torch.ones(1, 2))
        >>> seen, len(net[0]._forward_hooks)
        (['0', '1', ''], 0)
    """
    handles: list[RemovableHandle] = []
    try:
        for name, sub in module.named_modules():
            if isinstance(sub, skip) or name in exclude:
                continue
            try:
                handles.extend(register(name, sub))  # each handle kept as soon as it is made
            except RuntimeError:
                continue
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def grad_enabled_calls(module: nn.Module, names: Collection[str]) -> Iterator[set[str]]:
    """The submodules of ``module`` among ``names`` called with gradients enabled while the block
    runs (a frozen teacher or feature extractor run under ``torch.no_grad()`` is not among them).

    Example:
        >>> import torch
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        >>> with grad_enabled_calls(net, {"0", "1"}) as called:
        ...     with torch.no_grad():
        ...         h = net[0](torch.ones(1, 2))
        ...     _ = net[1](h)
        >>> sorted(called)
        ['1']
    """
    called: set[str] = set()

    def register(name: str, sub: nn.Module) -> Iterator[RemovableHandle]:
        if name in names:
            def note(*_: Any) -> None:
                if torch.is_grad_enabled():
                    called.add(name)

            yield sub.register_forward_pre_hook(note)

    with hooked(module, register):
        yield called


def _unwrapped(hook: Callable[..., None]) -> Callable[..., None]:
    return hook


@contextmanager
def capture_last_output(module: nn.Module, wrap: HookWrapper = _unwrapped,
                        exclude: Collection[str] = ()) -> Iterator[LastOutput]:
    """Record the output of the last module that finished its forward inside the block.

    The outermost module called by the user's code finishes last, so this is the model's head
    output whether ``training_step`` calls ``self(x)``, ``self.net(x)`` or a bare layer. Loss
    modules (``nn.CrossEntropyLoss`` ...) and 0-d outputs (losses) are ignored. Hooks are
    removed when the block exits. ``wrap`` wraps each hook (a callback passes its guard, so
    that an error in the hook, which runs inside the user's forward, disables the check);
    submodules named in ``exclude`` get none.

    Example:
        >>> import torch
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> with capture_last_output(net) as captured:
        ...     _ = nn.functional.cross_entropy(net(torch.randn(5, 4)), torch.zeros(5, dtype=torch.long))
        >>> captured.output.shape
        torch.Size([5, 3])
    """
    captured = LastOutput()

    def make_hook(name: str) -> Any:
        def hook(mod: nn.Module, args: Any, output: Any) -> None:
            tensor = first_float_tensor(output)
            # a 0-d output is a loss, e.g. Lightning's DDP wrapper redirects the LightningModule's
            # forward to `training_step`: keep the head's output seen before it
            if tensor is not None and tensor.ndim > 0 and is_plain(tensor):
                captured.module_name = name
                captured.output = tensor.detach()

        return wrap(hook)

    def register(name: str, sub: nn.Module) -> Iterator[RemovableHandle]:
        yield sub.register_forward_hook(make_hook(name))

    # a ScriptModule takes no hooks: its outputs are seen from its parent
    with hooked(module, register, skip=(_Loss, torch.jit.ScriptModule), exclude=exclude):
        yield captured


class HeadCapture:
    """The head output and the targets of one batch, for checks that infer the task from it.

    Call :meth:`start` before the batch's forward (hooks are registered only when ``hooks`` is
    true, e.g. when the task must be inferred), :meth:`finish` after it; :meth:`close` removes
    the hooks whenever the batch does not finish (teardown, crash).

    Example:
        >>> import torch
        >>> net = nn.Linear(4, 3)
        >>> capture = HeadCapture()
        >>> capture.start(net, targets=torch.tensor([0, 2]))
        >>> _ = net(torch.randn(2, 4))
        >>> output, targets = capture.finish()
        >>> output.shape, targets.tolist(), capture.active
        (torch.Size([2, 3]), [0, 2], False)
    """

    def __init__(self) -> None:
        self._stack: ExitStack | None = None
        self._captured: LastOutput | None = None
        self._targets: Tensor | None = None
        self.active = False
        #: the module is compiled as a whole: its head output cannot be captured without
        #: changing the user's graph, so nothing is
        self.traced = False

    def start(self, module: nn.Module, targets: Tensor | None, hooks: bool = True,
              wrap: HookWrapper = _unwrapped, on_forward: Callable[[], None] | None = None) -> None:
        """Register the hooks on ``module``'s submodules (when ``hooks``); ``on_forward`` (if
        given, wrapped by ``wrap`` too) runs after each forward of ``module`` itself, once its
        output is captured.

        ``module`` is the user's live model: no hook goes where ``torch.compile`` would trace
        it into the user's graph (inside a compiled submodule; none at all when ``module``
        itself is compiled, see :attr:`traced`)."""
        self.close()
        self.active = True
        self._targets = targets
        traced = traced_by_compile(module) if hooks else set()
        self.traced = "" in traced
        if hooks and not self.traced:
            self._stack = ExitStack()
            self._captured = self._stack.enter_context(
                capture_last_output(module, wrap, exclude=traced))
            if on_forward is not None:
                def after(mod: nn.Module, args: Any, output: Any) -> None:
                    on_forward()

                self._stack.callback(module.register_forward_hook(wrap(after)).remove)

    @property
    def captured(self) -> LastOutput | None:
        """What the hooks captured so far (``None`` without hooks)."""
        return self._captured

    def take(self) -> Tensor | None:
        """The head output captured since the last call, forgotten here; the hooks stay.

        Example:
            >>> import torch
            >>> net, capture = nn.Linear(4, 3), HeadCapture()
            >>> capture.start(net, targets=None)
            >>> _ = net(torch.randn(2, 4))
            >>> capture.take().shape, capture.take()
            (torch.Size([2, 3]), None)
            >>> capture.close()
        """
        if self._captured is None:
            return None
        output, self._captured.output = self._captured.output, None
        return output

    def finish(self) -> tuple[Tensor | None, Tensor | None]:
        """``(head output, targets)`` of the batch; removes the hooks."""
        output = self._captured.output if self._captured is not None else None
        targets = self._targets
        self.close()
        return output, targets

    def close(self) -> None:
        if self._stack is not None:
            self._stack.close()
        self._stack, self._captured, self._targets = None, None, None
        self.active = False


def backward_start_hook(tensors: Sequence[Tensor], fn: Callable[[], None]) -> RemovableHandle:
    """Call ``fn`` once per backward (``.backward()`` or ``torch.autograd.backward``) that
    reaches any of ``tensors`` (leaves that require gradients: parameters), at the first
    gradient computed for one of them, before that gradient or any other of theirs is added
    to ``.grad``: what ``fn`` reads of their ``.grad`` is what the backward started from,
    whoever called it.

    ``torch.autograd.graph.register_multi_grad_hook(..., mode="any")`` (torch >= 2.3); before
    that, one tensor hook each, the first of a backward (its graph task) calling ``fn``.

    Args:
        tensors: the leaves to watch (those without ``requires_grad`` are left out).
        fn: called with no argument; it must not modify any gradient.

    Returns:
        The handle that removes the hooks.

    Example:
        >>> import torch
        >>> w = torch.ones(3, requires_grad=True)
        >>> seen = []
        >>> handle = backward_start_hook([w], lambda: seen.append(
        ...     None if w.grad is None else w.grad.sum().item()))
        >>> for _ in range(2):
        ...     (2 * w).sum().backward()
        >>> handle.remove()
        >>> (2 * w).sum().backward()
        >>> seen
        [None, 6.0]
    """
    leaves = [t for t in tensors if t.requires_grad]

    def first(grad: Tensor) -> None:
        fn()

    try:
        return torch.autograd.graph.register_multi_grad_hook(leaves, first, mode="any")
    except TypeError:  # torch < 2.3: no `mode`
        pass
    task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)
    lock, last = threading.Lock(), [-2]

    def each(grad: Tensor) -> None:
        task = task_id()
        with lock:
            seen, last[0] = last[0] == task != -1, task
        if not seen:
            fn()

    return _Handles([t.register_hook(each) for t in leaves])


class _Handles(RemovableHandle):
    """Several hook handles removed as one."""

    def __init__(self, handles: Sequence[RemovableHandle]) -> None:
        self.handles = list(handles)

    def remove(self) -> None:
        while self.handles:
            self.handles.pop().remove()
