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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn

from lightning_triage._compat import grad_scaler, is_overridden
from lightning_triage.findings import Finding, sort_findings
from lightning_triage.functional.collection import map_tensors
from lightning_triage.functional.remedy import (
    EXPERIMENT_KINDS,
    RemedyThresholds,
    Replay,
    decide_remedy,
    next_candidate,
    remedy_kind,
    remedy_works,
    symptom_reproduced,
    with_remedy,
)
from lightning_triage.probing import (
    ProbeUnavailableError,
    RngState,
    module_bytes,
    probe_module,
    rng_state,
    run_user_step,
    set_rng_state,
    step_loss,
)
from lightning_triage.ranking import explain_findings, settle_suspicions, start_here

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
_SHARDED = ("fsdp", "deepspeed", "modelparallel", "xla")


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
    strategy = type(trainer.strategy).__name__.lower()
    if any(name in strategy for name in _SHARDED):
        return (f"the `{type(trainer.strategy).__name__}` shards the model: a copy on one rank "
                "is not the model")
    if not pl_module.automatic_optimization:
        return "manual optimization: the replay runs Lightning's automatic step only"
    if len(trainer.optimizers) != 1:
        return f"{len(trainer.optimizers)} optimizers: the replay steps exactly one"
    if grad_scaler(trainer) is not None:
        return "float16 mixed precision: the replay does not reproduce loss scaling"
    for name in ("optimizer_step", "optimizer_zero_grad", "backward"):
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
        self.trials = 0  # experiments run in this fit (a healthy run: 0)
        self.seconds = 0.0

    def record(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        """Record ``batch`` (and, at the first one, the starting state); ``done`` once enough."""
        if self.done:
            return
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

    def reset(self, factor: float = 1.0) -> None:
        rec = self.recorder
        assert rec.model_state is not None
        assert rec.optimizer_state is not None
        self.model.load_state_dict(rec.model_state)
        self.optimizer.load_state_dict(rec.optimizer_state)
        for sched, state in zip(self.schedulers, rec.scheduler_states, strict=False):
            sched.load_state_dict(copy.deepcopy(state))
        if factor != 1.0:
            _scale_lr(self.optimizer, self.schedulers, factor)
        self.optimizer.zero_grad(set_to_none=True)
        self.model.train()
        if rec.rng is not None:
            set_rng_state(rec.rng)

    def _batch(self, i: int) -> Any:
        return map_tensors(lambda t: t.to(self.device), self.recorder.batches[i])

    def _loss(self, i: int) -> Tensor:
        loss = step_loss(run_user_step(self.trainer, self.model, self._batch(i)))
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
                out.append(float(self._loss(i).detach().float()))
        return out

    def _check_time(self) -> None:
        if time.perf_counter() > self.deadline:
            raise _OutOfTimeError

    def replay(self) -> Replay:
        """Train on the recorded batches as the run did (accumulation, clipping, step-wise
        schedulers); then measure."""
        trainer, opt = self.trainer, self.optimizer
        accumulate = max(1, int(trainer.accumulate_grad_batches))
        clip = trainer.gradient_clip_val
        steps: list[float] = []
        n = len(self.recorder.batches)
        with torch.enable_grad():
            for i in range(n):
                self._check_time()
                loss = self._loss(i)
                value = float(loss.detach().float())
                steps.append(value)
                if not math.isfinite(value):
                    return Replay(steps)
                (loss / accumulate).backward()
                if (i + 1) % accumulate and i + 1 < n:
                    continue
                if clip:
                    self.model.configure_gradient_clipping(
                        opt, gradient_clip_val=clip,
                        gradient_clip_algorithm=trainer.gradient_clip_algorithm)
                opt.step()
                opt.zero_grad(set_to_none=True)
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


def _budget(recorder: RemedyRecorder) -> float:
    elapsed = time.perf_counter() - recorder.fit_start
    return min(TIME_CAP_S, max(TIME_FLOOR_S, TIME_SHARE * elapsed))


def run_trial(trainer: pl.Trainer, pl_module: pl.LightningModule, recorder: RemedyRecorder,
              kind: str, thresholds: RemedyThresholds | None = None) -> dict[str, Any]:
    """The ``remedy`` block of a learning-rate remedy (``kind`` ``"lr_down"``/``"lr_up"``)."""
    th = thresholds or RemedyThresholds()
    verb = "/" if kind == "lr_down" else "x"
    change = f"every param group's learning rate {verb} {th.factors[0]:g}"
    block: dict[str, Any] = {"kind": kind, "change": change, "verdict": "skipped"}
    if recorder.reason is not None:
        return {**block, "reason": recorder.reason}
    steps = len(recorder.batches)
    if recorder.model_state is None or steps < MIN_STEPS:
        return {**block, "reason": f"only {steps} training batch(es) recorded (at least "
                                   f"{MIN_STEPS} are needed)"}
    budget = _budget(recorder)
    started = time.perf_counter()
    recorder.trials += 1
    try:
        with probe_module(trainer, pl_module, trainer.optimizers, factor=3.0) as probe, \
                _no_warnings():
            if not probe.copied:
                return {**block, "reason": f"no copy of the model ({probe.how})"}
            trial = _Trial(trainer, probe.module, probe.optimizers[0], recorder,
                           started + budget)
            trial.reset()
            base = _lrs(trial.optimizer)
            start = trial.evaluate()
            trial.reset()
            as_is = trial.replay()
            shown, _ = symptom_reproduced(kind, start, as_is, th)  # type: ignore[arg-type]
            remedied: list[tuple[float, Replay]] = []
            if shown:
                for factor in th.factors:
                    trial.reset(1 / factor if kind == "lr_down" else factor)
                    remedied.append((factor, trial.replay()))
                    if remedy_works(start, as_is, remedied[-1][1], th)[0]:
                        break
    except _OutOfTimeError:
        return {**block, "reason": f"ran out of its time budget of {budget:.0f} s"}
    finally:
        recorder.seconds += time.perf_counter() - started
    decision = decide_remedy(kind, start, as_is, remedied, th)  # type: ignore[arg-type]
    start_loss = sum(start) / len(start)
    used = decision.factor if decision.factor is not None else \
        (remedied[-1][0] if remedied else th.factors[0])
    scale = 1 / used if kind == "lr_down" else used
    after = next((r for f, r in remedied if f == used), None)
    block = {
        "kind": kind,
        "change": f"every param group's learning rate {verb} {used:g} (lr {_lr_text(base)} -> "
                  f"{_lr_text([v * scale for v in base])})",
        "before": {**as_is.summary(base[0] if base else None), "loss_start": start_loss},
        "verdict": decision.verdict,
        "reason": decision.reason,
        "tried": [f"{verb}{f:g}" for f, _ in remedied],
        "seconds": round(time.perf_counter() - started, 3),
    }
    if after is not None:
        block["after"] = {**after.summary(base[0] * scale if base else None),
                          "loss_start": start_loss}
    return block


def float32_block(finding: Finding) -> dict[str, Any]:
    """``numerics.precision_overflow``'s block: the tracer's float32 replay is the trial."""
    ev = finding.evidence
    return {
        "kind": "float32_replay",
        "change": "the failing step replayed in float32 (the non-finite tracer's replay)",
        "before": {"precision": ev.get("precision"), "finite": False},
        "after": {"precision": "32-true", "finite": True},
        "verdict": "confirmed",
        "reason": "the failing step is non-finite in the run's precision and finite when the "
                  "tracer replayed it in float32 on a copy: the reduced precision overflows",
    }


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


def verify_lead(trainer: pl.Trainer, pl_module: pl.LightningModule, recorder: RemedyRecorder,
                findings: Sequence[Finding], *, strict: bool = False) -> list[Finding]:
    """``findings`` with the lead's ``remedy`` block set when its code declares a verifiable
    remedy (no lead, or a lead without one: ``findings`` unchanged and nothing runs)."""
    findings = list(findings)
    settled = explain_findings(settle_suspicions(findings))
    lead_code = start_here(settled)
    if lead_code is None:
        return findings
    candidates = [f for f in sort_findings(settled) if f.code == lead_code and f.is_problem]
    lead = next((f for f in candidates if not f.explained_by), candidates[0])
    index = next(i for i, f in enumerate(settled) if f is lead)
    kind = remedy_kind(lead)
    if kind == "float32_replay":
        block = float32_block(lead)
    elif kind in EXPERIMENT_KINDS:
        try:
            block = run_trial(trainer, pl_module, recorder, kind)
        except Exception as exc:  # the user's code failed in the replay: the run is unaffected
            if strict:
                raise
            block = {"kind": kind, "change": "every param group's learning rate scaled",
                     "verdict": "skipped",
                     "reason": f"the replay raised {type(exc).__name__}: {exc}"[:500]}
    else:
        return findings
    if block["verdict"] == "not confirmed":
        block["reason"] += _other_settings(trainer)
    findings[index] = with_remedy(findings[index], block)
    if block["verdict"] == "not confirmed":
        findings[index] = with_remedy(findings[index], {
            **block, "next_candidate": next_candidate(settle_suspicions(findings),
                                                      findings[index])})
    return findings


__all__ = ["RemedyRecorder", "float32_block", "run_trial", "unavailable", "verify_lead"]
