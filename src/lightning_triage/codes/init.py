"""The finding codes of stage 2, init: one ``spec(...)`` row per code."""

from __future__ import annotations

from lightning_triage.codes.spec import CodeSpec, spec

SPECS: tuple[CodeSpec, ...] = (
    spec("init.loss_above_chance", "error", "Step-0 loss is far above chance level",
         "Check the output scale (logits multiplied somewhere? a large init or temperature?), "
         "the label encoding, and a missing or extra softmax before the loss; for regression, "
         "the output scale, the target scale (standardize regression targets) and the loss "
         "reduction.",
         when="Classification: the step-0 loss is above `above_ratio` (2) x the chance level and more "
              "than 0.5 nats above it; regression: above 10x the largest baseline."),
    spec("init.loss_below_chance", "warning", "Step-0 loss is far below chance level",
         "A fresh model cannot beat chance: check for labels leaking into the inputs, a loss "
         "scaled down (divided by the batch size twice?) or the wrong loss function. Expected "
         "if the model starts from pretrained weights.",
         when="Classification: the step-0 loss is below `below_ratio` (0.5) x min(chance, prior entropy); "
              "regression: below 0.1x the smallest baseline."),
    spec("init.chance_unknown", "info", "Chance level unknown",
         "Pass `task=` and `num_classes=` so the step-0 loss can be checked.",
         when="The task or the class count could not be inferred, so the step-0 loss has nothing to be "
              "compared with."),
)

__all__ = ["SPECS"]
