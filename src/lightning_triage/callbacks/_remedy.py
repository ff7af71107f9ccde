"""The remedy trial of :class:`~lightning_triage.TriageReport`: the lead's fix, tried on a copy.

:class:`RemedyRecorder` keeps, from the fit's first training batch, the starting state (model,
optimizer, schedulers, every RNG, on the host) and the first ``steps`` batches (host copies);
then it has no per-step work left. When the report is built, :func:`verify_lead` finds the lead
and, when its code declares a learning-rate remedy (``CodeSpec.remedy``), replays the recorded
batches on a copy of the model from that state: as it is, then with every param group's
learning rate divided (or multiplied) by 10, then 100. The decision is
:func:`~lightning_triage.functional.remedy.decide_remedy`'s. Nothing of the user's run is
touched: a copy of the model and its optimizers (:func:`~lightning_triage.probing.probe_module`;
no copy, no trial), every RNG put back, loggers quiet.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn.parameter import is_lazy

from lightning_triage._compat import grad_scaler, is_overridden
from lightning_triage.callbacks._progress import progress
from lightning_triage.callbacks._shared import sharded_strategy
from lightning_triage.codes.remedies import REMEDIES, RemedyThresholds
from lightning_triage.findings import Finding
from lightning_triage.functional.collection import map_tensors
from lightning_triage.functional.realign import LabelPlan, label_plan, label_symptom
from lightning_triage.functional.remedy import (
    RemedyDecision,
    Replay,
    decide_remedy,
    next_candidate,
    partly,
    remedy_kind,
    remedy_works,
    with_remedy,
)
from lightning_triage.functional.remedy_plan import (
    AS_IS,
    PLACEBO_CHANGE,
    RemedyPlan,
    ReplayFacts,
    Variant,
    placebo,
    plan_remedy,
    recorded_inputs,
)
from lightning_triage.probing import (
    ProbeUnavailableError,
    RngState,
    module_bytes,
    probe_module,
    rng_state,
    run_user_step,
    set_rng_state,
    step_caller,
    step_loss,
    user_code,
)
from lightning_triage.ranking import rank, settle_suspicions

#: Recorded batches replayed (and measured after each replay).
REPLAY_STEPS = 30
#: The trial may use this share of the fit's time so far...
TIME_SHARE = 0.25
#: ...at least this many seconds (a short fit can still be checked)...
TIME_FLOOR_S = 5.0
#: ...and never more than this many.
TIME_CAP_S = 60.0
#: Host bytes the recorded batches may take.
MAX_BATCH_BYTES = 256 * 2**20
#: Host bytes the starting state (model and optimizer) may take.
MAX_STATE_BYTES = 2 * 2**30
#: Fewer recorded steps than this: no trial.
MIN_STEPS = 8


class _OutOfTimeError(Exception):
    pass


def _host(t: Tensor) -> Tensor:
    return t.detach().to("cpu", copy=True)


def _nbytes(batch: Any) -> int:
    total = 0

    def count(t: Tensor) -> Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    map_tensors(count, batch)
    return total


def unavailable(trainer: pl.Trainer, pl_module: pl.LightningModule) -> str | None:
    """Why no learning-rate trial can run in this fit (``None``: it can)."""
    # the strategies the other fit-start probes skip, and XLA's (a copy on one device of a
    # lazily executed, possibly sharded model is not the model)
    if sharded_strategy(trainer) is not None or "xla" in type(trainer.strategy).__name__.lower():
        return (f"the `{type(trainer.strategy).__name__}` shards the model: a copy on one rank "
                "is not the model")
    if not pl_module.automatic_optimization:
        return ("manual optimization: `training_step` runs its own backward and optimizer step "
                "(`manual_backward`, `opt.step()`), so the replay has no point between them at "
                "which to change the learning rate, clip or zero the gradients; it replays "
                "Lightning's automatic step only")
    if len(trainer.optimizers) != 1:
        return f"{len(trainer.optimizers)} optimizers: the replay steps exactly one"
    if any(is_lazy(t) for t in (*pl_module.parameters(), *pl_module.buffers())):
        return "lazy parameters not initialized at the first batch: no starting state to keep"
    if grad_scaler(trainer) is not None:
        return "float16 mixed precision: the replay does not reproduce loss scaling"
    for name in ("optimizer_step", "backward"):
        if is_overridden(name, pl_module):
            return f"the model overrides `{name}`: the replay runs Lightning's default one"
    if any(isinstance(m, nn.SyncBatchNorm) for m in pl_module.modules()) \
            and trainer.world_size > 1:
        return "`SyncBatchNorm` under DDP: a replay on rank 0 alone would wait for the others"
    size = module_bytes(pl_module)
    if 3 * size > MAX_STATE_BYTES:  # weights + optimizer state (Adam: two more of each)
        return (f"the model's {size / 2**20:.0f} MiB: its starting state is not kept on the "
                f"host (limit {MAX_STATE_BYTES / 2**30:.0f} GiB with the optimizer's)")
    return None


class RemedyRecorder:
    """The fit's starting state and first training batches, kept on the host for the trial.

    Args:
        steps: batches to record (and replay).
    """

    def __init__(self, steps: int = REPLAY_STEPS) -> None:
        self.steps = steps
        self.reset()

    def reset(self) -> None:
        self.batches: list[Any] = []
        self.model_state: dict[str, Tensor] | None = None
        self.optimizer_state: dict[str, Any] | None = None
        self.scheduler_states: list[dict[str, Any]] = []
        self.rng: RngState | None = None
        self.reason: str | None = None  # why nothing is (or can be) recorded
        self.done = False
        self._bytes = 0
        self.fit_start = time.perf_counter()
        self.starts: list[float] = []  # when each recorded batch started (the step time)
        self.trials = 0  # experiments run in this fit (a healthy run: 0)
        self.seconds = 0.0

    def record(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        """Record ``batch`` (and, at the first one, the starting state); ``done`` once enough."""
        if self.done:
            return
        self.starts.append(time.perf_counter())
        if self.model_state is None:
            self.reason = unavailable(trainer, pl_module)
            if self.reason is not None:
                self.done = True
                return
            self.rng = rng_state()
            self.model_state = {k: _host(v) for k, v in pl_module.state_dict().items()}
            self.optimizer_state = map_tensors(_host, copy.deepcopy(
                trainer.optimizers[0].state_dict()))
            self.scheduler_states = [copy.deepcopy(cfg.scheduler.state_dict())
                                     for cfg in trainer.lr_scheduler_configs]
        size = _nbytes(batch)
        if self._bytes + size > MAX_BATCH_BYTES:
            self.done = True
            return
        self._bytes += size
        self.batches.append(map_tensors(_host, batch))
        self.done = len(self.batches) >= self.steps


# ---------------------------------------------------------------------- the experiment
def _lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    return [float(g["lr"]) for g in optimizer.param_groups if "lr" in g]


def _lr_text(lrs: Sequence[float]) -> str:
    if not lrs:
        return "?"
    return f"{lrs[0]:.3g}" if all(v == lrs[0] for v in lrs) else \
        "[" + ", ".join(f"{v:.3g}" for v in lrs) + "]"


_LR_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")


def _scale_lr(optimizer: torch.optim.Optimizer, schedulers: Sequence[Any], factor: float) -> None:
    """Every param group's learning rate (and the schedulers' base rates) times ``factor``."""
    for group in optimizer.param_groups:
        for key in _LR_KEYS:
            if isinstance(group.get(key), (int, float)):
                group[key] = group[key] * factor
    for sched in schedulers:
        for attr in ("base_lrs", "max_lrs", "min_lrs"):
            values = getattr(sched, attr, None)
            if isinstance(values, list) and all(isinstance(v, (int, float)) for v in values):
                setattr(sched, attr, [v * factor for v in values])


class _Trial:
    """The copy, its optimizer and schedulers, and a way back to the fit's starting state."""

    def __init__(self, trainer: pl.Trainer, model: Any, optimizer: torch.optim.Optimizer,
                 recorder: RemedyRecorder, deadline: float) -> None:
        self.trainer = trainer
        self.model = model
        self.optimizer = optimizer
        scheds = model.lr_schedulers() if isinstance(model, pl.LightningModule) else None
        self.schedulers: list[Any] = [] if scheds is None else \
            list(scheds) if isinstance(scheds, list) else [scheds]
        self.intervals = [cfg.interval for cfg in trainer.lr_scheduler_configs]
        self.recorder = recorder
        self.deadline = deadline
        self.device = next((p.device for p in model.parameters()), torch.device("cpu"))
        self.groups = len(optimizer.param_groups)
        self.variant = AS_IS
        self.measure: Callable[[Any], Any] | None = None  # applied to the evaluation batches
        self.norms: list[float] = []  # total gradient norm of each optimizer step (pre-clip)
        self.stale_steps = 0  # steps whose backward found gradients left from before

    def missing(self) -> list[nn.Parameter]:
        """The copy's trainable parameters that are in none of its optimizer's param groups."""
        held = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
        return [p for p in self.model.parameters() if p.requires_grad and id(p) not in held]

    def reset(self, variant: Variant = AS_IS) -> None:
        rec = self.recorder
        assert rec.model_state is not None
        assert rec.optimizer_state is not None
        del self.optimizer.param_groups[self.groups:]  # a group added by a previous variant
        self.model.load_state_dict(rec.model_state)
        self.optimizer.load_state_dict(rec.optimizer_state)
        for sched, state in zip(self.schedulers, rec.scheduler_states, strict=False):
            sched.load_state_dict(copy.deepcopy(state))
        if variant.lr_factor != 1.0:
            _scale_lr(self.optimizer, self.schedulers, variant.lr_factor)
        if variant.add_missing:
            missing = self.missing()
            if missing:
                hyper = {k: v for k, v in self.optimizer.param_groups[0].items() if k != "params"}
                self.optimizer.add_param_group({**hyper, "params": missing})
        self.optimizer.zero_grad(set_to_none=True)
        self.model.train()
        self.variant = variant
        if rec.rng is not None:
            set_rng_state(rec.rng)

    def _batch(self, i: int, measuring: bool = False) -> Any:
        order = self.variant.order
        batch = self.recorder.batches[order[i] if order is not None and not measuring else i]
        transform = self.measure if measuring and self.measure is not None else \
            self.variant.transform
        if transform is not None:
            batch = transform(batch)
        return map_tensors(lambda t: t.to(self.device), batch)

    def _loss(self, i: int, measuring: bool = False) -> Tensor:
        loss = step_loss(run_user_step(self.trainer, self.model, self._batch(i, measuring)))
        if loss is None:
            raise ProbeUnavailableError("`training_step` returned no loss")
        return loss

    def evaluate(self) -> list[float]:
        """The loss on every recorded batch (no update; the same randomness each time)."""
        if self.recorder.rng is not None:
            set_rng_state(self.recorder.rng)
        out = []
        with torch.no_grad():
            for i in range(len(self.recorder.batches)):
                self._check_time()
                out.append(float(self._loss(i, measuring=True).detach().float()))
        return out

    def _check_time(self) -> None:
        if time.perf_counter() > self.deadline:
            raise _OutOfTimeError

    def _zero(self, i: int) -> None:
        """Zero the gradients as the run does (the model's `optimizer_zero_grad` hook, Lightning's
        default: `optimizer.zero_grad()`), or, for a ``zero_grads`` variant, ourselves; count a
        step whose gradients survive it."""
        if self.variant.zero_grads or not isinstance(self.model, pl.LightningModule):
            self.optimizer.zero_grad(set_to_none=True)
            return
        with user_code():
            self.model.optimizer_zero_grad(self.trainer.current_epoch, i, self.optimizer)
        if i and any(p.grad is not None and bool(p.grad.any())
                     for g in self.optimizer.param_groups for p in g["params"]):
            self.stale_steps += 1

    def replay(self) -> Replay:
        """Train on the recorded batches as the run did (accumulation, zeroing, clipping,
        step-wise schedulers), with the variant's change; then measure."""
        trainer, opt, variant = self.trainer, self.optimizer, self.variant
        accumulate = max(1, int(trainer.accumulate_grad_batches))
        clip = trainer.gradient_clip_val
        steps: list[float] = []
        self.norms, self.stale_steps = [], 0
        n = len(self.recorder.batches)
        with torch.enable_grad():
            for i in range(n):
                self._check_time()
                loss = self._loss(i)
                value = float(loss.detach().float())
                steps.append(value)
                if not math.isfinite(value):
                    return Replay(steps)
                if i % accumulate == 0:  # Lightning zeroes before the window's first backward
                    self._zero(i)
                (loss / accumulate).backward()
                if (i + 1) % accumulate and i + 1 < n:
                    continue
                params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
                self.norms.append(float(torch.nn.utils.get_total_norm(
                    [p.grad for p in params])) if params else 0.0)
                if clip:
                    self.model.configure_gradient_clipping(
                        opt, gradient_clip_val=clip,
                        gradient_clip_algorithm=trainer.gradient_clip_algorithm)
                if variant.clip is not None:
                    torch.nn.utils.clip_grad_norm_(params, variant.clip)
                opt.step()
                for sched, interval in zip(self.schedulers, self.intervals, strict=False):
                    if interval == "step":
                        sched.step()
        return Replay(steps, self.evaluate())


@contextmanager
def _no_warnings() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def step_seconds(recorder: RemedyRecorder) -> float | None:
    """The fit's median step time over the recorded batches (``None``: too few)."""
    gaps = sorted(b - a for a, b in zip(recorder.starts, recorder.starts[1:], strict=False))
    return gaps[len(gaps) // 2] if len(gaps) >= 3 else None


def _budget(recorder: RemedyRecorder) -> float:
    elapsed = time.perf_counter() - recorder.fit_start
    return min(TIME_CAP_S, max(TIME_FLOOR_S, TIME_SHARE * elapsed))


def _labels(evidence: Mapping[str, Any], batches: Sequence[Any]
            ) -> tuple[LabelPlan, tuple[bool, str]] | str:
    """``realign_labels``: the realignment and the symptom in the recorded batches (a string:
    why the labels cannot be realigned)."""
    plan = label_plan(evidence)
    if isinstance(plan, str):
        return plan
    symptom = label_symptom(plan, batches)
    return symptom if isinstance(symptom, str) else (plan, symptom)


def run_trial(trainer: pl.Trainer, pl_module: pl.LightningModule, recorder: RemedyRecorder,
              kind: str, thresholds: RemedyThresholds | None = None,
              evidence: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``remedy`` block of a replayed remedy (``kind``: a ``"replay"`` row of the remedy
    table; ``evidence``: the lead's, which says where the labels are for a ``"realign"`` kind)."""
    spec = REMEDIES[kind]
    th = thresholds or spec.thresholds
    block: dict[str, Any] = {"kind": kind, "change": spec.change, "verdict": "skipped"}
    if recorder.reason is not None:
        return {**block, "reason": recorder.reason}
    steps = len(recorder.batches)
    if recorder.model_state is None or steps < MIN_STEPS:
        return {**block, "reason": f"only {steps} training batch(es) recorded (at least "
                                   f"{MIN_STEPS} are needed)"}
    if spec.transform == "standardize" and len(recorded_inputs(recorder.batches)) < steps:
        return {**block, "reason": "the recorded batches have no float input tensor to "
                                   "standardize (or it could not be told which one is the input)"}
    labels = _labels(evidence or {}, recorder.batches) if spec.transform == "realign" else None
    if isinstance(labels, str):
        return {**block, "reason": labels}
    budget = _budget(recorder)
    step = step_seconds(recorder)
    if step is not None and 2 * steps * step > budget:  # two replays at least decide
        return {**block, "reason": f"would need about {2 * steps * step:.1f} s (two replays "
                                   f"of {steps} steps at the fit's {step * 1e3:.0f} ms per "
                                   f"step), more than its time budget of {budget:.0f} s"}
    started = time.perf_counter()
    recorder.trials += 1
    try:
        with step_caller("trial"), \
                progress(trainer, "trying the lead's fix on a copy", budget, spec.change), \
                probe_module(trainer, pl_module, trainer.optimizers, factor=3.0) as probe, \
                _no_warnings():
            if not probe.copied:
                return {**block, "reason": f"no copy of the model ({probe.how})"}
            trial = _Trial(trainer, probe.module, probe.optimizers[0], recorder,
                           started + budget)
            if labels is not None:  # every loss measured on the realigned labels
                trial.measure = labels[0].transform()
            trial.reset()
            base = _lrs(trial.optimizer)
            start = trial.evaluate()
            missing = trial.missing()
            trial.reset()
            as_is = trial.replay()
            plan = plan_remedy(kind, start, as_is, ReplayFacts(
                recorder.batches, trial.norms, trial.stale_steps,
                (len(missing), sum(p.numel() for p in missing)), labels), th)
            if isinstance(plan, str):
                return {**block, "reason": plan}
            remedied, control = _remedied(trial, plan, start, as_is, th, spec.placebo) \
                if plan.symptom[0] else ([], None)
    except _OutOfTimeError:
        return {**block, "reason": f"ran out of its time budget of {budget:.0f} s"}
    finally:
        recorder.seconds += time.perf_counter() - started
    decision = decide_remedy(kind, start, as_is, remedied, th,  # type: ignore[arg-type]
                             symptom=plan.symptom,
                             placebo=control if isinstance(control, Replay) else None)
    block = _block(kind, plan, decision, base, start, as_is, remedied,
                   round(time.perf_counter() - started, 3))
    if control is not None:
        block["placebo"] = {"change": PLACEBO_CHANGE, **(
            {"skipped": control} if isinstance(control, str) else
            {**control.summary(), "passes": remedy_works(start, as_is, control, th)[0]})}
    return block


def _remedied(trial: _Trial, plan: RemedyPlan, start: Sequence[float], as_is: Replay,
              th: RemedyThresholds, with_placebo: bool
              ) -> tuple[list[tuple[float | str, Replay]], Replay | str | None]:
    """The plan's variants replayed in order up to the first that works, and, for a kind that
    needs one (the table's ``placebo``), the placebo of that confirmation (a string: why it did
    not run)."""
    remedied: list[tuple[float | str, Replay]] = []
    for key, variant in plan.variants:
        trial.reset(variant)
        remedied.append((key, trial.replay()))
        if remedy_works(start, as_is, remedied[-1][1], th)[0]:
            break
    else:
        return remedied, None
    if not with_placebo:
        return remedied, None
    try:
        trial.reset(placebo(len(trial.recorder.batches)))
        return remedied, trial.replay()
    except _OutOfTimeError:
        return remedied, "ran out of the trial's time budget"


def _block(kind: str, plan: RemedyPlan, decision: RemedyDecision, base: Sequence[float],
           start: Sequence[float], as_is: Replay, remedied: Sequence[tuple[float | str, Replay]],
           seconds: float) -> dict[str, Any]:
    """The report's ``remedy`` block of a trial that ran."""
    start_loss = sum(start) / len(start)
    used = decision.factor if decision.factor is not None else \
        (remedied[-1][0] if remedied else plan.variants[0][0])
    after = next((r for f, r in remedied if f == used), None)
    labels = {key: v.label for key, v in plan.variants}
    lr_before = base[0] if base else None
    lr_after, change = lr_before, plan.change
    lr = REMEDIES[kind].lr
    if lr is not None and isinstance(used, float):
        scale = 1 / used if lr == "down" else used
        lr_after = lr_before * scale if lr_before is not None else None
        verb = "x" if lr == "up" else "/"
        change = (f"every param group's learning rate {verb} {used:g} (lr {_lr_text(base)} -> "
                  f"{_lr_text([v * scale for v in base])})"
                  + (f" and the gradients clipped at norm {plan.clip:.3g} (the median of the "
                     "as-is replay)" if plan.clip is not None else ""))
    block: dict[str, Any] = {
        "kind": kind,
        "change": change,
        "before": {**as_is.summary(lr_before), "loss_start": start_loss,
                   "losses": _curve(as_is)},
        "verdict": decision.verdict,
        "reason": decision.reason,
        "tried": [labels[f] for f, _ in remedied],
        "seconds": seconds,
    }
    if after is not None:
        block["after"] = {**after.summary(lr_after), "loss_start": start_loss,
                          "losses": _curve(after)}
        if plan.clip is not None:
            block["after"]["clip"] = plan.clip
    return block


def _curve(replay: Replay) -> list[float | None]:
    """The replay's per-step training losses for the report's plot (``None``: non-finite)."""
    return [round(v, 6) if math.isfinite(v) else None for v in replay.steps]


def float32_block(finding: Finding, kind: str = "float32_replay") -> dict[str, Any]:
    """``numerics.precision_overflow``'s block: the tracer's float32 replay is the trial."""
    ev = finding.evidence
    return {
        "kind": kind,
        "change": REMEDIES[kind].change,
        "before": {"precision": ev.get("precision"), "finite": False},
        "after": {"precision": "32-true", "finite": True},
        "verdict": "confirmed",
        "reason": "the failing step is non-finite in the run's precision and finite when the "
                  "tracer replayed it in float32 on a copy: the reduced precision overflows",
    }


def eval_block(finding: Finding, kind: str) -> dict[str, Any]:
    """A mode-stage lead's block: the trial its check ran at the probe, when the problem was
    found (its ``remedy_trial`` evidence; see :mod:`~lightning_triage.callbacks._mode_remedy`)."""
    trial = finding.evidence.get("remedy_trial")
    if isinstance(trial, dict) and trial.get("kind") == kind and "verdict" in trial:
        return dict(trial)
    return {"kind": kind, "change": REMEDIES[kind].change, "verdict": "skipped",
            "reason": f"`{finding.check}` ran no trial when it found the problem "
                      "(`verify_remedy=False`, or a report from an earlier version)"}


def _other_settings(trainer: pl.Trainer) -> str:
    """The run's settings besides the learning rate that shape every update (facts for the
    reader of a learning-rate lead the trial did not confirm)."""
    found = []
    decays = sorted({float(g.get("weight_decay") or 0.0) for opt in trainer.optimizers
                     for g in opt.param_groups} - {0.0})
    if decays:
        found.append(f"`weight_decay` {', '.join(f'{d:g}' for d in decays)}")
    if trainer.gradient_clip_val:
        found.append(f"`gradient_clip_val` {trainer.gradient_clip_val:g} "
                     f"({trainer.gradient_clip_algorithm or 'norm'})")
    if not found:
        return ". The learning rate is not what holds the loss back"
    return (". The learning rate is not what holds the loss back; this run also shapes every "
            f"update with {' and '.join(found)}")


def _position(findings: Sequence[Finding], lead: Finding) -> int:
    """Where ``lead`` (a finding of :func:`~lightning_triage.ranking.rank`'s order: a problem,
    so its ranking changed at most its ``explained_by`` and message) is in ``findings``."""
    def same(f: Finding) -> bool:
        return (f.code, f.check, f.global_step, f.epoch, f.rank, f.layer, f.severity) == \
            (lead.code, lead.check, lead.global_step, lead.epoch, lead.rank, lead.layer,
             lead.severity) and (f.evidence is lead.evidence or f.evidence == lead.evidence)

    return next(i for i, f in enumerate(findings) if same(f))


def verify_lead(trainer: pl.Trainer, pl_module: pl.LightningModule, recorder: RemedyRecorder,
                findings: Sequence[Finding], *, strict: bool = False,
                before_trial: Callable[[], None] | None = None) -> list[Finding]:
    """``findings`` with the lead's ``remedy`` block set when its code declares a verifiable
    remedy (no lead, or a lead without one: ``findings`` unchanged and nothing runs);
    ``before_trial`` is called just before a replayed trial starts (the report is written
    first)."""
    findings = list(findings)
    ordered, lead_code = rank(findings)
    if lead_code is None:
        return findings
    candidates = [f for f in ordered if f.code == lead_code and f.is_problem]
    lead = next((f for f in candidates if not f.explained_by), candidates[0])
    index = _position(findings, lead)
    kind = remedy_kind(lead)
    family = REMEDIES[kind].family
    if family == "float32":
        block = float32_block(lead, kind)
    elif family == "eval":
        block = eval_block(lead, kind)
        # the check's trial becomes the lead's block (once in the report, not twice)
        findings[index] = replace(findings[index], evidence={
            k: v for k, v in findings[index].evidence.items() if k != "remedy_trial"})
    elif family == "replay":
        if before_trial is not None:
            before_trial()
        try:
            block = run_trial(trainer, pl_module, recorder, kind, evidence=lead.evidence)
        except Exception as exc:  # the user's code failed in the replay: the run is unaffected
            if strict:
                raise
            block = {"kind": kind, "change": REMEDIES[kind].change,
                     "verdict": "skipped",
                     "reason": f"the replay raised {type(exc).__name__}: {exc}"[:500]}
    else:
        return findings
    if block["verdict"] == "not confirmed":
        block["reason"] += _other_settings(trainer)
    block = partly(kind, block, findings)
    findings[index] = with_remedy(findings[index], block)
    if block["verdict"] == "not confirmed":
        findings[index] = with_remedy(findings[index], {
            **block, "next_candidate": next_candidate(settle_suspicions(findings),
                                                      findings[index])})
    return findings


__all__ = ["RemedyRecorder", "eval_block", "float32_block", "run_trial", "unavailable", "verify_lead"]
