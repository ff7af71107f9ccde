"""The finding codes of stage 8, grad: one ``spec(...)`` row per code."""

from __future__ import annotations

from lightning_triage.codes.spec import CodeSpec, spec

SPECS: tuple[CodeSpec, ...] = (
    spec("grad.exploding", "error", "Gradient norms explode",
         "Lower the learning rate, clip gradients, check the initialization scale and "
         "normalization layers.",
         when="A non-finite total norm after growth, the median total norm of the window's last fifth "
              "100x that of its first fifth (1e4x in a run that ended inside a window of 8-19 steps), "
              "or the first weight layer's median norm 1000x the last one's.",
         remedy="lr_down_clip"),
    spec("grad.vanishing", "warning", "Gradients vanish in early layers",
         "Use ReLU-family activations, residual connections, normalization or a better init.",
         when="The first weight layer's median gradient norm is below 1/1000 of the last weight layer's."),
    spec("grad.spike", "warning", "Gradient-norm spike",
         "Clip gradients (see the suggested value) and look at the batch of that step.",
         when="The total gradient norm is 10 robust standard deviations and 10x above its running level "
              "(info unless a loss spike, a divergence or a NaN follows)."),
    spec("grad.dead_units", "warning", "Dead units or layers with zero gradient",
         "Check biases and init that push ReLUs below zero; try LeakyReLU or a lower LR.",
         when="At least half of the output units of a `Linear`/`Conv` layer never got a non-zero gradient "
              "in the window, or a parameter's gradient was always 0."),
    spec("grad.clipping_eats_update", "warning", "Gradient clipping removes nearly all of the update",
         "Clip at a threshold near the gradient norms the run has (the report's `grad_norm` "
         "series; a `gradient_clip_val` a few times their median), not orders of magnitude "
         "below them. Clipping by hand under a gradient scaler: unscale first "
         "(`scaler.unscale_(opt)` before `clip_grad_norm_`, or Lightning's "
         "`self.clip_gradients(opt, ...)`, which unscales), else the threshold applies to "
         "gradients multiplied by the scale.",
         when="Over the first optimizer steps (10 or more) the clipping keeps a median 1% or less "
              "of the total gradient norm: Lightning's `gradient_clip_val` (norm) against the "
              "norms before it, or, under manual optimization, the norm at the optimizer step "
              "against the unscaled norm backward produced (divided by the scale of the "
              "gradient scaler, the user's own included; kept at most 100/scale: clipped "
              "before `scaler.unscale_`, says the message). Info for optimizers whose update "
              "does not scale with the gradient (Adam, RMSprop...); in the report, info unless a "
              "slow or flat loss (`curve.lr_too_low`, `curve.not_learning`, "
              "`curve.plateau_at_chance`, `grad.update_ratio`) shows the trouble."),
    spec("grad.update_ratio", "warning", "Update-to-weight ratio far from ~1e-3",
         "Far above: lower the learning rate; far below: raise it (per layer in the evidence).",
         when="A layer's median ratio of update norm to weight norm (sampled every 10 steps) is below "
              "1e-5 or above 0.3.",
         remedy="lr_up"),
)

__all__ = ["SPECS"]
