"""The finding codes of stage 9, numerics: one ``spec(...)`` row per code."""

from __future__ import annotations

from lightning_triage.codes.spec import CodeSpec, spec

SPECS: tuple[CodeSpec, ...] = (
    spec("numerics.nonfinite_loss", "error", "The loss became NaN/Inf in the loss computation",
         "Every module output was finite: use stable loss functions (`F.cross_entropy` on "
         "logits, `log_softmax`) instead of `log(softmax(z))`, and guard divisions.",
         when="Replaying the failing step, every module output is finite but the loss is not."),
    spec("numerics.nonfinite_forward", "error", "A module's output became NaN/Inf",
         "Look at the named layer: a division by a zero std, a log of zero, an overflowing exp.",
         when="Replaying the failing step, a module's output is the first non-finite value in forward "
              "order."),
    spec("numerics.nonfinite_backward", "error", "A gradient became NaN/Inf in backward",
         "Forward was finite: look for `sqrt`, `pow` or `norm` at zero and divisions whose "
         "derivative blows up; add an epsilon.",
         when="Replaying the failing step, forward and loss are finite and a gradient computed in "
              "backward is the first non-finite value."),
    spec("numerics.nonfinite_params", "error", "Parameters became NaN/Inf",
         "An update wrote non-finite values: lower the learning rate, clip gradients.",
         when="Parameters are non-finite before a step's update (or at the end of training): an earlier "
              "update wrote them."),
    spec("numerics.precision_overflow", "error", "Overflow in reduced precision, finite in float32",
         "Keep the named layer in float32 (autocast disabled), rescale it, or use bf16.",
         when="The failing step is non-finite in the run's reduced precision and finite when replayed in "
              "float32.",
         remedy="float32_replay"),
    spec("numerics.near_overflow", "warning", "Activations approach the dtype's limit",
         "Rescale the layer or keep it in float32 before it overflows.",
         when="Sampled under reduced precision (every 100 steps): a float16/bfloat16 module output "
              "exceeds 25% of its dtype's largest value."),
    spec("numerics.autocast_bypassed", "warning", "Mixed precision is not applied to some layers",
         "The named modules run outside autocast: remove the `torch.autocast(enabled=False)` "
         "block or the cast back to float32 around them, keep the forward in the thread that "
         "runs `training_step` (autocast is per thread), or wrap a custom forward in "
         "`torch.autocast(device_type)`. Keep in float32 only what needs the range.",
         when="Under `*-mixed` precision, matrix products or convolutions return float32 at the "
              "first training step (info when they are a small part of the compute)."),
    spec("numerics.nonfinite_detected", "error", "A NaN/Inf was detected but not localized",
         "Run with `NonFiniteTracer(mode='sync')` (or `Triage(numerics_mode='sync')`) so the "
         "failing step is replayed and the first module, gradient or loss computation is named.",
         when="A NaN/Inf was detected but not localized: deferred mode, manual optimization, or a replay "
              "that came out finite."),
)

__all__ = ["SPECS"]
