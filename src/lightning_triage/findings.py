"""Findings: the protocol stages, the registry of public finding codes and the `Finding` record.

Pure Python, no Lightning import: a finding can be built, serialized and sorted from a plain
PyTorch loop or a test.

Example:
    >>> from lightning_triage.findings import Finding
    >>> f = Finding.create(
    ...     "init.loss_above_chance",
    ...     message="step-0 loss 33.9 is 14.7x the chance level ln(10) = 2.303",
    ...     check="InitialLossCheck",
    ...     global_step=0,
    ... )
    >>> f.severity, f.stage
    ('error', 'init')
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")

#: The protocol stages, in the order findings are reported and fixed.
STAGES: tuple[str, ...] = (
    "data",
    "init",
    "wiring",
    "overfit",
    "structure",
    "mode",
    "curve",
    "grad",
    "numerics",
)
#: Findings about lightning-triage itself (a check that failed internally). Sorted after the
#: protocol and never chosen as ``start_here``.
META_STAGE = "triage"
#: Context about the run's settings (e.g. ``run.unseeded``): info only, sorted after the
#: protocol, never chosen as ``start_here``.
RUN_STAGE = "run"


@dataclass(frozen=True)
class CodeSpec:
    """What the registry knows of a finding code: its stage, default severity, title and hint."""

    code: str
    severity: Severity
    title: str
    hint: str
    #: When the code fires, in one sentence for the docs (the thresholds are the rule's).
    when: str = ""

    @property
    def stage(self) -> str:
        return self.code.split(".", 1)[0]


def _spec(code: str, severity: Severity, title: str, hint: str, *, when: str = "") -> CodeSpec:
    return CodeSpec(code, severity, title, hint, when)


_SPECS: tuple[CodeSpec, ...] = (
    # 1. data
    _spec("data.nonfinite_input", "error", "Inputs hold NaN/Inf",
          "Find the example indices in the evidence and trace them back through the dataset and "
          "its transforms (a division by zero in normalization, a corrupt file, a missing value)."),
    _spec("data.nonfinite_target", "error", "Targets hold NaN/Inf",
          "Check how targets are read and encoded: missing values, a log of zero, a bad join."),
    _spec("data.unnormalized_input", "warning", "Inputs are far from standardized",
          "Standardize float inputs (subtract the mean, divide by the std of the training set) or "
          "scale pixels to [0, 1] (`x / 255`; `x / 16` for 0-16 digits); raw 0-255 or 0-16 values make "
          "early layers saturate."),
    _spec("data.constant_input", "warning", "An input tensor is the same for every example",
          "The model cannot learn from an input that never changes: check the dataset indexing, "
          "the collate function and transforms that may overwrite the input."),
    _spec("data.target_out_of_range", "error", "Class targets are outside [0, num_classes)",
          "Check the label encoding (labels 1..C instead of 0..C-1?) and the model's class count."),
    _spec("data.class_imbalance", "warning", "One class dominates the targets",
          "Check the sampler and the labels; if the imbalance is real, use class weights or a "
          "balanced sampler and judge the loss against the prior, not uniform chance."),
    _spec("data.repeated_batch", "warning", "The loader yields the same batch again",
          "Check the sampler and the dataset's `__getitem__` (a fixed index, a cached batch)."),
    _spec("data.duplicate_samples", "warning", "A batch holds many identical examples",
          "Check the dataset indexing and the collate function (an example repeated, a "
          "broadcast instead of a stack)."),
    _spec("data.train_val_overlap", "warning", "Training examples reappear in validation",
          "Split the dataset before any augmentation and make sure the validation indices are "
          "disjoint from the training indices."),
    _spec("data.train_val_shift", "warning", "Train and validation inputs differ in statistics",
          "Apply the same preprocessing (normalization, resizing, tokenization) to both splits."),
    _spec("data.label_misalignment", "warning", "Targets look unrelated to the inputs",
          "Check that inputs and labels are indexed together (shuffled separately? sorted "
          "differently? an off-by-one join?)."),
    _spec("data.tiny_input_scale", "warning", "Inputs are far below unit scale",
          "The float inputs are orders of magnitude smaller than standardized values (pixels "
          "divided by their range twice?): check the normalization; standardize with the "
          "training set's mean and std. If the small scale is the data's own, rescaling still "
          "helps the default initializations and learning rates."),
    _spec("data.unknown_batch_structure", "info", "The batch's inputs could not be found",
          "Pass `input_key=` and `target_key=` (a key, an index or a callable) to "
          "`BatchInspector` (or `Triage`) so the data checks can run."),
    _spec("data.worst_errors", "info", "The validation examples with the highest loss",
          "Look at these examples: a confident prediction of another class often means a wrong "
          "label; unreadable or ambiguous inputs point at the data pipeline."),
    # 2. init
    _spec("init.loss_above_chance", "error", "Step-0 loss is far above chance level",
          "Check the output scale (logits multiplied somewhere? a large init?), the label "
          "encoding, and a missing or extra softmax before the loss."),
    _spec("init.loss_below_chance", "warning", "Step-0 loss is far below chance level",
          "A fresh model cannot beat chance: check for labels leaking into the inputs, a loss "
          "scaled down (divided by the batch size twice?) or the wrong loss function. Expected "
          "if the model starts from pretrained weights."),
    _spec("init.chance_unknown", "info", "Chance level unknown",
          "Pass `task=` and `num_classes=` so the step-0 loss can be checked."),
    # 3. wiring
    _spec("wiring.no_grad_params", "error", "Trainable parameters got no gradient",
          "Look for `.detach()`, `torch.no_grad()`, `.item()`/numpy round trips or modules that "
          "are defined but never called in the forward pass."),
    _spec("wiring.zero_grad_params", "warning", "Trainable parameters got exactly zero gradient",
          "Check for dead activations, a multiplication by zero or a mask that blocks the path."),
    _spec("wiring.frozen_params", "info", "Frozen parameters",
          "Expected when fine-tuning; otherwise look for `requires_grad_(False)` or `freeze()`."),
    _spec("wiring.loss_detached", "error", "The loss is not connected to any trainable parameter",
          "The loss was computed from detached tensors: look for `.detach()`, `.item()`, "
          "`torch.no_grad()` or a re-created tensor in `training_step`."),
    _spec("wiring.params_not_in_optimizer", "error", "Parameters get gradients but no optimizer updates them",
          "Pass all trainable parameters to the optimizer in `configure_optimizers` "
          "(`self.parameters()`, not one submodule's)."),
    _spec("wiring.grads_not_zeroed", "error", "Gradients are not zeroed between optimizer steps",
          "Call `optimizer.zero_grad()` once per step (manual optimization: after `opt.step()`; "
          "an `optimizer_zero_grad` override must still zero). To accumulate on purpose, set "
          "`Trainer(accumulate_grad_batches=k)` or step and zero every k batches.",
          when="an optimizer steps on gradients left from before its previous step, not at "
               "regular intervals, in the first steps"),
    _spec("wiring.optimizer_not_stepping", "error", "The optimizer does not move the parameters",
          "See the cause in the evidence: `zero_lr`: check the LR scheduler (its factor at these "
          "steps) and `lr`; `skipped`: `training_step` returns `None` from that step on; "
          "`not_called`: an `optimizer_step` override must call `optimizer.step(closure=...)`; "
          "`no_effect`: `optimizer.step` was replaced or wrapped by something that does nothing.",
          when="5 optimizer steps in a row leave every parameter unchanged (no gradient, zero "
               "LR, a no-op step, a step not reached)"),
    _spec("wiring.params_changed_outside_step", "warning",
          "Parameters change outside the optimizer step",
          "Look for code that writes the weights between steps: a hook or callback re-running "
          "init (`reset_parameters`), `load_state_dict` mid-run, an EMA copied into the live "
          "weights, an in-place edit under `torch.no_grad()` in `forward`. A deliberate "
          "projection (weight clipping) can stay.",
          when="a trainable parameter's norm changes between the end of an optimizer step and "
               "the start of the next, in the first steps"),
    _spec("wiring.frozen_params_changed", "warning", "Frozen parameters change",
          "Leave frozen parameters out of the optimizer (`filter(lambda p: p.requires_grad, "
          "...)`), or let `zero_grad()` set their `.grad` to `None` before freezing; look for "
          "in-place edits of them.",
          when="a parameter with `requires_grad=False` or in no optimizer changes in the first "
               "steps"),
    _spec("wiring.frozen_batchnorm_in_train", "warning",
          "BatchNorm in a frozen part is in training mode",
          "Lightning calls `model.train()` when training starts: put the frozen part in eval "
          "mode in `on_train_epoch_start` (`self.backbone.eval()`), or freeze the statistics "
          "(`track_running_stats=False`).",
          when="running statistics of a layer whose module is frozen move during the first "
               "steps"),
    # 4. overfit
    _spec("overfit.failed", "error", "Could not overfit one small batch",
          "A model that cannot memorize 8 examples has a bug: check the wiring findings, frozen "
          "layers, and a loss bounded away from zero (cross-entropy on probabilities)."),
    _spec("overfit.loss_on_probabilities", "error",
          "The loss applies log-softmax to outputs that are already probabilities",
          "The model's outputs are in [0, 1] and sum to 1 (a softmax in the model) and the "
          "loss (`F.cross_entropy`) applies its own softmax: the loss is bounded away from zero "
          "and its gradients are tiny. Return logits from the model, or use "
          "`F.nll_loss(torch.log(p), y)` on probabilities."),
    _spec("overfit.passed", "info", "Overfit one small batch",
          "The model, loss and optimizer can learn; look at data and curves for the rest."),
    _spec("overfit.inconclusive", "info", "Overfit probe inconclusive",
          "The loss was still falling when the probe's steps or time ran out: raise "
          "`overfit_max_steps`/`max_steps` or `overfit_time_budget`/`time_budget` to decide."),
    _spec("overfit.skipped", "info", "Overfit probe skipped",
          "The detail says why (manual optimization, time budget, no loss); see the check's "
          "arguments to enable it."),
    # 5. structure
    _spec("structure.batch_mixing", "error", "Outputs mix examples of the batch",
          "An operation mixes the batch dimension in eval mode: a softmax/normalization over "
          "dim 0, a wrong `view`/`reshape`, or a transpose of batch and sequence dimensions."),
    _spec("structure.causal_leak", "error", "Outputs see future positions",
          "Check the attention masks (upper triangle masked? its orientation? the encoder's too? "
          "cross-attention to an encoder that saw the whole sequence?) and every sublayer that mixes "
          "positions (convolutions need left padding)."),
    _spec("structure.shape_mismatch", "error", "Prediction and target shapes broadcast silently",
          "Make prediction and target shapes equal before the loss (`pred.squeeze(-1)` a `(N, 1)` "
          "prediction for `(N,)` targets, or `target.view_as(pred)`)."),
    _spec("structure.target_leak", "error", "The targets reach the forward pass",
          "The model's outputs change when only the targets change: feed the decoder the "
          "targets shifted right, and keep labels out of the features."),
    _spec("structure.padding_leak", "warning", "Outputs at real positions depend on the padding",
          "Pass the padding mask to attention (`key_padding_mask`/`attention_mask`), pool over the "
          "real positions only (masked mean), and give padded targets `ignore_index`."),
    _spec("structure.probe_skipped", "info", "Structure probe skipped",
          "Pass `forward_fn=` (callable(pl_module, batch) -> output; `Triage` takes it too) or "
          "`input_key=`/`target_key=` to `StructureProbe` so the probe can run the model."),
    # 6. mode
    _spec("mode.train_mode_in_eval", "warning", "Dropout/BatchNorm in training mode during validation",
          "Do not call `.train()` in validation hooks; Lightning puts the model in eval mode."),
    # 7. curve
    _spec("curve.not_learning", "error", "The loss does not move",
          "The loss stays at its step-0 value: check the learning rate (0?), that the optimizer "
          "steps, that inputs are not all zero and that gradients reach the parameters."),
    _spec("curve.lr_too_low", "warning", "Slow, straight decline: learning rate too low",
          "Raise the learning rate by 10x, or run a learning-rate finder."),
    _spec("curve.lr_too_high", "warning", "Noisy or rising loss: learning rate too high",
          "Lower the learning rate by 3-10x, add warmup, or clip gradients."),
    _spec("curve.diverging", "error", "The loss grows without bound",
          "Lower the learning rate (3-10x), add warmup, clip gradients (`gradient_clip_val`), and "
          "see the numerics and grad findings."),
    _spec("curve.plateau_at_chance", "error", "The loss settled at chance level",
          "The model predicts the prior: look for saturated units (unscaled inputs, too high a "
          "learning rate early on) and dead ReLUs."),
    _spec("curve.loss_spike", "warning", "Loss spike",
          "Look at the batch of that step and the gradient norms just before it; clip gradients."),
    _spec("curve.overfitting", "warning", "Training loss falls while validation loss rises",
          "Add regularization or data, or stop earlier; check train/val distributions."),
    _spec("curve.healthy", "info", "The loss curve looks healthy", "Nothing to do."),
    _spec("curve.no_validation", "info", "No validation loss: overfitting cannot be seen",
          "Give `fit` a validation dataloader and a `validation_step` that returns or logs the "
          "loss (`val_loss`)."),
    _spec("curve.sparse_validation", "info", "Too few validation runs inside the first epochs",
          "Validate more often (`val_check_interval=`, `check_val_every_n_epoch=1`) or widen the "
          "window (`window_epochs=`, `window_steps=`)."),
    # 8. grad
    _spec("grad.exploding", "error", "Gradient norms explode",
          "Lower the learning rate, clip gradients, check the initialization scale and "
          "normalization layers."),
    _spec("grad.vanishing", "warning", "Gradients vanish in early layers",
          "Use ReLU-family activations, residual connections, normalization or a better init."),
    _spec("grad.spike", "warning", "Gradient-norm spike",
          "Clip gradients (see the suggested value) and look at the batch of that step."),
    _spec("grad.dead_units", "warning", "Dead units or layers with zero gradient",
          "Check biases and init that push ReLUs below zero; try LeakyReLU or a lower LR."),
    _spec("grad.update_ratio", "warning", "Update-to-weight ratio far from ~1e-3",
          "Far above: lower the learning rate; far below: raise it (per layer in the evidence)."),
    # 9. numerics
    _spec("numerics.nonfinite_loss", "error", "The loss became NaN/Inf in the loss computation",
          "Every module output was finite: use stable loss functions (`F.cross_entropy` on "
          "logits, `log_softmax`) instead of `log(softmax(z))`, and guard divisions."),
    _spec("numerics.nonfinite_forward", "error", "A module's output became NaN/Inf",
          "Look at the named layer: a division by a zero std, a log of zero, an overflowing exp."),
    _spec("numerics.nonfinite_backward", "error", "A gradient became NaN/Inf in backward",
          "Forward was finite: look for `sqrt`, `pow` or `norm` at zero and divisions whose "
          "derivative blows up; add an epsilon."),
    _spec("numerics.nonfinite_params", "error", "Parameters became NaN/Inf",
          "An update wrote non-finite values: lower the learning rate, clip gradients."),
    _spec("numerics.precision_overflow", "error", "Overflow in reduced precision, finite in float32",
          "Keep the named layer in float32 (autocast disabled), rescale it, or use bf16."),
    _spec("numerics.near_overflow", "warning", "Activations approach the dtype's limit",
          "Rescale the layer or keep it in float32 before it overflows."),
    _spec("numerics.nonfinite_detected", "error", "A NaN/Inf was detected but not localized",
          "Run with `NonFiniteTracer(mode='sync')` (or `Triage(numerics_mode='sync')`) so the "
          "failing step is replayed and the first module, gradient or loss computation is named."),
    # run settings (context)
    _spec("run.unseeded", "info", "No global seed was set",
          "Call `lightning.seed_everything(seed)` (or `seed_everything: <seed>` in LightningCLI) "
          "so a rerun that changes one setting can be compared with this one."),
    # meta
    _spec("triage.check_error", "warning", "A triage check failed internally and was disabled",
          "The training run was not affected. Please report it with the evidence; pass "
          "`strict=True` to raise instead."),
)

#: Every known finding code, with its stage, default severity, title and hint.
CODES: dict[str, CodeSpec] = {spec.code: spec for spec in _SPECS}


def register_code(code: str, severity: Severity, title: str, hint: str) -> CodeSpec:
    """Register a new finding code (codes are never renamed; new ones may be added).

    Raises:
        ValueError: if the code's stage is unknown, the severity is invalid, or the code exists
            with a different definition.
    """
    stage = code.split(".", 1)[0]
    if "." not in code or stage not in (*STAGES, META_STAGE, RUN_STAGE):
        raise ValueError(f"Finding code {code!r} must be `<stage>.<name>` with stage in {STAGES}.")
    if severity not in SEVERITIES:
        raise ValueError(f"`severity` must be one of {SEVERITIES}, got {severity!r}.")
    spec = CodeSpec(code, severity, title, hint)
    if code in CODES and CODES[code] != spec:
        raise ValueError(f"Finding code {code!r} is already registered differently.")
    CODES[code] = spec
    return spec


def stage_index(stage: str) -> int:
    """Position of ``stage`` in the protocol (the meta stage sorts last)."""
    return STAGES.index(stage) if stage in STAGES else len(STAGES)


def _jsonable(value: Any) -> Any:
    """Convert evidence values (numpy/torch scalars, tuples, non-finite floats) to JSON types."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if hasattr(value, "tolist"):  # numpy arrays/scalars, torch tensors
        return _jsonable(value.tolist())
    if hasattr(value, "item"):
        return _jsonable(value.item())
    return str(value)


@dataclass(frozen=True)
class Finding:
    """One diagnosis: what was found, with the numbers, and what to check next.

    Build findings with :meth:`Finding.create`, which checks the code against the registry and
    fills in the default severity, title and hint.

    Example:
        >>> f = Finding.create("init.loss_above_chance", "step-0 loss 34.3 is 14.9x the chance level",
        ...                    check="InitialLossCheck", global_step=0, evidence={"loss": 34.3})
        >>> f.severity, f.stage, f.is_problem
        ('error', 'init', True)
        >>> f.title
        'Step-0 loss is far above chance level'
        >>> Finding.from_dict(f.to_dict()) == f
        True
    """

    code: str
    severity: Severity
    title: str
    message: str
    hint: str
    check: str
    global_step: int | None = None
    epoch: int | None = None
    rank: int = 0
    layer: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    explained_by: list[str] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        code: str,
        message: str,
        *,
        check: str,
        severity: Severity | None = None,
        title: str | None = None,
        hint: str | None = None,
        global_step: int | None = None,
        epoch: int | None = None,
        rank: int = 0,
        layer: str | None = None,
        evidence: Mapping[str, Any] | None = None,
    ) -> Finding:
        """Create a finding for a registered ``code``.

        Raises:
            ValueError: if ``code`` is not registered or ``severity`` is not a known severity.
        """
        spec = CODES.get(code)
        if spec is None:
            raise ValueError(
                f"Unknown finding code {code!r}. Known codes: {', '.join(sorted(CODES))}."
            )
        severity = spec.severity if severity is None else severity
        if severity not in SEVERITIES:
            raise ValueError(f"`severity` must be one of {SEVERITIES}, got {severity!r}.")
        return cls(
            code=code,
            severity=severity,
            title=spec.title if title is None else title,
            message=message,
            hint=spec.hint if hint is None else hint,
            check=check,
            global_step=None if global_step is None else int(global_step),
            epoch=None if epoch is None else int(epoch),
            rank=int(rank),
            layer=layer,
            evidence=_jsonable(dict(evidence or {})),
        )

    @property
    def stage(self) -> str:
        """The protocol stage of the finding (the part of the code before the dot)."""
        return self.code.split(".", 1)[0]

    @property
    def is_problem(self) -> bool:
        """Whether the finding is an error or a warning (not context)."""
        return self.severity != "info"

    def to_dict(self) -> dict[str, Any]:
        """The finding as a JSON-ready dict (the report schema's ``findings[]`` item)."""
        out = asdict(self)
        out["explained_by"] = list(self.explained_by)
        return {key: out[key] for key in _FIELD_ORDER}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """Rebuild a finding from :meth:`to_dict` output (e.g. a checkpoint or report)."""
        values = {key: data[key] for key in _FIELD_ORDER if key in data}
        values["explained_by"] = list(values.get("explained_by") or [])
        return cls(**values)


_FIELD_ORDER = (
    "code", "severity", "title", "message", "hint", "global_step", "epoch", "rank", "layer",
    "evidence", "check", "explained_by",
)


def sort_findings(findings: Sequence[Finding]) -> list[Finding]:
    """Sort by protocol stage, then ``global_step`` (unknown steps last), then severity."""

    def key(f: Finding) -> tuple[int, float, int]:
        step = math.inf if f.global_step is None else f.global_step
        return stage_index(f.stage), step, SEVERITIES.index(f.severity)

    return sorted(findings, key=key)


#: A loss or gradient spike this many steps (or fewer) before a non-finite step or a divergence
#: is the start of that blow-up, not a separate problem.
SPIKE_WINDOW = 10

# Finding codes that name a cause when they are a problem (error or warning). A cause is never
# explained by another finding; the symptoms below are explained by the causes present.
_UPDATE_CAUSES = frozenset({
    "wiring.grads_not_zeroed", "wiring.optimizer_not_stepping",
    "wiring.params_changed_outside_step",
})
_OVERFIT_CAUSES = frozenset({
    "data.nonfinite_input", "data.nonfinite_target", "data.unnormalized_input",
    "data.tiny_input_scale",
    "data.constant_input", "data.target_out_of_range",
    "init.loss_above_chance",
    "wiring.no_grad_params", "wiring.zero_grad_params", "wiring.loss_detached",
    "wiring.params_not_in_optimizer", *_UPDATE_CAUSES,
    "overfit.loss_on_probabilities",
    "structure.batch_mixing", "structure.shape_mismatch",
    "curve.lr_too_low", "curve.lr_too_high", "curve.diverging",
    "grad.vanishing", "grad.update_ratio",
    "numerics.nonfinite_loss", "numerics.precision_overflow",
})
_NOT_LEARNING_CAUSES = frozenset({
    "data.constant_input", "data.tiny_input_scale", "data.nonfinite_input", "data.nonfinite_target",
    "wiring.no_grad_params", "wiring.zero_grad_params", "wiring.loss_detached",
    "wiring.params_not_in_optimizer", *_UPDATE_CAUSES,
    "grad.vanishing", "grad.update_ratio",
    "numerics.nonfinite_loss", "numerics.precision_overflow",
})
# Symptoms of a broken update contract (the cause leads): an optimizer that does not step
# shows as a tiny update ratio; gradients that are never zeroed grow step after step.
_UPDATE_SYMPTOMS: dict[str, frozenset[str]] = {
    "grad.update_ratio": _UPDATE_CAUSES,
    "grad.exploding": frozenset({"wiring.grads_not_zeroed"}),
    "grad.spike": frozenset({"wiring.grads_not_zeroed"}),
    "curve.loss_spike": frozenset({"wiring.grads_not_zeroed"}),
    "curve.lr_too_high": frozenset({"wiring.grads_not_zeroed"}),
    "curve.diverging": frozenset({"wiring.grads_not_zeroed"}),
    "curve.lr_too_low": _UPDATE_CAUSES,
}
# Non-finite findings that mark a blow-up at their step (numerics with a layer are added below).
_BLOW_UPS = frozenset({"curve.diverging", "numerics.nonfinite_loss",
                       "numerics.precision_overflow"})
_SPIKES = frozenset({"curve.loss_spike", "grad.exploding", "grad.spike"})
#: A module that turned inputs below this (largest ``|x|`` of the module outputs before it) into
#: NaN/Inf overflowed by itself (an ``exp``, a division): the module, not the learning rate, is
#: the cause of a divergence at that step.
MODEST_INPUT = 1e4


def _overflowed_by_itself(g: Finding) -> bool:
    """Whether a localized non-finite finding overflowed from modest inputs (see
    :data:`MODEST_INPUT`), or is a precision overflow (finite in float32)."""
    if g.code == "numerics.precision_overflow":
        return True
    if g.code != "numerics.nonfinite_forward" or g.layer is None:
        return False
    frames = g.evidence.get("frames") or []
    peaks = [float(fr.get("max_abs", 0.0)) for fr in frames if isinstance(fr, Mapping)]
    return max(peaks, default=0.0) < MODEST_INPUT


def _names_cause(f: Finding, causes: frozenset[str]) -> bool:
    """Whether ``f`` is a problem in ``causes`` (or a ``numerics.*`` finding with a layer)."""
    if not f.is_problem:
        return False
    return f.code in causes or (f.stage == "numerics" and f.layer is not None)


def _explainers(f: Finding, findings: Sequence[Finding]) -> list[str]:
    """The codes of the findings that explain ``f`` (empty: ``f`` is not explained)."""
    others = [g for g in findings if g is not f and g.code != f.code]
    update = [g for g in others if g.is_problem and g.code in _UPDATE_SYMPTOMS.get(f.code, ())]
    if update:  # a broken update contract explains the symptom before anything else
        found = update
    elif f.code in ("overfit.failed", "overfit.inconclusive"):
        found = [g for g in others if _names_cause(g, _OVERFIT_CAUSES)]
    elif f.code == "curve.not_learning":
        found = [g for g in others if _names_cause(g, _NOT_LEARNING_CAUSES)
                 and (g.code != "grad.update_ratio" or g.evidence.get("direction") == "below")]
    elif f.code == "curve.lr_too_low":
        found = [g for g in others if g.is_problem
                 and g.code in ("grad.vanishing", "data.tiny_input_scale")]
    elif f.code == "curve.diverging" and f.global_step is not None:
        found = [g for g in others if g.is_problem and g.global_step == f.global_step
                 and _overflowed_by_itself(g)]
    elif f.code in _SPIKES and f.global_step is not None:
        found = [g for g in others if _names_cause(g, _BLOW_UPS) and g.global_step is not None
                 and 0 <= g.global_step - f.global_step <= SPIKE_WINDOW
                 and g.code not in _SPIKES]
    else:
        return []
    codes: list[str] = []
    for g in sort_findings(found):
        if g.code not in codes:
            codes.append(g.code)
    return codes


def explain_findings(findings: Sequence[Finding]) -> list[Finding]:
    """Set ``explained_by`` on the symptoms that another finding of the report explains.

    A symptom is a finding whose cause is usually elsewhere; when that cause is in the same
    report, the symptom carries its codes in ``explained_by``, its message says so, and it
    never leads the report (see :func:`start_here`). The rules (documented in docs/report.md):

    - ``overfit.failed`` and ``overfit.inconclusive``: explained by the problems that make one
      batch impossible (or slow) to memorize: non-finite, constant or unscaled inputs, class
      targets out of range, a step-0 loss far above chance, the ``wiring.*`` problems, a loss
      fed probabilities, outputs that mix examples or broadcast against the targets, the
      learning rate (``curve.lr_too_low``, ``curve.lr_too_high``, ``curve.diverging``,
      ``grad.update_ratio``), ``grad.vanishing`` and the localized numerics findings.
    - ``curve.not_learning``: explained by a zero update: the ``wiring.*`` problems, constant
      or non-finite data, ``grad.update_ratio`` far *below* ~1e-3, ``grad.vanishing``, the
      localized numerics findings.
    - ``curve.loss_spike``, ``grad.exploding``, ``grad.spike``: explained by a blow-up (a
      localized numerics finding, ``numerics.nonfinite_loss``, ``curve.diverging``) at the
      same step or at most :data:`SPIKE_WINDOW` steps later.
    - ``grad.update_ratio`` and ``curve.lr_too_low`` (explained by ``wiring.grads_not_zeroed``,
      ``wiring.optimizer_not_stepping`` and ``wiring.params_changed_outside_step``),
      ``grad.exploding``, ``grad.spike``, ``curve.loss_spike``, ``curve.lr_too_high`` and
      ``curve.diverging`` (by ``wiring.grads_not_zeroed``): the update itself is broken.
      These symptoms then name only the wiring codes; the three codes also explain
      ``overfit.failed`` and ``curve.not_learning``.
    - ``curve.lr_too_low``: explained by ``grad.vanishing`` (the early layers barely move,
      whatever the learning rate) and by ``data.tiny_input_scale`` (inputs too small to move
      the first layer).
    - ``curve.diverging``: explained, at its non-finite step, by ``numerics.precision_overflow``
      or by a ``numerics.nonfinite_forward`` whose module overflowed from modest inputs (the
      outputs before it all below :data:`MODEST_INPUT`): an ``exp`` or a division, not weights
      grown by the learning rate.

    Every other finding is a cause or context and is never explained. Explanations are one
    level deep and do not chain; the function is idempotent.

    Example:
        >>> spike = Finding.create("curve.loss_spike", "spike at step 20", check="T",
        ...                        global_step=20)
        >>> nan = Finding.create("numerics.nonfinite_loss", "loss inf", check="T", global_step=23)
        >>> out = explain_findings([spike, nan])
        >>> out[0].explained_by, out[1].explained_by
        (['numerics.nonfinite_loss'], [])
        >>> out[0].message
        'spike at step 20 Explained by `numerics.nonfinite_loss`: fix that first.'
    """
    out: list[Finding] = []
    for f in findings:
        codes = _explainers(f, findings)
        if codes == list(f.explained_by):
            out.append(f)
            continue
        message = f.message.split(_EXPLAINED_PREFIX, 1)[0].rstrip()
        if codes:
            named = ", ".join(f"`{c}`" for c in codes)
            which = "that" if len(codes) == 1 else "those"
            message = f"{message}{_EXPLAINED_PREFIX}{named}: fix {which} first."
        out.append(replace(f, explained_by=codes, message=message))
    return out


_EXPLAINED_PREFIX = " Explained by "


def start_here(findings: Sequence[Finding]) -> str | None:
    """The code of the finding to fix first, or ``None``: cause before symptom, then protocol
    order.

    The first problem (error or warning) in protocol order that no other finding explains
    (see :func:`explain_findings`); if every problem is explained (explanations by findings
    that are not themselves problems cannot happen), the first problem.

    Example:
        >>> failed = Finding.create("overfit.failed", "could not overfit", check="T", global_step=0)
        >>> low = Finding.create("curve.lr_too_low", "slow decline", check="T", global_step=90)
        >>> start_here([failed, low])
        'curve.lr_too_low'
    """
    problems = [f for f in sort_findings(explain_findings(findings))
                if f.is_problem and f.stage in STAGES]
    for f in problems:
        if not f.explained_by:
            return f.code
    return problems[0].code if problems else None
