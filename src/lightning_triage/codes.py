"""The registry's table of finding codes: one :class:`CodeSpec` per public code (stage, default
severity, title, hint, when it fires, how its fix is verified).

Pure Python, no Lightning import. :mod:`lightning_triage.findings` builds the registry
(``CODES``) from :data:`SPECS` and holds the :class:`~lightning_triage.findings.Finding` record;
this module is its table alone, in protocol order (moved out of ``findings.py`` by issue 33 to
keep each module under the size limit: a new code is one ``_spec(...)`` entry here).

Example:
    >>> next(s for s in SPECS if s.code == "init.loss_above_chance").stage
    'init'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")
#: How a code's fix is verified on a copy of the run (docs/remedies.md): ``"lr_down"`` (every
#: param group's learning rate divided, the first replayed steps run again), ``"lr_up"`` (the
#: learning rate multiplied), ``"float32_replay"`` (the non-finite tracer's float32 replay of the
#: failing step is the verification), ``"causal"`` (the finding's own probe is already an
#: experiment on a copy: nothing to add), ``"none"`` (no mechanical remedy yet). The other
#: replayed ones: ``"lr_down_clip"`` (the learning rate divided *and* the gradients clipped at
#: the median norm the replay saw), ``"standardize_input"`` (the main input standardized per
#: channel with the recorded batches' statistics), ``"zero_grads"`` (the gradients zeroed before
#: every backward), ``"add_params"`` (the parameters no optimizer holds added to a param group),
#: ``"realign_labels"`` (the batch's labels moved by the offset the structure probe found).
#: The mode stage's, tried by the check at its probe: ``"eval_mode"`` (the validation path with
#: every layer in eval mode), ``"gate_dropout"`` (its dropout calls gated on the mode).
RemedyKind = Literal["lr_down", "lr_up", "lr_down_clip", "standardize_input", "zero_grads",
                     "add_params", "realign_labels", "eval_mode", "gate_dropout",
                     "float32_replay", "causal", "none"]
REMEDY_KINDS: tuple[RemedyKind, ...] = ("lr_down", "lr_up", "lr_down_clip", "standardize_input",
                                        "zero_grads", "add_params", "realign_labels",
                                        "eval_mode", "gate_dropout", "float32_replay", "causal",
                                        "none")


@dataclass(frozen=True)
class CodeSpec:
    """What the registry knows of a finding code: its stage, default severity, title, hint and
    when it fires. The registry is the one source of a code: the docs' code tables are generated
    from it (``docs/make_code_tables.py``)."""

    code: str
    severity: Severity
    title: str
    hint: str
    #: When the code fires, in one sentence for the docs (the thresholds are the rule's).
    when: str = ""
    #: How its fix is verified on a copy (:data:`RemedyKind`; docs/remedies.md).
    remedy: RemedyKind = "none"

    @property
    def stage(self) -> str:
        return self.code.split(".", 1)[0]


def _spec(code: str, severity: Severity, title: str, hint: str, *, when: str = "",
          remedy: RemedyKind = "none") -> CodeSpec:
    return CodeSpec(code, severity, title, hint, when, remedy)


_SPECS: tuple[CodeSpec, ...] = (
    # 1. data
    _spec("data.nonfinite_input", "error", "Inputs hold NaN/Inf",
          "The model's inputs must be finite: find the example indices in the evidence and trace "
          "them back through the dataset and its transforms (a division by zero in normalization, a "
          "corrupt file, a missing value).",
          when="An input tensor of an inspected batch (or of the batch of a non-finite step) holds NaN/Inf "
               "(other tensors than the main input and the targets: NaN only, an attention mask holds "
               "`-inf` on purpose)."),
    _spec("data.nonfinite_target", "error", "Targets hold NaN/Inf",
          "Check how targets are read and encoded: missing values, a log of zero, a bad join.",
          when="The targets of an inspected batch (or of the batch of a non-finite step) hold NaN/Inf."),
    _spec("data.unnormalized_input", "warning", "Inputs are far from standardized",
          "Standardize float inputs (subtract the mean, divide by the std of the training set) or "
          "scale pixels to [0, 1] (`x / 255`; `x / 16` for 0-16 digits); raw 0-255 or 0-16 values make "
          "early layers saturate.",
          when="The main float input of a training batch has a root mean square above `max_rms` (4.0), or "
               "every value below 0.1 in magnitude with rms < 0.01; integer inputs (token ids) are never "
               "reported.",
          remedy="standardize_input"),
    _spec("data.constant_input", "warning", "An input tensor is the same for every example",
          "The model cannot learn from an input that never changes: check the dataset indexing, "
          "the collate function and transforms that may overwrite the input.",
          when="The main input is identical for every example of a batch of 2+ examples (a constant "
               "feature, such as a black border pixel, is normal and not reported)."),
    _spec("data.target_out_of_range", "error", "Class targets are outside [0, num_classes)",
          "Check the label encoding (labels 1..C instead of 0..C-1?) and the model's class count.",
          when="Integer class targets lie outside `[0, C)` (other than `ignore_index`), `C` being "
               "`num_classes` or the class dimension of the model's output on the first batch."),
    _spec("data.class_imbalance", "warning", "One class dominates the targets",
          "Batches of a single class: shuffle the training loader (`shuffle=True` or a shuffling "
          "sampler). One class dominating: check the sampler and the labels; if the imbalance is real, "
          "use class weights or a balanced sampler and judge the loss against the class prior, not "
          "uniform chance.",
          when="Over 64+ integer training targets, one class holds 50% of them (90% with 2 classes), or "
               "half of the batches hold a single class where a shuffled loader would rarely give one."),
    _spec("data.repeated_batch", "warning", "The loader yields the same batch again",
          "Check the sampler and the dataset's `__getitem__` (a fixed index, a cached batch).",
          when="A training batch is identical, example for example, to an earlier batch of the same epoch "
               "(batches that recur across epochs are normal)."),
    _spec("data.duplicate_samples", "warning", "A batch holds many identical examples",
          "Check the dataset indexing and the collate function (an example repeated, a "
          "broadcast instead of a stack).",
          when="At least `duplicate_fraction` (50%) of the examples of a batch of 8+ examples repeat "
               "another example of the batch."),
    _spec("data.train_val_overlap", "warning", "Training examples reappear in validation",
          "Split the dataset before any augmentation and make sure the validation indices are "
          "disjoint from the training indices.",
          when="At least 5 validation examples, and 1% of the distinct validation examples seen, equal a "
               "training example seen (by fingerprint)."),
    _spec("data.train_val_shift", "warning", "Train and validation inputs differ in statistics",
          "Apply the same preprocessing (normalization, scaling, resizing, tokenization) to both "
          "splits.",
          when="Per-feature statistics of the main float input differ between training and validation "
               "batches: median standardized mean difference above 0.5, or median std ratio above 2."),
    _spec("data.val_outlier", "warning", "A validation example lies far outside the training data",
          "Look at that example's feature in the validation preprocessing: a standardization that "
          "divides by a per-feature std clamped to a tiny value (a feature constant in training, "
          "such as a border pixel, explodes wherever validation has a non-zero value there), a "
          "unit or scale that differs, a corrupt value. Divide by `std` where it is positive and "
          "by 1 elsewhere.",
          when="A value of the validation inputs seen lies at least 1000 training scales from its "
               "feature's training mean (the scale: the feature's training std, at least the "
               "median training std over the features), with 64+ training and 32+ "
               "validation examples seen."),
    _spec("data.label_misalignment", "warning", "Targets look unrelated to the inputs",
          "Check that inputs and labels are indexed together (shuffled separately? sorted "
          "differently? an off-by-one join?). A genuinely near-unpredictable task looks the same: "
          "then ignore this.",
          when="Neither a 1-nearest-neighbour nor a nearest-centroid probe on up to 1024 training examples "
               "beats 100 label permutations by 3.5 standard deviations."),
    _spec("data.tiny_input_scale", "warning", "Inputs are far below unit scale",
          "The float inputs are orders of magnitude smaller than standardized values (pixels "
          "divided by their range twice?): check the normalization; standardize with the "
          "training set's mean and std. If the small scale is the data's own, rescaling still "
          "helps the default initializations and learning rates.",
          when="The main float input is non-negative, holds 64+ values per example and stays below 0.1 "
               "with rms below 0.05 (intensities scaled down twice); signed signals and few-feature "
               "tabular data stay silent.",
          remedy="standardize_input"),
    _spec("data.short_batches", "warning", "The loader delivers fewer examples than its batch size",
          "Check the `collate_fn` and any processor after the sampler (a transform of whole "
          "batches, `on_after_batch_transfer`) for code that drops, filters or merges examples. "
          "If dropping is deliberate (corrupt samples filtered out), filter in the dataset "
          "instead, or keep in mind that the effective batch size (and the gradient noise) "
          "differs from the configured one.",
          when="Training batches that are not the loader's last hold fewer examples than its "
               "`batch_size` (info when only some of the first batches do); packed sequences "
               "count the examples their `position_ids` (or `cu_seq_lens`) hold."),
    _spec("data.shared_worker_rng", "warning", "DataLoader workers share one random generator",
          "Give each worker its own generator: create or reseed it in the worker, from "
          "`torch.utils.data.get_worker_info().seed` (in `__getitem__`/`__iter__`, or in a "
          "`worker_init_fn` that sets `get_worker_info().dataset.<attribute>`), or draw from "
          "`torch`'s global generator, which PyTorch reseeds in every worker and epoch. "
          "`seed_everything(workers=True)` reseeds only the global generators, not those your "
          "objects own.",
          when="A training loader with `num_workers > 0` whose dataset (or a transform it holds) "
               "owns a generator object that per-example code reads and nothing reseeds per worker "
               "(info with a `worker_init_fn` that does not name it)."),
    _spec("data.ranks_same_data", "error", "Every rank trains on the same examples",
          "Give each rank its own shard: keep `use_distributed_sampler=True` (the default) with a "
          "standard sampler, or build a `DistributedSampler(dataset, num_replicas=world_size, "
          "rank=global_rank)` yourself (inside a custom batch sampler too); an `IterableDataset` "
          "must split its stream by `torch.distributed.get_rank()` (and by worker).",
          when="Under several ranks, the first training batches of every rank hold the same "
               "examples (compared by fingerprint at fit start)."),
    _spec("data.ranks_overlap", "warning", "Ranks train on overlapping examples",
          "Every rank's `DistributedSampler` must use the same `seed` (and the same "
          "`num_replicas`) so that their shards are disjoint parts of one permutation; do not "
          "derive the seed from the rank or the time.",
          when="Under several ranks, at least 10% of the distinct examples of the first training "
               "batches were seen by another rank too (more than the dataset's own duplicates "
               "explain), or the ranks' distributed samplers hold different seeds."),
    _spec("data.order_not_reshuffled", "warning", "The training order does not change between epochs",
          "Call `set_epoch(epoch)` on the distributed sampler at each epoch start (Lightning does "
          "it only for `loader.sampler` and `loader.batch_sampler.sampler`: expose it there, or "
          "call it in `on_train_epoch_start`), or draw the order from the epoch.",
          when="Under several ranks, the first training batches of the second epoch repeat those "
               "of the first in the same order on every rank, though a sampler of the loader "
               "shuffles."),
    _spec("data.ranks_uneven_batches", "error", "Ranks take different numbers of batches per epoch",
          "Give every rank the same number of batches: a `DistributedSampler` pads the shards "
          "to equal length (`drop_last=False`) or drops the remainder (`drop_last=True`); a "
          "dataset sharded by hand must do the same, and an `IterableDataset` must yield the "
          "same number of batches on every rank.",
          when="Under several ranks, the ranks' training loaders hold different numbers of "
               "batches per epoch (compared at the start of training; sized loaders only)."),
    _spec("data.unknown_batch_structure", "info", "The batch's inputs could not be found",
          "Pass `input_key=` and `target_key=` (a key, an index or a callable) to "
          "`BatchInspector` (or `Triage`) so the data checks can run.",
          when="The inputs (or targets) could not be found in the batch, so the data checks cannot run."),
    _spec("data.worst_errors", "info", "The validation examples with the highest loss",
          "Look at these examples: a confident prediction of another class often means a wrong "
          "label; unreadable or ambiguous inputs point at the data pipeline.",
          when="At the end of each validation run (info, not a bug): the validation examples with the "
               "highest loss, with labels, predictions and confidence."),
    # 2. init
    _spec("init.loss_above_chance", "error", "Step-0 loss is far above chance level",
          "Check the output scale (logits multiplied somewhere? a large init or temperature?), "
          "the label encoding, and a missing or extra softmax before the loss; for regression, "
          "the output scale, the target scale (standardize regression targets) and the loss "
          "reduction.",
          when="Classification: the step-0 loss is above `above_ratio` (2) x the chance level and more "
               "than 0.5 nats above it; regression: above 10x the largest baseline."),
    _spec("init.loss_below_chance", "warning", "Step-0 loss is far below chance level",
          "A fresh model cannot beat chance: check for labels leaking into the inputs, a loss "
          "scaled down (divided by the batch size twice?) or the wrong loss function. Expected "
          "if the model starts from pretrained weights.",
          when="Classification: the step-0 loss is below `below_ratio` (0.5) x min(chance, prior entropy); "
               "regression: below 0.1x the smallest baseline."),
    _spec("init.chance_unknown", "info", "Chance level unknown",
          "Pass `task=` and `num_classes=` so the step-0 loss can be checked.",
          when="The task or the class count could not be inferred, so the step-0 loss has nothing to be "
               "compared with."),
    # 3. wiring
    _spec("wiring.no_grad_params", "error", "Trainable parameters got no gradient",
          "Look for `.detach()`, `torch.no_grad()`, `.item()`/numpy round trips or modules that "
          "are defined but never called in the forward pass.",
          when="Trainable parameters whose `.grad` stayed `None` after the first batch's backward(s)."),
    _spec("wiring.zero_grad_params", "warning", "Trainable parameters got exactly zero gradient",
          "Check for dead activations, a multiplication by zero or a mask that blocks the path.",
          when="Trainable parameters whose gradient after the first batch's backward(s) is exactly zero "
               "everywhere."),
    _spec("wiring.frozen_params", "info", "Frozen parameters",
          "Expected when fine-tuning; otherwise look for `requires_grad_(False)` or `freeze()`.",
          when="Parameters with `requires_grad=False`, counted per module (info)."),
    _spec("wiring.loss_detached", "error", "The loss is not connected to any trainable parameter",
          "The loss was computed from detached tensors: look for `.detach()`, `.item()`, "
          "`torch.no_grad()` or a re-created tensor in `training_step`.",
          when="The loss has no `grad_fn`, or the first batch's backward(s) reached no trainable "
               "parameter."),
    _spec("wiring.params_not_in_optimizer", "error", "Parameters get gradients but no optimizer updates them",
          "Pass all trainable parameters to the optimizer in `configure_optimizers` "
          "(`self.parameters()`, not one submodule's), or add the missing ones to a param group.",
          when="Parameters receive gradients but are in no param group of `trainer.optimizers`.",
          remedy="add_params"),
    _spec("wiring.unregistered_params", "error",
          "Tensors train the loss but are not parameters of the module",
          "Keep layers in `nn.ModuleList` / `nn.ModuleDict` (or `nn.Sequential`), not a plain "
          "`list`, `dict` or `tuple`, and weights as `nn.Parameter` attributes (or in "
          "`nn.ParameterList` / `nn.ParameterDict`): then `parameters()`, the optimizer, "
          "`.to(device)` and `state_dict()` see them.",
          when="Leaf tensors of the first batch's loss graph that require grad are neither "
               "parameters nor buffers of the LightningModule, and are kept in its attributes "
               "(named by attribute path) or are `nn.Parameter` objects; a warning when every "
               "optimizer holds them (they train but are not saved)."),
    _spec("wiring.frozen_at_init", "warning", "A frozen part still holds its random initialization",
          "Load the pretrained weights before freezing (check the `load_state_dict` keys and "
          "its `missing_keys`), or unfreeze the part: remove the leftover `requires_grad_(False)` "
          "/ `freeze()`, and with an adapter library declare the new head trainable (peft: "
          "`task_type=` or `modules_to_save=[...]`).",
          when="At the first backward, frozen (`requires_grad=False`, in no optimizer) weights of "
               "`Linear`, `Conv*`, `Embedding` or recurrent layers are statistically what the "
               "layer's `reset_parameters` draws (uniform within the bound `1/sqrt(fan_in)` with "
               "uniform moments; `Embedding`: N(0, 1)) and no trainable tensor holds the same "
               "values (an EMA or target copy)."),
    _spec("wiring.grads_not_zeroed", "error", "Gradients are not zeroed between optimizer steps",
          "Call `optimizer.zero_grad()` once per step (manual optimization: after `opt.step()`; "
          "an `optimizer_zero_grad` override must still zero). To accumulate on purpose, set "
          "`Trainer(accumulate_grad_batches=k)` or step and zero every k batches.",
          when="An optimizer steps on gradients left from before its previous step, not at "
               "regular intervals, in the first steps.",
          remedy="zero_grads"),
    _spec("wiring.optimizer_not_stepping", "error", "The optimizer does not move the parameters",
          "See the cause in the evidence: `zero_lr`: check the LR scheduler (its factor at these "
          "steps) and `lr`; `skipped`: `training_step` returns `None` from that step on; "
          "`not_called`: an `optimizer_step` override must call `optimizer.step(closure=...)`; "
          "`no_effect`: `optimizer.step` was replaced or wrapped by something that does nothing.",
          when="5 optimizer steps in a row leave every parameter unchanged (no gradient, zero "
               "LR, a no-op step, a step not reached)."),
    _spec("wiring.params_changed_outside_step", "warning",
          "Parameters change outside the optimizer step",
          "Look for code that writes the weights between steps: a hook or callback re-running "
          "init (`reset_parameters`), `load_state_dict` mid-run, an EMA copied into the live "
          "weights, an in-place edit under `torch.no_grad()` in `forward`. A deliberate "
          "projection (weight clipping) can stay.",
          when="A trainable parameter's norm changes between the end of an optimizer step and "
               "the start of the next, in the first steps."),
    _spec("wiring.frozen_params_changed", "warning", "Frozen parameters change",
          "Leave frozen parameters out of the optimizer (`filter(lambda p: p.requires_grad, "
          "...)`), or let `zero_grad()` set their `.grad` to `None` before freezing; look for "
          "in-place edits of them.",
          when="A parameter with `requires_grad=False` or in no optimizer changes in the first "
               "steps."),
    _spec("wiring.frozen_late", "warning", "Parameters were frozen after they had trained",
          "Freeze before the first optimizer step: call the freezing code (`requires_grad_(False)`, "
          "`_freeze_stages()`) in `__init__`, `configure_model` or `setup`, not only in a `train()` "
          "override (Lightning first calls `train()`/`eval()` at the first validation) or a later "
          "hook; put frozen BatchNorm layers in eval mode from the start too. Reload the weights "
          "they had before training if they are pretrained.",
          when="Parameters trainable (and held by an optimizer) at the first training batch have "
               "`requires_grad=False` later (seen at a batch start in the first steps, an epoch "
               "start or a validation end) after optimizer steps changed their norms; info when "
               "they trained for more than one full epoch first (a freeze schedule), silent for "
               "parameters frozen before the first step and for schedules that unfreeze."),
    _spec("wiring.frozen_batchnorm_in_train", "warning",
          "BatchNorm in a frozen part is in training mode",
          "Lightning calls `model.train()` when training starts: put the frozen part in eval "
          "mode in `on_train_epoch_start` (`self.backbone.eval()`), or freeze the statistics "
          "(`track_running_stats=False`).",
          when="Running statistics of a layer whose module is frozen move during the first "
               "steps."),
    # 4. overfit
    _spec("wiring.replicas_differ", "error", "The ranks hold different parameters",
          "Something changes the parameters on some ranks only: an update outside the wrapped "
          "model's forward/backward on one rank (a hook, an EMA, a `torch.no_grad()` edit under "
          "`if trainer.is_global_zero`), a step skipped or clipped on one rank only, a "
          "rank-dependent initialization after the model was wrapped. Make every rank take the "
          "same decisions (`trainer.strategy.reduce_boolean_decision`, `broadcast`).",
          when="Under several ranks, a parameter's checksum (its sum and norm) differs "
               "between ranks at fit start, after the first optimizer step or at a periodic "
               "check."),
    _spec("wiring.buffers_differ", "warning", "The ranks hold different buffers",
          "A buffer that some ranks update differently: make the update the same on every rank, "
          "or broadcast it. Batch-norm running statistics differ by design without "
          "`SyncBatchNorm` (`Trainer(sync_batchnorm=True)`): each rank normalizes with its own "
          "batch, and evaluation uses rank 0's statistics.",
          when="Under several ranks, a buffer's checksum differs between ranks (info when only "
               "batch-norm running statistics differ, or when DDP overwrites the buffers with "
               "rank 0's at each forward: `broadcast_buffers=True`)."),
    _spec("overfit.failed", "error", "Could not overfit one small batch",
          "A model that cannot memorize 8 examples has a bug: check the wiring findings, frozen "
          "layers, and a loss bounded away from zero (cross-entropy on probabilities).",
          when="The probe's loss on one small batch stopped above the target: a plateau, a known floor, a "
               "non-finite or rising loss, a loss that never moved, or `max_steps` ran out with the loss "
               "not halved."),
    _spec("overfit.loss_on_probabilities", "error",
          "The loss applies its own softmax or sigmoid to outputs that are already probabilities",
          "Cross-entropy gets probabilities (a softmax in the model, or in the loss code "
          "before `F.cross_entropy`) and applies its own softmax: the loss is bounded away "
          "from zero and its gradients are tiny. Pass logits to `F.cross_entropy` (remove the "
          "extra softmax), or use `F.nll_loss(torch.log(p), y)` on probabilities. Likewise "
          "`BCEWithLogitsLoss` / `binary_cross_entropy_with_logits` takes logits: remove the "
          "`nn.Sigmoid` before it, or use `BCELoss` on probabilities.",
          when="The step-0 loss equals `F.cross_entropy` of probabilities: the model's outputs (in [0, 1], "
               "summing to 1), or the softmax of its logits taken in the loss code (a double softmax); "
               "or it equals `binary_cross_entropy_with_logits` of probabilities (outputs in [0, 1], or "
               "the sigmoid of the logits) and the overfit probe then stalls on that loss's floor "
               "(binary and multilabel targets)."),
    _spec("overfit.passed", "info", "Overfit one small batch",
          "The model, loss and optimizer can learn; look at data and curves for the rest.",
          when="The probe's loss reached the target, or settled on a floor above it while every probed "
               "example is predicted right (never a probability floor) (info)."),
    _spec("overfit.loss_floor", "warning", "The loss has a floor near chance level",
          "The model memorizes the probed examples (every one predicted right) but the loss "
          "cannot fall below the floor: look for what bounds it besides the model, such as "
          "`label_smoothing` far above ~0.1, a penalty term with a huge coefficient (on the "
          "logits or the weights), or soft targets close to uniform (a distillation teacher "
          "never loaded, a temperature too high).",
          when="The overfit probe predicts every example right while its loss settles on a floor "
               "at least half the chance level (or of its start). Info unless a slow loss "
               "(`curve.lr_too_low`, `curve.not_learning`) is not cured by a larger learning "
               "rate tried on a copy (docs/remedies.md)."),
    _spec("overfit.inconclusive", "info", "Overfit probe inconclusive",
          "The loss was still falling when the probe's steps or time ran out: raise "
          "`overfit_max_steps`/`max_steps` or `overfit_time_budget`/`time_budget` to decide.",
          when="The probe's loss was still falling when its steps or its time ran out (info)."),
    _spec("overfit.skipped", "info", "Overfit probe skipped",
          "The detail says why (manual optimization, time budget, no loss); see the check's "
          "arguments to enable it.",
          when="The probe did not run: manual optimization, a step too slow for the budget, or no loss "
               "returned (info)."),
    # 5. structure
    _spec("structure.batch_mixing", "error", "Outputs mix examples of the batch",
          "An operation mixes the batch dimension in eval mode: a softmax/log_softmax or "
          "normalization over `dim=0`, a `view`/`reshape` that merges the batch with another "
          "dimension, or batch and sequence dimensions swapped (an `nn.LSTM`/`nn.GRU`/`nn.RNN` "
          "fed `(N, T, F)` needs `batch_first=True`).",
          when="In eval mode, an example's output depends on the inputs of other examples of the batch.",
          remedy="causal"),
    _spec("structure.causal_leak", "error", "Outputs see future positions",
          "Check the attention masks (upper triangle masked? its orientation? the encoder's too? "
          "cross-attention to an encoder that saw the whole sequence?) and every sublayer that mixes "
          "positions (convolutions need left padding).",
          when="An output position depends on later input positions, when the model is declared causal or "
               "the data is next-token prediction.",
          remedy="causal"),
    _spec("structure.shape_mismatch", "error", "Prediction and target shapes broadcast silently",
          "Make prediction and target shapes equal before the loss (`pred.squeeze(-1)` a `(N, 1)` "
          "prediction for `(N,)` targets, or `target.view_as(pred)`).",
          when="Prediction and target shapes differ but broadcast against each other in the loss (e.g. "
               "`(N, 1)` against `(N,)`)."),
    _spec("structure.target_leak", "error", "The targets reach the forward pass",
          "The targets reach the forward pass: feed the decoder the targets shifted right, and "
          "keep labels out of the features (expected only for label-conditioned models).",
          when="The model's outputs change when only the targets of the batch change.",
          remedy="causal"),
    _spec("structure.label_misaligned", "error", "Language-model labels are misaligned with the inputs",
          "Shift the labels once. transformers' causal LMs (`*ForCausalLM`, `GPT2LMHeadModel`) shift "
          "`labels` inside their loss: pass `labels = input_ids` (with `-100` at padding), not "
          "`input_ids[:, 1:]`. A model that does not shift needs the shift in your loss: "
          "`cross_entropy(logits[:, :-1].flatten(0, 1), input_ids[:, 1:].flatten())`.",
          when="On the structure probe's pass over token inputs, the targets given to the loss lead "
               "the inputs by two positions (labels shifted twice), or are the inputs themselves "
               "while the model is causal (no shift: each position sees its own target).",
          remedy="realign_labels"),
    _spec("structure.padding_leak", "warning", "Outputs at real positions depend on the padding",
          "Pass the padding mask to attention (`key_padding_mask`/`attention_mask`), pool over the "
          "real positions only (masked mean), and give padded targets `ignore_index`.",
          when="Outputs at real positions change when only the padded positions of the input change.",
          remedy="causal"),
    _spec("structure.probe_skipped", "info", "Structure probe skipped",
          "Pass `forward_fn=` (callable(pl_module, batch) -> output; `Triage` takes it too) or "
          "`input_key=`/`target_key=` to `StructureProbe` so the probe can run the model.",
          when="A structure or padding probe could not run the model (no forward found, an exception, a "
               "non-deterministic output) (info)."),
    # 6. mode
    _spec("mode.train_mode_in_eval", "warning", "Dropout/BatchNorm in training mode during validation",
          "In training mode dropout stays active and BatchNorm uses and updates batch statistics, so "
          "validation results are noisy and the running statistics absorb validation data. Remove the "
          "`.train()` call from the validation hooks: Lightning puts the model in eval mode itself.",
          when="A dropout layer with `p > 0`, a BatchNorm layer that tracks running statistics, or an "
               "`nn.MultiheadAttention` with dropout is in training mode during validation.",
          remedy="eval_mode"),
    _spec("mode.nondeterministic_eval", "warning", "Evaluation is random in eval mode",
          "Gate the randomness on the mode: `F.dropout(x, p, training=self.training)`, "
          "`scaled_dot_product_attention(..., dropout_p=self.p if self.training else 0.0)`, "
          "noise layers only `if self.training`. If evaluation is random on purpose (MC dropout, "
          "test-time augmentation), pass `stochastic_eval=True`.",
          when="The same validation examples, run twice in eval mode from two random states, "
               "give different outputs.",
          remedy="gate_dropout"),
    _spec("mode.eval_loss_gap", "warning", "The evaluated model is not the model that trains",
          "Look for a path only eval mode takes: BatchNorm running statistics never updated "
          "(`momentum=0`, `track_running_stats` buffers overwritten or frozen), a weight "
          "reparametrization or cache computed only when `self.training`, a buffer read before "
          "it is filled.",
          when="The loss of the same validation examples stays far higher in eval mode than in "
               "training mode, and the gap does not shrink as training goes on."),
    _spec("mode.eval_broken_before_training", "warning",
          "Evaluation is broken until a training-mode forward has run",
          "Eval mode reads state that only a training-mode forward sets. For "
          "`torch.nn.utils.spectral_norm` (power-iteration vectors never iterated before the first "
          "training forward) use `torch.nn.utils.parametrizations.spectral_norm`, which iterates at "
          "construction; initialize running buffers to a usable value (a variance of ones, not "
          "zeros or `torch.empty`); fill caches outside `if self.training`. The named module is "
          "where the eval-mode output first departs.",
          when="At the sanity check (or the first validation before `min_steps`), the eval-mode loss "
               "of the same validation examples is at least 10x the chance level and their "
               "training-mode loss, which is at most 2x chance (a standard BatchNorm whose running "
               "statistics are still at their init is not reported)."),
    # 7. curve
    _spec("mode.unsynced_metric", "warning", "A monitored metric differs between ranks",
          "Log it with `self.log(..., sync_dist=True)` (or log a torchmetrics `Metric`, which "
          "syncs itself): otherwise each rank holds the mean of its own validation shard and "
          "the checkpoint or early-stopping callback decides from one rank's data.",
          when="Under several ranks, a metric that a `ModelCheckpoint` or `EarlyStopping` "
               "monitors holds different values on the ranks at the end of a validation run."),
    _spec("curve.not_learning", "error", "The loss does not move",
          "The loss stays at its step-0 value: check the learning rate (0?), that the optimizer "
          "steps, that inputs are not all zero and that gradients reach the parameters.",
          when="Less than 10% progress from the step-0 loss and from the start median, with identical "
               "validation losses or no significant trend.",
          remedy="lr_up"),
    _spec("curve.below_baseline", "warning", "The model ends below a simple baseline",
          "A nearest-centroid or linear model on the raw inputs does better: check that the body "
          "of the model trains (`requires_grad`, the optimizer's parameters, a frozen backbone "
          "you meant to fine-tune), the learning rate, and the preprocessing of the inputs.",
          when="At the last validation run, the model's accuracy (argmax of its output) on the "
               "first validation examples is below the best simple baseline (majority class, "
               "nearest centroid, ridge linear classifier fitted in closed form on the first "
               "training batches) by at least 0.08 (and three standard errors), or its mean squared "
               "error is over 1.25x the mean predictor's; judged from 150 optimizer steps on."),
    _spec("curve.lr_too_low", "warning", "Slow, straight decline: learning rate too low",
          "Raise the learning rate by 10x, or run a learning-rate finder.",
          when="Less than 10% progress with a significant decline (validation lower at every run, or a "
               "training slope with t < -4).",
          remedy="lr_up"),
    _spec("curve.lr_too_high", "warning", "Noisy or rising loss: learning rate too high",
          "Lower the learning rate by 3-10x, add warmup, or clip gradients.",
          when="A block median (1/8 of the window) above 1.2x the step-0 loss, or 1.5x above the best "
               "earlier block median and by more than 10% of the loss scale.",
          remedy="lr_down"),
    _spec("curve.diverging", "error", "The loss grows without bound",
          "Lower the learning rate (3-10x), add warmup, clip gradients (`gradient_clip_val`), and "
          "see the numerics and grad findings.",
          when="A NaN/Inf loss after growth (a value above 10x the step-0 loss in the 8 steps before), a "
               "NaN/Inf validation loss, or a running median above 10x the step-0 loss until the end; "
               "or a loss that falls without bound (its running median below -10x the step-0 "
               "loss's size, still falling: a term with the wrong sign).",
          remedy="lr_down"),
    _spec("curve.plateau_at_chance", "error", "The loss settled at chance level",
          "The model predicts the prior: look for saturated units (unscaled inputs, too high a "
          "learning rate early on) and dead ReLUs.",
          when="The loss moved and then settled within 5% of the chance level (or of the prior entropy), "
               "with no significant downward trend in the second half."),
    _spec("curve.loss_spike", "warning", "Loss spike",
          "Look at the batch of that step and the gradient norms just before it; clip gradients.",
          when="A loss value above its running level by 12 robust standard deviations, 2x the level and at "
               "least the loss scale, after 16 steps of baseline (at most 5 per window)."),
    _spec("curve.overfitting", "warning", "Training loss falls while validation loss rises",
          "Add regularization or data, or stop earlier; check train/val distributions.",
          when="Validation 10% above its best at 2 validation runs in a row while the training loss kept "
               "falling, the rise above `overfit_z` (2) standard errors; never under `overfit_batches`, "
               "info when the user's `EarlyStopping`/`ModelCheckpoint` watch that loss."),
    _spec("curve.healthy", "info", "The loss curve looks healthy", "Nothing to do.",
          when="None of the curve findings fired in the first-epochs window (info)."),
    _spec("curve.no_validation", "info", "No validation loss: overfitting cannot be seen",
          "Give `fit` a validation dataloader and a `validation_step` that returns or logs the "
          "loss (`val_loss`).",
          when="At the end of training no validation loss was seen in the fit (the reason is in the "
               "evidence) (info)."),
    _spec("curve.sparse_validation", "info", "Too few validation runs inside the first epochs",
          "Validate more often (`val_check_interval=`, `check_val_every_n_epoch=1`) or widen the "
          "window (`window_epochs=`, `window_steps=`).",
          when="Validation ran less often than once per epoch and fewer than 3 validation losses fell "
               "inside the first-epochs window, too few for the overfitting rule (info)."),
    # 8. grad
    _spec("grad.exploding", "error", "Gradient norms explode",
          "Lower the learning rate, clip gradients, check the initialization scale and "
          "normalization layers.",
          when="A non-finite total norm after growth, the median total norm of the window's last fifth "
               "100x that of its first fifth (1e4x in a run that ended inside a window of 8-19 steps), "
               "or the first weight layer's median norm 1000x the last one's.",
          remedy="lr_down_clip"),
    _spec("grad.vanishing", "warning", "Gradients vanish in early layers",
          "Use ReLU-family activations, residual connections, normalization or a better init.",
          when="The first weight layer's median gradient norm is below 1/1000 of the last weight layer's."),
    _spec("grad.spike", "warning", "Gradient-norm spike",
          "Clip gradients (see the suggested value) and look at the batch of that step.",
          when="The total gradient norm is 10 robust standard deviations and 10x above its running level "
               "(info unless a loss spike, a divergence or a NaN follows)."),
    _spec("grad.dead_units", "warning", "Dead units or layers with zero gradient",
          "Check biases and init that push ReLUs below zero; try LeakyReLU or a lower LR.",
          when="At least half of the output units of a `Linear`/`Conv` layer never got a non-zero gradient "
               "in the window, or a parameter's gradient was always 0."),
    _spec("grad.clipping_eats_update", "warning", "Gradient clipping removes nearly all of the update",
          "Clip at a threshold near the gradient norms the run has (the report's `grad_norm` "
          "series; a `gradient_clip_val` a few times their median), not orders of magnitude "
          "below them. Clipping by hand under a gradient scaler: unscale first "
          "(`scaler.unscale_(opt)` before `clip_grad_norm_`, or Lightning's "
          "`self.clip_gradients(opt, ...)`, which unscales), else the threshold applies to "
          "gradients multiplied by the scale.",
          when="Over the first optimizer steps (10 or more) the clipping keeps a median 1% or less "
               "of the total gradient norm: Lightning's `gradient_clip_val` (norm) against the "
               "norms before it, or, under manual optimization, the norm at the optimizer step "
               "against the unscaled norm backward produced. Info for optimizers whose update "
               "does not scale with the gradient (Adam, RMSprop...); in the report, info unless a "
               "slow or flat loss (`curve.lr_too_low`, `curve.not_learning`, "
               "`curve.plateau_at_chance`, `grad.update_ratio`) shows the trouble."),
    _spec("grad.update_ratio", "warning", "Update-to-weight ratio far from ~1e-3",
          "Far above: lower the learning rate; far below: raise it (per layer in the evidence).",
          when="A layer's median ratio of update norm to weight norm (sampled every 10 steps) is below "
               "1e-5 or above 0.3.",
          remedy="lr_up"),
    # 9. numerics
    _spec("numerics.nonfinite_loss", "error", "The loss became NaN/Inf in the loss computation",
          "Every module output was finite: use stable loss functions (`F.cross_entropy` on "
          "logits, `log_softmax`) instead of `log(softmax(z))`, and guard divisions.",
          when="Replaying the failing step, every module output is finite but the loss is not."),
    _spec("numerics.nonfinite_forward", "error", "A module's output became NaN/Inf",
          "Look at the named layer: a division by a zero std, a log of zero, an overflowing exp.",
          when="Replaying the failing step, a module's output is the first non-finite value in forward "
               "order."),
    _spec("numerics.nonfinite_backward", "error", "A gradient became NaN/Inf in backward",
          "Forward was finite: look for `sqrt`, `pow` or `norm` at zero and divisions whose "
          "derivative blows up; add an epsilon.",
          when="Replaying the failing step, forward and loss are finite and a gradient computed in "
               "backward is the first non-finite value."),
    _spec("numerics.nonfinite_params", "error", "Parameters became NaN/Inf",
          "An update wrote non-finite values: lower the learning rate, clip gradients.",
          when="Parameters are non-finite before a step's update (or at the end of training): an earlier "
               "update wrote them."),
    _spec("numerics.precision_overflow", "error", "Overflow in reduced precision, finite in float32",
          "Keep the named layer in float32 (autocast disabled), rescale it, or use bf16.",
          when="The failing step is non-finite in the run's reduced precision and finite when replayed in "
               "float32.",
          remedy="float32_replay"),
    _spec("numerics.near_overflow", "warning", "Activations approach the dtype's limit",
          "Rescale the layer or keep it in float32 before it overflows.",
          when="Sampled under reduced precision (every 100 steps): a float16/bfloat16 module output "
               "exceeds 25% of its dtype's largest value."),
    _spec("numerics.autocast_bypassed", "warning", "Mixed precision is not applied to some layers",
          "The named modules run outside autocast: remove the `torch.autocast(enabled=False)` "
          "block or the cast back to float32 around them, keep the forward in the thread that "
          "runs `training_step` (autocast is per thread), or wrap a custom forward in "
          "`torch.autocast(device_type)`. Keep in float32 only what needs the range.",
          when="Under `*-mixed` precision, matrix products or convolutions return float32 at the "
               "first training step (info when they are a small part of the compute)."),
    _spec("numerics.nonfinite_detected", "error", "A NaN/Inf was detected but not localized",
          "Run with `NonFiniteTracer(mode='sync')` (or `Triage(numerics_mode='sync')`) so the "
          "failing step is replayed and the first module, gradient or loss computation is named.",
          when="A NaN/Inf was detected but not localized: deferred mode, manual optimization, or a replay "
               "that came out finite."),
    # run settings (context)
    _spec("run.unseeded", "info", "No global seed was set",
          "Call `lightning.seed_everything(seed)` (or `seed_everything: <seed>` in LightningCLI) "
          "so a rerun that changes one setting can be compared with this one.",
          when="No `seed_everything` call was seen before the fit (info)."),
    # meta
    _spec("triage.check_error", "warning", "A triage check failed internally and was disabled",
          "The training run was not affected. Please report it with the evidence; pass "
          "`strict=True` to raise instead.",
          when="A check raised internally; it is disabled and the run goes on (`strict=True` raises "
               "instead)."),
)

#: The registered codes, in protocol order (``findings.CODES`` is built from them).
SPECS = _SPECS

__all__ = ["REMEDY_KINDS", "SEVERITIES", "SPECS", "CodeSpec", "RemedyKind", "Severity"]
