"""The finding codes of stage 1, data: one ``spec(...)`` row per code."""

from __future__ import annotations

from lightning_triage.codes.spec import CodeSpec, spec

SPECS: tuple[CodeSpec, ...] = (
    spec("data.nonfinite_input", "error", "Inputs hold NaN/Inf",
         "The model's inputs must be finite: find the example indices in the evidence and trace "
         "them back through the dataset and its transforms (a division by zero in normalization, a "
         "corrupt file, a missing value).",
         when="An input tensor of an inspected batch (or of the batch of a non-finite step) holds NaN/Inf "
              "(other tensors than the main input and the targets: NaN only, an attention mask holds "
              "`-inf` on purpose)."),
    spec("data.nonfinite_target", "error", "Targets hold NaN/Inf",
         "Check how targets are read and encoded: missing values, a log of zero, a bad join.",
         when="The targets of an inspected batch (or of the batch of a non-finite step) hold NaN/Inf."),
    spec("data.unnormalized_input", "warning", "Inputs are far from standardized",
         "Standardize float inputs (subtract the mean, divide by the std of the training set) or "
         "scale pixels to [0, 1] (`x / 255`; `x / 16` for 0-16 digits); raw 0-255 or 0-16 values make "
         "early layers saturate.",
         when="The main float input of a training batch has a root mean square above `max_rms` (4.0), or "
              "every value below 0.1 in magnitude with rms < 0.01; integer inputs (token ids) are never "
              "reported.",
         remedy="standardize_input"),
    spec("data.constant_input", "warning", "An input tensor is the same for every example",
         "The model cannot learn from an input that never changes: check the dataset indexing, "
         "the collate function and transforms that may overwrite the input.",
         when="The main input is identical for every example of a batch of 2+ examples (a constant "
              "feature, such as a black border pixel, is normal and not reported)."),
    spec("data.target_out_of_range", "error", "Class targets are outside [0, num_classes)",
         "Check the label encoding (labels 1..C instead of 0..C-1?) and the model's class count.",
         when="Integer class targets lie outside `[0, C)` (other than `ignore_index`), `C` being "
              "`num_classes` or the class dimension of the model's output on the first batch."),
    spec("data.class_imbalance", "warning", "One class dominates the targets",
         "Batches of a single class: shuffle the training loader (`shuffle=True` or a shuffling "
         "sampler). One class dominating: check the sampler and the labels; if the imbalance is real, "
         "use class weights or a balanced sampler and judge the loss against the class prior, not "
         "uniform chance.",
         when="Over 64+ integer training targets, one class holds 50% of them (90% with 2 classes), or "
              "half of the batches hold a single class where a shuffled loader would rarely give one."),
    spec("data.repeated_batch", "warning", "The loader yields the same batch again",
         "Check the sampler and the dataset's `__getitem__` (a fixed index, a cached batch).",
         when="A training batch is identical, example for example, to an earlier batch of the same epoch "
              "(batches that recur across epochs are normal)."),
    spec("data.duplicate_samples", "warning", "A batch holds many identical examples",
         "Check the dataset indexing and the collate function (an example repeated, a "
         "broadcast instead of a stack).",
         when="At least `duplicate_fraction` (50%) of the examples of a batch of 8+ examples repeat "
              "another example of the batch."),
    spec("data.train_val_overlap", "warning", "Training examples reappear in validation",
         "Split the dataset before any augmentation and make sure the validation indices are "
         "disjoint from the training indices.",
         when="At least 5 validation examples, and 1% of the distinct validation examples seen, equal a "
              "training example seen (by fingerprint)."),
    spec("data.train_val_shift", "warning", "Train and validation inputs differ in statistics",
         "Apply the same preprocessing (normalization, scaling, resizing, tokenization) to both "
         "splits.",
         when="Per-feature statistics of the main float input differ between training and validation "
              "batches: median standardized mean difference above 0.5, or median std ratio above 2."),
    spec("data.val_outlier", "warning", "A validation example lies far outside the training data",
         "Look at that example's feature in the validation preprocessing: a standardization that "
         "divides by a per-feature std clamped to a tiny value (a feature constant in training, "
         "such as a border pixel, explodes wherever validation has a non-zero value there), a "
         "unit or scale that differs, a corrupt value. Divide by `std` where it is positive and "
         "by 1 elsewhere.",
         when="A value of the validation inputs seen lies at least 1000 training scales from its "
              "feature's training mean (the scale: the feature's training std, at least the "
              "median training std over the features), with 64+ training and 32+ "
              "validation examples seen."),
    spec("data.label_misalignment", "warning", "Targets look unrelated to the inputs",
         "Check that inputs and labels are indexed together (shuffled separately? sorted "
         "differently? an off-by-one join?). A genuinely near-unpredictable task looks the same: "
         "then ignore this.",
         when="Neither a 1-nearest-neighbour nor a nearest-centroid probe on up to 1024 training examples "
              "beats 100 label permutations by 3.5 standard deviations."),
    spec("data.tiny_input_scale", "warning", "Inputs are far below unit scale",
         "The float inputs are orders of magnitude smaller than standardized values (pixels "
         "divided by their range twice?): check the normalization; standardize with the "
         "training set's mean and std. If the small scale is the data's own, rescaling still "
         "helps the default initializations and learning rates.",
         when="The main float input is non-negative, holds 64+ values per example and stays below 0.1 "
              "with rms below 0.05 (intensities scaled down twice); signed signals and few-feature "
              "tabular data stay silent.",
         remedy="standardize_input"),
    spec("data.short_batches", "warning", "The loader delivers fewer examples than its batch size",
         "Check the `collate_fn` and any processor after the sampler (a transform of whole "
         "batches, `on_after_batch_transfer`) for code that drops, filters or merges examples. "
         "If dropping is deliberate (corrupt samples filtered out), filter in the dataset "
         "instead, or keep in mind that the effective batch size (and the gradient noise) "
         "differs from the configured one.",
         when="Training batches that are not the loader's last hold fewer examples than its "
              "`batch_size` (info when only some of the first batches do); packed sequences "
              "count the examples their `position_ids` (or `cu_seq_lens`) hold."),
    spec("data.shared_worker_rng", "warning", "DataLoader workers share one random generator",
         "Give each worker its own generator: create or reseed it in the worker, from "
         "`torch.utils.data.get_worker_info().seed` (in `__getitem__`/`__iter__`, or in a "
         "`worker_init_fn` that sets `get_worker_info().dataset.<attribute>`), or draw from "
         "`torch`'s global generator, which PyTorch reseeds in every worker and epoch. "
         "`seed_everything(workers=True)` reseeds only the global generators, not those your "
         "objects own.",
         when="A training loader with `num_workers > 0` whose dataset (or a transform it holds) "
              "owns a generator object that per-example code reads and nothing reseeds per worker "
              "(info with a `worker_init_fn` that does not name it)."),
    spec("data.ranks_same_data", "error", "Every rank trains on the same examples",
         "Give each rank its own shard: keep `use_distributed_sampler=True` (the default) with a "
         "standard sampler, or build a `DistributedSampler(dataset, num_replicas=world_size, "
         "rank=global_rank)` yourself (inside a custom batch sampler too); an `IterableDataset` "
         "must split its stream by `torch.distributed.get_rank()` (and by worker).",
         when="Under several ranks, the first training batches of every rank hold the same "
              "examples (compared by fingerprint at fit start)."),
    spec("data.ranks_overlap", "warning", "Ranks train on overlapping examples",
         "Every rank's `DistributedSampler` must use the same `seed` (and the same "
         "`num_replicas`) so that their shards are disjoint parts of one permutation; do not "
         "derive the seed from the rank or the time.",
         when="Under several ranks, at least 10% of the distinct examples of the first training "
              "batches were seen by another rank too (more than the dataset's own duplicates "
              "explain), or the ranks' distributed samplers hold different seeds."),
    spec("data.order_not_reshuffled", "warning", "The training order does not change between epochs",
         "Call `set_epoch(epoch)` on the distributed sampler at each epoch start (Lightning does "
         "it only for `loader.sampler` and `loader.batch_sampler.sampler`: expose it there, or "
         "call it in `on_train_epoch_start`), or draw the order from the epoch.",
         when="Under several ranks, the first training batches of the second epoch repeat those "
              "of the first in the same order on every rank, though a sampler of the loader "
              "shuffles."),
    spec("data.ranks_uneven_batches", "error", "Ranks take different numbers of batches per epoch",
         "Give every rank the same number of batches: a `DistributedSampler` pads the shards "
         "to equal length (`drop_last=False`) or drops the remainder (`drop_last=True`); a "
         "dataset sharded by hand must do the same, and an `IterableDataset` must yield the "
         "same number of batches on every rank.",
         when="Under several ranks, the ranks' training loaders hold different numbers of "
              "batches per epoch (compared at the start of training; sized loaders only)."),
    spec("data.unknown_batch_structure", "info", "The batch's inputs could not be found",
         "Pass `input_key=` and `target_key=` (a key, an index or a callable) to "
         "`BatchInspector` (or `Triage`) so the data checks can run.",
         when="The inputs (or targets) could not be found in the batch, so the data checks cannot run."),
    spec("data.worst_errors", "info", "The validation examples with the highest loss",
         "Look at these examples: a confident prediction of another class often means a wrong "
         "label; unreadable or ambiguous inputs point at the data pipeline.",
         when="At the end of each validation run (info, not a bug): the validation examples with the "
              "highest loss, with labels, predictions and confidence."),
)

__all__ = ["SPECS"]
