"""Stage 5 (structure): do the outputs at the real positions of a padded batch depend on the
padding?"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from torch import Tensor
from typing_extensions import override

from lightning_triage.callbacks._args import (
    BundleArg,
    check_batch_keys,
    check_callable,
    check_int,
    check_number,
    passes,
)
from lightning_triage.callbacks._probe import ForwardFn, ProbeCallback
from lightning_triage.callbacks.base import guarded
from lightning_triage.functional import structure_verdicts as rules
from lightning_triage.functional.batch import BatchKey, split_batch
from lightning_triage.functional.chance import IGNORE_INDEX
from lightning_triage.functional.padding import (
    DEFAULT_PADDING_TOLERANCE,
    PaddingMask,
    Recording,
    find_padding_mask,
    record_outputs,
)
from lightning_triage.functional.padding_probe import (
    PaddingProbeResult,
    declared_max_length,
    probe_padding,
)
from lightning_triage.probing import (
    ProbeUnavailableError,
    UserCodeError,
    eval_copy,
    rng_state,
    set_rng_state,
)


class PaddingProbe(ProbeCallback):
    """Probe, once, whether the outputs at the real positions of a padded batch depend on the
    padding (``structure.padding_leak``).

    At the first training batch, when the batch has a padding mask (found by
    :func:`~lightning_triage.functional.padding.find_padding_mask`: a dict entry named like
    ``attention_mask``/``padding_mask``/``key_padding_mask`` holding a bool or 0/1 tensor of the
    inputs' shape, or targets holding ``ignore_index`` at a padded end of every row), the probe
    runs the user's ``training_step`` (or ``forward_fn``) on a deep copy of the module, in eval
    mode, without gradients, on a copy of the batch (at most ``max_examples`` examples),
    recording every module's output:

    1. twice as is: if the two head outputs differ, the model is not deterministic in eval mode
       and the probe stops (``structure.probe_skipped``, info);
    2. with other token ids (or noise, for float inputs) at the padded positions;
    3. with more padded positions at the padded end (right or left padding).

    If the head output at the real positions (or the pooled head output) moves beyond float
    noise (``tolerance``, relative), the finding names the first module whose output at the real
    positions moved. Without a padding mask the probe does not run and ``checks[].detail`` says
    why. Every RNG is reset before each pass and restored afterwards; the live module, its
    optimizer and the batch are never touched.

    Args:
        padding_mask_key: the batch entry holding the padding mask when it cannot be found by
            name (a key, an index or a callable ``batch -> tensor``); a name containing "pad"
            means true/1 marks padding, any other that true/1 marks a real position.
        forward_fn: ``callable(pl_module, batch) -> output`` running the model's forward on a
            batch; default: ``training_step``. Needed under manual optimization.
        input_key: the batch entry holding the inputs (default: found by name or position).
        target_key: the batch entry holding the targets, likewise.
        max_examples: the probe uses at most this many examples of the batch.
        tolerance: relative change of the head output at the real positions above which the
            padding counts as leaking.
        ignore_index: the target value of padded positions.
        strict: raise internal errors (and errors of the user's code in the probe) instead of
            reporting them.

    Raises:
        TriageConfigError: for an invalid argument (named in the message).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[PaddingProbe(padding_mask_key="mask")])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.PaddingProbe
                  init_args: {padding_mask_key: mask, max_examples: 8}
    """

    stage: ClassVar[str] = "structure"
    codes: ClassVar[tuple[str, ...]] = ("structure.padding_leak",)
    # how `Triage` builds this check (TriageCallback.bundle_args)
    bundle_args: ClassVar[Mapping[str, BundleArg]] = passes(
        "padding_mask_key", "forward_fn", "input_key", "target_key")
    shared_codes: ClassVar[tuple[str, ...]] = ("structure.probe_skipped",)

    state_key_args = ("padding_mask_key", "input_key", "target_key")

    def __init__(
        self,
        *,
        padding_mask_key: BatchKey | None = None,
        forward_fn: ForwardFn | None = None,
        input_key: BatchKey | None = None,
        target_key: BatchKey | None = None,
        max_examples: int = 8,
        tolerance: float = DEFAULT_PADDING_TOLERANCE,
        ignore_index: int = IGNORE_INDEX,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        check_batch_keys(padding_mask_key=padding_mask_key, input_key=input_key,
                         target_key=target_key)
        check_callable("forward_fn", forward_fn, "(pl_module, batch) -> output")
        check_int("max_examples", max_examples, 1)
        check_number("tolerance", tolerance, 0, 1)
        check_int("ignore_index", ignore_index)
        self.padding_mask_key = padding_mask_key
        self.forward_fn = forward_fn
        self.input_key = input_key
        self.target_key = target_key
        self.max_examples = max_examples
        self.tolerance = tolerance
        self.ignore_index = ignore_index
        self.results: dict[str, Any] = {}

    # ------------------------------------------------------------------ hooks
    @override
    @guarded
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.ran or self.results or trainer.global_step != 0 or batch_idx != 0:
            self.idle = True  # the probe runs on the first batch of a fit or not at all
            if not self.ran and not self.detail:
                self.skip(f"not run: the fit started at step {trainer.global_step} (the probe "
                          "runs at the first batch of step 0)")
            return
        start = time.perf_counter()
        error: Exception | None = None
        try:
            ready, why, plan = self._plan(pl_module, batch)
        except Exception as plan_error:  # reported after the decision: no rank left waiting
            ready, why, plan, error = False, None, (), plan_error
        go = ready
        if trainer.world_size > 1:  # the user's code may hold collectives: all ranks or none
            go = bool(trainer.strategy.reduce_boolean_decision(ready, all=True))
        if error is not None:
            raise error
        if not go:
            self.results["skipped"] = why or "another rank could not run it"
            self.skip(f"skipped: {self.results['skipped']}")
            self.idle = True
            return
        try:
            self._probe(trainer, pl_module, *plan)
        except (UserCodeError, ProbeUnavailableError) as err:
            why = (f"the model raised {err.describe()} when run on a perturbed copy of the first "
                   "batch" if isinstance(err, UserCodeError) else str(err))
            self.results["skipped"] = why
            self.add_verdict(trainer, rules.padding_unfinished(why))
            self.mark_ran(f"skipped: {why}")
        finally:
            seconds = time.perf_counter() - start
            self.results["seconds"] = round(seconds, 4)
            self.idle = True
        if self.ran:
            self.detail = f"{self.detail}; cost {1000 * seconds:.0f} ms"

    # ------------------------------------------------------------------ probe
    def _plan(self, pl_module: pl.LightningModule,
              batch: Any) -> tuple[bool, str | None, tuple[Any, Tensor, Tensor | None, PaddingMask]
                                   | tuple[()]]:
        if not pl_module.automatic_optimization and self.forward_fn is None:
            return False, ("manual optimization (running `training_step` would step the "
                           "optimizers); pass `forward_fn=`"), ()
        copied = self._copy(batch)
        x, y = split_batch(copied, self.input_key, self.target_key)
        mask = find_padding_mask(copied, x, y, key=self.padding_mask_key,
                                 ignore_index=self.ignore_index)
        if isinstance(mask, str):
            return False, mask, ()
        assert x is not None
        return True, None, (copied, x, y, mask)

    def _probe(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, x: Tensor,
               y: Tensor | None, mask: PaddingMask) -> None:
        n = x.shape[0]
        self.results.update({"mask": mask.source, "side": mask.side,
                             "padded_positions": int(mask.pad.sum()),
                             "real_positions": int(mask.real.sum()),
                             "shape": list(x.shape[:2])})
        saved = rng_state()
        asked: list[str] = []

        def run(b: Any) -> Recording:
            # a fresh copy per pass, every RNG as at the start: paired passes start alike
            inputs = split_batch(b, self.input_key, self.target_key).inputs
            examples = n if inputs is None else inputs.shape[0]  # fewer rows: a shorter pass
            with eval_copy(trainer, pl_module, saved, factor=1.0) as probe, torch.no_grad(), \
                    warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.results["isolation"] = probe.how
                with record_outputs(probe.module, examples) as rec:
                    self._run(trainer, probe.module, b)
                return rec

        def gate(name: str, ready: bool) -> bool:  # every rank runs the same passes
            asked.append(name)
            if trainer.world_size > 1:
                return bool(trainer.strategy.reduce_boolean_decision(ready, all=True))
            return ready

        room, room_why = self._room(pl_module, x)
        try:
            result = probe_padding(run, batch, x, mask, targets=y,
                                   ignore_index=self.ignore_index, tolerance=self.tolerance,
                                   gate=gate, pass_errors=(UserCodeError,), room=room,
                                   room_why=room_why)
        except BaseException:
            if trainer.world_size > 1:  # answer the decisions this rank will not reach
                for _ in range(len(asked), 4):
                    trainer.strategy.reduce_boolean_decision(False, all=True)
            raise
        finally:
            set_rng_state(saved)
        self.results["forward_passes"] = result.passes
        self.results["noise"] = result.noise
        status = result.status
        self.results["status"] = status
        base = (f"mask {mask.source} ({mask.side or 'mixed'} padding, {int(mask.pad.sum())} "
                f"padded of {mask.pad.numel()} positions); {result.passes} forward passes on "
                f"a copy")
        if status in ("no_head", "unaligned"):
            why = ("no module returned a floating output with the batch's examples on dim 0"
                   if status == "no_head" else
                   f"the head output {tuple(result.shape or [])} is neither per position "
                   f"(dim 1 = {x.shape[1]}) nor pooled `(N, C)`")
            self.add_verdict(trainer, rules.padding_unaligned(why))
            self.mark_ran(f"skipped: {why}")
            return
        if status == "skipped":
            self.mark_ran("skipped: another rank could not run the probe's passes")
            return
        if status == "nondeterministic":
            why, verdict = rules.padding_nondeterministic(
                result.noise if result.noise is not None else math.inf)
            self.add_verdict(trainer, verdict)
            self.mark_ran(f"skipped: {why}")
            return
        leaks = result.leaks
        self.results["failed_passes"] = dict(result.failed)
        base += self._partial(result)
        if not leaks:
            self.mark_ran(f"{base}: no leak (head `{self._label(pl_module, result.head)}`)")
            return
        first = next((leak.first_module for leak in leaks if leak.first_module is not None), None)
        self.add_verdict(trainer, rules.padding_leak(
            self._label(pl_module, result.head), self._label(pl_module, first), result.head or "",
            mask, leaks, result.noise if result.noise is not None else math.nan,
            list(x.shape[:2])))
        self.mark_ran(f"{base}: leak ({', '.join(leak.perturbation for leak in leaks)})")

    @staticmethod
    def _room(pl_module: pl.LightningModule, x: Tensor) -> tuple[int | None, str]:
        """How many positions the model takes beyond the batch's length (``None``: unknown, try).

        Unknown on an accelerator counts as none: an index past a position table there is a
        device-side assert, which ends the process's use of the device, not an exception."""
        limit = declared_max_length(pl_module)
        if limit is not None:
            return limit - x.shape[1], f"the model takes at most {limit} positions"
        if x.device.type != "cpu":
            return 0, f"the model's maximum length is unknown on {x.device.type}"
        return None, ""

    @staticmethod
    def _partial(result: PaddingProbeResult) -> str:
        """The passes that failed and what replaced them, for the detail."""
        text = "".join(f"; the {kind} pass was not run ({why.removeprefix('not run: ')})"
                       if why.startswith("not run: ") else f"; the {kind} pass failed ({why})"
                       for kind, why in result.failed.items())
        if result.fewer is not None:
            text += f"; compared with {result.fewer} fewer padded positions instead"
        return text

    @staticmethod
    def _label(pl_module: pl.LightningModule, name: str | None) -> str:
        if not name:
            return type(pl_module).__name__
        return name

    @override
    def _count_user_call(self) -> None:
        self.results["user_code_calls"] = int(self.results.get("user_code_calls", 0)) + 1

    # ------------------------------------------------------------------ state
    @override
    def extra_state(self) -> dict[str, Any]:
        return {"results": dict(self.results)}

    @override
    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.results = dict(state.get("results", {}))


__all__ = ["PaddingProbe"]
