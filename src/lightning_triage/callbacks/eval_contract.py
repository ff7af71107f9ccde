"""Stage 6 (mode): is evaluation deterministic, and is the model evaluated the model that trains?"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from lightning_triage._compat import forward_context, hook_takes, is_overridden
from lightning_triage.callbacks._args import BundleArg, check_batch_keys, check_bool, check_int, passes
from lightning_triage.callbacks._mode_remedy import dropout_gate, eval_remedy_trial
from lightning_triage.callbacks._shared import loss_from_outputs, validate_task
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.functional.batch import BatchKey, split_batch
from lightning_triage.functional.chance import IGNORE_INDEX, ChanceLevel, Task, resolve_chance
from lightning_triage.functional.draws import DrawWatch
from lightning_triage.functional.eval_contracts import (
    GAP_MIN_STEPS,
    GapRun,
    ModuleCall,
    eval_broken_before_training,
    eval_loss_gap,
    first_divergence,
    first_scale_change,
    nondeterministic_eval,
    sampling_eval,
    unique,
)
from lightning_triage.functional.hooks import capture_last_output
from lightning_triage.probing import (
    ProbeUnavailableError,
    UserCodeError,
    copy_first_examples,
    eval_copy,
    probe_module,
    rng_state,
    run_user_step,
    set_rng_state,
    step_loss,
    user_code,
)
from lightning_triage.probing.recording import CallTrace

#: The validation runs probed for the loss gap, at most.
MAX_GAP_RUNS = 8


@contextmanager
def _maybe(ctx: AbstractContextManager[Any], enter: bool) -> Iterator[None]:
    if enter:
        with ctx:
            yield
    else:
        yield


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


class EvalContractCheck(TriageCallback):
    """Check, on copies of the model, that evaluation is deterministic and that the model
    evaluated is the model that trains.

    At the first batch of a validation run (the sanity check's included), on a copy of at most
    ``max_examples`` of its examples:

    1. **Determinism** (first validation run only): ``validation_step`` runs three times in
       eval mode, each on a fresh copy of the module, from random states A, B and A again, with
       hooks recording every module's input and output. When A and B differ (and A twice
       agrees: the difference comes from the random state), ``mode.nondeterministic_eval``
       names the first module whose output differs, or the module calling it when its input
       already differed (a functional dropout or noise that ignores ``self.training``). Layers
       left in training mode are :class:`EvalModeCheck`'s finding, not this one. When it
       finds randomness, it tries the remedy right there (``verify_remedy``): the same passes
       from two random states with the dropout calls gated on the mode; the result is the
       finding's ``remedy_trial`` evidence (docs/remedies.md).
    2. **Eval path** (each validation run until one at ``min_steps`` or later): the user's
       ``training_step`` on the same examples in eval mode and in training mode (same random
       state). ``mode.eval_loss_gap`` when the eval-mode loss is at least twice the
       training-mode loss and above it by a quarter of the chance level (or of the step-0 loss), and
       the gap did not shrink since the first run: an eval-only path (running statistics never
       updated, a reparametrization computed only in training mode). Harder validation data
       raises both losses; BatchNorm statistics that lag at first give a gap that shrinks.
       Before training (the sanity check, or the first validation before ``min_steps``),
       ``mode.eval_broken_before_training`` when the eval-mode loss is orders of magnitude
       above chance while the training-mode loss is at chance (old-style ``spectral_norm``
       power-iteration vectors never iterated, a running buffer read at its init, a cache only
       training fills), naming the first module whose output changes scale between the modes.

    The run's weights, RNG and loggers are untouched; after that the check is idle.

    Args:
        stochastic_eval: evaluation is random on purpose (MC dropout, test-time augmentation):
            skip the determinism probe.
        task: as in :class:`InitialLossCheck`, for the chance level of the loss gap.
        num_classes: class count (vocabulary size for ``"sequence"``).
        ignore_index: target value excluded from class statistics.
        input_key: where the inputs are in a batch the defaults do not understand.
        target_key: where the targets are, likewise.
        max_examples: the probes use at most this many validation examples.
        min_steps: the loss gap is judged at a validation run at this optimizer step or later.
        verify_remedy: try the remedy on copies when evaluation is found random.
        strict: raise internal errors instead of disabling the check.

    Raises:
        TriageConfigError: for an invalid argument (named in the message).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[EvalContractCheck(stochastic_eval=True)])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.EvalContractCheck
                  init_args: {stochastic_eval: true}
    """

    stage: ClassVar[str] = "mode"
    codes: ClassVar[tuple[str, ...]] = ("mode.nondeterministic_eval", "mode.eval_loss_gap",
                                        "mode.eval_broken_before_training")
    # how `Triage` builds this check (TriageCallback.bundle_args)
    bundle_args: ClassVar[Mapping[str, BundleArg]] = {
        **passes("stochastic_eval", "task", "num_classes", "input_key", "target_key"),
        "verify_remedy": "verify_remedies"}

    state_key_args = ("stochastic_eval", "task", "num_classes", "input_key", "target_key")

    def __init__(
        self,
        *,
        stochastic_eval: bool = False,
        task: Task = "auto",
        num_classes: int | None = None,
        ignore_index: int = IGNORE_INDEX,
        input_key: BatchKey | None = None,
        target_key: BatchKey | None = None,
        max_examples: int = 8,
        min_steps: int = GAP_MIN_STEPS,
        verify_remedy: bool = True,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        check_bool("stochastic_eval", stochastic_eval)
        check_bool("verify_remedy", verify_remedy)
        validate_task(task, num_classes)
        check_int("ignore_index", ignore_index)
        check_batch_keys(input_key=input_key, target_key=target_key)
        check_int("max_examples", max_examples, 1)
        check_int("min_steps", min_steps, 0)
        self.stochastic_eval = stochastic_eval
        self.task = task
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.input_key = input_key
        self.target_key = target_key
        self.max_examples = max_examples
        self.min_steps = min_steps
        self.verify_remedy = verify_remedy
        self.determinism: str | None = None
        self.gap_runs: list[GapRun] = []
        self.gap_done = False
        self.gap_skipped: str | None = None
        self.initial_loss: float | None = None
        self.chance: ChanceLevel | None = None
        self.probe_seconds = 0.0
        self._pending = False

    # ------------------------------------------------------------------ hooks
    @override
    @guarded
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: STEP_OUTPUT, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == 0 and batch_idx == 0 and self.initial_loss is None:
            loss = loss_from_outputs(outputs, pl_module, trainer)
            self.initial_loss = float(loss) if loss is not None else None
        self.idle = True  # the step-0 loss is all this check reads from training steps

    @override
    @guarded
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pending = self.determinism is None or not self.gap_done

    @override
    @guarded
    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                  batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if not self._pending or dataloader_idx != 0:
            return
        self._pending = False
        start = time.perf_counter()
        try:
            if self.determinism is None:
                self.determinism = self._determinism(trainer, pl_module, batch)
            if not self.gap_done:
                self._gap(trainer, pl_module, batch)
        finally:
            self.probe_seconds += time.perf_counter() - start
            self._describe()

    def _describe(self) -> None:
        gap = self.gap_skipped or (f"loss gap probed at {len(self.gap_runs)} validation run(s)"
                                   if self.gap_runs else "loss gap not probed")
        self.mark_ran(f"determinism: {self.determinism or 'not probed'}; {gap}; "
                      f"cost {1000 * self.probe_seconds:.0f} ms")

    # ------------------------------------------------------------------ determinism
    def _validation_pass(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                         seed: int, gated: bool = False) -> tuple[list[ModuleCall], DrawWatch]:
        """One eval-mode run of ``validation_step`` on a copy: the module calls and the random
        draws (the dropout calls gated on the mode when ``gated``)."""
        small = copy_first_examples(batch, self.max_examples, self.input_key, self.target_key)
        trace = CallTrace()
        watch = DrawWatch()
        with eval_copy(trainer, pl_module, None) as probe, trace.attached(probe.module), \
                torch.no_grad(), forward_context(trainer), user_code(), \
                _maybe(dropout_gate(), gated), watch:
            _seed_all(seed)
            step = probe.module.validation_step
            args: tuple[Any, ...] = (small,)
            if hook_takes(step, "batch_idx", min_args=2):
                args = (small, 0, 0) if hook_takes(step, "dataloader_idx", min_args=3) \
                    else (small, 0)
            step(*args)
        return trace.calls, watch

    def _determinism(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> str:
        """One eval-mode probe of ``validation_step``; returns what it found (for the detail)."""
        if self.stochastic_eval:
            return "skipped (stochastic_eval=True)"
        if not is_overridden("validation_step", pl_module):
            return "skipped (no validation_step)"
        try:
            (a, watch), (b, _), (again, _) = (self._validation_pass(trainer, pl_module, batch, seed)
                                              for seed in (1, 2, 1))
        except UserCodeError as err:
            return f"skipped (validation_step raised {err.describe()} on a copy)"
        except ProbeUnavailableError as exc:
            return f"skipped ({exc})"
        divergence = first_divergence(a, b)
        if divergence is None:
            return f"deterministic over {len(a)} module call(s)"
        if first_divergence(a, again) is not None:
            return "outputs differ even from the same random state (not the RNG): not judged"
        if any(call.training for call in a):
            return "modules in training mode during validation (see EvalModeCheck)"
        if watch.sampled and not watch.dropouts:  # the objective samples (noise, mask, latent)
            self.add_verdict(trainer, sampling_eval(watch.draws, step=trainer.global_step),
                             sanity_check=bool(trainer.sanity_checking))
            return f"random by design (validation_step draws {', '.join(unique(watch.draws))})"
        if watch.sampled:
            # dropout on top of the objective's draws: the first call dropout changes, from the
            # same random state with the dropout calls gated, is where dropout drew
            try:
                gated, _ = self._validation_pass(trainer, pl_module, batch, 1, gated=True)
                divergence = first_divergence(a, gated) or divergence
            except (UserCodeError, ProbeUnavailableError):
                pass
        inputs = split_batch(batch, self.input_key, self.target_key).inputs
        n = min(self.max_examples, int(inputs.shape[0])) if inputs is not None \
            and inputs.dim() > 0 else self.max_examples
        extra: dict[str, Any] = {}
        if self.verify_remedy:
            extra["remedy_trial"] = eval_remedy_trial(
                trainer, pl_module, batch, "gate_dropout", max_examples=self.max_examples,
                input_key=self.input_key, target_key=self.target_key)
        self.add_verdict(trainer, nondeterministic_eval(
            divergence, examples=n, root=type(pl_module).__name__, step=trainer.global_step,
            dropouts=watch.dropouts, draws=watch.draws), sanity_check=bool(trainer.sanity_checking), **extra)
        return f"random: first differs at `{divergence.call.name or type(pl_module).__name__}`"

    # ------------------------------------------------------------------ loss gap
    def _step_loss(self, trainer: pl.Trainer, module: Any, batch: Any, capture: bool) -> float:
        with torch.enable_grad(), capture_last_output(module) as head:
            loss = step_loss(run_user_step(trainer, module, batch))
        if loss is None:
            raise ValueError("training_step returned no scalar loss")
        if capture and self.chance is None:
            targets = split_batch(batch, self.input_key, self.target_key).targets
            self.chance = resolve_chance(self.task, self.num_classes, head.output, targets,
                                         self.ignore_index)
        return float(loss.detach().float())

    def _gap(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        if not pl_module.automatic_optimization:
            self.gap_done, self.gap_skipped = True, "loss gap skipped (manual optimization)"
            return
        small = copy_first_examples(batch, self.max_examples, self.input_key, self.target_key)
        rng = rng_state()
        sanity = bool(trainer.sanity_checking)
        # before training (the sanity check, or the first validation) the passes are traced too:
        # the module whose output changes scale first is named when eval mode is broken
        early = trainer.global_step < self.min_steps \
            and not self.has_finding("mode.eval_broken_before_training") \
            and (sanity or not any(not r.sanity for r in self.gap_runs))
        traces = (CallTrace(), CallTrace())
        try:
            with eval_copy(trainer, pl_module, rng) as probe, \
                    _maybe(traces[0].attached(probe.module), early):
                eval_loss = self._step_loss(trainer, probe.module, small, capture=True)
            with probe_module(trainer, pl_module, trainer.optimizers) as probe:
                probe.module.train()
                set_rng_state(rng)
                with _maybe(traces[1].attached(probe.module), early):
                    train_loss = self._step_loss(trainer, probe.module, small, capture=False)
                if early:
                    self._judge_start(trainer, probe.module, GapRun(
                        trainer.global_step, eval_loss, train_loss, sanity=sanity), traces)
        except (UserCodeError, ProbeUnavailableError, ValueError) as exc:
            why = exc.describe() if isinstance(exc, UserCodeError) else str(exc)
            self.gap_done, self.gap_skipped = True, f"loss gap skipped ({why})"
            return
        self.gap_runs.append(GapRun(trainer.global_step, eval_loss, train_loss, sanity=sanity))
        judged = trainer.global_step >= self.min_steps
        if judged or len(self.gap_runs) >= MAX_GAP_RUNS:
            self.gap_done = True
        if not judged:
            return
        reference, name = (self.chance.value, "chance level") if self.chance is not None \
            else (self.initial_loss, "step-0 training loss")
        if reference is not None and not math.isfinite(reference):
            reference = None
        self.add_verdicts(trainer, eval_loss_gap(self.gap_runs, reference=reference,
                                                 reference_name=name, min_steps=self.min_steps))

    def _judge_start(self, trainer: pl.Trainer, module: torch.nn.Module, run: GapRun,
                      traces: tuple[CallTrace, CallTrace]) -> None:
        """``mode.eval_broken_before_training`` for a run before training, against the chance
        level (unknown: not judged). A standard BatchNorm whose running statistics are still at
        their init (they catch up in the first steps) is not a broken eval path."""
        if self.chance is None or not math.isfinite(self.chance.value):
            return
        found = first_scale_change(traces[0].calls, traces[1].calls)
        name, kind, scale = (found[0].name, found[0].kind, found[1]) if found else (None, None, None)
        if name is not None:
            try:
                sub = module.get_submodule(name)
            except AttributeError:
                sub = None
            if isinstance(sub, torch.nn.modules.batchnorm._BatchNorm) \
                    and sub.track_running_stats and sub.momentum != 0.0:
                return
        self.add_verdicts(trainer, eval_broken_before_training(
            run, chance=self.chance.value, module=name or None,
            module_kind=kind, scale=scale))

    # ------------------------------------------------------------------ state
    @override
    def extra_state(self) -> dict[str, Any]:
        return {"determinism": self.determinism, "gap_done": self.gap_done,
                "gap_skipped": self.gap_skipped, "initial_loss": self.initial_loss,
                "gap_runs": [[r.step, r.eval_loss, r.train_loss, r.sanity]
                             for r in self.gap_runs]}

    @override
    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.determinism = state.get("determinism", self.determinism)
        self.gap_done = bool(state.get("gap_done", self.gap_done))
        self.gap_skipped = state.get("gap_skipped", self.gap_skipped)
        self.initial_loss = state.get("initial_loss", self.initial_loss)
        self.gap_runs = [GapRun(int(s), float(e), float(t), bool(q))
                         for s, e, t, q in state.get("gap_runs", [])]


__all__ = ["EvalContractCheck"]
