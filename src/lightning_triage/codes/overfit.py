"""The finding codes of stage 4, overfit: one ``spec(...)`` row per code."""

from __future__ import annotations

from lightning_triage.codes.spec import CodeSpec, spec

SPECS: tuple[CodeSpec, ...] = (
    spec("wiring.replicas_differ", "error", "The ranks hold different parameters",
         "Something changes the parameters on some ranks only: an update outside the wrapped "
         "model's forward/backward on one rank (a hook, an EMA, a `torch.no_grad()` edit under "
         "`if trainer.is_global_zero`), a step skipped or clipped on one rank only, a "
         "rank-dependent initialization after the model was wrapped. Make every rank take the "
         "same decisions (`trainer.strategy.reduce_boolean_decision`, `broadcast`).",
         when="Under several ranks, a parameter's checksum (its sum and norm) differs "
              "between ranks at fit start, after the first optimizer step or at a periodic "
              "check."),
    spec("wiring.buffers_differ", "warning", "The ranks hold different buffers",
         "A buffer that some ranks update differently: make the update the same on every rank, "
         "or broadcast it. Batch-norm running statistics differ by design without "
         "`SyncBatchNorm` (`Trainer(sync_batchnorm=True)`): each rank normalizes with its own "
         "batch, and evaluation uses rank 0's statistics.",
         when="Under several ranks, a buffer's checksum differs between ranks (info when only "
              "batch-norm running statistics differ, or when DDP overwrites the buffers with "
              "rank 0's at each forward: `broadcast_buffers=True`)."),
    spec("overfit.failed", "error", "Could not overfit one small batch",
         "A model that cannot memorize 8 examples has a bug: check the wiring findings, frozen "
         "layers, and a loss bounded away from zero (cross-entropy on probabilities).",
         when="The probe's loss on one small batch stopped above the target: a plateau, a known floor, a "
              "non-finite or rising loss, a loss that never moved, or `max_steps` ran out with the loss "
              "not halved."),
    spec("overfit.loss_on_probabilities", "error",
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
    spec("overfit.passed", "info", "Overfit one small batch",
         "The model, loss and optimizer can learn; look at data and curves for the rest.",
         when="The probe's loss reached the target, or settled on a floor above it while every probed "
              "example is predicted right (never a probability floor) (info)."),
    spec("overfit.loss_floor", "warning", "The loss has a floor near chance level",
         "The model memorizes the probed examples (every one predicted right) but the loss "
         "cannot fall below the floor: look for what bounds it besides the model, such as "
         "`label_smoothing` far above ~0.1, a penalty term with a huge coefficient (on the "
         "logits or the weights), or soft targets close to uniform (a distillation teacher "
         "never loaded, a temperature too high).",
         when="The overfit probe predicts every example right while its loss settles on a floor "
              "at least half the chance level (or of its start). Info unless a slow loss "
              "(`curve.lr_too_low`, `curve.not_learning`) is not cured by a larger learning "
              "rate tried on a copy (docs/remedies.md)."),
    spec("overfit.inconclusive", "info", "Overfit probe inconclusive",
         "The loss was still falling when the probe's steps or time ran out: raise "
         "`overfit_max_steps`/`max_steps` or `overfit_time_budget`/`time_budget` to decide.",
         when="The probe's loss was still falling when its steps or its time ran out (info)."),
    spec("overfit.skipped", "info", "Overfit probe skipped",
         "The detail says why (manual optimization, time budget, no loss); see the check's "
         "arguments to enable it.",
         when="The probe did not run: manual optimization, a step too slow for the budget, or no loss "
              "returned (info)."),
)

__all__ = ["SPECS"]
