"""The finding codes of stage 7, curve: one ``spec(...)`` row per code."""

from __future__ import annotations

from lightning_triage.codes.spec import CodeSpec, spec

#: The hint of a ``curve.diverging`` whose loss falls without bound (``evidence["direction"]``
#: is ``"down"``): no objective reaches minus infinity, so the learning rate is not the cause.
UNBOUNDED_BELOW_HINT = (
    "The objective is unbounded below: a term has the wrong sign (a KL or entropy term added "
    "where it should be subtracted, a likelihood maximized instead of minimized, a reward not "
    "negated) or a penalty the model can drive to minus infinity. Check each term's sign and "
    "value at step 0; lowering the learning rate only slows the fall.")

SPECS: tuple[CodeSpec, ...] = (
    spec("mode.unsynced_metric", "warning", "A validation metric differs between ranks",
         "Log it with `self.log(..., sync_dist=True)` (or log a torchmetrics `Metric`, which "
         "syncs itself): otherwise each rank holds the mean of its own validation shard and "
         "the checkpoint or early-stopping callback decides from one rank's data.",
         when="Under several ranks, a metric that a `ModelCheckpoint` or `EarlyStopping` "
              "monitors holds different values on the ranks at the end of a validation run "
              "(info for a metric logged in validation that nothing monitors)."),
    spec("curve.not_learning", "error", "The loss does not move",
         "The loss stays at its step-0 value: check the learning rate (0?), that the optimizer "
         "steps, that inputs are not all zero and that gradients reach the parameters.",
         when="Less than 10% progress from the step-0 loss and from the start median, with identical "
              "validation losses or no significant trend.",
         remedy="lr_up"),
    spec("curve.below_baseline", "warning", "The model ends below a simple baseline",
         "A nearest-centroid or linear model on the raw inputs does better: check that the body "
         "of the model trains (`requires_grad`, the optimizer's parameters, a frozen backbone "
         "you meant to fine-tune), the learning rate, and the preprocessing of the inputs.",
         when="At the last validation run, the model's accuracy (argmax of its output) on the "
              "first validation examples is below the best simple baseline (majority class, "
              "nearest centroid, ridge linear classifier fitted in closed form on the first "
              "training batches) by at least 0.08 (and three standard errors), or its mean squared "
              "error is over 1.25x the mean predictor's; judged from 150 optimizer steps on."),
    spec("curve.lr_too_low", "warning", "Slow, straight decline: learning rate too low",
         "Raise the learning rate by 10x, or run a learning-rate finder.",
         when="Less than 10% progress with a significant decline (validation lower at every run, or a "
              "training slope with t < -4).",
         remedy="lr_up"),
    spec("curve.lr_too_high", "warning", "Noisy or rising loss: learning rate too high",
         "Lower the learning rate by 3-10x, add warmup, or clip gradients.",
         when="A block median (1/8 of the window) above 1.2x the step-0 loss, or 1.5x above the best "
              "earlier block median and by more than 10% of the loss scale; an error beside "
              "`curve.plateau_at_chance` when the loss first blew up to over 10x the step-0 loss "
              "(and the chance level) within the first 16 steps: the network died at the start "
              "(evidence `collapse`), and the plateau is explained by it.",
         remedy="lr_down"),
    spec("curve.diverging", "error", "The loss grows without bound",
         "Lower the learning rate (3-10x), add warmup, clip gradients (`gradient_clip_val`), and "
         "see the numerics and grad findings.",
         when="A NaN/Inf loss after growth (a value above 10x the step-0 loss in the 8 steps before), a "
              "NaN/Inf validation loss, or a running median above 10x the step-0 loss until the end; "
              "or a loss that falls without bound (its running median below -10x the step-0 "
              "loss's size, still falling: a term with the wrong sign).",
         remedy="lr_down"),
    spec("curve.plateau_at_chance", "error", "The loss settled at chance level",
         "The model predicts the prior: look for saturated units (unscaled inputs, too high a "
         "learning rate early on) and dead ReLUs.",
         when="The loss moved and then settled within 5% of the chance level (or of the prior entropy), "
              "with no significant downward trend in the second half."),
    spec("curve.loss_spike", "warning", "Loss spike",
         "Look at the batch of that step and the gradient norms just before it; clip gradients.",
         when="A loss value above its running level by 12 robust standard deviations, 2x the level and at "
              "least the loss scale, after 16 steps of baseline (at most 5 per window)."),
    spec("curve.overfitting", "warning", "Training loss falls while validation loss rises",
         "Add regularization or data, or stop earlier; check train/val distributions.",
         when="Validation 10% above its best at 2 validation runs in a row while the training loss kept "
              "falling, the rise above `overfit_z` (2) standard errors; never under `overfit_batches`, "
              "info when the user's `EarlyStopping`/`ModelCheckpoint` watch that loss."),
    spec("curve.healthy", "info", "The loss curve looks healthy", "Nothing to do.",
         when="None of the curve findings fired in the first-epochs window (info)."),
    spec("curve.no_validation", "info", "No validation loss: overfitting cannot be seen",
         "Give `fit` a validation dataloader and a `validation_step` that returns or logs the "
         "loss (`val_loss`).",
         when="At the end of training no validation loss was seen in the fit (the reason is in the "
              "evidence) (info)."),
    spec("curve.sparse_validation", "info", "Too few validation runs inside the first epochs",
         "Validate more often (`val_check_interval=`, `check_val_every_n_epoch=1`) or widen the "
         "window (`window_epochs=`, `window_steps=`).",
         when="Validation ran less often than once per epoch and fewer than 3 validation losses fell "
              "inside the first-epochs window, too few for the overfitting rule (info)."),
)

__all__ = ["SPECS"]
