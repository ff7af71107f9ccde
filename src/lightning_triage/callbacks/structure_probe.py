"""Stage 5 (structure): do outputs mix examples, see future positions or the targets, or rely on
silent broadcasting?"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.functional.batch import BatchKey, split_batch
from lightning_triage.functional.chance import IGNORE_INDEX
from lightning_triage.functional.hooks import first_float_tensor
from lightning_triage.functional.structure import (
    DEFAULT_TOLERANCE,
    LossWatch,
    aligned_start,
    broadcast_mismatch,
    example_dependence,
    is_next_token,
    output_change,
    pairwise_output,
    parse_size_warning,
    position_dependence,
    probe_positions,
    redraw_targets,
    replace_tensor,
    same_storage,
)
from lightning_triage.probing import (
    ProbeUnavailableError,
    RngState,
    UserCodeError,
    copy_first_examples,
    eval_copy,
    rng_state,
    run_user_step,
)
from lightning_triage.probing.recording import ModuleRecorder, replace_input, replace_output

ForwardFn = Callable[[pl.LightningModule, Any], Any]

class StructureProbe(TriageCallback):
    """Probe the model's structure once, on a copy of the first training batch.

    At the first training batch the probe runs the user's ``training_step`` (or ``forward_fn``)
    three times on a copy of the batch (at most ``max_examples`` examples), each time on a fresh
    deep copy of the module (:func:`~lightning_triage.probing.probe_module`: the module's state
    stays with the copy; trainer and loggers shared, loggers quiet) in eval mode with every global
    RNG reset to the same state, and with temporary hooks that find the model's head output:

    1. as is: a shape trace of every module, the framework's broadcast warnings and the
       elementwise operations between predictions and targets that broadcast
       (``structure.shape_mismatch``);
    2. with the targets redrawn from their own values, inputs unchanged: if the head output
       changes (and the unchanged batch run once more gives the first output again: a
       determinism control), the targets reach the forward pass (``structure.target_leak``);
       when the control differs too, the model is stochastic beyond reach and the leak probe is
       skipped (``structure.probe_skipped``). For sequence
       targets only the first output position is compared (teacher forcing feeds it the start
       token, never a target it predicts);
    3. with what the model receives made an autograd leaf (the input of the first module called
       on the batch, or for integer inputs the output of the module that embeds them): the
       gradient of example 0's output w.r.t. the other examples (``structure.batch_mixing``)
       and, when ``causal=True`` or the data is next-token (``targets[:, :-1] ==
       inputs[:, 1:]``), of output positions w.r.t. later positions
       (``structure.causal_leak``). A problem is localized to the first module whose output
       shows it (the finding's ``layer``).

    When the model cannot be run this way (manual optimization, no input tensor found, no head
    output found) the probe reports ``structure.probe_skipped`` (info) saying what to pass.
    Under DDP the second and third runs happen on every rank or on none (one
    ``reduce_boolean_decision`` each). The cost is in ``checks[].detail``.

    Args:
        causal: ``True``: the model must be causal, always probe it; ``None`` (default): probe
            causality when the batch is next-token data; ``False``: never probe it.
        forward_fn: ``callable(pl_module, batch) -> output`` running the model's forward on a
            batch; default: run ``training_step`` and find the head output with hooks. Needed
            under manual optimization.
        input_key: the batch entry holding the inputs (default: found by name or position): a
            key, an index or a callable ``batch -> tensor``.
        target_key: the batch entry holding the targets, likewise.
        max_examples: the probe uses at most this many examples of the batch.
        tolerance: relative gradient or output change above which a dependence counts.
        time_budget: seconds the probe may take; when the first run of the model already
            takes more than a third of it, the other two runs are skipped (info finding).
        ignore_index: target value ignored when recognizing next-token data.
        strict: raise internal errors instead of reporting them (an error of the user's code
            in the probe is always reported as ``structure.probe_skipped``, naming it; the real
            step then runs as usual).

    Raises:
        ValueError: for an invalid argument (named in the message).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[StructureProbe(causal=True)])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.StructureProbe
                  init_args: {causal: true, max_examples: 16}
    """

    def __init__(
        self,
        causal: bool | None = None,
        forward_fn: ForwardFn | None = None,
        input_key: BatchKey | None = None,
        target_key: BatchKey | None = None,
        max_examples: int = 16,
        tolerance: float = DEFAULT_TOLERANCE,
        time_budget: float = 10.0,
        ignore_index: int = IGNORE_INDEX,
        *,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        if causal is not None and not isinstance(causal, bool):
            raise ValueError(f"`causal` must be True, False or None (auto), got {causal!r}.")
        if forward_fn is not None and not callable(forward_fn):
            raise ValueError(f"`forward_fn` must be callable(pl_module, batch) or None, got {forward_fn!r}.")
        for arg, value in (("input_key", input_key), ("target_key", target_key)):
            if value is not None and not isinstance(value, (str, int)) and not callable(value):
                raise ValueError(f"`{arg}` must be a key, an index, a callable or None, "
                                 f"got {value!r}.")
        if isinstance(max_examples, bool) or not isinstance(max_examples, int) or max_examples < 2:
            raise ValueError(f"`max_examples` must be an integer >= 2, got {max_examples!r}.")
        if not 0 < tolerance < 1:
            raise ValueError(f"`tolerance` must be in (0, 1), got {tolerance!r}.")
        if isinstance(time_budget, bool) or not isinstance(time_budget, (int, float)) \
                or not time_budget > 0:
            raise ValueError(f"`time_budget` must be a positive number of seconds, got {time_budget!r}.")
        self.causal = causal
        self.forward_fn = forward_fn
        self.input_key = input_key
        self.target_key = target_key
        self.max_examples = max_examples
        self.tolerance = tolerance
        self.time_budget = time_budget
        self.ignore_index = ignore_index
        self.shape_trace: list[dict[str, Any]] = []
        self.trace_truncated = 0
        self.results: dict[str, Any] = {}
        self._rng: RngState | None = None
        self.probe_seconds: float | None = None
        self._slot = 0

    # ------------------------------------------------------------------ hooks
    @override
    @guarded
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.ran or self.results or trainer.global_step != 0 or batch_idx != 0:
            self.idle = True  # the probe runs on the first batch of a fit or not at all
            return
        start = time.perf_counter()
        self._slot = 0
        try:
            self._probe(trainer, pl_module, batch)
        except UserCodeError as err:
            self.results.pop("head", None)
            self._skipped(trainer, f"the model raised {err.describe()} when run on a copy of the "
                          f"first batch (at most {self.max_examples} examples, eval mode)",
                          "Pass `max_examples=` >= your batch size if the model needs a fixed "
                          "batch size, or `forward_fn=`.")
        except ProbeUnavailableError as exc:
            self._skipped(trainer, str(exc), "Pass `forward_fn=` on a smaller part of the model.")
        finally:
            self._rng = None
            self._gate(trainer, 2, False)  # every rank takes part in every decision
            self.probe_seconds = time.perf_counter() - start
            self.results.setdefault("seconds", round(self.probe_seconds, 4))
        if self.ran:
            self.detail = f"{self.detail}; cost {1000 * self.probe_seconds:.0f} ms"

    # ------------------------------------------------------------------ probe
    def _copy(self, batch: Any) -> Any:
        """A copy of ``batch`` with at most ``max_examples`` examples (tensors cloned)."""
        return copy_first_examples(batch, self.max_examples, self.input_key, self.target_key)

    def _run(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> Any:
        """The user's code on a batch, in the run's precision context (as the real step)."""
        self.results["user_code_calls"] = int(self.results.get("user_code_calls", 0)) + 1
        return run_user_step(trainer, pl_module, batch, self.forward_fn)

    @contextmanager
    def _model(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Iterator[Any]:
        """A fresh deep copy of the module for one pass (or the live module under a snapshot
        when a copy does not fit), in eval mode, with every global RNG as at the probe's start:
        paired passes start from the same state."""
        with eval_copy(trainer, pl_module, self._rng, factor=2.0) as probe:
            self.results["isolation"] = probe.how
            yield probe.module

    def _gate(self, trainer: pl.Trainer, slot: int, ready: bool) -> bool:
        """Whether every rank is ready to run the user's code for pass ``slot`` (1: targets
        redrawn, 2: gradients); slots this rank skipped are answered "not ready" first.

        Under DDP the user's code may hold collectives (`all_gather`), so a pass runs on all
        ranks or on none: one `reduce_boolean_decision` per slot, on every rank, in order.
        """
        go = False
        while self._slot < slot:
            self._slot += 1
            flag = ready if self._slot == slot else False
            if trainer.world_size > 1:
                flag = bool(trainer.strategy.reduce_boolean_decision(flag, all=True))
            go = flag
        return go and ready

    def _skipped(self, trainer: pl.Trainer, why: str, what: str, part: str = "") -> None:
        """Report (info) that the whole probe, or one ``part`` of it, could not run."""
        self.add_finding(trainer, "structure.probe_skipped",
                         f"The {part or 'structure probe'} did not run: {why}. {what}",
                         evidence={"reason": why, "part": part or "all"}, global_step=0)
        if not part:
            self.results["skipped"] = why
            self.mark_ran(f"skipped: {why}")

    def _probe(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        if not pl_module.automatic_optimization and self.forward_fn is None:
            self._skipped(trainer, "manual optimization (running `training_step` would step the "
                          "optimizers)", "Pass `forward_fn=lambda module, batch: module(batch[0])` "
                          "(your model's forward on a batch) to probe the structure.")
            return
        copy_a = self._copy(batch)
        parts = split_batch(copy_a, self.input_key, self.target_key)
        x, y = parts.inputs, parts.targets
        if x is None or x.dim() == 0:
            self._skipped(trainer, "no input tensor found in the batch",
                          "Pass `input_key=` (and `target_key=`) naming the batch entries.")
            return
        if y is not None and same_storage(x, y):
            y = None
        n = x.shape[0]
        forwards = 0
        start = time.perf_counter()
        self._rng = rng_state()
        with torch.enable_grad():
            # pass 1: as is (trace, warnings, broadcasting)
            rec_a = ModuleRecorder(n, x, y, trace=True, keep_graph=False)
            watch = LossWatch(y) if y is not None else None
            with self._model(trainer, pl_module) as model, \
                    warnings.catch_warnings(record=True) as caught, rec_a.attached(model):
                warnings.simplefilter("always")
                if watch is not None:
                    with watch:
                        out_a = self._run(trainer, model, copy_a)
                else:
                    out_a = self._run(trainer, model, copy_a)
            forwards += 1
            first_run = time.perf_counter() - start
            head_name, head_a = self._head(rec_a, out_a, n)
            self.shape_trace = rec_a.trace
            self.trace_truncated = max(0, rec_a.calls - len(rec_a.trace))
            self._check_shapes(trainer, watch, caught, head_name)
            if head_a is None:
                self._skipped(trainer, "no per-example floating output found (no module call "
                              f"returned a tensor with {n} examples on dim 0)",
                              "Pass `forward_fn=` returning the model's predictions.")
                return
            self.results["head"] = {"module": head_name, "shape": list(head_a.shape)}
            if 3 * first_run > self.time_budget:
                self._skipped(trainer, f"one run of the model on {n} examples took "
                              f"{first_run:.2f} s, so three would exceed `time_budget` = "
                              f"{self.time_budget:g} s", "Raise `time_budget=` or lower "
                              "`max_examples=`.", part="target-leak, batch-mixing and causal "
                              "probes")
                self.results["forward_passes"] = forwards
                self.mark_ran(f"1 forward pass on {n} examples; shape "
                              f"{self.results.get('shape')}; other probes over the time budget")
                return
            # pass 2: targets redrawn
            if y is not None and watch is not None and watch.target_uses == 0:
                self.results["target_leak"] = (
                    f"skipped: the batch tensor taken as targets {tuple(y.shape)} never "
                    "reached a loss (it is another input); pass `target_key=`")
            elif y is not None:
                forwards += self._check_target_leak(trainer, pl_module, copy_a, y, head_name,
                                                    head_a)
            else:
                self.results["target_leak"] = "skipped: no targets found in the batch"
            # pass 3: gradients
            forwards += self._check_gradients(trainer, pl_module, copy_a, x, y, rec_a)
        checked = ", ".join(f"{k} {v if isinstance(v, str) else 'ran'}"
                            for k, v in self.results.items()
                            if k in ("batch_mixing", "causal", "target_leak", "shape"))
        self.results["forward_passes"] = forwards
        calls = "" if self.forward_fn is not None else " (`training_step` calls)"
        fresh = "copy" if self.results.get("isolation") == "copy" else "snapshot"
        self.mark_ran(f"{forwards} forward passes{calls} on {min(n, self.max_examples)} examples, "
                      f"each on a fresh {fresh} of the model; {checked}")

    @staticmethod
    def _label(pl_module: pl.LightningModule, name: str | None) -> str:
        """A module name for messages (the LightningModule's class for the root)."""
        if name is None:
            return "<unknown>"
        return name or type(pl_module).__name__

    @staticmethod
    def _layer(name: str | None) -> str | None:
        return None if name in (None, "", "<forward_fn>") else name

    def _head(self, rec: ModuleRecorder, output: Any, n: int) -> tuple[str | None, Tensor | None]:
        if self.forward_fn is not None:
            out = first_float_tensor(output)
            if out is not None and out.dim() >= 1 and out.shape[0] == n:
                return "<forward_fn>", out if rec.keep_graph else out.detach().clone()
        return rec.head_name, rec.head

    # ------------------------------------------------------------------ shapes
    def _check_shapes(self, trainer: pl.Trainer, watch: LossWatch | None,
                      caught: list[warnings.WarningMessage], head_name: str | None) -> None:
        framework: list[dict[str, Any]] = []
        for w in caught:
            parsed = parse_size_warning(str(w.message))
            if parsed is not None and broadcast_mismatch(*parsed) is not None:
                framework.append({"message": str(w.message), "input_shape": parsed[0],
                                  "target_shape": parsed[1], "category": w.category.__name__})
        events = [vars(e) for e in watch.events] if watch is not None else []
        if not events and not framework:
            self.results["shape"] = "ok"
            return
        first: dict[str, Any] = events[0] if events else {
            "op": "loss", "prediction_shape": framework[0]["input_shape"],
            "target_shape": framework[0]["target_shape"],
            "result_shape": broadcast_mismatch(framework[0]["input_shape"],
                                               framework[0]["target_shape"])}
        self.results["shape"] = "mismatch"
        pred, tgt, res = first["prediction_shape"], first["target_shape"], first["result_shape"]
        self.add_finding(
            trainer, "structure.shape_mismatch",
            f"`{first['op']}` combines predictions of shape {tuple(pred)} with targets of shape "
            f"{tuple(tgt)}, which broadcast silently to {tuple(res)}: every prediction is compared "
            f"with every target. Make the shapes equal before the loss (e.g. `pred.squeeze(-1)` "
            f"or `target.view_as(pred)`).",
            evidence={"prediction_shape": pred, "target_shape": tgt, "broadcast_shape": res,
                      "op": first["op"], "operations": events, "framework_warnings": framework,
                      "head_module": head_name},
            global_step=0,
        )

    # ------------------------------------------------------------------ target leak
    def _check_target_leak(self, trainer: pl.Trainer, pl_module: pl.LightningModule, copy_a: Any,
                           y: Tensor, head_name: str | None, head_a: Tensor) -> int:
        start = aligned_start(list(head_a.shape), list(y.shape))
        new_y = redraw_targets(y, start=start)
        if new_y is None:
            self.results["target_leak"] = "skipped: every target of the batch is equal"
            return 0
        copy_b = replace_tensor(copy_a, y, new_y)
        parts_b = split_batch(copy_b, self.input_key, self.target_key)
        x_b = parts_b.inputs
        if parts_b.targets is not new_y or x_b is None:
            self.results["target_leak"] = ("skipped: the targets could not be replaced in this "
                                           f"batch type ({type(copy_a).__name__})")
            return 0
        if not self._gate(trainer, 1, True):
            self.results["target_leak"] = "skipped: another rank could not run it"
            return 0
        # same state and randomness as pass 1 (a fresh copy, every RNG reset): only the targets
        # differ
        rec_b = ModuleRecorder(head_a.shape[0], x_b, new_y, trace=False, keep_graph=False)
        with self._model(trainer, pl_module) as model, rec_b.attached(model), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out_b = self._run(trainer, model, copy_b)
        _, head_b = self._head(rec_b, out_b, head_a.shape[0])
        if head_b is None:
            self.results["target_leak"] = "skipped: no head output with the redrawn targets"
            return 1
        positions = slice(0, 1) if start is not None else None
        change = output_change(head_a, head_b, positions=positions, tolerance=self.tolerance)
        redrawn = (f"target positions {start}..{y.shape[1] - 1} permuted"
                   if start is not None else "targets permuted across the batch")
        self.results["target_leak"] = "leak" if change.changed else "ok"
        control = change.changed
        if trainer.world_size > 1:  # the control runs the user's code: on every rank or none
            control = bool(trainer.strategy.reduce_boolean_decision(control, all=False))
        if not control:
            return 1
        # determinism control: the same batch as pass 1 again; a different output means the model
        # is stochastic or stateful beyond what the probe resets, and proves no leak
        x_a = split_batch(copy_a, self.input_key, self.target_key).inputs
        assert x_a is not None
        rec_c = ModuleRecorder(head_a.shape[0], x_a, y, trace=False, keep_graph=False)
        with self._model(trainer, pl_module) as model, rec_c.attached(model), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out_c = self._run(trainer, model, copy_a)
        _, head_c = self._head(rec_c, out_c, head_a.shape[0])
        if not change.changed:
            return 2
        same = head_c is not None and not output_change(
            head_a, head_c, positions=positions, tolerance=self.tolerance).changed
        if not same:
            why = ("the same batch run twice gave different outputs (the model is stochastic or "
                   "stateful beyond what the probe resets: global and module-owned RNGs, module "
                   "state), so a change with redrawn targets proves nothing")
            self.results["target_leak"] = f"skipped: {why}"
            self._skipped(trainer, why, "Make the forward deterministic in eval mode (or pass "
                          "`forward_fn=`) to probe for a target leak.", part="target-leak probe")
            return 2
        where = ("at the first output position, which teacher forcing only feeds the tokens "
                 f"before target position {start}" if start is not None else "")
        self.add_finding(
            trainer, "structure.target_leak",
            f"The output of `{self._label(pl_module, head_name)}` changed when only the targets "
            f"changed ({redrawn}, inputs unchanged){' ' + where if where else ''}: max |diff| "
            f"{change.max_abs_diff:.4g} ({change.relative_diff:.3g} of its scale), "
            f"{100 * change.fraction_changed:.0f}% of the compared values changed. The targets "
            "reach the forward pass: feed the decoder the targets shifted right and keep labels "
            "out of the features (expected only for label-conditioned models).",
            layer=self._layer(head_name),
            evidence={"module": head_name, "compared": change.compared,
                      "max_abs_diff": change.max_abs_diff, "relative_diff": change.relative_diff,
                      "fraction_changed": change.fraction_changed, "replacement": redrawn,
                      "output_shape": change.shape_before, "output_shape_after": change.shape_after,
                      "target_shape": list(y.shape)},
            global_step=0,
        )
        return 2

    # ------------------------------------------------------------------ gradients
    def _causal_reason(self, x: Tensor, y: Tensor | None) -> str | None:
        if self.causal is True:
            return "`causal=True`"
        if self.causal is None and is_next_token(x, y, self.ignore_index):
            assert y is not None
            return (f"next-token data: targets[:, :-1] == inputs[:, 1:] on the probed batch "
                    f"({y.shape[0]} sequences of {y.shape[1]} tokens), so the model must be causal")
        return None

    def _check_gradients(self, trainer: pl.Trainer, pl_module: pl.LightningModule, copy_a: Any,
                         x: Tensor, y: Tensor | None, rec_a: ModuleRecorder) -> int:
        with self._model(trainer, pl_module) as model:
            return self._gradients(trainer, model, copy_a, x, y, rec_a)

    def _gradients(self, trainer: pl.Trainer, pl_module: pl.LightningModule, copy_a: Any,
                   x: Tensor, y: Tensor | None, rec_a: ModuleRecorder) -> int:
        """Pass 3, on ``pl_module``: a fresh copy of the user's module."""
        reason = self._causal_reason(x, y)
        deadline = time.perf_counter() + self.time_budget / 3  # for localizing a problem
        holder: dict[str, Tensor] = {}
        replace_in: nn.Module | None = None
        replace: nn.Module | None = None
        leaf: Tensor | None = None
        copy_g = copy_a
        if x.is_floating_point() and rec_a.first_float_input is not None:
            name = rec_a.first_float_input
            probe_input = (f"the input of `{self._label(pl_module, name)}` (the first module "
                           "called on the batch)")
            replace_in = pl_module.get_submodule(name)
        elif x.is_floating_point():
            leaf = x.detach().clone().requires_grad_(True)
            copy_g = replace_tensor(copy_a, x, leaf)
            probe_input = "the batch's input tensor"
        elif rec_a.embedding is not None:
            name = rec_a.embedding
            probe_input = (f"the output of `{self._label(pl_module, name)}` (it embeds the "
                           "integer inputs)")
            replace = pl_module.get_submodule(name)
        elif rec_a.first_float_input is not None:  # integer inputs made floats by code (one_hot)
            name = rec_a.first_float_input
            probe_input = (f"the input of `{self._label(pl_module, name)}` (the first module "
                           "called on floats)")
            replace_in = pl_module.get_submodule(name)
        else:
            why = ("integer inputs and no module takes them to a floating output (e.g. an "
                   "embedding) or is called on floats")
            self.results["batch_mixing"] = f"skipped: {why}"
            if reason is not None:
                self.results["causal"] = f"skipped: {why}"
                self._skipped(trainer, why, "Pass `forward_fn=` calling the model on the batch's "
                              "inputs, or embed the tokens with an `nn.Embedding` module.",
                              part=f"causal probe ({reason})")
            return 0
        x_g, y_g = split_batch(copy_g, self.input_key, self.target_key)
        if x_g is None or (leaf is not None and x_g is not leaf):
            self.results["batch_mixing"] = ("skipped: the inputs could not be replaced in this "
                                            f"batch type ({type(copy_a).__name__})")
            return 0
        if not self._gate(trainer, 2, True):
            self.results["batch_mixing"] = "skipped: another rank could not run it"
            return 0
        rec_g = ModuleRecorder(x.shape[0], x_g, y_g, trace=False, keep_graph=True)
        watch = LossWatch(y_g) if y_g is not None else None
        with warnings.catch_warnings(), ExitStack() as stack:
            warnings.simplefilter("ignore")
            if replace is not None:
                stack.enter_context(replace_output(replace, x_g, holder))
            if replace_in is not None:
                stack.enter_context(replace_input(replace_in, holder))
            stack.enter_context(rec_g.attached(pl_module))
            if watch is not None:
                stack.enter_context(watch)
            out_g = self._run(trainer, pl_module, copy_g)
        if replace is not None or replace_in is not None:
            leaf = holder.get("leaf")
        head_name, head = self._head(rec_g, out_g, x.shape[0])
        if leaf is None or head is None or not head.requires_grad:
            self.results["batch_mixing"] = "skipped: the head output does not depend on the inputs"
            return 1
        self.results["probe_input"] = probe_input
        causal_ok = (reason is not None and head.dim() >= 2 and leaf.dim() >= 2
                     and head.shape[1] == leaf.shape[1] >= 2)
        positions = probe_positions(leaf.shape[1]) if causal_ok else []
        outputs = [(f"the output of `{self._label(pl_module, head_name)}`", head_name, head)]
        if watch is not None:
            for fn_name, pred in watch.loss_inputs[:1]:
                if (pred is not head and pred.requires_grad and pred.dim() >= 1
                        and pred.shape[0] == leaf.shape[0]):
                    outputs.append((f"the prediction given to `{fn_name}`", None, pred))
        if leaf.shape[0] < 2:
            self.results["batch_mixing"] = "skipped: a single example"
        else:
            self.results["batch_mixing"] = "ok"
        for label, out_name, out in outputs if leaf.shape[0] >= 2 else []:
            mix = example_dependence(out, leaf, example=0, tolerance=self.tolerance,
                                     retain_graph=True)  # freed with the probe's references
            if not mix.mixing:
                continue
            if pairwise_output(out, leaf, column=mix.worst_example or 1, tolerance=self.tolerance,
                               retain_graph=True):
                self.results["batch_mixing"] = (f"ok: {label} is an example-by-example score "
                                                "matrix (in-batch pairs by design)")
                break
            self.results["batch_mixing"] = "mixing"

            def mixes(t: Tensor) -> bool:
                dep = example_dependence(t, leaf, tolerance=self.tolerance, retain_graph=True)
                return dep.mixing and not pairwise_output(t, leaf, column=dep.worst_example or 1,
                                                          tolerance=self.tolerance, retain_graph=True)

            first = self._localize(rec_g, leaf, mixes, deadline)
            where = self._where(pl_module, first, "mixes examples", out_name is None)
            self.add_finding(
                trainer, "structure.batch_mixing",
                f"In eval mode {label} for example 0 depends on the inputs of other examples: "
                f"gradient norm {mix.other_grad_norm:.3g} reaches them (largest: example "
                f"{mix.worst_example}) vs {mix.own_grad_norm:.3g} for its own input. An operation "
                "mixes the batch dimension: a softmax/log_softmax or normalization over `dim=0`, a "
                "`view`/`reshape` that merges the batch with another dimension, or batch and "
                f"sequence dimensions swapped.{where}",
                layer=self._layer(first) or self._layer(out_name),
                evidence={"output": label, "first_module": first, "example": 0,
                          "own_grad_norm": mix.own_grad_norm,
                          "other_grad_norm": mix.other_grad_norm, "ratio": mix.ratio,
                          "worst_example": mix.worst_example, "probe_input": probe_input,
                          "batch_size": int(leaf.shape[0])},
                global_step=0,
            )
            break
        if reason is None:
            return 1
        if not causal_ok:
            why = (f"the head output {tuple(head.shape)} and the probed input {tuple(leaf.shape)} do "
                   "not share a sequence length on dim 1")
            self.results["causal"] = f"skipped: {why}"
            self._skipped(trainer, why, "Pass `forward_fn=` returning per-position outputs "
                          "`(N, T, ...)`.", part=f"causal probe ({reason})")
            return 1
        self.results["causal"] = f"ok ({reason})"
        for pos in positions:
            dep = position_dependence(head, leaf, pos, tolerance=self.tolerance,
                                      retain_graph=True)  # freed with the probe's references
            if dep.leak:
                self.results["causal"] = f"leak ({reason})"
                shown = dep.future_positions[:8]
                more = "..." if len(dep.future_positions) > 8 else ""
                length = leaf.shape[1]

                def leaks(t: Tensor, pos: int = pos, length: int = length) -> bool:
                    if t.dim() < 2 or t.shape[1] != length:
                        return False
                    return position_dependence(t, leaf, pos, tolerance=self.tolerance,
                                               retain_graph=True).leak

                first = self._localize(rec_g, leaf, leaks, deadline)
                where = self._where(pl_module, first, "sees the future", False)
                self.add_finding(
                    trainer, "structure.causal_leak",
                    f"Output position {pos} of `{self._label(pl_module, head_name)}` depends on "
                    f"later input positions {shown}{more} ({100 * dep.ratio:.1f}% of its input "
                    f"gradient norm comes from the future); checked because of {reason}. Check "
                    "the attention masks (upper triangle masked? the encoder's too? cross-attention "
                    "to an encoder that saw the whole sequence?) and every layer that mixes "
                    f"positions (convolutions need left padding).{where}",
                    layer=self._layer(first) or self._layer(head_name),
                    evidence={"position": pos, "future_positions": dep.future_positions,
                              "first_module": first,
                              "future_grad_norm": dep.future_grad_norm,
                              "past_grad_norm": dep.past_grad_norm, "future_share": dep.ratio,
                              "reason": reason, "probe_input": probe_input,
                              "sequence_length": int(leaf.shape[1]),
                              "positions_probed": positions},
                    global_step=0,
                )
                break
        return 1

    def _where(self, pl_module: pl.LightningModule, first: str | None, what: str,
               after_model: bool) -> str:
        """The sentence of a message that says where the problem first shows."""
        if first:
            return f" The first module whose output {what} is `{first}`."
        if first == "":
            return (f" No submodule's output {what}: it happens in "
                    f"`{type(pl_module).__name__}.forward` itself, after its last submodule.")
        if after_model:
            return (f" No module's output {what}: it happens in `training_step` code after the "
                    "model.")
        return ""

    def _localize(self, rec: ModuleRecorder, leaf: Tensor, shows: Callable[[Tensor], bool],
                  deadline: float) -> str | None:
        """The first module (in completion order) whose output already shows the problem."""
        for name, out in rec.outputs:
            if out is leaf or time.perf_counter() > deadline:
                continue
            try:
                if shows(out):
                    return name
            except RuntimeError:  # an output outside the leaf's graph or freed: skip it
                continue
        return None

    # ------------------------------------------------------------------ state
    @override
    def extra_state(self) -> dict[str, Any]:
        return {"shape_trace": self.shape_trace, "trace_truncated": self.trace_truncated,
                "results": self.results, "probe_seconds": self.probe_seconds}

    @override
    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.shape_trace = list(state.get("shape_trace", []))
        self.trace_truncated = int(state.get("trace_truncated", 0))
        self.results = dict(state.get("results", {}))
        self.probe_seconds = state.get("probe_seconds")


__all__ = ["StructureProbe"]
