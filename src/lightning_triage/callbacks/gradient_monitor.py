"""Stage 8 (grad): are gradient norms exploding, vanishing, spiking?

Also the long-run gradient watch: gradient-norm spikes and explosions for the whole run, with
an opt-in action that skips the update of a spiking step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor, nn
from torch.optim import Optimizer
from typing_extensions import override

from lightning_triage._compat import StepCounter, fp16_amp, step_counter
from lightning_triage.callbacks._args import (
    BundleArg,
    bundle_window_cap,
    check_bool,
    check_choice,
    check_int,
    passes,
)
from lightning_triage.callbacks._clipping import CLIP_STEPS, ClipMeter, scaler_of, total_norm, user_clip
from lightning_triage.callbacks._monitor import (
    WindowMixin,
    log_finding,
    log_to_loggers,
    scalar,
    validate_window,
)
from lightning_triage.callbacks._step import RowBuffer, StepState
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.functional.adapters import adapter_layer_of
from lightning_triage.functional.clipping import clip_kept, clipping_verdict
from lightning_triage.functional.gradient_watch import GradientWatch
from lightning_triage.functional.gradients import (
    GradThresholds,
    alive_units,
    classify_gradients,
    layer_groups,
    layer_norms,
    median_ratios,
    module_name,
    update_norms,
)
from lightning_triage.functional.series import BoundedSeries
from lightning_triage.functional.spikes import SpikeWatch
from lightning_triage.functional.tensors import is_plain
from lightning_triage.functional.verdict import Verdict

OnSpike = Literal["warn", "skip"]
_UNIT_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


_MAX_LAYER_ROWS = 128  # columns (steps) of the report's per-layer heatmap


class GradientMonitor(TriageCallback, WindowMixin):
    """Judge gradient norms in the first epochs, then watch them for spikes for the whole run.

    In ``on_before_optimizer_step`` (gradients unscaled under AMP, not yet clipped) the
    per-parameter gradient norms are computed with one fused ``torch._foreach_norm`` and
    written to a preallocated buffer (on the device on accelerators, where every step's total
    norm is taken at the flush); every ``flush_every_n_steps`` steps (default the smallest multiple of
    ``log_every_n_steps`` >= 100) the chunk moves to the host in one transfer. Inside
    :class:`~lightning_triage.Triage` the norms, their total and the loss are read once per
    step for this monitor, the loss watch and the NaN tracer together. During the window
    (``window_epochs`` epochs or ``window_steps`` steps, whichever is longer, at most
    ``max_window_steps``) the monitor also
    tracks units whose gradient is always zero and samples update-to-weight ratios every
    ``ratio_every_n_steps`` steps; at the end of the window
    :func:`~lightning_triage.functional.gradients.classify_gradients` judges them all.

    After the window, with ``watch=True``, only those norms are computed (the total once per
    step, shared by the window classifier and the watch) and a
    :class:`~lightning_triage.functional.spikes.SpikeWatch` reports ``grad.spike`` (step,
    size, level before, which layer jumped first, whether a loss spike followed, a suggested
    ``gradient_clip_val``) and ``grad.exploding`` (a sustained jump or non-finite norms),
    marked ``"after_window": true`` and sent to the loggers at once.

    ``on_spike="skip"`` zeroes the gradients of a step whose total norm is above the spike
    threshold (or non-finite) before the optimizer step, on the device, without a host
    synchronization; the count is in the report. With momentum or Adam the optimizer still
    applies its running averages on that step. Under fp16 mixed precision the steps the
    gradient scaler skips (non-finite gradients) are normal and are not findings.

    Findings: ``grad.exploding``, ``grad.vanishing``, ``grad.spike``, ``grad.dead_units``,
    ``grad.update_ratio``, ``grad.clipping_eats_update`` (gradient clipping that keeps almost
    none of the gradient).

    Args:
        window_epochs: epochs in the window (the window is the longer of the two).
        window_steps: optimizer steps in the window.
        max_window_steps: the window ends here whatever ``window_epochs`` says.
        watch: keep watching for gradient spikes after the window.
        on_spike: ``"warn"`` (default) or ``"skip"`` (skip the update of a spiking step).
        flush_every_n_steps: optimizer steps between host reads (default: the smallest multiple of
            ``log_every_n_steps`` that is at least 100).
        ratio_every_n_steps: sample the update-to-weight ratio every this many steps in the
            window.
        max_points: length bound of the ``grad_norm`` series in the report.
        strict: raise internal errors instead of disabling the check.

    Raises:
        TriageConfigError: for invalid arguments (the message names the argument).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[GradientMonitor(on_spike="skip")])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.GradientMonitor
                  init_args: {window_steps: 200, on_spike: warn}
    """

    stage: ClassVar[str] = "grad"
    codes: ClassVar[tuple[str, ...]] = ("grad.exploding", "grad.vanishing", "grad.spike",
        "grad.dead_units", "grad.update_ratio", "grad.clipping_eats_update")
    # how `Triage` builds this check (TriageCallback.bundle_args)
    bundle_args: ClassVar[Mapping[str, BundleArg]] = {
        **passes("window_epochs", "window_steps", "watch", "on_spike"),
        "max_window_steps": bundle_window_cap}

    state_key_args = ("window_epochs", "window_steps")
    #: the per-epoch view of the trainer's step counter (see `TriageCallback.unpicklable`)
    unpicklable: ClassVar[tuple[str, ...]] = ("_steps",)

    def __init__(
        self,
        *,
        window_epochs: int = 2,
        window_steps: int = 200,
        max_window_steps: int = 5000,
        watch: bool = True,
        on_spike: OnSpike = "warn",
        flush_every_n_steps: int | None = None,
        ratio_every_n_steps: int = 10,
        max_points: int = 1000,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        validate_window(window_epochs, window_steps, max_window_steps, flush_every_n_steps, max_points)
        check_choice("on_spike", on_spike, ("warn", "skip"))
        check_bool("watch", watch)
        check_int("ratio_every_n_steps", ratio_every_n_steps, 1)
        self.window_epochs = window_epochs
        self.window_steps = window_steps
        self.max_window_steps = max_window_steps
        self.watch = watch
        self.on_spike = on_spike
        self.flush_every_n_steps = flush_every_n_steps
        self.ratio_every_n_steps = ratio_every_n_steps
        self.max_points = max_points
        self.thresholds = GradThresholds()
        #: the per-step reads (shared with the other watches inside the ``Triage`` bundle)
        self.step_state = StepState()
        self._reset_state()

    def _reset_state(self) -> None:
        th = self.thresholds
        self.window_closed = False
        self.watcher = SpikeWatch(z=th.spike_z, ratio=th.spike_ratio, warmup=th.spike_warmup,
                                  window=128, patience=16)
        self.series_norm = BoundedSeries(self.max_points)
        self.skipped_steps = 0
        self._skipped_base = 0
        #: what of the gradient verdicts to report, and the context of spikes (the policy, in
        #: the functional core)
        self.grad_watch = GradientWatch()
        self._names: list[str] = []
        self._params: list[nn.Parameter] = []
        self._weight_idx: list[int] = []
        #: adapter parameter -> its LoRA layer: the depth comparison reads the pair together
        self._adapter_layer: dict[str, str] = {}
        self._unit_idx: list[int] = []
        self._amp_fp16 = False
        self._clip_val: float | None = None
        # clipping that eats the update: the optimizer's class; under manual optimization the
        # unscaled norm backward produced (pending) and the kept fraction per step
        self._optimizer_name = ""
        self._manual = False
        self._backward_norm: float | None = None
        self.clip_kept: list[float] = []
        # one process: torch hooks read what clipping keeps (any backward, any optimizer step)
        self._clip_meter: ClipMeter | None = None
        self._steps: StepCounter | None = None
        # this chunk: rows [total, per-parameter norms..., loss] (on the device on accelerators)
        self._buf: RowBuffer | None = None
        self._loss_from = 0  # the first row whose loss is not written yet
        self._need_loss = False
        self._alive: list[Tensor] | None = None
        self._snap: list[Tensor] | None = None
        self._ratio_rows: list[Tensor] = []
        self._thr: Tensor | None = None
        self._skipped: Tensor | None = None
        # host side
        self.w_steps: list[int] = []
        self.w_total: list[float] = []
        self.w_loss: list[float] = []
        self.w_rows: list[np.ndarray] = []
        self._flush_n: int | None = None
        # per-layer norms for the report's heatmap: bounded (decimated like `BoundedSeries`)
        self.layer_names: list[str] = []
        self._layer_of: list[int] | None = None
        self.layer_rows: list[list[Any]] = []
        self._layer_stride = 1
        self._layer_seen = 0

    # ------------------------------------------------------------------ setup
    @override
    @guarded
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.step_state.reset()
            self._params, self._names, self._weight_idx, self._unit_idx = [], [], [], []
            self._buf, self._loss_from, self._need_loss = None, 0, False
            # fp16 mixed precision with a gradient scaler: the scaler skips non-finite steps
            self._amp_fp16 = fp16_amp(trainer)
            self._clip_val = user_clip(trainer)
            self._manual = not pl_module.automatic_optimization

    def _build(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        owners = {}
        for mod_name, mod in pl_module.named_modules():
            if isinstance(mod, _UNIT_MODULES):
                owners[f"{mod_name}.weight" if mod_name else "weight"] = True
        state = self.step_state
        self._params = list(state.bind(pl_module))
        self._names = list(state.names)
        self._adapter_layer = adapter_layer_of(pl_module)
        for j, (name, p) in enumerate(zip(self._names, self._params, strict=True)):
            if p.ndim >= 2:
                self._weight_idx.append(j)
                if name in owners:
                    self._unit_idx.append(j)
        if self._params:
            self._buf = RowBuffer(len(self._params) + 2, self.flush_interval(trainer) + 8,
                                  self._params[0].device, host=state.host)
            self._loss_from = 0

    # ------------------------------------------------------------------ per step
    @override
    @guarded
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._steps = step_counter(trainer)
        if self._manual and trainer.world_size == 1 and self._clip_meter is None:
            # raw optimizer steps (`scaler.step(opt.optimizer)`) skip on_before_optimizer_step
            if not self._params:
                self._build(trainer, pl_module)
            meter = ClipMeter(self.clip_kept, lambda: not self.window_closed)
            for handle in meter.hooks(self._params, trainer.optimizers, scaler_of(trainer, pl_module)):
                self._clip_meter = meter
                self.add_handle(handle)

    @override
    @guarded
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: Optimizer) -> None:
        if not self._params:
            self._build(trainer, pl_module)
            if not self._params:
                return
        if self.window_closed and not self.watch and self.on_spike == "warn":
            return
        if not self._optimizer_name:
            inner = getattr(optimizer, "optimizer", optimizer)  # a LightningOptimizer's own
            self._optimizer_name = type(inner).__name__
        if self._backward_norm is not None and self._clip_meter is None:  # several processes
            after, before = total_norm(self._params), self._backward_norm
            self._backward_norm = None
            if math.isfinite(after) and math.isfinite(before) and before > 0:
                self.clip_kept.append(after / before)
        step = trainer.global_step if self._steps is None else self._steps.completed
        # one fused kernel per step, read once for every watch; on the host the total comes
        # with it, on accelerators it is taken per chunk at the flush
        state = self.step_state
        state.read_grads(step, optimizer)
        buf = self._buf
        assert buf is not None
        i = buf.next_row(step)
        if buf.data is None:  # the host: a list of floats in a preallocated slot
            buf.rows[i] = [state.total, *state.norms, math.nan]  # type: ignore[list-item, misc]
        else:
            buf.data[i, 1:-1].copy_(state.norms)  # type: ignore[arg-type]
        self._need_loss = True
        if not self.window_closed:
            self._window_step(trainer)
        if self.on_spike == "skip":
            self._skip(state.total)

    @override
    def needs_hook(self, hook: str) -> bool:
        if hook == "on_after_backward":  # only to measure the user's own clipping (manual)
            return (self._manual and self._clip_meter is None and not self.idle
                    and not self.window_closed and len(self.clip_kept) < CLIP_STEPS)
        return super().needs_hook(hook)

    @override
    @guarded
    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # manual optimization: the norm backward produced (unscaled) against the norm at the
        # optimizer step says how much the user's own clipping kept (Lightning's clipping is
        # judged from the norms before it and `gradient_clip_val`)
        if not self._manual or self._clip_meter is not None or self.window_closed \
                or len(self.clip_kept) >= CLIP_STEPS:
            return
        if not self._params:
            self._build(trainer, pl_module)
        scaler = scaler_of(trainer, pl_module)
        scale = float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0
        norm = total_norm(self._params)
        self._backward_norm = norm / scale if scale > 0 else math.nan

    def _clipping(self, step: int) -> Verdict | None:
        if self._manual:
            kept, how = self.clip_kept, "manual"
        elif self._clip_val is not None:
            kept, how = clip_kept(self.w_total, self._clip_val), "gradient_clip_val"
        else:
            return None
        meter = self._clip_meter
        name = self._optimizer_name or (meter.optimizer if meter else "") or "optimizer"
        return clipping_verdict(kept, step=step, optimizer=name, how=how, clip_val=self._clip_val,
                                scale=meter.scale if self._manual and meter else None)

    def _window_step(self, trainer: pl.Trainer) -> None:
        if self._alive is None:
            self._alive = [torch.zeros(self._params[j].shape[0], dtype=torch.bool,
                                       device=self._params[j].device) for j in self._unit_idx]
        for k, j in enumerate(self._unit_idx):
            g = self._params[j].grad
            if g is not None:
                self._alive[k].logical_or_(alive_units(g))
        if (len(self.w_total) + len(self._buf or ()) - 1) % self.ratio_every_n_steps == 0 and \
                self._weight_idx:
            self._snap = [self._params[j].detach().clone() for j in self._weight_idx]

    def _skip(self, total: float | Tensor) -> None:
        if isinstance(total, float):  # host: decided here, no tensor op on a healthy step
            thr = self.watcher.threshold()
            if (total > thr) if self._amp_fp16 else not total <= thr:
                for p in self._params:
                    if p.grad is not None and is_plain(p.grad):
                        p.grad.zero_()
                    elif p.grad is not None:  # sparse layouts: scaled, as on the device path
                        p.grad.mul_(0.0)
                self.skipped_steps += 1
            return
        if self._thr is None:
            self._thr = torch.full((), self.watcher.threshold(), device=total.device)
        skip = total > self._thr if self._amp_fp16 else ~(total <= self._thr)
        for p in self._params:
            if p.grad is not None:
                if is_plain(p.grad):
                    p.grad.masked_fill_(skip, 0.0)
                else:  # sparse layouts have no masked_fill_
                    p.grad.mul_((~skip).to(p.grad.dtype))
        if self._skipped is None:
            self._skipped = torch.zeros((), dtype=torch.long, device=total.device)
        self._skipped += skip

    @override
    @guarded
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: STEP_OUTPUT, batch: Any, batch_idx: int) -> None:
        if self._clip_meter is not None and (self.window_closed or len(self.clip_kept) >= CLIP_STEPS):
            self.remove_handles()  # the clipping hooks are done (never removed inside one)
        if not self._need_loss:
            return
        self._need_loss = False
        buf = self._buf
        assert buf is not None
        # the loss only tells whether a loss spike followed a gradient spike: a ratio to its own
        # recent level, so the accumulation factor does not matter (no op per step for it);
        # every step of the batch gets it (manual optimization: several steps)
        loss, value = self.step_state.loss(outputs)
        if buf.data is None:
            for r in range(self._loss_from, buf.n):
                buf.rows[r][-1] = math.nan if value is None else value
        elif loss is None:
            buf.data[self._loss_from:buf.n, -1].fill_(math.nan)
        else:
            buf.data[self._loss_from:buf.n, -1].fill_(loss.to(buf.device))
        self._loss_from = buf.n
        if self._snap is not None:
            weights = [self._params[j].detach() for j in self._weight_idx]
            dn, wn = update_norms(weights, self._snap)
            self._ratio_rows.append(dn / wn)
            self._snap = None
        if buf.n >= self.flush_interval(trainer):
            self._flush(trainer)

    # ------------------------------------------------------------------ flush
    def _flush(self, trainer: pl.Trainer, epoch_done: bool = False, final: bool = False) -> None:
        n = self._loss_from  # the rows whose loss is written
        buf = self._buf
        if n and buf is not None:
            if buf.data is not None:  # the device: every step's total norm, once per chunk
                buf.data[:n, 0] = torch.linalg.vector_norm(buf.data[:n, 1:-1], dim=1)
            steps, rows = buf.take(n)  # the one host transfer of the chunk
            self._loss_from = 0
            if self._skipped is not None:
                self.skipped_steps = self._skipped_base + int(self._skipped)
            self.mark_ran()
            self._consume(trainer, steps, rows)
        if not self.window_closed and self.w_total and (final or self.window_over(
                trainer, len(self.w_total), epoch_done)):
            self._close_window(trainer, complete=not final)
        self._resolve_spikes(trainer, final)

    def _consume(self, trainer: pl.Trainer, steps: list[int], rows: np.ndarray) -> None:
        totals, per, loss = rows[:, 0], rows[:, 1:-1], rows[:, -1]
        self.series_norm.extend(steps, totals.tolist())
        if trainer.loggers:
            every = max(1, int(getattr(trainer, "log_every_n_steps", 50) or 50))
            for s, t in zip(steps, totals.tolist(), strict=True):
                if s % every == 0 and math.isfinite(t):
                    metrics = {"triage/grad_norm": t}
                    if self.on_spike == "skip":
                        metrics["triage/skipped_steps"] = float(self.skipped_steps)
                    log_to_loggers(trainer, metrics, s)
        self._record_layers(steps, per)
        self.grad_watch.observe(steps, totals, per, loss)
        if not self.window_closed:
            room = self.max_window_steps - len(self.w_total)
            self.w_steps.extend(steps[:room])
            self.w_total.extend(float(t) for t in totals[:room])
            self.w_loss.extend(float(v) for v in loss[:room])
            self.w_rows.extend(per[:room])
            self._report(trainer, self.grad_watch.window(
                self._classify(final=False), last_step=self.w_steps[-1],
                thresholds=self.thresholds), after_window=False)
        self._watch(trainer, steps, totals, per)

    def _watch(self, trainer: pl.Trainer, steps: list[int], totals: np.ndarray,
               per: np.ndarray) -> None:
        finite = np.isfinite(totals)
        # under fp16 the gradient scaler skips non-finite steps: feed the finite runs only
        events = self.watcher.update_finite(totals, steps) if self._amp_fp16 and not finite.all() \
            else self.watcher.update(totals, start_step=steps[0])
        if self._thr is not None:
            self._thr.fill_(self.watcher.threshold())
        # the level of healthy steps is kept in the window too; explosions and spikes after it
        self._report(trainer, self.grad_watch.events(
            events, steps, totals, per, ring=self.watcher.ring,
            after_window=self.window_closed and self.watch, thresholds=self.thresholds),
            after_window=True)

    def _resolve_spikes(self, trainer: pl.Trainer, final: bool) -> None:
        self._report(trainer, self.grad_watch.resolve(
            self._names, ring=self.watcher.ring, final=final, thresholds=self.thresholds,
            clip_val=self._clip_val), after_window=True)

    # ------------------------------------------------------------------ window
    def _classify(self, final: bool, extra: Mapping[str, Any] | None = None) -> list[Verdict]:
        rows = np.stack(self.w_rows) if self.w_rows else np.zeros((0, len(self._names)))
        layers: dict[str, Any] = {}
        for j in self._weight_idx:
            name = self._names[j]
            # LoRA's `lora_A` gets a tiny gradient while `lora_B` is near its zero start, by
            # design: the adapter layer's gradient is the pair's (root of the sum of squares)
            key = self._adapter_layer.get(name) or module_name(name)
            col = np.square(rows[:, j].astype(np.float64))
            layers[key] = layers[key] + col if key in layers else col
        layers = {k: np.sqrt(v) for k, v in layers.items()}
        # adapters over a frozen base: their gradients say where each adapter sits (an
        # attention query, a pooler), not how gradients propagate through depth; and a fresh
        # head beside them says nothing about depth either: no depth comparison
        depth: list[str] | None = [] if self._adapter_layer else None
        return classify_gradients(self.w_total, steps=self.w_steps, layers=layers,
                                  loss=self.w_loss, nonfinite_is_skip=self._amp_fp16,
                                  final=final, thresholds=self.thresholds,
                                  clip_val=self._clip_val, depth_layers=depth,
                                  **(extra or {}))

    def _close_window(self, trainer: pl.Trainer, complete: bool = True) -> None:
        ratios = median_ratios(torch.stack(self._ratio_rows).cpu().double().numpy(),
                               [module_name(self._names[j]) for j in self._weight_idx]) \
            if self._ratio_rows else {}
        dead: dict[str, tuple[int, int]] = {}
        if self._alive is not None:
            for k, j in enumerate(self._unit_idx):
                alive = self._alive[k]
                dead[module_name(self._names[j])] = (int((~alive).sum()), int(alive.numel()))
        verdicts = self._classify(final=True, extra={"update_ratios": ratios, "dead_units": dead})
        clipping = self._clipping(self.w_steps[-1] if self.w_steps else trainer.global_step)
        self._report(trainer, verdicts + ([clipping] if clipping else []), after_window=False)
        n = len(self.w_total)
        fin = [t for t in self.w_total if math.isfinite(t)]
        self.detail = (f"window of {n} steps: median grad norm "
                       f"{float(np.median(fin)) if fin else math.nan:.3g}"
                       f"{'' if complete else ' (run ended inside the window)'}")
        self.window_closed = True
        self.w_steps, self.w_total, self.w_loss, self.w_rows = [], [], [], []
        self._alive, self._snap, self._ratio_rows = None, None, []

    # ------------------------------------------------------------------ findings
    @property
    def counts(self) -> dict[str, int]:
        """Gradient spikes and explosions seen after the window."""
        return self.grad_watch.counts

    def _report(self, trainer: pl.Trainer, verdicts: list[Verdict], after_window: bool) -> None:
        for v in self.grad_watch.admit(verdicts, after_window=after_window,
                                       held=[f.code for f in self.findings]):
            finding = self.add_verdict(trainer, v, after_window=after_window)
            log_finding(trainer, finding, scalar(v.evidence, "ratio"))

    # ------------------------------------------------------------------ epoch / end
    @override
    @guarded
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._flush(trainer, epoch_done=True)

    @override
    @guarded
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._flush(trainer, final=True)
        clipping = self._clipping(trainer.global_step) if self._clip_meter and not self.window_closed \
            else None  # raw optimizer steps only: no window closed, the clipping is still due
        self._report(trainer, [clipping] if clipping else [], after_window=False)
        parts = [self.detail] if self.detail else []
        if self.watch:
            parts.append(f"watch: {self.counts['spikes_after_window']} spike(s), "
                         f"{self.counts['explosions_after_window']} explosion(s) after the window")
        if self.on_spike == "skip":
            parts.append(f"{self.skipped_steps} step(s) skipped (`on_spike='skip'`)")
        self.detail = "; ".join(parts)

    @override
    def series(self) -> dict[str, list[list[float]]]:
        return {"grad_norm": self.series_norm.to_list()}

    def _record_layers(self, steps: list[int], per: np.ndarray) -> None:
        """Per-layer norms of this chunk into the bounded heatmap rows (at the flush, on host)."""
        if self._layer_of is None:
            self.layer_names, groups = layer_groups(self._names)
            self._layer_of = groups
        if per.shape[1] != len(self._layer_of):
            return
        layer = layer_norms(per, self._layer_of, len(self.layer_names))
        for step, row in zip(steps, layer, strict=True):
            if self._layer_seen % self._layer_stride == 0:
                self.layer_rows.append([int(step), [float(v) if math.isfinite(v) else None
                                                    for v in row]])
                if len(self.layer_rows) >= _MAX_LAYER_ROWS:
                    self.layer_rows = self.layer_rows[::2]
                    self._layer_stride *= 2
            self._layer_seen += 1

    @override
    def report_details(self) -> dict[str, Any]:
        if not self.layer_rows:
            return {}
        return {"grad_layers": {"layers": list(self.layer_names),
                                "steps": [r[0] for r in self.layer_rows],
                                "norms": [list(r[1]) for r in self.layer_rows]}}

    # ------------------------------------------------------------------ state
    @override
    def extra_state(self) -> dict[str, Any]:
        return {
            "layer_names": list(self.layer_names), "layer_rows": [list(r) for r in self.layer_rows],
            "layer_stride": self._layer_stride, "layer_seen": self._layer_seen,
            "window_closed": self.window_closed, "watcher": self.watcher.state_dict(),
            "series": self.series_norm.state_dict(), "skipped_steps": self.skipped_steps
            if self._skipped is None else self._skipped_base + int(self._skipped),
            **self.grad_watch.state_dict(),
            "w_steps": list(self.w_steps), "w_total": list(self.w_total),
            "w_loss": list(self.w_loss), "w_rows": [r.tolist() for r in self.w_rows],
            "clip_kept": list(self.clip_kept),
        }

    @override
    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self._reset_state()
        self.window_closed = bool(state.get("window_closed", False))
        self.clip_kept = [float(v) for v in state.get("clip_kept", [])]
        self.watcher.load_state_dict(state.get("watcher", {}))
        self.series_norm.load_state_dict(state.get("series", {}))
        self.skipped_steps = self._skipped_base = int(state.get("skipped_steps", 0))
        self.grad_watch.load_state_dict(state)
        self.w_steps = [int(s) for s in state.get("w_steps", [])]
        self.w_total = [float(v) for v in state.get("w_total", [])]
        self.w_loss = [float(v) for v in state.get("w_loss", [])]
        self.w_rows = [np.asarray(r, dtype=np.float64) for r in state.get("w_rows", [])]
        self.layer_names = [str(n) for n in state.get("layer_names", [])]
        self.layer_rows = [list(r) for r in state.get("layer_rows", [])]
        self._layer_stride = int(state.get("layer_stride", 1))
        self._layer_seen = int(state.get("layer_seen", 0))


__all__ = ["GradientMonitor", "OnSpike"]
