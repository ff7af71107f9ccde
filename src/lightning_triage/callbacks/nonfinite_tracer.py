"""Stage 9 (numerics): where does the first NaN/Inf appear, and is it precision?"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor, nn
from torch.optim import Optimizer
from typing_extensions import override

from lightning_triage.callbacks._monitor import StepCounter, step_counter
from lightning_triage.callbacks._step import StepState
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.functional.batch import split_batch
from lightning_triage.functional.nonfinite import (
    Localization,
    dtype_max,
    float_tensors,
    localize_nonfinite,
    max_abs,
    nonfinite_examples,
    tensor_stats,
)
from lightning_triage.functional.tensors import abs_peak
from lightning_triage.probing import probe_module, step_loss

OnNonFinite = Literal["stop", "skip", "warn"]
Mode = Literal["auto", "sync", "deferred"]
ON_NONFINITE: tuple[OnNonFinite, ...] = ("stop", "skip", "warn")
MODES: tuple[Mode, ...] = ("auto", "sync", "deferred")

_LOSS, _GRAD, _PARAMS = 1, 2, 4

#: ``trainer.precision`` values that compute in a reduced floating dtype.
_REDUCED: dict[str, torch.dtype] = {
    "16-mixed": torch.float16, "16-true": torch.float16, "16": torch.float16,
    "bf16-mixed": torch.bfloat16, "bf16-true": torch.bfloat16, "bf16": torch.bfloat16,
}


def _short(dtype: torch.dtype | str) -> str:
    return str(dtype).replace("torch.", "")


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


@contextmanager
def _float32_state(module: nn.Module) -> Iterator[None]:
    """Temporarily swap reduced-precision parameters and buffers for float32 copies (``.data``),
    restoring the very same tensors afterwards; the originals are not written."""
    saved: list[tuple[Tensor, Tensor]] = []
    saved_grads: list[tuple[Tensor, Tensor]] = []
    try:
        for t in (*module.parameters(), *module.buffers()):
            if t.is_floating_point() and t.dtype in (torch.float16, torch.bfloat16):
                if t.grad is not None:
                    saved_grads.append((t, t.grad))
                    t.grad = None
                saved.append((t, t.data))
                t.data = t.data.float()
        yield
    finally:
        for t, data in saved:
            t.data = data
        for t, grad in saved_grads:
            t.grad = grad


def _finite(value: Tensor | None) -> bool:
    return value is None or math.isfinite(float(value))


def _healthy(total: float | Tensor | None, peak: Tensor | None) -> bool:
    """At most one host read: a non-finite total gradient norm or a non-finite peak means a
    problem (a NaN/Inf in any gradient makes its norm, hence the total, non-finite)."""
    if isinstance(total, float):  # read on the host already (CPU)
        return math.isfinite(total) and (peak is None or math.isfinite(peak.item()))
    if total is None:
        return peak is None or math.isfinite(peak.item())
    return math.isfinite((total if peak is None else total + peak.to(total.device)).item())


def _to_float32(batch: Any) -> Any:
    def cast(t: Tensor) -> Tensor:
        return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t

    return apply_to_collection(batch, Tensor, cast)


class NonFiniteTracer(TriageCallback):
    """Watch every training step for NaN/Inf and say exactly where the first one was born.

    **Detection** (every step, cheap, no per-module hooks): the loss (``on_before_backward``), the
    gradients through their total norm (``on_before_optimizer_step``, before the update, so the
    weights are still finite: one ``torch._foreach_norm``, shared with
    :class:`~lightning_triage.GradientMonitor` inside :class:`~lightning_triage.Triage`) and the
    parameters the updates write.

    **Localization** (only when a step goes non-finite, in ``"sync"`` mode): the step's batch
    (kept by reference from ``on_train_batch_start``) is replayed with the pre-step weights and
    the step's RNG state, through the user's ``training_step`` under the run's precision context
    and temporary hooks, inside a snapshot that restores everything (weights, gradients,
    buffers, optimizer state, RNG; nothing is logged). The first non-finite module output in
    forward order gives ``numerics.nonfinite_forward``; forward finite but a gradient not gives
    ``numerics.nonfinite_backward`` (the autograd op and its module); every module finite but the
    loss not gives ``numerics.nonfinite_loss``. NaN/Inf in the batch also gives
    ``data.nonfinite_input``/``data.nonfinite_target`` with the example indices. Under a reduced
    precision (``16-mixed``, ``bf16-mixed``, ``16-true``, ``bf16-true``) the step is replayed
    again in float32 (float32 copies of the weights, no autocast): finite there gives
    ``numerics.precision_overflow``. Parameters that turn non-finite after an update made from
    finite gradients give ``numerics.nonfinite_params``. Optionally, every
    ``near_overflow_every_n_steps`` steps under a reduced precision, one step's module outputs
    are sampled and ``numerics.near_overflow`` warns when one exceeds ``near_overflow_ratio`` of
    its dtype's largest value. Steps skipped by a gradient scaler (fp16 ``16-mixed`` on GPU) for
    non-finite gradients are normal and only counted.

    **Modes.** ``"sync"`` reads the flags on the host at every step (free on CPU; on GPU one
    synchronization per step) and can act before the update and localize. ``"deferred"`` keeps
    the flags on the device (no host synchronization) and reads them every
    ``check_every_n_steps`` optimizer steps: the first bad step is still exact, but the update
    of that step is not prevented and the step cannot be replayed (its batch and weights are
    gone), so the finding is ``numerics.nonfinite_detected``; after a detection the tracer
    switches to ``"sync"`` to localize the next occurrence. ``"auto"``: ``"sync"`` on CPU,
    ``"deferred"`` on accelerators.

    **Policy** (``on_nonfinite``): ``"stop"`` reports, drops the step's gradients (``.grad =
    None``: the optimizer leaves weights and state untouched) and stops fit cleanly on every rank
    (the report is written at fit end); ``"skip"`` drops the step's gradients and continues
    (counts in the check's detail); ``"warn"`` reports and lets the step happen. In deferred
    mode the policy acts when the flag is read.

    Args:
        on_nonfinite: ``"stop"``, ``"skip"`` or ``"warn"``.
        mode: ``"auto"``, ``"sync"`` or ``"deferred"``.
        check_every_n_steps: in deferred mode, read the device flags every this many optimizer
            steps.
        check_params: check the parameters the updates write: whenever the loss or the
            gradients go non-finite, every ``check_every_n_steps`` steps and at the end of
            training (sync mode); every step on the device (deferred mode).
        precision_replay: under a reduced precision, replay the failing step in float32.
        near_overflow_every_n_steps: sample module outputs every this many steps under a reduced
            precision (``None`` disables the sampling).
        near_overflow_ratio: warn when a sampled output's max ``|x|`` exceeds this fraction of its
            dtype's largest finite value.
        max_localized: replay at most this many failing steps (later ones are only counted).
        strict: raise internal errors instead of disabling the check.

    Raises:
        ValueError: for an argument outside what is allowed (the message names it).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[NonFiniteTracer(on_nonfinite="skip")])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.NonFiniteTracer
                  init_args: {on_nonfinite: stop, mode: auto, check_every_n_steps: 50}
    """

    def __init__(
        self,
        on_nonfinite: OnNonFinite = "stop",
        mode: Mode = "auto",
        check_every_n_steps: int = 50,
        check_params: bool = True,
        precision_replay: bool = True,
        near_overflow_every_n_steps: int | None = 100,
        near_overflow_ratio: float = 0.25,
        max_localized: int = 3,
        *,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        if on_nonfinite not in ON_NONFINITE:
            raise ValueError(f"`on_nonfinite` must be one of {ON_NONFINITE}, got {on_nonfinite!r}.")
        if mode not in MODES:
            raise ValueError(f"`mode` must be one of {MODES}, got {mode!r}.")
        if not isinstance(check_every_n_steps, int) or check_every_n_steps < 1:
            raise ValueError(f"`check_every_n_steps` must be an integer >= 1, got "
                             f"{check_every_n_steps!r}.")
        if near_overflow_every_n_steps is not None and (
                not isinstance(near_overflow_every_n_steps, int) or near_overflow_every_n_steps < 1):
            raise ValueError(f"`near_overflow_every_n_steps` must be an integer >= 1 or None, got "
                             f"{near_overflow_every_n_steps!r}.")
        if not 0 < near_overflow_ratio < 1:
            raise ValueError(f"`near_overflow_ratio` must be in (0, 1), got {near_overflow_ratio!r}.")
        if not isinstance(max_localized, int) or max_localized < 0:
            raise ValueError(f"`max_localized` must be an integer >= 0, got {max_localized!r}.")
        self.on_nonfinite = on_nonfinite
        self.mode = mode
        self.check_every_n_steps = check_every_n_steps
        self.check_params = check_params
        self.precision_replay = precision_replay
        self.near_overflow_every_n_steps = near_overflow_every_n_steps
        self.near_overflow_ratio = near_overflow_ratio
        self.max_localized = max_localized
        # counts (kept in checkpoints)
        self.nonfinite_steps = 0
        self.skipped_steps = 0
        self.scaler_skips = 0
        self.localized = 0
        #: `training_step` calls made by replays (each on a copy of the module)
        self.replay_calls = 0
        self.first_step: int | None = None
        # run state
        self._sync = True
        self._cpu = True
        self._reduced: torch.dtype | None = None
        self._has_scaler = False
        self._cuda: torch.device | None = None
        self._world_size = 1
        self._steps: StepCounter | None = None
        #: the per-step reads (shared with the other watches inside the ``Triage`` bundle)
        self.step_state = StepState()
        # per-batch state
        self._batch: Any = None
        self._batch_idx = 0
        self._batch_step = 0
        self._rng: Tensor | None = None
        self._cuda_rng: Tensor | None = None
        self._loss_bad = False
        self._handled = False
        self._window_handled = False
        self._stepped = False
        self._grad_peak: float | None = None
        self._last_update_step: int | None = None
        self._bad_update_step: int | None = None
        # deferred flags (device tensors)
        self._bits: Tensor | None = None
        self._first_dev: Tensor | None = None
        self._losses: list[Tensor] = []
        # near-overflow sampling
        self._peaks: list[tuple[str, Tensor]] | None = None
        self._near_reported: set[str] = set()

    # ------------------------------------------------------------------ setup
    @override
    @guarded
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.step_state.reset()
        self.step_state.automatic = pl_module.automatic_optimization
        device = trainer.strategy.root_device
        self._sync = self.mode == "sync" or (self.mode == "auto" and device.type == "cpu")
        self._reduced = _REDUCED.get(str(trainer.precision))
        self._has_scaler = getattr(trainer.precision_plugin, "scaler", None) is not None
        self._cuda = device if device.type == "cuda" else None
        self._cpu = device.type == "cpu"
        self._world_size = trainer.world_size
        self.mark_ran(self._describe())

    def _describe(self) -> str:
        mode = "sync" if self._sync else f"deferred (read every {self.check_every_n_steps} steps)"
        parts = [f"mode {mode}", f"{self.nonfinite_steps} non-finite step(s)"]
        if self.first_step is not None:
            parts.append(f"first at step {self.first_step}")
        if self.skipped_steps:
            parts.append(f"{self.skipped_steps} skipped")
        if self.scaler_skips:
            parts.append(f"{self.scaler_skips} gradient-scaler skip(s) (normal)")
        if self.replay_calls:
            parts.append(f"{self.replay_calls} `training_step` call(s) in replays")
        return ", ".join(parts)

    # ------------------------------------------------------------------ per step
    @override
    @guarded
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._steps = step_counter(trainer)

    @override
    @guarded
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        self._batch = batch
        self._batch_idx = batch_idx
        self._batch_step = trainer.global_step if self._steps is None else self._steps.completed
        self._loss_bad = False
        self._handled = False
        self._stepped = False
        self._grad_peak = None
        if self._sync:
            self._rng = torch.default_generator.get_state()  # = torch.get_rng_state(), one call less
            if self._cuda is not None and torch.cuda.is_initialized():
                self._cuda_rng = torch.cuda.get_rng_state(self._cuda)
        n = self.near_overflow_every_n_steps
        if (self._reduced is not None and n is not None and self._batch_step % n == 0
                and self._peaks is None and batch_idx % trainer.accumulate_grad_batches == 0):
            self._sample_outputs(trainer, pl_module)

    @override
    @guarded
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           loss: Tensor) -> None:
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            return
        # read once for the tracer and (inside the bundle) the watches at the batch's end
        value, host = self.step_state.note_loss(loss)
        if self._sync and host is not None:  # reading a CPU scalar is free
            self._loss_bad = self._loss_bad or not math.isfinite(host)
        else:  # no op here: joins the step's single reduction (every micro-batch's loss)
            self._losses.append(value)

    def _read_loss(self) -> bool:
        """Sync mode: whether the loss of this step (any micro-batch so far) was non-finite."""
        if self._losses:
            self._loss_bad = self._loss_bad or not _finite(max_abs(self._losses))
            self._losses = []
        return self._loss_bad

    @override
    @guarded
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: Optimizer) -> None:
        self._stepped = True
        # gradients: their total norm (the step state's one `_foreach_norm`, shared with the
        # gradient watch), non-finite when any gradient is
        state = self.step_state
        if not state.params:
            state.bind(pl_module)
        total: float | Tensor | None = None
        if state.params and (self._sync or not state.host):  # CPU deferred: the old path
            state.read_grads(trainer.global_step if self._steps is None else self._steps.completed,
                             optimizer)
            total = state.total
        if not self._sync:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            self._defer_step([total] if isinstance(total, Tensor) else self._grads(params), params)
            return
        # the losses (accelerators) and the parameters (as the previous update left them, every
        # `check_every_n_steps` steps, whenever something is non-finite and at the end of
        # training) join the total in one host read (none on CPU, where it is read already)
        watched = self._losses
        if self.check_params and self._batch_step % self.check_every_n_steps == 0:
            watched = [*watched, *(p for group in optimizer.param_groups for p in group["params"])]
        local_bad = self._loss_bad or not _healthy(total, max_abs(watched) if watched else None)
        params_bad = False
        if local_bad:  # the rare path: find out exactly which signal it was
            params = [p for group in optimizer.param_groups for p in group["params"]]
            grads = self._grads(params)
            loss_bad = self._read_loss()
            grad_peak = max_abs(grads)
            self._grad_peak = None if grad_peak is None else float(grad_peak)
            grad_bad = self._grad_peak is not None and not math.isfinite(self._grad_peak)
            params_bad = self.check_params and not _finite(max_abs(params))
            if params_bad:
                self.nonfinite_steps += 1
                self._params_event(trainer, pl_module, params)
            elif grad_bad and not loss_bad and self._has_scaler:
                self.scaler_skips += 1  # the scaler skips this step, lowers its scale: normal
                local_bad = False
            elif not (loss_bad or grad_bad):
                local_bad = False  # a total norm that overflowed on finite gradients
        self._losses = []
        if not self._any_rank(trainer, local_bad):
            self._window_handled = False
            return
        if not self._handled and not self._window_handled and not params_bad:
            self._event(trainer, pl_module, local_bad, "loss" if self._loss_bad else "gradients")
        self._handled = True
        self._window_handled = False
        self._apply_policy(trainer, optimizer)

    @staticmethod
    def _grads(params: Sequence[Tensor]) -> list[Tensor]:
        return [p.grad for p in params if p.grad is not None]

    @override
    @guarded
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: STEP_OUTPUT, batch: Any, batch_idx: int) -> None:
        try:
            if self._peaks is not None:
                self._read_samples(trainer)
            if self._stepped:
                self._last_update_step = self._batch_step
                if not self._sync and trainer.global_step % self.check_every_n_steps == 0:
                    self._read_deferred(trainer)
            elif not self._sync:
                if len(self._losses) > 1:  # keep it bounded until the next optimizer step
                    peak = max_abs(self._losses)
                    self._losses = [] if peak is None else [peak]
            # a micro-batch of gradient accumulation (or manual optimization without a step):
            # localize a bad loss now, while the weights are still pre-step
            elif self._any_rank(trainer, self._read_loss()) and not self._handled:
                self._event(trainer, pl_module, self._loss_bad, "loss")
                self._handled = True
                self._window_handled = True
        finally:
            self._batch = None

    @override
    @guarded
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.check_params and self._last_update_step is not None:
            params = list(pl_module.parameters())
            if not _finite(max_abs(params)):  # the last update, not followed by a step's check
                if self._sync:
                    self._params_event(trainer, pl_module, params)
                else:
                    self._bits = torch.full((), _PARAMS, dtype=torch.int32) if self._bits is None \
                        else self._bits | _PARAMS
        if not self._sync:
            self._read_deferred(trainer)
        self.detail = self._describe()

    # ------------------------------------------------------------------ decisions
    def _any_rank(self, trainer: pl.Trainer, local: bool) -> bool:
        if self._world_size > 1:
            return bool(trainer.strategy.reduce_boolean_decision(local, all=False))
        return local

    def _apply_policy(self, trainer: pl.Trainer, optimizer: Optimizer) -> None:
        if self.on_nonfinite == "warn":
            self._bad_update_step = self._batch_step
            return
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None  # optimizers skip parameters without gradient: no NaN is written
        self.skipped_steps += 1
        if self.on_nonfinite == "stop":
            trainer.should_stop = True
        self.detail = self._describe()

    def _event(self, trainer: pl.Trainer, pl_module: pl.LightningModule, local_bad: bool,
               signal: str) -> None:
        """A step went non-finite on some rank: count it, localize it (every rank replays, so that
        collectives inside the model match), report on the ranks where it happened."""
        if local_bad:
            self.nonfinite_steps += 1
            if self.first_step is None:
                self.first_step = self._batch_step
        if self.localized >= self.max_localized or self._batch is None:
            return
        if not pl_module.automatic_optimization:
            if local_bad:
                self.localized += 1
                self._not_localized(trainer, signal,
                                    "manual optimization: the step cannot be replayed without "
                                    "running its optimizer steps")
            return
        self.localized += 1
        if local_bad:
            self._check_batch(trainer)
        try:
            run = self._replay(trainer, pl_module, float32=False)
        except Exception as exc:  # the user's code may refuse a NaN: still apply the policy
            if self.strict:
                raise
            if local_bad:
                self._not_localized(trainer, signal, f"the replay raised {type(exc).__name__}: {exc}")
            return
        reduced = self._reduced
        needs_fp32 = (reduced is not None and self.precision_replay and not run.finite)
        if trainer.world_size > 1:
            needs_fp32 = bool(trainer.strategy.reduce_boolean_decision(needs_fp32, all=False))
        ref: Localization | None = None
        if needs_fp32:
            try:
                ref = self._replay(trainer, pl_module, float32=True)
            except Exception:  # code that insists on half precision: no float32 verdict
                if self.strict:
                    raise
        # under DDP a NaN born on one rank reaches every rank's gradients through the all-reduce:
        # a rank whose own replay is finite reports nothing when another rank localized it
        localized_somewhere = not run.finite
        if trainer.world_size > 1:
            localized_somewhere = bool(
                trainer.strategy.reduce_boolean_decision(not run.finite, all=False))
        if not local_bad or (run.finite and localized_somewhere):
            return
        if run.finite:
            self._not_localized(trainer, signal,
                                "the replay of the step was finite (a non-deterministic op, a "
                                "batch modified in place by `training_step`, or a collective?)")
        elif reduced is not None and ref is not None and ref.finite:
            self._precision_overflow(trainer, pl_module, run, ref, reduced)
        else:
            self._report(trainer, pl_module, run, also_fp32=ref is not None)

    # ------------------------------------------------------------------ replay
    def _replay(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                float32: bool) -> Localization:
        batch = _to_float32(self._batch) if float32 else self._batch
        n_args = len(inspect.signature(pl_module.training_step).parameters)
        args: tuple[Any, ...] = (batch, self._batch_idx) if n_args >= 2 else (batch,)
        # on a copy of the module (its state stays out of the run; loggers quiet), or in place
        # under a complete snapshot when a copy does not fit; every RNG is put back after
        with probe_module(trainer, pl_module, trainer.optimizers, factor=2.0) as probe, \
                torch.enable_grad(), ExitStack() as stack:
            model = probe.module

            def step() -> Tensor | None:
                self.replay_calls += 1
                return step_loss(model.training_step(*args))

            if self._rng is not None:
                torch.set_rng_state(self._rng)
            if self._cuda_rng is not None:
                torch.cuda.set_rng_state(self._cuda_rng, pl_module.device)
            if float32:
                stack.enter_context(_float32_state(model))
                stack.enter_context(torch.autocast(pl_module.device.type, enabled=False))
            else:
                stack.enter_context(trainer.precision_plugin.forward_context())
            return localize_nonfinite(model, step)

    # ------------------------------------------------------------------ findings
    def _check_batch(self, trainer: pl.Trainer) -> None:
        parts = split_batch(self._batch)
        for code, tensor, what in (("data.nonfinite_input", parts.inputs, "inputs"),
                                   ("data.nonfinite_target", parts.targets, "targets")):
            if tensor is None or not tensor.is_floating_point():
                continue
            indices, count = nonfinite_examples(tensor)
            if not count:
                continue
            stats = tensor_stats(tensor)
            self.add_finding(
                trainer, code,
                f"step {self._batch_step} (batch {self._batch_idx}): the {what} "
                f"{tuple(tensor.shape)} {stats.dtype} hold {stats.nan} NaN and {stats.inf} Inf "
                f"values in {count} example(s), at indices {indices}"
                f"{' (first 32)' if count > len(indices) else ''}.",
                evidence={"batch_idx": self._batch_idx, "examples": indices, "num_examples": count,
                          "nan": stats.nan, "inf": stats.inf, "shape": list(tensor.shape),
                          "dtype": stats.dtype},
                global_step=self._batch_step,
            )

    def _module_desc(self, pl_module: nn.Module, layer: str | None) -> str:
        if layer is None:
            return "the loss computation in `training_step` (outside every module)"
        if layer == "":
            return f"the root module `{type(pl_module).__name__}` (its own `forward` code)"
        module = dict(pl_module.named_modules()).get(layer)
        kind = f" ({type(module).__name__})" if module is not None else ""
        return f"module `{layer}`{kind}"

    def _report(self, trainer: pl.Trainer, pl_module: pl.LightningModule, run: Localization,
                also_fp32: bool) -> None:
        step = self._batch_step
        evidence = {**run.evidence(), "batch_idx": self._batch_idx,
                    "precision": str(trainer.precision), "on_nonfinite": self.on_nonfinite}
        fp32 = " It is non-finite in float32 too: not a precision problem." if also_fp32 else ""
        if run.kind == "forward" and run.first is not None:
            s = run.first.stats
            before = (f" The {len(run.leading)} module output(s) before it were finite, peaking "
                      f"at max |x| = {_fmt(max(f.stats.max_abs for f in run.leading))}."
                      if run.leading else "")
            source = (" Its inputs were already non-finite (they came from the batch or from "
                      "code outside any module)." if not run.first.inputs_finite else
                      f" Its inputs were finite (largest finite output value "
                      f"{_fmt(s.max_abs)}).")
            self.add_finding(
                trainer, "numerics.nonfinite_forward",
                f"step {step}: the output of {self._module_desc(pl_module, run.layer)} is the first "
                f"non-finite one in forward order: {s.nan} NaN and {s.inf} Inf of {s.numel} values "
                f"({s.dtype}).{source}{before}{fp32}",
                layer=run.layer, evidence=evidence, global_step=step,
            )
        elif run.kind == "loss":
            last = run.leading[-1] if run.leading else None
            tail = (f" (the last, {self._module_desc(pl_module, last.name)}, peaked at max "
                    f"|x| = {_fmt(last.stats.max_abs)})" if last is not None else "")
            self.add_finding(
                trainer, "numerics.nonfinite_loss",
                f"step {step}: every module output was finite{tail}, but the loss was "
                f"{run.loss}: the loss computation in `training_step` produced it (e.g. "
                f"`log(softmax(z))` underflowing to `log(0)`). Use `F.cross_entropy` on logits or "
                f"`log_softmax`.{fp32}",
                evidence=evidence, global_step=step,
            )
        elif run.kind == "backward" and run.backward is not None:
            b = run.backward
            self.add_finding(
                trainer, "numerics.nonfinite_backward",
                f"step {step}: forward and loss ({_fmt(run.loss)}) were finite, but in backward "
                f"the gradient computed by `{b.op}` in {self._module_desc(pl_module, b.layer)} is "
                f"the first non-finite one ({b.stats.nan} NaN, {b.stats.inf} Inf of "
                f"{b.stats.numel}) while the gradient arriving there was finite (max |g| = "
                f"{_fmt(b.incoming_max_abs)}).{fp32}",
                layer=b.layer, evidence=evidence, global_step=step,
            )

    def _precision_overflow(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                            run: Localization, ref: Localization, dtype: torch.dtype) -> None:
        step = self._batch_step
        limit = dtype_max(dtype)
        over = {name: v for name, v in ref.max_abs_by_layer.items() if v > limit}
        layer = run.layer
        peak32 = ref.max_abs_by_layer.get(layer) if layer is not None else None
        where = {"forward": "output", "backward": "gradient", "loss": "loss"}[run.kind]
        values = (f"; replayed in float32 the step is finite and `{layer}` peaks at max |x| = "
                  f"{_fmt(peak32)}, {peak32 / limit:.2f}x the largest {_short(dtype)} value "
                  f"{limit:.6g}" if peak32 is not None and layer is not None else
                  "; replayed in float32 the step is finite")
        self.add_finding(
            trainer, "numerics.precision_overflow",
            f"step {step}: under precision {trainer.precision!r} the {where} of "
            f"{self._module_desc(pl_module, layer)} became non-finite{values}. Keep that module "
            f"in float32 (autocast disabled), rescale it, or use bf16.",
            layer=layer, global_step=step,
            evidence={**run.evidence(), "dtype": _short(dtype), "dtype_max": limit,
                      "float32_max_abs": peak32, "float32_loss": ref.loss,
                      "exceeding_in_float32": over, "precision": str(trainer.precision),
                      "batch_idx": self._batch_idx},
        )

    def _not_localized(self, trainer: pl.Trainer, signal: str, why: str) -> None:
        self.add_finding(
            trainer, "numerics.nonfinite_detected",
            f"step {self._batch_step}: the {signal} went non-finite"
            f"{'' if self._grad_peak is None else f' (max |grad| = {self._grad_peak})'}, but it "
            f"was not localized: {why}.",
            evidence={"signal": signal, "batch_idx": self._batch_idx,
                      "grad_max_abs": self._grad_peak},
            global_step=self._batch_step,
        )

    def _params_event(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                      params: Sequence[Tensor]) -> None:
        """Parameters are non-finite before this step's update: the last update wrote them."""
        if self.has_finding("numerics.nonfinite_params"):
            return
        names = {id(p): name for name, p in pl_module.named_parameters()}
        bad_names = [names.get(id(p), "?") for p in params if not _finite(max_abs([p]))]
        step = self._last_update_step
        lrs = sorted({float(g.get("lr", float("nan"))) for opt in trainer.optimizers
                      for g in opt.param_groups})
        if self.first_step is None:
            self.first_step = step
        if step is None:
            when = ("before the first optimizer step of this run (initialization, or a loaded "
                    "checkpoint?)")
            step = self._batch_step
        else:
            cause = ("its non-finite gradients were applied (`on_nonfinite="
                     f"{self.on_nonfinite!r}`)" if self._bad_update_step == step
                     else "its gradients were finite: the update itself overflowed; check the "
                     f"learning rate {lrs}, weight decay and the optimizer's `eps`")
            when = f"by the optimizer update of step {step}: {cause}"
        self.add_finding(
            trainer, "numerics.nonfinite_params",
            f"step {step}: {len(bad_names)} of {len(params)} parameter tensors became NaN/Inf "
            f"({', '.join(f'`{n}`' for n in bad_names[:8])}{', ...' if len(bad_names) > 8 else ''}) "
            f"{when}.",
            evidence={"params": bad_names[:32], "num_params": len(bad_names), "lr": lrs,
                      "seen_at_step": self._batch_step},
            global_step=step,
            layer=bad_names[0].rsplit(".", 1)[0] if bad_names and "." in bad_names[0] else None,
        )

    # ------------------------------------------------------------------ deferred mode
    def _defer_step(self, grads: list[Tensor], params: list[Tensor]) -> None:
        """Accumulate this step's flags on the device: no host synchronization."""
        flags: list[Tensor] = []
        for chunk, bit in ((self._losses, _LOSS), (grads, _GRAD), (params, _PARAMS)):
            if not chunk or (bit == _GRAD and self._has_scaler) or (
                    bit == _PARAMS and not self.check_params):
                continue
            peak = max_abs(chunk)
            if peak is not None:
                flags.append((~torch.isfinite(peak)).to(torch.int32) * bit)
        self._losses = []
        if not flags:
            return
        bad = flags[0]
        for flag in flags[1:]:
            bad = bad | flag
        if self._bits is None or self._first_dev is None:
            self._bits = torch.zeros((), dtype=torch.int32, device=bad.device)
            self._first_dev = torch.full((), -1, dtype=torch.int64, device=bad.device)
        self._first_dev = torch.where((self._first_dev < 0) & (bad > 0), self._batch_step,
                                      self._first_dev)
        self._bits = self._bits | bad

    def _read_deferred(self, trainer: pl.Trainer) -> None:
        bits = 0 if self._bits is None else int(self._bits)
        first = -1 if self._first_dev is None else int(self._first_dev)
        if not self._any_rank(trainer, bits != 0):
            return
        self._bits = None
        self._first_dev = None
        if bits:
            step = first if first >= 0 else trainer.global_step
            self.nonfinite_steps += 1
            self.first_step = step if self.first_step is None else self.first_step
            what = [name for bit, name in ((_LOSS, "loss"), (_GRAD, "gradients"),
                                           (_PARAMS, "parameters")) if bits & bit]
            self.add_finding(
                trainer, "numerics.nonfinite_detected",
                f"step {step}: the {' and '.join(what)} went non-finite (read in deferred mode, "
                f"every {self.check_every_n_steps} steps, at step {trainer.global_step}); the "
                f"update of that step was not prevented and the step cannot be replayed. "
                f"The tracer now runs in sync mode to localize the next occurrence.",
                evidence={"signals": what, "read_at_step": trainer.global_step,
                          "check_every_n_steps": self.check_every_n_steps},
                global_step=step,
            )
        if self.on_nonfinite == "stop":
            trainer.should_stop = True
        self._sync = True
        self.detail = self._describe()

    # ------------------------------------------------------------------ near overflow
    def _sample_outputs(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        peaks: list[tuple[str, Tensor]] = []
        self._peaks = peaks

        def make_hook(name: str) -> Any:
            def hook(mod: nn.Module, args: Any, output: Any) -> None:
                for t in float_tensors(output):
                    if t.dtype in (torch.float16, torch.bfloat16):
                        peak = abs_peak(t)  # None for an empty output (an idle expert)
                        if peak is not None:
                            peaks.append((name, peak))

            return self.guard_hook(trainer, "forward hook", hook)

        for name, sub in pl_module.named_modules():
            if not isinstance(sub, torch.jit.ScriptModule):  # takes no hooks
                self.add_handle(sub.register_forward_hook(make_hook(name)))

    def _read_samples(self, trainer: pl.Trainer) -> None:
        peaks, self._peaks = self._peaks, None
        self.remove_handles()
        if not peaks:
            return
        values = torch.stack([v for _, v in peaks]).tolist()
        worst: dict[str, float] = {}
        for (name, _), v in zip(peaks, values, strict=True):
            worst[name] = max(worst.get(name, 0.0), v)
        limit = dtype_max(self._reduced or torch.float16)
        for name, v in worst.items():
            if name in self._near_reported or not (self.near_overflow_ratio * limit < v <= limit):
                continue
            self._near_reported.add(name)
            self.add_finding(
                trainer, "numerics.near_overflow",
                f"step {self._batch_step}: the output of module `{name}` reached max |x| = "
                f"{v:.4g}, {v / limit:.0%} of the largest {_short(self._reduced or torch.float16)} "
                f"value {limit:.6g} (threshold {self.near_overflow_ratio:.0%}).",
                layer=name, global_step=self._batch_step,
                evidence={"max_abs": v, "dtype_max": limit, "ratio": v / limit,
                          "dtype": _short(self._reduced or torch.float16)},
            )

    # ------------------------------------------------------------------ state
    @override
    def remove_handles(self) -> None:
        super().remove_handles()
        self._peaks = None

    @override
    def extra_state(self) -> dict[str, Any]:
        return {"nonfinite_steps": self.nonfinite_steps, "skipped_steps": self.skipped_steps,
                "scaler_skips": self.scaler_skips, "localized": self.localized,
                "first_step": self.first_step, "near_reported": sorted(self._near_reported),
                "replay_calls": self.replay_calls}

    @override
    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.nonfinite_steps = int(state.get("nonfinite_steps", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.replay_calls = int(state.get("replay_calls", 0))
        self.scaler_skips = int(state.get("scaler_skips", 0))
        self.localized = int(state.get("localized", 0))
        self.first_step = state.get("first_step")
        self._near_reported = set(state.get("near_reported", ()))

    @override
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for key in ("_batch", "_rng", "_cuda_rng", "_bits", "_first_dev", "_peaks"):
            state[key] = None
        state["_losses"] = []
        return state


__all__ = ["NonFiniteTracer"]
