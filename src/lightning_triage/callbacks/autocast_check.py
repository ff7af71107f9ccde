"""Stage 9 (numerics): under ``*-mixed`` precision, do the layers autocast lowers run in reduced
precision?"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from typing_extensions import override

from lightning_triage._compat import train_step_context
from lightning_triage.callbacks._args import BundleArg, check_batch_keys, check_callable, check_int, passes
from lightning_triage.callbacks._probe import ForwardFn
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.functional.batch import BatchKey
from lightning_triage.functional.precision import AutocastRecorder, autocast_bypassed
from lightning_triage.probing import (
    ProbeUnavailableError,
    UserCodeError,
    copy_first_examples,
    probe_module,
    run_user_step,
)


class AutocastCheck(TriageCallback):
    """Check that autocast lowers what it should under ``*-mixed`` precision.

    At the first training batch, on a copy of the module and of at most ``max_examples``
    examples, the user's ``training_step`` (or ``forward_fn``) runs once in the run's precision
    context while a function mode records every call of the operations autocast runs in
    float16/bfloat16 (``linear``, ``matmul``, ``bmm``, ``einsum``, convolutions, attention) and
    the module running it. Calls that still return float32 ran outside autocast (a block under
    ``torch.autocast(enabled=False)``, a forward in another thread, a custom function casting
    back): ``numerics.autocast_bypassed`` lists their modules with their share of those
    operations' multiply-adds, a warning when they hold half of them or more, info below. Norms,
    softmax and losses, which autocast keeps in float32 by design, are not among the recorded
    operations. Under ``*-true`` precisions and ``32`` the check does nothing. Under manual
    optimization it needs ``forward_fn``. Then idle.

    Lightning runs ``"16-mixed"`` on CPU as bfloat16 autocast; the expected dtype is read from
    the run's own autocast context.

    Args:
        forward_fn: ``callable(pl_module, batch) -> output`` running the model on a batch
            (default: the user's ``training_step``).
        input_key: where the inputs are in a batch the defaults do not understand.
        target_key: where the targets are, likewise.
        max_examples: the probe uses at most this many examples of the first batch.
        strict: raise internal errors instead of disabling the check.

    Raises:
        TriageConfigError: for an invalid argument (named in the message).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(precision="bf16-mixed", callbacks=[AutocastCheck()])

        In LightningCLI YAML::

            trainer:
              precision: bf16-mixed
              callbacks:
                - class_path: lightning_triage.AutocastCheck
    """

    stage: ClassVar[str] = "numerics"
    codes: ClassVar[tuple[str, ...]] = ("numerics.autocast_bypassed",)
    # how `Triage` builds this check (TriageCallback.bundle_args)
    bundle_args: ClassVar[Mapping[str, BundleArg]] = passes(
        "forward_fn", "input_key", "target_key")
    state_key_args = ("input_key", "target_key")

    def __init__(
        self,
        *,
        forward_fn: ForwardFn | None = None,
        input_key: BatchKey | None = None,
        target_key: BatchKey | None = None,
        max_examples: int = 8,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        check_callable("forward_fn", forward_fn, "(pl_module, batch) -> output")
        check_batch_keys(input_key=input_key, target_key=target_key)
        check_int("max_examples", max_examples, 1)
        self.forward_fn = forward_fn
        self.input_key = input_key
        self.target_key = target_key
        self.max_examples = max_examples
        self.probe_seconds: float | None = None

    @override
    @guarded
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.ran or trainer.global_step != 0 or batch_idx != 0:
            self.idle = True
            return
        self.idle = True  # one probe at the first batch of a fit, then nothing per step
        precision = str(trainer.precision)
        if not precision.endswith("-mixed"):
            self.mark_ran(f"precision {precision}: no autocast to check")
            return
        if not pl_module.automatic_optimization and self.forward_fn is None:
            self.mark_ran("skipped: manual optimization (pass `forward_fn=`)")
            return
        start = time.perf_counter()
        try:
            self._probe(trainer, pl_module, batch, precision)
        except UserCodeError as err:
            self.mark_ran(f"skipped: the model raised {err.describe()} on a copy of the batch")
        except ProbeUnavailableError as exc:
            self.mark_ran(f"skipped: {exc}")
        finally:
            self.probe_seconds = time.perf_counter() - start
        self.detail += f"; cost {1000 * self.probe_seconds:.0f} ms"

    def _probe(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
               precision: str) -> None:
        device = trainer.strategy.root_device.type
        with train_step_context(trainer):
            lowered = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) \
                else None
        if lowered is None:
            self.mark_ran(f"precision {precision}: the run's step context enables no autocast "
                          f"on {device}")
            return
        small = copy_first_examples(batch, self.max_examples, self.input_key, self.target_key)
        with probe_module(trainer, pl_module, trainer.optimizers) as probe, \
                AutocastRecorder().attached(probe.module) as recorder:
            run_user_step(trainer, probe.module, small, self.forward_fn)
        calls = recorder.calls
        verdict = autocast_bypassed(calls, precision=precision, lowered=lowered,
                                    step=trainer.global_step)
        self.add_verdicts(trainer, verdict)
        share = f", {verdict.evidence['share']:.0%} of their multiply-adds in float32" \
            if verdict is not None else ""
        self.mark_ran(f"{len(calls)} call(s) of lowered operations under {precision} "
                      f"({str(lowered).replace('torch.', '')}){share}")

    @override
    def extra_state(self) -> dict[str, Any]:
        return {"probe_seconds": self.probe_seconds}

    @override
    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.probe_seconds = state.get("probe_seconds", self.probe_seconds)


__all__ = ["AutocastCheck"]
