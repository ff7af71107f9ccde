"""The finding codes of stage 6, mode: one ``spec(...)`` row per code."""

from __future__ import annotations

from lightning_triage.codes.spec import CodeSpec, spec

SPECS: tuple[CodeSpec, ...] = (
    spec("mode.train_mode_in_eval", "warning", "Dropout/BatchNorm in training mode during validation",
         "In training mode dropout stays active and BatchNorm uses and updates batch statistics, so "
         "validation results are noisy and the running statistics absorb validation data. Remove the "
         "`.train()` call from the validation hooks: Lightning puts the model in eval mode itself.",
         when="A dropout layer with `p > 0`, a BatchNorm layer that tracks running statistics, or an "
              "`nn.MultiheadAttention` with dropout is in training mode during validation.",
         remedy="eval_mode"),
    spec("mode.nondeterministic_eval", "warning", "Evaluation is random in eval mode",
         "Gate the randomness on the mode: `F.dropout(x, p, training=self.training)`, "
         "`scaled_dot_product_attention(..., dropout_p=self.p if self.training else 0.0)`, "
         "noise layers only `if self.training`. If evaluation is random on purpose (MC dropout, "
         "test-time augmentation), pass `stochastic_eval=True`.",
         when="The same validation examples, run twice in eval mode from two random states, "
              "give different outputs.",
         remedy="gate_dropout"),
    spec("mode.eval_loss_gap", "warning", "The evaluated model is not the model that trains",
         "Look for a path only eval mode takes: BatchNorm running statistics never updated "
         "(`momentum=0`, `track_running_stats` buffers overwritten or frozen), a weight "
         "reparametrization or cache computed only when `self.training`, a buffer read before "
         "it is filled.",
         when="The loss of the same validation examples stays far higher in eval mode than in "
              "training mode, and the gap does not shrink as training goes on."),
    spec("mode.eval_broken_before_training", "warning",
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
)

__all__ = ["SPECS"]
