"""Broken runs of the healthy-recipe corpus (issue 41, :mod:`lightning_triage.demo.recipes`):
the bugs people report in those recipes, each with the healthy recipe as its fixed twin.

Each is caught, its twin silent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl

from lightning_triage.demo.recipes.classify import digits
from lightning_triage.demo.recipes.contrastive import CLIP, MixtureOfExperts, pairs
from lightning_triage.demo.recipes.generative import DDPM, VAE, digit_pixels
from lightning_triage.demo.scenario import Builder, Scenario

_FIT = {"limit_train_batches": 16, "limit_val_batches": 2}


def _build(model: Callable[[], pl.LightningModule],
           data: Callable[[int], tuple[Any, Any]]) -> Builder:
    """A builder of the model and the recipe's seed-0 data."""
    def build() -> tuple[pl.LightningModule, Any, Any]:
        train, val = data(0)
        return model(), train, val
    return build


RECIPE_RUNS: list[Scenario] = [
    # The timestep never reaches the denoiser: the loss still falls (to the average noise), the
    # samples are garbage. Reported as "the time step t is not used?"
    # (samb-t/unleashing-transformers#10) and as an embedding computed over the batch axis that
    # makes "the position in the diffusion process useless" (gmongaras/Diffusion_models_from_scratch#10).
    Scenario("ddpm-timestep-unused",
             "DDPM denoiser whose timestep embedding is built but never added "
             "(samb-t/unleashing-transformers#10)",
             "wiring.no_grad_params", _build(lambda: DDPM(use_time=False), digit_pixels),
             trainer_kwargs=_FIT, fixed=_build(DDPM, digit_pixels)),
    # The logit scale applied twice: 14.3^2 = 204 times the cosine similarities, a step-0 loss
    # near 35 where ln(64) = 4.2 is chance. Misapplied CLIP temperatures are reported in
    # BAAI-DCAI/M3D#52 (the log-scale used without `.exp()`) and bowang-lab/BLEEP#5 (divided in
    # the logits, multiplied in the targets).
    Scenario("clip-scale-twice",
             "CLIP loss with its logit scale applied twice (BAAI-DCAI/M3D#52)",
             "init.loss_above_chance", _build(lambda: CLIP(scale_twice=True), pairs),
             trainer_kwargs=_FIT, fixed=_build(CLIP, pairs)),
    # The KL term with the wrong sign: the encoder is rewarded for an ever wider posterior and the
    # loss falls without bound. Sign mix-ups of the VAE's KL: AntixK/PyTorch-VAE#68,
    # wiseodd/generative-models#43; "VAE loss becomes largely negative": SeldonIO/alibi-detect#316.
    Scenario("vae-kl-sign",
             "VAE whose KL term is subtracted (AntixK/PyTorch-VAE#68)",
             "curve.diverging", _build(lambda: VAE(kl_sign=-1.0), digit_pixels),
             max_epochs=4, trainer_kwargs={**_FIT, "limit_train_batches": 32},  # -5e4 at the end
             fixed=_build(VAE, digit_pixels)),
    # A router that receives no gradient: its probabilities detached, the experts are picked but
    # the router never learns ("Zero grad of w_gate": davidmrau/mixture-of-experts#27; the
    # router's gradient path: lucidrains/mixture-of-experts#7).
    Scenario("moe-detached-router",
             "mixture of experts whose router probabilities are `.detach()`ed "
             "(davidmrau/mixture-of-experts#27)",
             "wiring.no_grad_params",
             _build(lambda: MixtureOfExperts(detach_router=True), digits),
             trainer_kwargs=_FIT, fixed=_build(MixtureOfExperts, digits)),
]
