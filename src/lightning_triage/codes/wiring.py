"""The finding codes of stage 3, wiring: one ``spec(...)`` row per code."""

from __future__ import annotations

from lightning_triage.codes.spec import CodeSpec, spec

SPECS: tuple[CodeSpec, ...] = (
    spec("wiring.no_grad_params", "error", "Trainable parameters got no gradient",
         "Look for `.detach()`, `torch.no_grad()`, `.item()`/numpy round trips or modules that "
         "are defined but never called in the forward pass.",
         when="Trainable parameters whose `.grad` stayed `None` after the first batch's backward(s)."),
    spec("wiring.zero_grad_params", "warning", "Trainable parameters got exactly zero gradient",
         "Check for dead activations, a multiplication by zero or a mask that blocks the path.",
         when="Trainable parameters whose gradient after the first batch's backward(s) is exactly zero "
              "everywhere."),
    spec("wiring.frozen_params", "info", "Frozen parameters",
         "Expected when fine-tuning; otherwise look for `requires_grad_(False)` or `freeze()`.",
         when="Parameters with `requires_grad=False`, counted per module (info)."),
    spec("wiring.loss_detached", "error", "The loss is not connected to any trainable parameter",
         "The loss was computed from detached tensors: look for `.detach()`, `.item()`, "
         "`torch.no_grad()` or a re-created tensor in `training_step`.",
         when="The loss has no `grad_fn`, or the first batch's backward(s) reached no trainable "
              "parameter."),
    spec("wiring.params_not_in_optimizer", "error", "Parameters get gradients but no optimizer updates them",
         "Pass all trainable parameters to the optimizer in `configure_optimizers` "
         "(`self.parameters()`, not one submodule's), or add the missing ones to a param group.",
         when="Parameters receive gradients but are in no param group of `trainer.optimizers`.",
         remedy="add_params"),
    spec("wiring.unregistered_params", "error",
         "Tensors train the loss but are not parameters of the module",
         "Keep layers in `nn.ModuleList` / `nn.ModuleDict` (or `nn.Sequential`), not a plain "
         "`list`, `dict` or `tuple`, and weights as `nn.Parameter` attributes (or in "
         "`nn.ParameterList` / `nn.ParameterDict`): then `parameters()`, the optimizer, "
         "`.to(device)` and `state_dict()` see them.",
         when="Leaf tensors of the first batch's loss graph that require grad are neither "
              "parameters nor buffers of the LightningModule, and are kept in its attributes "
              "(named by attribute path) or are `nn.Parameter` objects; a warning when every "
              "optimizer holds them (they train but are not saved)."),
    spec("wiring.frozen_at_init", "warning", "A frozen part still holds its random initialization",
         "Load the pretrained weights before freezing (check the `load_state_dict` keys and "
         "its `missing_keys`), or unfreeze the part: remove the leftover `requires_grad_(False)` "
         "/ `freeze()`, and with an adapter library declare the new head trainable (peft: "
         "`task_type=` or `modules_to_save=[...]`).",
         when="At the first backward, frozen (`requires_grad=False`, in no optimizer) weights of "
              "`Linear`, `Conv*`, `Embedding` or recurrent layers are statistically what the "
              "layer's `reset_parameters` draws (uniform within the bound `1/sqrt(fan_in)` with "
              "uniform moments; `Embedding`: N(0, 1)), or, when the model's config declares "
              "`initializer_range` (transformers), `Linear` and `Embedding` weights of at "
              "least 4,096 values are a N(0, initializer_range²) draw (mean, second and fourth "
              "moments) with zero biases, and no trainable tensor holds the same values (an EMA "
              "or target copy)."),
    spec("wiring.grads_not_zeroed", "error", "Gradients are not zeroed between optimizer steps",
         "Call `optimizer.zero_grad()` once per step (manual optimization: after `opt.step()`; "
         "an `optimizer_zero_grad` override must still zero). To accumulate on purpose, set "
         "`Trainer(accumulate_grad_batches=k)` or step and zero every k batches.",
         when="An optimizer steps on gradients left from before its previous step, not at "
              "regular intervals, in the first steps.",
         remedy="zero_grads"),
    spec("wiring.optimizer_not_stepping", "error", "The optimizer does not move the parameters",
         "See the cause in the evidence: `zero_lr`: check the LR scheduler (its factor at these "
         "steps) and `lr`; `skipped`: `training_step` returns `None` from that step on; "
         "`not_called`: an `optimizer_step` override must call `optimizer.step(closure=...)`; "
         "`no_effect`: `optimizer.step` was replaced or wrapped by something that does nothing.",
         when="5 optimizer steps in a row leave every parameter unchanged (no gradient, zero "
              "LR, a no-op step, a step not reached)."),
    spec("wiring.params_changed_outside_step", "warning",
         "Parameters change outside the optimizer step",
         "Look for code that writes the weights between steps: a hook or callback re-running "
         "init (`reset_parameters`), `load_state_dict` mid-run, an EMA copied into the live "
         "weights, an in-place edit under `torch.no_grad()` in `forward`. A deliberate "
         "projection (weight clipping) can stay.",
         when="A trainable parameter's norm changes between the end of an optimizer step and "
              "the start of the next, in the first steps."),
    spec("wiring.frozen_params_changed", "warning", "Frozen parameters change",
         "Leave frozen parameters out of the optimizer (`filter(lambda p: p.requires_grad, "
         "...)`), or let `zero_grad()` set their `.grad` to `None` before freezing; look for "
         "in-place edits of them.",
         when="A parameter with `requires_grad=False` or in no optimizer changes in the first "
              "steps."),
    spec("wiring.frozen_late", "warning", "Parameters were frozen after they had trained",
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
    spec("wiring.frozen_batchnorm_in_train", "warning",
         "BatchNorm in a frozen part is in training mode",
         "Lightning calls `model.train()` when training starts: put the frozen part in eval "
         "mode in `on_train_epoch_start` (`self.backbone.eval()`), or freeze the statistics "
         "(`track_running_stats=False`).",
         when="Running statistics of a layer whose module is frozen move during the first "
              "steps."),
)

__all__ = ["SPECS"]
