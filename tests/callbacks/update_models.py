"""Models that keep or break the contracts of the update (UpdateContractCheck's tests)."""

from __future__ import annotations

from typing import Any, Literal

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from tests.probe_models import Classifier, EncoderHead, ManualClassifier


# ---------------------------------------------------------------------- 1. zeroing
class ManualNoZeroGrad(ManualClassifier):
    """Manual optimization that never calls `zero_grad`."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        opt = self.optimizers()
        loss = self.loss(batch)
        self.manual_backward(loss)
        opt.step()  # type: ignore[union-attr]
        return loss.detach()


class ManualAccumulation(ManualClassifier):
    """Lightning's documented manual accumulation: step and zero every ``k`` batches."""

    def __init__(self, k: int = 3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.k = k

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        opt = self.optimizers()
        loss = self.loss(batch) / self.k
        self.manual_backward(loss)
        if (batch_idx + 1) % self.k == 0:
            opt.step()  # type: ignore[union-attr]
            opt.zero_grad()  # type: ignore[union-attr]
        return loss.detach()


class ManualZeroEveryK(ManualClassifier):
    """Steps every batch, zeroes every ``k`` batches (equal spacing): deliberate."""

    def __init__(self, k: int = 2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.k = k

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        opt = self.optimizers()
        if batch_idx % self.k == 0:
            opt.zero_grad()  # type: ignore[union-attr]
        loss = self.loss(batch)
        self.manual_backward(loss)
        opt.step()  # type: ignore[union-attr]
        return loss.detach()


class NoOpZeroGrad(Classifier):
    """An `optimizer_zero_grad` override that does nothing."""

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        pass


class GANZeroAtDifferentTimes(pl.LightningModule):
    """Two optimizers, no `toggle_optimizer`: the generator's loss also fills the
    discriminator's gradients, which are zeroed just before the discriminator's own backward."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 64))
        self.discriminator = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, _ = batch
        opt_g, opt_d = self.optimizers()  # type: ignore[misc]
        z = torch.randn(x.shape[0], 8)
        ones = torch.ones(x.shape[0], 1)
        opt_d.zero_grad()
        fake = self.generator(z).detach()
        d_loss = (F.binary_cross_entropy_with_logits(self.discriminator(x), ones)
                  + F.binary_cross_entropy_with_logits(self.discriminator(fake), 0 * ones))
        self.manual_backward(d_loss)
        opt_d.step()
        opt_g.zero_grad()
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self.generator(z)), ones)
        self.manual_backward(g_loss)
        opt_g.step()

    def configure_optimizers(self) -> Any:
        return (torch.optim.Adam(self.generator.parameters(), lr=1e-3),
                torch.optim.Adam(self.discriminator.parameters(), lr=1e-3))


class WGANClip(GANZeroAtDifferentTimes):
    """WGAN-style weight clipping of the critic, right after its step (manual)."""

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, _ = batch
        opt_g, opt_d = self.optimizers()  # type: ignore[misc]
        z = torch.randn(x.shape[0], 8)
        opt_d.zero_grad()
        d_loss = self.discriminator(self.generator(z).detach()).mean() \
            - self.discriminator(x).mean()
        self.manual_backward(d_loss)
        opt_d.step()
        with torch.no_grad():
            for p in self.discriminator.parameters():
                p.clamp_(-0.01, 0.01)
        if batch_idx % 2 == 0:
            opt_g.zero_grad()
            g_loss = -self.discriminator(self.generator(z)).mean()
            self.manual_backward(g_loss)
            opt_g.step()


class ClipBeforeStep(Classifier):
    """Weight clipping in `on_before_optimizer_step` (automatic optimization)."""

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        with torch.no_grad():
            for p in self.parameters():
                p.clamp_(-0.2, 0.2)


# ---------------------------------------------------------------------- 2. stepping
class SkipOneBatch(Classifier):
    """Returns `None` for one bad batch."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        return None if batch_idx == 3 else super().training_step(batch, batch_idx)


class NoneFrom(Classifier):
    """Returns `None` at every step from ``start`` on."""

    def __init__(self, start: int = 5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start = start

    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        return None if batch_idx >= self.start else super().training_step(batch, batch_idx)


class NoOpStep(Classifier):
    """`optimizer.step` replaced by a function that only evaluates the closure."""

    def configure_optimizers(self) -> Any:
        opt = super().configure_optimizers()
        opt.step = lambda closure=None: closure() if closure is not None else None
        return opt


class ClosureOnlyStep(Classifier):
    """An `optimizer_step` override that runs the closure but never `optimizer.step`."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any,
                       optimizer_closure: Any = None) -> None:
        optimizer_closure()


class Scheduled(Classifier):
    """An LR schedule given as a function of the step (`LambdaLR`)."""

    def __init__(self, factor: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.factor = factor

    def configure_optimizers(self) -> Any:
        opt = super().configure_optimizers()
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self.factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class LBFGSClassifier(Classifier):
    def configure_optimizers(self) -> Any:
        return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=4)


# ---------------------------------------------------------------------- 3. outside the step
class ResetEvery(pl.Callback):
    """Re-runs `reset_parameters` on every linear layer every ``n`` batches."""

    def __init__(self, n: int = 4) -> None:
        self.n = n

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if (batch_idx + 1) % self.n == 0:
            for m in pl_module.modules():
                if isinstance(m, nn.Linear):
                    m.reset_parameters()


class ReloadAt(pl.Callback):
    """Loads the weights of the start of fit back at batch ``at``."""

    def __init__(self, at: int = 6) -> None:
        self.at = at
        self.state: dict[str, Tensor] = {}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.state = {k: v.clone() for k, v in pl_module.state_dict().items()}

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if batch_idx == self.at:
            pl_module.load_state_dict(self.state)


class EditInForward(EncoderHead):
    """Rescales the head in place under `torch.no_grad()` in `forward`."""

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            with torch.no_grad():
                self.head.weight.mul_(0.99)
        return super().forward(x)


# ---------------------------------------------------------------------- 4. frozen parts
class BNBackbone(Classifier):
    """A convolutional backbone with BatchNorm and a linear head; ``freeze`` freezes the
    backbone's parameters (its BatchNorm stays in training mode unless ``eval_at_epoch_start``
    puts the backbone in eval mode, where Lightning keeps it)."""

    def __init__(self, freeze: bool = True, eval_at_epoch_start: bool = False,
                 track: bool = True, **kwargs: Any) -> None:
        super().__init__(net=nn.Identity(), **kwargs)
        self.backbone = nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 4, 3, padding=1),
            nn.BatchNorm2d(4, track_running_stats=track), nn.ReLU(), nn.Flatten())
        self.head = nn.Linear(4 * 64, 10)
        self.eval_at_epoch_start = eval_at_epoch_start
        if freeze:
            self.backbone.requires_grad_(False)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.backbone(x))

    def on_train_epoch_start(self) -> None:
        if self.eval_at_epoch_start:
            self.backbone.eval()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.lr)


class FreezeLater(EncoderHead):
    """Freezes the encoder after a few warm-up batches while AdamW still holds it and
    `zero_grad` keeps the gradients as zero tensors: weight decay and momentum keep moving it."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if batch_idx == 3:
            self.encoder.requires_grad_(False)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        optimizer.zero_grad(set_to_none=False)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=0.1)


class EditFrozen(EncoderHead):
    """A frozen encoder edited in place at the end of every third batch."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.encoder.requires_grad_(False)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx % 3 == 2:
            with torch.no_grad():
                self.encoder[0].weight.add_(0.01)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.head.parameters(), lr=self.lr)


# ---------------------------------------------------------------------- 5. a scaler of its own
class OwnScaler(ManualClassifier):
    """Manual optimization that keeps its own ``torch.amp.GradScaler`` (on CPU), the way users
    write it: ``opt.zero_grad()``, the scaled loss's backward (``self.manual_backward`` or
    ``.backward()`` directly), optionally ``scaler.unscale_`` and clipping, then
    ``scaler.step`` on the raw optimizer (``opt.optimizer``) or on Lightning's wrapper, and
    ``scaler.update()``. (Clipping before ``scaler.unscale_``, the bug, is the registry's run
    ``scaler-clip-before-unscale``.)

    Args:
        backward: ``"manual"`` (``self.manual_backward``) or ``"direct"`` (``.backward()``).
        step: ``"raw"`` (``scaler.step(opt.optimizer)``) or ``"lightning"`` (``scaler.step(opt)``).
        clip: unscale and clip the gradients before the step.
        zero: call ``opt.zero_grad()`` (``False``: the real bug, gradients never zeroed).
        reset_at: re-initialize the head after the step of this batch (the real bug: a change
            outside the step).
        device: the scaler's device (``"cuda"`` with a CUDA trainer).
    """

    def __init__(self, backward: Literal["manual", "direct"] = "direct",
                 step: Literal["raw", "lightning"] = "raw", clip: bool = False,
                 zero: bool = True, reset_at: int | None = None, device: str = "cpu",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.backward_kind, self.step_kind, self.clip = backward, step, clip
        self.zero, self.reset_at = zero, reset_at
        self.scaler = torch.amp.GradScaler(device, init_scale=2.0**10)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        opt = self.optimizers()
        if self.zero:
            opt.zero_grad()  # type: ignore[union-attr]
        loss = self.loss(batch)
        scaled = self.scaler.scale(loss)
        if self.backward_kind == "manual":
            self.manual_backward(scaled)
        else:
            scaled.backward()
        target = opt.optimizer if self.step_kind == "raw" else opt  # type: ignore[union-attr]
        if self.clip:
            self.scaler.unscale_(target)
            torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)
        self.scaler.step(target)
        self.scaler.update()
        if batch_idx == self.reset_at:
            self.net[-1].reset_parameters()  # type: ignore[index,operator]
        self.log("train_loss", loss)
        return loss.detach()


# ---------------------------------------------------------------------- 6. backward of its own
class DirectBackward(ManualClassifier):
    """Manual optimization that calls ``loss.backward()`` itself (Lightning's
    ``on_before_backward`` does not fire) and zeros the gradients in place, the ways users
    write it.

    Args:
        zero: ``"lightning"`` (``opt.zero_grad(set_to_none=False)`` on Lightning's wrapper),
            ``"torch"`` (the same on the raw torch optimizer), ``"loop"``
            (``p.grad.zero_()`` for each parameter) or ``"never"`` (the real bug: the
            gradients accumulate across steps).
        when: zero ``"before"`` the backward or ``"after"`` the step.
        micro: backwards per step (the batch split in ``micro`` parts, accumulated).
    """

    def __init__(self, zero: Literal["lightning", "torch", "loop", "never"] = "lightning",
                 when: Literal["before", "after"] = "before", micro: int = 1,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.zero, self.when, self.micro = zero, when, micro

    def _zero(self, opt: Any) -> None:
        if self.zero == "lightning":
            opt.zero_grad(set_to_none=False)
        elif self.zero == "torch":
            opt.optimizer.zero_grad(set_to_none=False)
        elif self.zero == "loop":
            for p in self.parameters():
                if p.grad is not None:
                    p.grad.zero_()

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        opt = self.optimizers()
        if self.when == "before":
            self._zero(opt)
        x, y = batch
        losses = [self.loss((xs, ys)) / self.micro
                  for xs, ys in zip(x.chunk(self.micro), y.chunk(self.micro), strict=True)]
        for part in losses:
            part.backward()
        loss = torch.stack(losses).sum().detach()
        opt.step()  # type: ignore[union-attr]
        if self.when == "after":
            self._zero(opt)
        self.log("train_loss", loss)
        return loss.detach()
