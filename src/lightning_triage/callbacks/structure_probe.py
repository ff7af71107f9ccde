"""Stage 5 (structure): do outputs mix examples, see future positions or the targets, or rely on
silent broadcasting?"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from torch import Tensor
from typing_extensions import override

from lightning_triage.callbacks._args import (
    BundleArg,
    check_batch_keys,
    check_callable,
    check_causal,
    check_int,
    check_number,
    passes,
)
from lightning_triage.callbacks._probe import ForwardFn, ProbeCallback
from lightning_triage.callbacks._progress import progress
from lightning_triage.callbacks.base import guarded
from lightning_triage.functional import structure_verdicts as rules
from lightning_triage.functional.batch import BatchKey, locate_batch, split_batch
from lightning_triage.functional.chance import IGNORE_INDEX
from lightning_triage.functional.coupling import CouplingWatch
from lightning_triage.functional.structure import (
    DEFAULT_TOLERANCE,
    LossWatch,
    aligned_start,
    is_next_token,
    output_change,
    position_dependence,
    probe_positions,
    redraw_targets,
    replace_tensor,
    same_storage,
    target_shift,
)
from lightning_triage.functional.structure_verdicts import (
    Outcome,
    PartResult,
    StructureProbeResult,
    skipped,
)
from lightning_triage.probing import (
    ProbeUnavailableError,
    RngState,
    UserCodeError,
    eval_copy,
    rng_state,
)
from lightning_triage.probing.recording import (
    LeafPlan,
    ModuleRecorder,
    plan_leaf,
    replace_input,
    replace_output,
)


@dataclass
class _GradientRun:
    """The gradient pass: its recorder, the leaf, the head output and the time left."""

    rec: ModuleRecorder
    leaf: Tensor
    head_name: str | None
    head: Tensor
    probe_input: str
    deadline: float


class StructureProbe(ProbeCallback):
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
       inputs[:, 1:]``, or ``labels = input_ids`` given to the loss shifted by one inside the
       model), of output positions w.r.t. later positions
       (``structure.causal_leak``). A problem is localized to the first module whose output
       shows it (the finding's ``layer``).
    4. **Label alignment** (language models): the targets the loss receives compared with the
       inputs: labels shifted twice (the user shifts and the model shifts again) or not at all
       where the model does not shift (``structure.label_misaligned``).

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
        TriageConfigError: for an invalid argument (named in the message).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[StructureProbe(causal=True)])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.StructureProbe
                  init_args: {causal: true, max_examples: 16}
    """

    stage: ClassVar[str] = "structure"
    codes: ClassVar[tuple[str, ...]] = ("structure.batch_mixing", "structure.causal_leak",
        "structure.shape_mismatch", "structure.target_leak", "structure.probe_skipped",
        "structure.label_misaligned")
    # how `Triage` builds this check (TriageCallback.bundle_args)
    bundle_args: ClassVar[Mapping[str, BundleArg]] = passes(
        "causal", "forward_fn", "input_key", "target_key")

    state_key_args = ("causal", "input_key", "target_key")

    def __init__(
        self,
        *,
        causal: bool | None = None,
        forward_fn: ForwardFn | None = None,
        input_key: BatchKey | None = None,
        target_key: BatchKey | None = None,
        max_examples: int = 16,
        tolerance: float = DEFAULT_TOLERANCE,
        time_budget: float = 10.0,
        ignore_index: int = IGNORE_INDEX,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        check_causal(causal)
        check_callable("forward_fn", forward_fn, "(pl_module, batch) -> output")
        check_batch_keys(input_key=input_key, target_key=target_key)
        check_int("max_examples", max_examples, 2)
        check_number("tolerance", tolerance, 0, 1)
        check_number("time_budget", time_budget, 0, unit="seconds")
        check_int("ignore_index", ignore_index)
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
        #: what the probe ran and found
        self.result = StructureProbeResult()
        self._rng: RngState | None = None
        self.probe_seconds: float | None = None
        self._slot = 0

    @property
    def results(self) -> dict[str, Any]:
        """:attr:`result` as plain values (each part's outcome as text), read only."""
        return self.result.as_dict()

    @override
    def _count_user_call(self) -> None:
        self.result.user_code_calls += 1

    # ------------------------------------------------------------------ hooks
    @override
    @guarded
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.ran or self.result.as_dict() or trainer.global_step != 0 or batch_idx != 0:
            self.idle = True  # the probe runs on the first batch of a fit or not at all
            return
        start = time.perf_counter()
        self._slot = 0
        try:
            with progress(trainer, "structure probes on copies", self.time_budget):
                self._probe(trainer, pl_module, batch)
        except UserCodeError as err:
            self.result.head = None
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
            if self.result.seconds is None:
                self.result.seconds = round(self.probe_seconds, 4)
        if self.ran:
            self.detail = f"{self.detail}; cost {1000 * self.probe_seconds:.0f} ms"

    # ------------------------------------------------------------------ probe
    @contextmanager
    def _model(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Iterator[Any]:
        """A fresh deep copy of the module for one pass (or the live module under a snapshot
        when a copy does not fit), in eval mode, with every global RNG as at the probe's start:
        paired passes start from the same state."""
        with eval_copy(trainer, pl_module, self._rng, factor=2.0) as probe:
            self.result.isolation = probe.how
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
        self.add_verdict(trainer, rules.probe_skipped(why, what, part))
        if not part:
            self.result.skipped = why
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
            self.result.head = (head_name, list(head_a.shape))
            if 3 * first_run > self.time_budget:
                self._skipped(trainer, f"one run of the model on {n} examples took "
                              f"{first_run:.2f} s, so three would exceed `time_budget` = "
                              f"{self.time_budget:g} s", "Raise `time_budget=` or lower "
                              "`max_examples=`.", part="target-leak, batch-mixing and causal "
                              "probes")
                self.result.forward_passes = forwards
                self.mark_ran(f"1 forward pass on {n} examples; shape "
                              f"{self.result.shape}; other probes over the time budget")
                return
            # pass 2: targets redrawn
            if y is not None and watch is not None and watch.target_uses == 0:
                self.result.target_leak = skipped(
                    f"the batch tensor taken as targets {tuple(y.shape)} never "
                    "reached a loss (it is another input); pass `target_key=`")
            elif y is not None:
                forwards += self._check_target_leak(trainer, pl_module, copy_a, y, head_name,
                                                    head_a)
            else:
                self.result.target_leak = skipped("no targets found in the batch")
            # pass 3: gradients
            forwards += self._check_gradients(trainer, pl_module, copy_a, x, y, rec_a)
        checked = self.result.checked()
        self.result.forward_passes = forwards
        calls = "" if self.forward_fn is not None else " (`training_step` calls)"
        fresh = "copy" if self.result.isolation == "copy" else "snapshot"
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
        return rec.head_of(output if self.forward_fn is not None else None, n)

    # ------------------------------------------------------------------ shapes
    def _check_shapes(self, trainer: pl.Trainer, watch: LossWatch | None,
                      caught: list[warnings.WarningMessage], head_name: str | None) -> None:
        framework = rules.framework_broadcasts([(str(w.message), w.category.__name__)
                                                for w in caught])
        events = [vars(e) for e in watch.events] if watch is not None else []
        verdict = rules.shape_mismatch(events, framework, head_name)
        self.result.shape = PartResult(Outcome.OK if verdict is None else Outcome.MISMATCH)
        if verdict is not None:
            self.add_verdict(trainer, verdict)

    # ------------------------------------------------------------------ target leak
    def _check_target_leak(self, trainer: pl.Trainer, pl_module: pl.LightningModule, copy_a: Any,
                           y: Tensor, head_name: str | None, head_a: Tensor) -> int:
        start = aligned_start(list(head_a.shape), list(y.shape))
        new_y = redraw_targets(y, start=start)
        if new_y is None:
            self.result.target_leak = skipped("every target of the batch is equal")
            return 0
        copy_b = replace_tensor(copy_a, y, new_y)
        parts_b = split_batch(copy_b, self.input_key, self.target_key)
        x_b = parts_b.inputs
        if parts_b.targets is not new_y or x_b is None:
            self.result.target_leak = skipped("the targets could not be replaced in this "
                                              f"batch type ({type(copy_a).__name__})")
            return 0
        if not self._gate(trainer, 1, True):
            self.result.target_leak = skipped("another rank could not run it")
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
            self.result.target_leak = skipped("no head output with the redrawn targets")
            return 1
        positions = slice(0, 1) if start is not None else None
        change = output_change(head_a, head_b, positions=positions, tolerance=self.tolerance)
        redrawn = (f"target positions {start}..{y.shape[1] - 1} permuted"
                   if start is not None else "targets permuted across the batch")
        self.result.target_leak = PartResult(Outcome.LEAK if change.changed else Outcome.OK)
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
            self.result.target_leak = skipped(why)
            self._skipped(trainer, why, "Make the forward deterministic in eval mode (or pass "
                          "`forward_fn=`) to probe for a target leak.", part="target-leak probe")
            return 2
        self.add_verdict(trainer, rules.target_leak(
            self._label(pl_module, head_name), head_name, self._layer(head_name), change, redrawn,
            start, list(y.shape)))
        return 2

    # ------------------------------------------------------------------ gradients
    def _check_gradients(self, trainer: pl.Trainer, pl_module: pl.LightningModule, copy_a: Any,
                         x: Tensor, y: Tensor | None, rec_a: ModuleRecorder) -> int:
        with self._model(trainer, pl_module) as model:
            try:
                return self._gradients(trainer, model, copy_a, x, y, rec_a)
            except RuntimeError as exc:
                if "use_reentrant" not in str(exc):
                    raise
        # reentrant activation checkpointing refuses `torch.autograd.grad`, which these
        # probes are made of: a standard set-up, not a fault of the model
        why = "reentrant activation checkpointing (`use_reentrant=True`) refuses `torch.autograd.grad`"
        self.result.batch_mixing = skipped(why)
        self._skipped(trainer, why, "Checkpoint with `use_reentrant=False` (PyTorch's "
                      "recommendation) to probe for batch mixing and causal leaks.",
                      part="gradient probes (batch mixing, causal)")
        return 1

    def _gradient_pass(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                       choice: LeafPlan, x_g: Tensor, y_g: Tensor | None,
                       n: int) -> tuple[ModuleRecorder, LossWatch | None, Any, Tensor | None]:
        """Run the user's code with ``choice`` made a leaf: ``(recorder, loss watch, output,
        leaf)``."""
        holder: dict[str, Tensor] = {}
        rec_g = ModuleRecorder(n, x_g, y_g, trace=False, keep_graph=True)
        watch = LossWatch(y_g) if y_g is not None else None
        with warnings.catch_warnings(), ExitStack() as stack:
            warnings.simplefilter("ignore")
            if choice.replace_out is not None:
                stack.enter_context(replace_output(choice.replace_out, x_g, holder))
            if choice.replace_in is not None:
                stack.enter_context(replace_input(choice.replace_in, holder))
            stack.enter_context(rec_g.attached(pl_module))
            if watch is not None:
                stack.enter_context(watch)
            out_g = self._run(trainer, pl_module, choice.batch)
        if choice.leaf is None:
            return rec_g, watch, out_g, holder.get("leaf")
        return rec_g, watch, out_g, choice.leaf

    def _gradients(self, trainer: pl.Trainer, pl_module: pl.LightningModule, copy_a: Any,
                   x: Tensor, y: Tensor | None, rec_a: ModuleRecorder) -> int:
        """Pass 3, on ``pl_module``: a fresh copy of the user's module."""
        reason = rules.causal_reason(self.causal, x, y, self.ignore_index)
        deadline = time.perf_counter() + self.time_budget / 3  # for localizing a problem
        choice = plan_leaf(pl_module, copy_a, x, rec_a)
        if choice is None:
            why = ("integer inputs and no module takes them to a floating output (e.g. an "
                   "embedding) or is called on floats")
            self.result.batch_mixing = skipped(why)
            if reason is not None:
                self.result.causal = skipped(why)
                self._skipped(trainer, why, "Pass `forward_fn=` calling the model on the batch's "
                              "inputs, or embed the tokens with an `nn.Embedding` module.",
                              part=f"causal probe ({reason})")
            return 0
        x_g, y_g = split_batch(choice.batch, self.input_key, self.target_key)
        if x_g is None or (choice.leaf is not None and x_g is not choice.leaf):
            self.result.batch_mixing = skipped("the inputs could not be replaced in this "
                                               f"batch type ({type(copy_a).__name__})")
            return 0
        if not self._gate(trainer, 2, True):
            self.result.batch_mixing = skipped("another rank could not run it")
            return 0
        with CouplingWatch(int(x.shape[0])) as coupling:  # what the objective couples
            rec_g, watch, out_g, leaf = self._gradient_pass(trainer, pl_module, choice, x_g,
                                                            y_g, x.shape[0])
        head_name, head = self._head(rec_g, out_g, x.shape[0])
        if leaf is None or head is None or not head.requires_grad:
            self.result.batch_mixing = skipped("the head output does not depend on the inputs")
            return 1
        self.result.probe_input = choice.description
        run = _GradientRun(rec_g, leaf, head_name, head, choice.description, deadline)
        self._batch_mixing(trainer, pl_module, run, watch)
        self._coupled(trainer, pl_module, run, coupling)
        if reason is None and watch is not None:  # `labels = input_ids`, shifted in the loss
            reason = rules.causal_reason(self.causal, x, y, self.ignore_index, watch.loss_targets)
        if reason is not None:
            self._causal(trainer, pl_module, run, reason)
        if watch is not None and y is not None:
            self._label_alignment(trainer, pl_module, run, copy_a, x, y, watch)
        return 1

    def _label_alignment(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                         run: _GradientRun, batch: Any, x: Tensor, y: Tensor,
                         watch: LossWatch) -> None:
        """Token inputs: by how many positions the targets a loss was given lead the inputs
        (``structure.label_misaligned`` for 2, and for 0 under a causal model)."""
        if x.is_floating_point() or x.dim() != 2 or x.shape[1] < 4 or y.is_floating_point():
            return
        shifts = [(name, target_shift(x, t, self.ignore_index), ignore)
                  for (name, _), t, ignore in zip(watch.loss_inputs, watch.loss_targets,
                                                  watch.loss_ignore, strict=True)]
        found = next(((n, k, i) for n, k, i in shifts if k in (0, 2)), None)
        if found is None:
            return
        name, shift, ignore = found
        causal = shift == 0 and self._is_causal(run)
        self.result.labels = f"loss offset {shift}" + (" (causal model)" if causal else "")
        layout = locate_batch(batch, self.input_key, self.target_key)
        # where the labels are, for the realignment remedy (docs/remedies.md)
        labels = {"label_entry": layout.target_name, "input_entry": layout.input_name,
                  "labels_lead_by": target_shift(x, y, self.ignore_index),
                  "ignore_index": self.ignore_index if ignore is None else ignore}
        self.add_verdicts(trainer, rules.label_misaligned(
            shift, name, user_shifted=is_next_token(x, y, self.ignore_index),
            model=rules.lm_name(pl_module), sequences=int(x.shape[0]),
            length=int(x.shape[1]), causal_model=causal, labels=labels))

    def _is_causal(self, run: _GradientRun) -> bool:
        """No output position of the head depends on a later input position (a quiet probe:
        no finding either way)."""
        leaf, head = run.leaf, run.head
        if not (head.dim() >= 2 and leaf.dim() >= 2 and head.shape[1] == leaf.shape[1] >= 2):
            return False
        return not any(position_dependence(head, leaf, pos, tolerance=self.tolerance,
                                           retain_graph=True).leak
                       for pos in probe_positions(int(leaf.shape[1])))

    def _batch_mixing(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                      run: _GradientRun, watch: LossWatch | None) -> None:
        """Does example 0's output (the head's, and the prediction given to the loss) depend on
        the other examples' inputs?"""
        leaf, head = run.leaf, run.head
        outputs = [(f"the output of `{self._label(pl_module, run.head_name)}`", run.head_name, head)]
        if watch is not None:
            for fn_name, pred in watch.loss_inputs[:1]:
                if (pred is not head and pred.requires_grad and pred.dim() >= 1
                        and pred.shape[0] == leaf.shape[0]):
                    outputs.append((f"the prediction given to `{fn_name}`", None, pred))
        self.result.batch_mixing, mixed = rules.judge_batch_mixing(outputs, leaf, self.tolerance)
        if mixed is None:
            return
        label, out_name, mix = mixed
        first = run.rec.first_showing(
            leaf, lambda t: rules.mixes_examples(t, leaf, mix.example, self.tolerance), run.deadline)
        where = rules.where_sentence(first, "mixes examples", out_name is None,
                                     type(pl_module).__name__)
        self.add_verdict(trainer, rules.batch_mixing(
            label, self._layer(first) or self._layer(out_name), first, where, mix,
            run.probe_input, int(leaf.shape[0]), time_major=rules.time_major_rnn(pl_module, first)))

    def _coupled(self, trainer: pl.Trainer, pl_module: pl.LightningModule, run: _GradientRun,
                 coupling: CouplingWatch) -> None:
        """The examples are independent per output and the objective couples them on purpose
        (a score matrix, in-batch similarities, batch statistics): said at info."""
        self.add_verdicts(trainer, rules.coupled_verdict(
            self.result, f"the output of `{self._label(pl_module, run.head_name)}`",
            coupled=coupling.coupled, pairs=coupling.pairs, statistics=coupling.statistics,
            batch_size=int(run.leaf.shape[0])))

    def _causal(self, trainer: pl.Trainer, pl_module: pl.LightningModule, run: _GradientRun,
                reason: str) -> None:
        """Do output positions depend on later input positions (checked because of
        ``reason``)?"""
        leaf, head = run.leaf, run.head
        if not (head.dim() >= 2 and leaf.dim() >= 2 and head.shape[1] == leaf.shape[1] >= 2):
            why = (f"the head output {tuple(head.shape)} and the probed input {tuple(leaf.shape)} do "
                   "not share a sequence length on dim 1")
            self.result.causal = skipped(why)
            self._skipped(trainer, why, "Pass `forward_fn=` returning per-position outputs "
                          "`(N, T, ...)`.", part=f"causal probe ({reason})")
            return
        length = leaf.shape[1]
        positions = probe_positions(length)
        self.result.causal = PartResult(Outcome.OK, reason=reason)
        for pos in positions:
            dep = position_dependence(head, leaf, pos, tolerance=self.tolerance,
                                      retain_graph=True)  # freed with the probe's references
            if not dep.leak:
                continue
            self.result.causal = PartResult(Outcome.LEAK, reason=reason)

            def leaks(t: Tensor, pos: int = pos) -> bool:
                if t.dim() < 2 or t.shape[1] != length:
                    return False
                return position_dependence(t, leaf, pos, tolerance=self.tolerance,
                                           retain_graph=True).leak

            first = run.rec.first_showing(leaf, leaks, run.deadline)
            where = rules.where_sentence(first, "sees the future", False, type(pl_module).__name__)
            self.add_verdict(trainer, rules.causal_leak(
                self._label(pl_module, run.head_name),
                self._layer(first) or self._layer(run.head_name), first, where, dep, reason,
                run.probe_input, int(length), positions))
            return

    # ------------------------------------------------------------------ state
    @override
    def extra_state(self) -> dict[str, Any]:
        return {"shape_trace": self.shape_trace, "trace_truncated": self.trace_truncated,
                "results": self.result.as_dict(), "probe_seconds": self.probe_seconds}

    @override
    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.shape_trace = list(state.get("shape_trace", []))
        self.trace_truncated = int(state.get("trace_truncated", 0))
        self.result = StructureProbeResult.from_dict(state.get("results", {}))
        self.probe_seconds = state.get("probe_seconds")


__all__ = ["ForwardFn", "StructureProbe"]
