"""Stage 7 (curve): does the model end above simple baselines (majority, nearest centroid,
linear; the mean predictor for regression)?"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from typing_extensions import override

from lightning_triage.callbacks._args import BundleArg, check_batch_keys, check_int, passes
from lightning_triage.callbacks._shared import loss_from_outputs
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.functional.baselines import (
    Baselines,
    Task,
    as_features,
    below_baseline,
    compute_baselines,
    head_not_class_scores,
    model_score,
    target_task,
)
from lightning_triage.functional.batch import BatchKey, split_batch
from lightning_triage.functional.hooks import HeadCapture
from lightning_triage.functional.objective import StepObjective

#: The model is judged against the baselines from this optimizer step on.
MIN_STEPS = 150


def _host(t: Tensor) -> Tensor:
    return t.detach().to("cpu", copy=True)


class BaselineCheck(TriageCallback):
    """Compute simple baselines on the first batches and compare the model with them.

    On the first ``max_train_batches`` training batches (at most ``max_examples`` examples, kept
    on the host) and the first ``max_val_batches`` validation batches of the first validation
    run, it fits in closed form (no random draw, no effect on the run): for class-index targets
    the majority class, a nearest-centroid and a ridge linear classifier on the inputs flattened
    to vectors; for float targets the mean predictor (and a ridge linear model). At every
    validation run it reads the model's head output on those first validation batches (a
    forward hook, no extra forward) and computes its accuracy (argmax) or mean squared error
    itself, whatever the user logs. When the last validation run (at ``min_steps`` or later) is
    clearly below the best baseline: ``curve.below_baseline``. The baselines are in the report
    (``details.baselines``), one console line and the HTML.

    Skipped, with the reason, when the inputs are not float features of at most 4096 values per
    example or the targets are not class indices or regression values. The model is not compared
    with the classification baselines when its first training step's loss is not one over class
    scores (a triplet or embedding head, in-batch negatives, a loss the watch does not know):
    its head output is an embedding even when it is as wide as the class count.

    Args:
        input_key: where the inputs are in a batch the defaults do not understand.
        target_key: where the targets are, likewise.
        max_train_batches: training batches the baselines are fitted on, at most.
        max_val_batches: validation batches they (and the model) are evaluated on, at most.
        max_examples: examples kept per split, at most.
        min_steps: the model is judged at a validation run at this optimizer step or later.
        strict: raise internal errors instead of disabling the check.

    Raises:
        TriageConfigError: for an invalid argument (named in the message).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[BaselineCheck(max_train_batches=4)])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.BaselineCheck
                  init_args: {max_train_batches: 4}
    """

    stage: ClassVar[str] = "curve"
    codes: ClassVar[tuple[str, ...]] = ("curve.below_baseline",)
    bundle_args: ClassVar[Mapping[str, BundleArg]] = passes("input_key", "target_key")
    state_key_args = ("input_key", "target_key")

    def __init__(self, *, input_key: BatchKey | None = None, target_key: BatchKey | None = None,
                 max_train_batches: int = 8, max_val_batches: int = 4, max_examples: int = 2048,
                 min_steps: int = MIN_STEPS, strict: bool = False) -> None:
        super().__init__(strict=strict)
        check_batch_keys(input_key=input_key, target_key=target_key)
        check_int("max_train_batches", max_train_batches, 1, 1000)
        check_int("max_val_batches", max_val_batches, 1, 1000)
        check_int("max_examples", max_examples, 2, 100_000)
        check_int("min_steps", min_steps, 0)
        self.input_key = input_key
        self.target_key = target_key
        self.max_train_batches = max_train_batches
        self.max_val_batches = max_val_batches
        self.max_examples = max_examples
        self.min_steps = min_steps
        self.baselines: Baselines | None = None
        self.why_not: str | None = None
        self.last: tuple[int, float] | None = None
        self._train: list[tuple[Tensor, Tensor]] = []
        self._val: list[tuple[Tensor, Tensor]] = []
        self._scores: list[tuple[float, int]] = []
        self._widths: set[int] = set()  # the head output's columns (one per class)
        self._capture = HeadCapture()
        self._in_run = False  # this validation run is read (its first batches)
        self._objective = StepObjective()  # the first step's loss: are the outputs class scores?
        #: why the head output is not class scores (the first step's objective), if it is not
        self.not_scores: str | None = None
        self._objective_read = False

    # ------------------------------------------------------------------ collection
    def _pair(self, batch: Any) -> tuple[Tensor, Tensor] | str:
        x, y = split_batch(batch, self.input_key, self.target_key)
        if x is None or y is None:
            return "no input and target tensors found in the batch"
        feats, why = as_features(x)
        task, why_y = target_task(y, int(x.shape[0]) if x.dim() else 0)
        if feats is None or task is None:
            return str(why or why_y)
        return x, y

    def _kept(self, rows: list[tuple[Tensor, Tensor]]) -> int:
        return sum(int(x.shape[0]) for x, _ in rows)

    @override
    @guarded
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if not self._objective_read and batch_idx == 0 and trainer.global_step == 0 \
                and self.why_not is None:
            self._objective.start(pl_module)  # which loss the step calls
        if self.why_not is not None or self.baselines is not None \
                or len(self._train) >= self.max_train_batches \
                or self._kept(self._train) >= self.max_examples:
            return
        pair = self._pair(batch)
        if isinstance(pair, str):
            self._give_up(pair)
            return
        room = self.max_examples - self._kept(self._train)
        self._train.append((_host(pair[0][:room]), _host(pair[1][:room])))

    @override
    @guarded
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           loss: Tensor) -> None:
        self._objective.stop(loss)

    @override
    @guarded
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: STEP_OUTPUT, batch: Any, batch_idx: int) -> None:
        if self._objective_read:
            return
        self._objective_read = True
        loss = loss_from_outputs(outputs, pl_module, trainer) if self._objective.active else None
        objective = self._objective.finish(None if loss is None else float(loss))
        self.not_scores = head_not_class_scores(objective)

    @override
    def needs_hook(self, hook: str) -> bool:
        if hook in ("on_before_backward", "on_train_batch_end"):  # the first step's objective
            return not self._objective_read and not self.idle
        return super().needs_hook(hook)

    def _give_up(self, why: str) -> None:
        self.why_not = why
        self._train, self._val = [], []
        self._close()
        self.skip(f"skipped: {why}")
        self.idle = True

    def _judging(self, trainer: pl.Trainer) -> bool:
        return self.why_not is None and not trainer.sanity_checking \
            and trainer.state.fn == "fit"

    @override
    @guarded
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close()
        self._scores, self._widths = [], set()
        self._in_run = False
        if not self._judging(trainer) or (not self._train and self.baselines is None):
            return
        self._in_run = True
        self._capture.start(pl_module, None)
        if self._capture.traced:
            self._give_up("the LightningModule is compiled as a whole: capturing its outputs "
                          "would change the compiled graph")

    @override
    @guarded
    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                  batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._capture.take()  # an output of another forward than this batch's

    @override
    @guarded
    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                outputs: STEP_OUTPUT, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        if not self._capture.active or dataloader_idx != 0:
            return
        output = self._capture.take()
        if batch_idx >= self.max_val_batches:
            self._close()
            return
        pair = self._pair(batch)
        if isinstance(pair, str):
            return
        x, y = pair
        if self.baselines is None and self._kept(self._val) < self.max_examples:
            self._val.append((_host(x), _host(y)))
        task: Task = "regression" if y.is_floating_point() else "classification"
        if output is None:
            return
        score = model_score(output, y, task)
        if score is not None:
            self._scores.append(score)
            self._widths.add(int(output.shape[1]) if output.dim() == 2 else 0)

    @override
    @guarded
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._in_run or self.why_not is not None:
            return
        self._in_run = False
        self._close()
        if self.baselines is None:
            self._fit_baselines()
        if self.baselines is None:
            return
        total, n = sum(s for s, _ in self._scores), sum(c for _, c in self._scores)
        if self.baselines.task == "classification" and self.not_scores is not None:
            self.mark_ran(f"baselines {self._describe()}; {self.not_scores}")
            return
        if self.baselines.task == "classification" and self._widths != {self.baselines.classes}:
            # an embedding or another head than one logit per class: argmax means nothing
            self.mark_ran(f"baselines {self._describe()}; the head output has "
                          f"{sorted(self._widths)} column(s) for {self.baselines.classes} "
                          "classes: the model is not compared")
            return
        if n == 0:
            self.mark_ran(f"baselines {self._describe()}; the model's output does not fit the "
                          "targets (no accuracy or MSE computed)")
            return
        metric = total / n  # accuracy, or the mean squared error
        self.last = (trainer.global_step, metric)
        self._judge(trainer, pl_module)

    def _fit_baselines(self) -> None:
        if not self._train or not self._val:
            return
        x, y = torch.cat([t for t, _ in self._train]), torch.cat([t for _, t in self._train])
        xv, yv = torch.cat([t for t, _ in self._val]), torch.cat([t for _, t in self._val])
        self._train, self._val = [], []
        found = compute_baselines(x, y, xv[: self.max_examples], yv[: self.max_examples])
        if isinstance(found, str):
            self._give_up(found)
            return
        self.baselines = found

    def _judge(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.baselines is None or self.last is None:
            return
        step, metric = self.last
        self.findings = [f for f in self.findings if f.code != "curve.below_baseline"]
        name = "accuracy" if self.baselines.task == "classification" else "MSE"
        self.mark_ran(f"baselines {self._describe()}; model {name} {metric:.3g} at step {step}")
        if step < self.min_steps:
            return
        share, sentence = _frozen(pl_module)
        verdict = below_baseline(metric, self.baselines, step=step, extra=sentence)
        if verdict is not None:
            self.add_verdict(trainer, verdict, frozen_share=round(share, 4))

    def _describe(self) -> str:
        b = self.baselines
        if b is None:
            return "not computed"
        shown = ", ".join(f"{k.replace('_', '-')} {v:.3g}" for k, v in b.scores.items())
        return f"({b.metric}: {shown}; {b.milliseconds:.0f} ms)"

    @override
    @guarded
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close()
        if not self.ran and not self.detail:
            self.skip("skipped: no validation run after a training batch in this fit")

    # ------------------------------------------------------------------ report and state
    @override
    def report_details(self) -> dict[str, Any]:
        if self.baselines is None:
            return {}
        info: dict[str, Any] = {"values": self.baselines.to_json()}
        if self.last is not None:
            info["model"] = {"step": self.last[0], "value": self.last[1]}
        return {"baselines": info}

    def _close(self) -> None:
        self._capture.close()
        self._objective.close()

    @override
    def remove_handles(self) -> None:
        super().remove_handles()
        self._close()

    @override
    def extra_state(self) -> dict[str, Any]:
        return {"baselines": None if self.baselines is None else self.baselines.to_json(),
                "why_not": self.why_not, "last": None if self.last is None else list(self.last),
                "not_scores": self.not_scores}

    @override
    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        found = state.get("baselines")
        if isinstance(found, Mapping):
            values = {k: v for k, v in found.items() if k != "metric"}
            self.baselines = Baselines(**values)
        self.why_not = state.get("why_not", self.why_not)
        last = state.get("last")
        self.last = (int(last[0]), float(last[1])) if last else self.last
        self.not_scores = state.get("not_scores", self.not_scores)
        self._objective_read = True  # a resumed run does not read it again

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_capture"] = HeadCapture()
        state["_objective"] = StepObjective()
        state["_train"], state["_val"], state["_scores"], state["_widths"] = [], [], [], set()
        return state


def _frozen(pl_module: pl.LightningModule) -> tuple[float, str]:
    """The share of parameters frozen (``requires_grad=False``), and a sentence saying it."""
    total = frozen = 0
    for p in pl_module.parameters():
        total += p.numel()
        frozen += 0 if p.requires_grad else p.numel()
    share = frozen / total if total else 0.0
    if frozen == 0:
        return share, ""
    return share, (f" {100 * share:.0f}% of the parameters are frozen (`requires_grad=False`)"
                   + (": the part that learns may be too small." if share >= 0.5 else "."))


__all__ = ["BaselineCheck"]
