"""Regenerate docs/gallery.md: real finding messages from real ``Trainer.fit`` runs.

Run: ``PYTHONPATH=src python docs/make_gallery.py`` (needs the ``demo`` extra; a few minutes on
2 CPU cores). Each scenario trains a small model with ``Triage()`` attached and a bug put in on
purpose; the first message seen for each finding code is written to the page, verbatim (wall
times left out, so that a rerun changes only what changed).

``--only CODE`` (repeatable) updates those codes' entries alone and keeps every other entry as
it is: it reruns the scenario each entry names; for a new code (no entry yet), the scenarios no
entry names yet, that is the one you added to :data:`SCENARIOS` for it (every scenario when none
is new). A code no run produces is listed under "Codes without a recorded example".
"""

from __future__ import annotations

import argparse
import logging
import re
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage import Triage
from lightning_triage.demo.digits import DigitsMLP, digits_loaders, load_digits_tensors
from lightning_triage.demo.numerics import log_softmax_scenario
from lightning_triage.demo.sequences import TinyLM, random_token_loaders
from lightning_triage.demo.wiring import DetachedEncoderMLP
from lightning_triage.findings import CODES, stage_index
from lightning_triage.report import remedy_line

Loaders = tuple[DataLoader, DataLoader]


def loaders(x: Tensor, y: Tensor, xv: Tensor, yv: Tensor, shuffle: bool = True) -> Loaders:
    train = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=shuffle,
                       generator=torch.Generator().manual_seed(0))
    return train, DataLoader(TensorDataset(xv, yv), batch_size=256)


def digits(**changes: Callable[[Tensor], Tensor]) -> Loaders:
    """Digits loaders with some of ``x``, ``y``, ``xv``, ``yv`` transformed."""
    parts = dict(zip(("x", "y", "xv", "yv"), load_digits_tensors(), strict=True))
    for key, change in changes.items():
        parts[key] = change(parts[key])
    return loaders(parts["x"], parts["y"], parts["xv"], parts["yv"])


def shuffled(y: Tensor) -> Tensor:
    return y[torch.randperm(len(y), generator=torch.Generator().manual_seed(1))]


def with_nan(x: Tensor) -> Tensor:
    x = x.clone()
    x[:, 10] = float("nan")
    return x


class NoTrainMLP(DigitsMLP):
    """Logs a loss that is divided by the batch size a second time."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y) / len(y)


class ZeroBranchMLP(DigitsMLP):
    """An extra branch multiplied by zero: its parameters get exactly zero gradient."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.extra = nn.Linear(64, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x) + 0.0 * self.extra(x)


class HeadOnlyOptimizerMLP(DigitsMLP):
    """``configure_optimizers`` passes only the last layer's parameters."""

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.net[2].parameters(), lr=self.lr)


class FrozenFirstLayerMLP(DigitsMLP):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net[0].requires_grad_(False)


class BatchMeanMLP(DigitsMLP):
    """Subtracts the batch mean from the logits: every output depends on the whole batch."""

    def forward(self, x: Tensor) -> Tensor:
        z = self.net(x)
        return z - z.mean(dim=0, keepdim=True)


class TargetInInputMLP(DigitsMLP):
    """``training_step`` feeds the labels into the model."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        x = x.clone()
        x[:, 0] = y.float()
        return F.cross_entropy(self(x), y)


class ShapeMismatchRegressor(DigitsMLP):
    """Regresses the digit value with MSE between a ``(N, 1)`` prediction and ``(N,)`` targets."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net[2] = nn.Linear(32, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.mse_loss(self(x), y.float())

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y.float()))


class TrainModeInValMLP(DigitsMLP):
    """Puts the model back in training mode during validation (dropout stays on)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 10))

    def on_validation_epoch_start(self) -> None:
        self.train()


class Log(nn.Module):
    def forward(self, h: Tensor) -> Tensor:
        return torch.log(h)  # log of a negative activation: NaN


class LogLayerMLP(DigitsMLP):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = nn.Sequential(nn.Linear(64, 32), Log(), nn.Linear(32, 10))


class Square(nn.Module):
    def forward(self, h: Tensor) -> Tensor:
        return h * h * 1000.0


class SquareMLP(DigitsMLP):
    """Squares its hidden activations times 1000: past float16's range on raw pixels."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = nn.Sequential(nn.Linear(64, 32), Square(), nn.Linear(32, 10))


class DeadReluMLP(DigitsMLP):
    """Hidden biases start at -20: most ReLUs never fire."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        nn.init.constant_(self.net[0].bias, -20.0)


class AutoEncoder(DigitsMLP):
    """Reconstructs its inputs from a batch that holds only inputs (no targets)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 64))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        (x,) = batch
        return F.mse_loss(self(x), x)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        (x,) = batch
        self.log("val_loss", F.mse_loss(self(x), x))


class DetachedLossMLP(DigitsMLP):
    """Returns a loss rebuilt as a new leaf tensor: no graph to the parameters."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y).detach().requires_grad_()


class ManualMLP(DigitsMLP):
    """Manual optimization, with a ``torch.log`` layer that makes NaN."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.automatic_optimization = False
        self.net = nn.Sequential(nn.Linear(64, 32), Log(), nn.Linear(32, 10))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        opt = self.optimizers()
        loss = F.cross_entropy(self(x), y)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss


class DeepSigmoidMLP(DigitsMLP):
    """Twelve sigmoid layers: the gradient dies out before it reaches the first ones."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        layers: list[nn.Module] = [nn.Linear(64, 32), nn.Sigmoid()]
        for _ in range(11):
            layers += [nn.Linear(32, 32), nn.Sigmoid()]
        self.net = nn.Sequential(*layers, nn.Linear(32, 10))


class WideMLP(DigitsMLP):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(hidden=256, optimizer="adam", **kwargs)


def inputs_only_loaders() -> tuple[DataLoader, DataLoader]:
    x, _, xv, _ = load_digits_tensors()
    return (DataLoader(TensorDataset(x), batch_size=32, shuffle=True,
                       generator=torch.Generator().manual_seed(0)),
            DataLoader(TensorDataset(xv), batch_size=256))


def nan_target_loaders() -> Loaders:
    x, y, xv, yv = load_digits_tensors()
    y = y.float()
    y[3] = float("nan")
    return loaders(x, y, xv, yv.float(), shuffle=False)


def small_loaders() -> Loaders:
    x, y, xv, yv = load_digits_tensors()
    train = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=32, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    return train, DataLoader(TensorDataset(xv, yv), batch_size=256)


def repeated_loaders() -> Loaders:
    x, y, xv, yv = load_digits_tensors()
    x, y = x[:32].repeat(20, 1), y[:32].repeat(20)
    return loaders(x, y, xv, yv, shuffle=False)


def duplicate_loaders() -> Loaders:
    x, y, xv, yv = load_digits_tensors()
    return loaders(x[:180].repeat_interleave(8, 0), y[:180].repeat_interleave(8, 0), xv, yv,
                   shuffle=False)


def imbalanced_loaders() -> Loaders:
    x, y, xv, yv = load_digits_tensors()
    keep = (y == 0) | (torch.arange(len(y)) % 20 == 0)
    return loaders(x[keep], y[keep], xv, yv)


def constant_loaders() -> Loaders:
    x, y, xv, yv = load_digits_tensors()
    return loaders(x[:1].expand_as(x).clone(), y, xv, yv)


def unshifted_token_loaders() -> Loaders:
    """Token data whose targets are the inputs, for a model that does not shift."""
    train, val = random_token_loaders()
    x, xv = train.dataset.tensors[0], val.dataset.tensors[0]  # type: ignore[attr-defined]
    return (DataLoader(TensorDataset(x, x.clone()), batch_size=32),
            DataLoader(TensorDataset(xv, xv.clone()), batch_size=32))


def clamped_std_loaders() -> Loaders:
    """Per-pixel standardization dividing by ``std.clamp(min=1e-8)``: a pixel always 0 in
    training explodes in the validation image that has ink there."""
    x, y, xv, yv = load_digits_tensors(standardize=False)
    mean, std = x.mean(0), x.std(0).clamp(min=1e-8)
    return loaders((x - mean) / std, y, (xv - mean) / std, yv)


def overlap_loaders() -> Loaders:
    x, y, _, _ = load_digits_tensors()
    return loaders(x, y, x[:300], y[:300])


Build = Callable[[], tuple[pl.LightningModule, Any, Any]]
Scenario = tuple[str, Build, dict[str, Any]]


class NoZeroGradMLP(DigitsMLP):
    """An ``optimizer_zero_grad`` override that does nothing: gradients add up step after step."""

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        pass


class LRToZeroMLP(DigitsMLP):
    """A step-wise LR schedule whose factor drops to 0 after 10 steps."""

    def configure_optimizers(self) -> Any:
        opt = super().configure_optimizers()
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 if s < 10 else 0.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class ResetEveryMLP(DigitsMLP):
    """Re-runs ``reset_parameters`` on the first layer every 8 batches."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (batch_idx + 1) % 8 == 0:
            self.net[0].reset_parameters()


class FreezeLaterMLP(DigitsMLP):
    """Freezes the first layer after 3 batches; AdamW still holds it and ``zero_grad`` keeps its
    gradient as a zero tensor."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if batch_idx == 3:
            self.net[0].requires_grad_(False)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        optimizer.zero_grad(set_to_none=False)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=0.1)


class FrozenBatchNormMLP(DigitsMLP):
    """A frozen input block with BatchNorm, never put in eval mode."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stem = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64)).requires_grad_(False)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(self.stem(x))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.net.parameters(), lr=self.lr)


def one_per_class(examples: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """A "deduplicating" collate keyed by the label: keeps one example per class."""
    kept = {int(y): (x, y) for x, y in examples}
    xs, ys = zip(*kept.values(), strict=True)
    return torch.stack(xs), torch.stack(ys)


def dropping_collate_loaders() -> Loaders:
    x, y, xv, yv = load_digits_tensors()
    train = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, collate_fn=one_per_class,
                       generator=torch.Generator().manual_seed(0))
    return train, DataLoader(TensorDataset(xv, yv), batch_size=256)


class NoisyDigits(TensorDataset):
    """Gaussian-noise augmentation drawn from a generator created in the main process."""

    def __init__(self, x: Tensor, y: Tensor) -> None:
        super().__init__(x, y)
        self.rng = np.random.default_rng(0)

    def __getitem__(self, i: int) -> tuple[Tensor, ...]:
        x, y = super().__getitem__(i)
        return x + torch.from_numpy(self.rng.normal(0, 0.1, x.shape)).float(), y


def shared_rng_loaders() -> Loaders:
    x, y, xv, yv = load_digits_tensors()
    train = DataLoader(NoisyDigits(x, y), batch_size=32, shuffle=True, num_workers=2,
                       generator=torch.Generator().manual_seed(0))
    return train, DataLoader(TensorDataset(xv, yv), batch_size=256)


class FunctionalDropoutMLP(DigitsMLP):
    """``F.dropout(h, 0.3)`` without ``training=self.training``: still random in eval mode."""

    def forward(self, x: Tensor) -> Tensor:
        return self.net[2](F.dropout(self.net[1](self.net[0](x)), 0.3))


class StaleBatchNormMLP(DigitsMLP):
    """BatchNorm with ``momentum=0`` after a small-scale layer: in training it normalizes each
    batch; its running statistics, what eval mode uses, never leave their initial values."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        first = nn.Linear(64, 64)
        nn.init.normal_(first.weight, std=0.01)
        self.net = nn.Sequential(first, nn.BatchNorm1d(64, momentum=0.0), nn.ReLU(), nn.Linear(64, 10))


class OldSpectralNormMLP(DigitsMLP):
    """Hidden layers under ``torch.nn.utils.spectral_norm``: its power-iteration vectors stay
    random until the first training-mode forward, so the sanity check evaluates garbage."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        sn = nn.utils.spectral_norm
        self.net = nn.Sequential(sn(nn.Linear(64, 64)), nn.ReLU(), sn(nn.Linear(64, 10)))


class Float32BodyMLP(DigitsMLP):
    """The hidden layers run under ``torch.autocast(enabled=False)``, in float32."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                 nn.Linear(256, 10))

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast("cpu", enabled=False):
            h = self.net[:4](x.float())
        return self.net[4](h)


def digits_model(model: Callable[[], pl.LightningModule],
                 data: Callable[[], Loaders] = digits_loaders) -> Build:
    def build() -> tuple[pl.LightningModule, Any, Any]:
        train, val = data()
        return model(), train, val
    return build


def mlp(lr: float = 0.1, **kwargs: Any) -> Callable[[], pl.LightningModule]:
    return lambda: DigitsMLP(lr=lr, **kwargs)


RAW = lambda: digits_loaders(standardize=False)  # noqa: E731
D = digits_model
SCENARIOS: list[Scenario] = [
    ("healthy digits MLP (SGD, lr 0.1)", D(mlp()), {}),
    ("raw 0-16 pixels", D(mlp(0.5), RAW), {}),
    ("NaN in one input feature", D(mlp(), lambda: digits(x=with_nan)), {}),
    ("labels 1..10 for a 10-class head", D(mlp(), lambda: digits(y=lambda y: y + 1)), {}),
    ("shuffled training labels", D(mlp(), lambda: digits(y=shuffled)), {}),
    ("class 0 dominates the training set", D(mlp(), imbalanced_loaders), {}),
    ("every training input is the same image", D(mlp(), constant_loaders), {}),
    ("each example repeated 8 times, not shuffled", D(mlp(), duplicate_loaders), {}),
    ("the loader yields the same 32 examples every step", D(mlp(), repeated_loaders), {}),
    ("validation examples taken from the training set", D(mlp(), overlap_loaders), {}),
    ("per-pixel standardization dividing by a std clamped to 1e-8", D(mlp(), clamped_std_loaders),
     {}),
    ("validation inputs left as raw pixels",
     D(mlp(), lambda: digits(xv=lambda x: load_digits_tensors(standardize=False)[2])), {}),
    ("logits multiplied by 100", D(mlp(logit_scale=100.0)), {}),
    ("loss divided by the batch size twice", D(lambda: NoTrainMLP(lr=0.1)), {}),
    ("encoder output `.detach()`ed", D(lambda: DetachedEncoderMLP(lr=0.1)), {}),
    ("an extra branch multiplied by 0", D(lambda: ZeroBranchMLP(lr=0.1)), {}),
    ("optimizer built over the last layer only", D(lambda: HeadOnlyOptimizerMLP(lr=0.1)), {}),
    ("first layer frozen", D(lambda: FrozenFirstLayerMLP(lr=0.1)), {}),
    ("logits minus their batch mean", D(lambda: BatchMeanMLP(lr=0.1)), {}),
    ("labels written into the first input feature", D(lambda: TargetInInputMLP(lr=0.1)), {}),
    ("MSE between (N, 1) predictions and (N,) targets",
     D(lambda: ShapeMismatchRegressor(lr=0.01)), {"task": "regression"}),
    ("`self.train()` in `on_validation_epoch_start`", D(lambda: TrainModeInValMLP(lr=0.1)), {}),
    ("transformer LM whose attention mask shows the future",
     lambda: (TinyLM(mask="future"), *random_token_loaders()), {}),
    ("a causal transformer LM trained with `labels = input_ids` and no shift",
     lambda: (TinyLM(), *unshifted_token_loaders()), {}),
    ("SGD at learning rate 50", D(mlp(50.0)), {}),
    ("SGD at learning rate 1e-5", D(mlp(1e-5)), {}),
    ("hidden biases initialized at -20 (dead ReLUs)", D(lambda: DeadReluMLP(lr=0.1)), {}),
    ("hand-written `-log(softmax(z))` loss, SGD lr 2", log_softmax_scenario, {}),
    ("`torch.log` of hidden activations", D(lambda: LogLayerMLP(lr=0.1)), {}),
    ("activations squared x1000 in `16-true` (fp16) on raw pixels",
     D(lambda: SquareMLP(lr=1e-6), RAW), {"precision": "16-true"}),
    ("NaN in one regression target", D(lambda: ShapeMismatchRegressor(lr=0.01), nan_target_loaders), {}),
    ("an autoencoder: batches hold inputs only", D(lambda: AutoEncoder(lr=0.1), inputs_only_loaders), {}),
    ("`training_step` returns `loss.detach().requires_grad_()`", D(lambda: DetachedLossMLP(lr=0.1)), {}),
    ("manual optimization with a `torch.log` layer", D(lambda: ManualMLP(lr=0.1)), {}),
    ("twelve sigmoid layers", D(lambda: DeepSigmoidMLP(lr=0.1)), {}),
    ("SGD at learning rate 3", D(mlp(3.0)), {}),
    ("`optimizer_zero_grad` overridden with `pass`", D(lambda: NoZeroGradMLP(lr=0.1)), {}),
    ("an LR schedule that drops to 0 after 10 steps", D(lambda: LRToZeroMLP(lr=0.1)), {}),
    ("the first layer re-initialized every 8 batches", D(lambda: ResetEveryMLP(lr=0.1)), {}),
    ("first layer frozen mid-run, AdamW with weight decay still holding it",
     D(lambda: FreezeLaterMLP(lr=0.1)), {}),
    ("a frozen BatchNorm stem left in training mode", D(lambda: FrozenBatchNormMLP(lr=0.1)), {}),
    ("a collate function that keeps one example per class",
     D(mlp(), dropping_collate_loaders), {}),
    ("noise drawn from a generator the dataset created, 2 workers",
     D(mlp(), shared_rng_loaders), {}),
    ("`F.dropout(h, 0.3)` without `training=self.training`",
     D(lambda: FunctionalDropoutMLP(lr=0.1)), {}),
    ("BatchNorm with `momentum=0` (Adam, lr 3e-3)",
     D(lambda: StaleBatchNormMLP(lr=3e-3, optimizer="adam")), {}),
    ("layers under the old `torch.nn.utils.spectral_norm`, evaluated at the sanity check",
     D(lambda: OldSpectralNormMLP(lr=0.1)), {}),
    ("`gradient_clip_val=1e-4` with SGD (gradient norms about 1)", D(mlp()),
     {"gradient_clip_val": 1e-4}),
    ("hidden layers under `torch.autocast(enabled=False)` in `bf16-mixed`",
     D(lambda: Float32BodyMLP(lr=0.1)), {"precision": "bf16-mixed"}),
    ("256-unit MLP, Adam, 64 training examples, 30 epochs",
     D(lambda: WideMLP(lr=1e-2), small_loaders), {"max_epochs": 30}),
]


def run(story: str, build: Callable[[], tuple[pl.LightningModule, Any, Any]],
        options: dict[str, Any], root: Path) -> tuple[list[dict[str, Any]], str | None]:
    options = dict(options)
    precision = options.pop("precision", "32-true")
    max_epochs = options.pop("max_epochs", 2)
    clip = options.pop("gradient_clip_val", None)
    pl.seed_everything(0, verbose=False)
    model, train, val = build()
    triage = Triage(report_dir=root, verbose=False, **options)
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=[triage], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False,
                         default_root_dir=root, precision=precision, gradient_clip_val=clip)
    try:
        trainer.fit(model, train, val)
    except Exception as exc:  # broken runs may crash: the report is written anyway
        print(f"  ({story}: fit raised {type(exc).__name__})")
    report = triage.report.report
    return ([], None) if report is None else (report["findings"], report["start_here"])


MISSING_HEADING = "## Codes without a recorded example"
_WALL_TIME = re.compile(r"\d+(?:\.\d+)? s, |, \d+(?:\.\d+)? s(?=\))")


def entry(code: str, story: str, f: dict[str, Any]) -> str:
    """One code's section of the page: the run, the message (without wall times), the hint."""
    where = f" at step {f['global_step']}" if f.get("global_step") is not None else ""
    layer = f", layer `{f['layer']}`" if f.get("layer") else ""
    message = _WALL_TIME.sub("", " ".join(f["message"].split()))
    lines = [f"## `{code}`", "", f"*{f['severity']}* — run: {story}{where}{layer}.", "",
             f"> {message}", "", f"**Next:** {f['hint']}", ""]
    trial = remedy_line(code, f.get("remedy"))
    if trial is not None:  # the lead's fix tried on a copy (docs/remedies.md)
        lines += [f"**Remedy:** {trial}", ""]
    return "\n".join(lines)


def read_entries(text: str) -> dict[str, str]:
    """The sections of an existing page, by code."""
    parts = re.split(r"^(?=## )", text, flags=re.MULTILINE)
    return {m.group(1): part.rstrip("\n") + "\n" for part in parts
            if (m := re.match(r"## `([\w.]+)`\n", part))}


def page(entries: dict[str, str]) -> str:
    lines = [
        "# Finding gallery: real messages",
        "",
        "Each entry is the message a real `Trainer.fit` run produced, verbatim: a small model on",
        "scikit-learn's digits (or random tokens) with `Triage()` attached and one bug put in on",
        "purpose. What each code means, its thresholds and how to tune them are on the stage's page",
        "([the finding codes](findings.md) link them all).",
        "",
        f"Generated by `python docs/make_gallery.py` (torch {torch.__version__},",
        f"Lightning {pl.__version__}, CPU; wall times left out); numbers differ a little between",
        "machines.",
        "",
    ]
    missing = []
    for code in sorted(CODES, key=lambda c: (stage_index(CODES[c].stage), c)):
        if code in entries:
            lines.append(entries[code])
        else:
            missing.append(code)
    if missing:
        lines += [MISSING_HEADING, "",
                  "None of the runs above produced these; their stage pages describe them:", ""]
        lines += [f"- `{code}`" for code in missing] + [""]
    return "\n".join(lines)


def _named_story(entry_text: str, stories: list[str]) -> str | None:
    """The scenario story an entry's "run:" line names (the longest that matches), or None."""
    run_line = re.search(r"— run: (.*)", entry_text)
    named = [s for s in stories if run_line and run_line.group(1).startswith(s)]
    return max(named, key=len) if named else None


def scenarios_for(codes: list[str], entries: dict[str, str]) -> list[Scenario]:
    """The scenarios to rerun for ``codes``: the one each code's entry names; for a code without
    an entry (a new code), the scenarios no entry of the page names yet (the one just added for
    it), or every scenario when each is already named."""
    stories = [sc[0] for sc in SCENARIOS]
    wanted: set[str] = set()
    for code in codes:
        story = _named_story(entries.get(code, ""), stories)
        if story is None:
            recorded = {_named_story(e, stories) for e in entries.values()}
            fresh = [s for s in stories if s not in recorded]
            if not fresh:
                return list(SCENARIOS)
            wanted.update(fresh)
        else:
            wanted.add(story)
    return [sc for sc in SCENARIOS if sc[0] in wanted]


def main(only: list[str]) -> None:
    unknown = [c for c in only if c not in CODES]
    if unknown:
        raise SystemExit(f"unknown finding codes: {unknown}")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    path = Path(__file__).with_name("gallery.md")
    entries = read_entries(path.read_text()) if only else {}
    targets = set(only or CODES)
    seen: dict[str, tuple[str, dict[str, Any]]] = {}
    leading: set[str] = set()  # codes whose example is the run's "start here"
    with tempfile.TemporaryDirectory() as tmp:
        for i, (story, build, options) in enumerate(scenarios_for(only, entries) if only else SCENARIOS):
            findings, start = run(story, build, options, Path(tmp) / str(i))
            for f in findings:
                code = f["code"]
                # the first run where the code leads (the bug put in for it), else the first seen
                if code in targets and (code not in seen or (code == start and code not in leading)):
                    seen[code] = (story, f)
                    if code == start:
                        leading.add(code)
            print(f"{story}: start here {start}; {len(seen)} codes so far")
    for code in targets:
        entries.pop(code, None)
    entries.update({code: entry(code, story, f) for code, (story, f) in seen.items()})
    path.write_text(page(entries))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], metavar="CODE",
                        help="update this code's entry alone (repeatable)")
    main(parser.parse_args().only)
