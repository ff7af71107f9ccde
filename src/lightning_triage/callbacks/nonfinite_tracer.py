"""Stage 9 (numerics): where does the first NaN/Inf appear, and is it precision?"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor, nn
from torch.optim import Optimizer
from typing_extensions import override

from lightning_triage._compat import StepCounter, grad_scaler, step_counter
from lightning_triage.callbacks._args import (
    BundleArg,
    check_batch_keys,
    check_bool,
    check_choice,
    check_int,
    check_number,
    passes,
)
from lightning_triage.callbacks._nonfinite_replay import replay_step
from lightning_triage.callbacks._step import StepState
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.functional.batch import BatchKey, split_batch
from lightning_triage.functional.compiled import compiled_parts, traced_by_compile
from lightning_triage.functional.nonfinite import (
    Localization,
    float_tensors,
    max_abs,
)
from lightning_triage.functional.numerics import (
    MODES,
    ON_NONFINITE,
    REDUCED_PRECISIONS,
    DeferredFlags,
    Mode,
    OnNonFinite,
    deferred_verdict,
    describe_tracer,
    finite_or_none,
    localized_verdict,
    near_overflow_verdicts,
    nonfinite_batch_verdicts,
    nonfinite_params_verdict,
    not_localized_verdict,
    precision_overflow_verdict,
    step_healthy,
)
from lightning_triage.functional.tensors import abs_peak


class NonFiniteTracer(TriageCallback):
    """Watch every training step for NaN/Inf and say exactly where the first one was born.

    **Detection** (every step, cheap, no per-module hooks): the loss (``on_before_backward``), the
    gradients through their total norm (``on_before_optimizer_step``, before the update, so the
    weights are still finite: one ``torch._foreach_norm``, shared with
    :class:`~lightning_triage.GradientMonitor` inside :class:`~lightning_triage.Triage`) and the
    parameters the updates write.

    **Localization** (only when a step goes non-finite, in ``"sync"`` mode): the step is
    replayed on a copy of the module, with the pre-step weights, the step's batch and RNG state,
    through the user's ``training_step`` in the run's precision context. The first non-finite
    module output gives ``numerics.nonfinite_forward``, a gradient
    ``numerics.nonfinite_backward``, the loss alone ``numerics.nonfinite_loss``; NaN/Inf in the
    batch ``data.nonfinite_input``/``data.nonfinite_target``. Under a reduced precision a
    float32 replay that stays finite gives ``numerics.precision_overflow``; parameters that a
    finite update made non-finite ``numerics.nonfinite_params``; sampled outputs near the
    dtype's limit ``numerics.near_overflow``. Gradient-scaler skips (fp16 ``16-mixed`` on GPU)
    are normal and only counted. The details: the numerics page of the docs.

    **Modes.** ``"sync"`` reads the flags on the host every step (free on CPU; one
    synchronization per step on GPU), acts before the update and localizes. ``"deferred"`` keeps
    them on the device and reads them every ``check_every_n_steps`` optimizer steps: the first
    bad step is still exact, but its update happens and it cannot be replayed
    (``numerics.nonfinite_detected``); the tracer then switches to ``"sync"`` to localize the
    next one. ``"auto"``: ``"sync"`` on CPU, ``"deferred"`` on accelerators.

    **Policy** (``on_nonfinite``): ``"stop"`` reports, drops the step's gradients (the optimizer
    leaves weights and state untouched) and stops fit cleanly on every rank; ``"skip"`` drops
    them and continues; ``"warn"`` only reports. In deferred mode the policy acts when the flag
    is read.

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
        input_key: where the inputs are in a batch the defaults do not understand (a key, an
            index or a callable ``batch -> tensor``), for the check of a failing step's batch.
        target_key: where the targets are, likewise.
        strict: raise internal errors instead of disabling the check.

    Raises:
        TriageConfigError: for an argument outside what is allowed (the message names it).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[NonFiniteTracer(on_nonfinite="skip")])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.NonFiniteTracer
                  init_args: {on_nonfinite: stop, mode: auto, check_every_n_steps: 50}
    """

    stage: ClassVar[str] = "numerics"
    codes: ClassVar[tuple[str, ...]] = ("numerics.nonfinite_loss", "numerics.nonfinite_forward",
        "numerics.nonfinite_backward", "numerics.nonfinite_params", "numerics.precision_overflow",
        "numerics.near_overflow", "numerics.nonfinite_detected")
    # how `Triage` builds this check (TriageCallback.bundle_args)
    bundle_args: ClassVar[Mapping[str, BundleArg]] = {
        "mode": "numerics_mode", "check_every_n_steps": "numerics_check_every_n_steps",
        **passes("on_nonfinite", "input_key", "target_key")}
    shared_codes: ClassVar[tuple[str, ...]] = ("data.nonfinite_input", "data.nonfinite_target")

    state_key_args = ("on_nonfinite", "mode")
    #: the per-epoch view of the trainer's step counter (see `TriageCallback.unpicklable`)
    unpicklable: ClassVar[tuple[str, ...]] = ("_steps",)

    def __init__(
        self,
        *,
        on_nonfinite: OnNonFinite = "stop",
        mode: Mode = "auto",
        check_every_n_steps: int = 50,
        check_params: bool = True,
        precision_replay: bool = True,
        near_overflow_every_n_steps: int | None = 100,
        near_overflow_ratio: float = 0.25,
        max_localized: int = 3,
        input_key: BatchKey | None = None,
        target_key: BatchKey | None = None,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        check_choice("on_nonfinite", on_nonfinite, ON_NONFINITE)
        check_choice("mode", mode, MODES)
        check_int("check_every_n_steps", check_every_n_steps, 1)
        check_bool("check_params", check_params)
        check_bool("precision_replay", precision_replay)
        check_int("near_overflow_every_n_steps", near_overflow_every_n_steps, 1, optional=True)
        check_number("near_overflow_ratio", near_overflow_ratio, 0, 1)
        check_int("max_localized", max_localized, 0)
        check_batch_keys(input_key=input_key, target_key=target_key)
        self.on_nonfinite = on_nonfinite
        self.mode = mode
        self.check_every_n_steps = check_every_n_steps
        self.check_params = check_params
        self.precision_replay = precision_replay
        self.near_overflow_every_n_steps = near_overflow_every_n_steps
        self.near_overflow_ratio = near_overflow_ratio
        self.max_localized = max_localized
        self.input_key = input_key
        self.target_key = target_key
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
        #: deferred mode's flags (device tensors); the losses since the last optimizer step
        self._flags = DeferredFlags()
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
        self._reduced = REDUCED_PRECISIONS.get(str(trainer.precision))
        self._has_scaler = grad_scaler(trainer) is not None
        self._cuda = device if device.type == "cuda" else None
        self._world_size = trainer.world_size
        self.mark_ran(self._describe())

    def _describe(self) -> str:
        return describe_tracer(sync=self._sync, every=self.check_every_n_steps,
                               nonfinite_steps=self.nonfinite_steps, first_step=self.first_step,
                               skipped=self.skipped_steps, scaler_skips=self.scaler_skips,
                               replay_calls=self.replay_calls)

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
            self._loss_bad = self._loss_bad or not finite_or_none(max_abs(self._losses))
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
        local_bad = self._loss_bad or not step_healthy(total, max_abs(watched) if watched else None)
        params_bad = False
        if local_bad:  # the rare path: find out exactly which signal it was
            params = [p for group in optimizer.param_groups for p in group["params"]]
            grads = self._grads(params)
            loss_bad = self._read_loss()
            grad_peak = max_abs(grads)
            self._grad_peak = None if grad_peak is None else float(grad_peak)
            grad_bad = self._grad_peak is not None and not math.isfinite(self._grad_peak)
            params_bad = self.check_params and not finite_or_none(max_abs(params))
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
            if not finite_or_none(max_abs(params)):  # the last update, not followed by a step's check
                if self._sync:
                    self._params_event(trainer, pl_module, params)
                else:
                    self._flags.flag_params()
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
            parts = split_batch(self._batch, self.input_key, self.target_key)
            self.add_verdicts(trainer, nonfinite_batch_verdicts(
                parts.inputs, parts.targets, step=self._batch_step, batch_idx=self._batch_idx))
        try:
            run = self._replay(trainer, pl_module, float32=False)
        except Exception as exc:  # the user's code may refuse a NaN: still apply the policy
            if self.strict:
                raise
            if local_bad:
                self._not_localized(trainer, signal, f"the replay raised {type(exc).__name__}: {exc}")
            return
        ref = self._float32_replay(trainer, pl_module, run)
        # under DDP a NaN born on one rank reaches every rank's gradients through the all-reduce:
        # a rank whose own replay is finite reports nothing when another rank localized it
        localized_somewhere = not run.finite
        if trainer.world_size > 1:
            localized_somewhere = bool(
                trainer.strategy.reduce_boolean_decision(not run.finite, all=False))
        if not local_bad or (run.finite and localized_somewhere):
            return
        self._conclude(trainer, pl_module, run, ref, signal)

    def _float32_replay(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                        run: Localization) -> Localization | None:
        """Under a reduced precision, the failing step replayed in float32 (on every rank when
        one needs it), or ``None``."""
        needs_fp32 = (self._reduced is not None and self.precision_replay and not run.finite)
        if trainer.world_size > 1:
            needs_fp32 = bool(trainer.strategy.reduce_boolean_decision(needs_fp32, all=False))
        if needs_fp32:
            try:
                return self._replay(trainer, pl_module, float32=True)
            except Exception:  # code that insists on half precision: no float32 verdict
                if self.strict:
                    raise
        return None

    def _conclude(self, trainer: pl.Trainer, pl_module: pl.LightningModule, run: Localization,
                  ref: Localization | None, signal: str) -> None:
        if run.finite:
            compiled = compiled_parts(pl_module)
            why = ("the replay of the step was finite (a non-deterministic op, a batch modified "
                   "in place by `training_step`, or a collective?)")
            if compiled:
                why = (f"the eager replay of the step was finite: the compiled code of "
                       f"`{compiled[0] or type(pl_module).__name__}` rounds differently from its "
                       "eager form (fused kernels); run one fit uncompiled to localize it")
            self._not_localized(trainer, signal, why)
            return
        step, precision = self._batch_step, str(trainer.precision)
        if self._reduced is not None and ref is not None and ref.finite:
            self.add_verdicts(trainer, precision_overflow_verdict(
                run, ref, self._reduced, pl_module, step=step, precision=precision,
                batch_idx=self._batch_idx))
            return
        evidence = {**run.evidence(), "batch_idx": self._batch_idx, "precision": precision,
                    "on_nonfinite": self.on_nonfinite}
        self.add_verdicts(trainer, localized_verdict(run, pl_module, step=step, evidence=evidence,
                                                 also_fp32=ref is not None))

    # ------------------------------------------------------------------ replay
    def _replay(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                float32: bool) -> Localization:
        def count() -> None:
            self.replay_calls += 1

        return replay_step(trainer, pl_module, self._batch, self._batch_idx, rng=self._rng,
                           cuda_rng=self._cuda_rng, float32=float32, on_call=count)

    # ------------------------------------------------------------------ findings
    def _not_localized(self, trainer: pl.Trainer, signal: str, why: str) -> None:
        self.add_verdicts(trainer, not_localized_verdict(signal, why, step=self._batch_step,
                                                     batch_idx=self._batch_idx,
                                                     grad_peak=self._grad_peak))

    def _params_event(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                      params: Sequence[Tensor]) -> None:
        """Parameters are non-finite before this step's update: the last update wrote them."""
        if self.has_finding("numerics.nonfinite_params"):
            return
        names = {id(p): name for name, p in pl_module.named_parameters()}
        bad_names = [names.get(id(p), "?") for p in params if not finite_or_none(max_abs([p]))]
        step = self._last_update_step
        lrs = sorted({float(g.get("lr", float("nan"))) for opt in trainer.optimizers
                      for g in opt.param_groups})
        if self.first_step is None:
            self.first_step = step
        self.add_verdicts(trainer, nonfinite_params_verdict(
            bad_names, len(params), lrs, update_step=step, seen_at_step=self._batch_step,
            applied_bad=step is not None and self._bad_update_step == step,
            on_nonfinite=self.on_nonfinite))

    # ------------------------------------------------------------------ deferred mode
    def _defer_step(self, grads: list[Tensor], params: list[Tensor]) -> None:
        """Accumulate this step's flags on the device: no host synchronization."""
        self._flags.note_step(self._batch_step, self._losses, [] if self._has_scaler else grads,
                              params if self.check_params else [])
        self._losses = []

    def _read_deferred(self, trainer: pl.Trainer) -> None:
        read = self._flags.read()
        if not self._any_rank(trainer, read.bits != 0):
            return
        self._flags.clear()
        if read.bits:
            verdict = deferred_verdict(read, read_at=trainer.global_step,
                                       every=self.check_every_n_steps)
            self.nonfinite_steps += 1
            self.first_step = verdict.step if self.first_step is None else self.first_step
            self.add_verdicts(trainer, verdict)
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

        traced = traced_by_compile(pl_module)  # a hook there would change the user's graph
        for name, sub in pl_module.named_modules():
            if not isinstance(sub, torch.jit.ScriptModule) and name not in traced:
                self.add_handle(sub.register_forward_hook(make_hook(name)))

    def _read_samples(self, trainer: pl.Trainer) -> None:
        peaks, self._peaks = self._peaks, None
        self.remove_handles()
        if not peaks:
            return
        values = torch.stack([v for _, v in peaks]).tolist()
        self.add_verdicts(trainer, near_overflow_verdicts(
            [(name, v) for (name, _), v in zip(peaks, values, strict=True)],
            self._reduced or torch.float16, self.near_overflow_ratio, step=self._batch_step,
            reported=self._near_reported))

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
        for key in ("_batch", "_rng", "_cuda_rng", "_peaks"):
            state[key] = None
        state["_losses"] = []
        state["_flags"] = DeferredFlags()
        return state


__all__ = ["NonFiniteTracer"]
