"""False alarms of `Triage()` on healthy runs of real model families and real set-ups.

    PYTHONPATH=src python benchmarks/false_alarms.py [--seeds 0-11] [--only bert,gpt2,...]

Every run trains well (the script prints the first and last training loss to show it) and uses
a set-up a user chooses on purpose: transformers' BERT sequence classifier and GPT-2 language
model built from small configs (no download), plain and with the usual fine-tuning recipe
(warm-up, ``gradient_clip_val=1.0``); a CNN with BatchNorm after its first convolution fed raw
0-255 pixels; polynomial regression features (rms ~6); ``EarlyStopping`` with
``ModelCheckpoint`` on ``val_loss``; ``Trainer(overfit_batches=2)``; LBFGS. Each is tiny (a few
hundred steps at most). The script prints, per run, the codes raised at warning or error, then
per code the runs that raised it. The rates in docs/findings.md come from this script.
"""

from __future__ import annotations

import argparse
import logging
import math
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_triage import Triage
from lightning_triage.demo.digits import load_digits_tensors

Built = tuple[pl.LightningModule, DataLoader, DataLoader, dict[str, Any]]


def _warmup_linear(opt: torch.optim.Optimizer, warm: int, total: int) -> Any:
    def factor(step: int) -> float:
        return (step + 1) / warm if step < warm else max(0.0, (total - step) / max(1, total - warm))
    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


class HFModule(pl.LightningModule):
    """A transformers model whose forward computes its own loss (``labels`` in the batch)."""

    def __init__(self, model: nn.Module, lr: float, warmup: int = 0, total: int = 0) -> None:
        super().__init__()
        self.model, self.lr, self.warmup, self.total = model, lr, warmup, total
        self.losses: list[float] = []

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self.model(**batch).loss
        self.losses.append(float(loss))
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self.model(**batch).loss
        self.log("val_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)
        if not self.warmup:
            return opt
        sched = _warmup_linear(opt, self.warmup, self.total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _dict_loader(data: dict[str, Tensor], batch_size: int, shuffle: bool, seed: int) -> DataLoader:
    keys = list(data)
    rows = [dict(zip(keys, values, strict=True)) for values in zip(*data.values(), strict=True)]
    return DataLoader(rows, batch_size=batch_size, shuffle=shuffle,  # type: ignore[arg-type]
                      generator=torch.Generator().manual_seed(seed))


def _bert_data(n: int, seed: int, seq: int = 24, vocab: int = 120) -> dict[str, Tensor]:
    """Sentences of random tokens, padded to varying lengths; label: token 5 appears more often
    than token 6."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(7, vocab, (n, seq), generator=g)
    marks = torch.rand(n, seq, generator=g)
    ids[marks < 0.15] = 5
    ids[(marks >= 0.15) & (marks < 0.28)] = 6
    lengths = torch.randint(seq // 2, seq + 1, (n,), generator=g)
    mask = (torch.arange(seq)[None] < lengths[:, None]).long()
    ids = ids * mask  # 0: padding
    ids[:, 0] = 1  # [CLS]
    labels = ((ids == 5).sum(1) > (ids == 6).sum(1)).long()
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def bert(seed: int, recipe: bool = False) -> Built:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=32, num_labels=2)
    steps = 150
    model = HFModule(BertForSequenceClassification(cfg), lr=2e-3, warmup=15 if recipe else 0,
                     total=steps)
    train = _dict_loader(_bert_data(512, seed), 16, True, seed)
    val = _dict_loader(_bert_data(128, seed + 1000), 64, False, seed)
    kwargs: dict[str, Any] = {"max_steps": steps, "val_check_interval": 16}
    if recipe:
        kwargs["gradient_clip_val"] = 1.0
    return model, train, val, kwargs


def _gpt2_data(n: int, seed: int, seq: int = 24, vocab: int = 48) -> dict[str, Tensor]:
    """A Markov chain in which every token has two possible successors (the same chain for
    every seed): next-token data; ``labels == input_ids`` (the model shifts inside)."""
    succ = torch.randint(0, vocab, (vocab, 2), generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    ids = torch.empty(n, seq, dtype=torch.long)
    ids[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    for t in range(1, seq):
        pick = torch.randint(0, 2, (n,), generator=g)
        ids[:, t] = succ[ids[:, t - 1], pick]
    return {"input_ids": ids, "labels": ids.clone()}


def gpt2(seed: int, recipe: bool = False) -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=48, n_embd=32, n_layer=2, n_head=2, n_positions=32)
    steps = 150
    model = HFModule(GPT2LMHeadModel(cfg), lr=3e-3, warmup=15 if recipe else 0, total=steps)
    train = _dict_loader(_gpt2_data(512, seed), 16, True, seed)
    val = _dict_loader(_gpt2_data(128, seed + 1000), 64, False, seed)
    kwargs: dict[str, Any] = {"max_steps": steps, "val_check_interval": 16}
    if recipe:
        kwargs["gradient_clip_val"] = 1.0
    return model, train, val, kwargs


class Classifier(pl.LightningModule):
    """A classifier over any ``net``, logging ``val_loss``."""

    def __init__(self, net: nn.Module, lr: float = 3e-3, optimizer: str = "adam",
                 loss: str = "ce") -> None:
        super().__init__()
        self.net, self.lr, self.optimizer_name, self.loss_name = net, lr, optimizer, loss
        self.losses: list[float] = []

    def _loss(self, batch: Any) -> Tensor:
        x, y = batch
        out = self.net(x)
        return F.mse_loss(out.squeeze(-1), y) if self.loss_name == "mse" else F.cross_entropy(out, y)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        if self.optimizer_name == "lbfgs":  # L2-regularized logistic regression
            loss = loss + 1e-3 * sum(p.pow(2).sum() for p in self.parameters())
        self.losses.append(float(loss))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("val_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.optimizer_name == "lbfgs":
            return torch.optim.LBFGS(self.parameters(), lr=1.0, max_iter=20,
                                     line_search_fn="strong_wolfe")
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def _digits(seed: int, scale: float = 1.0, batch_size: int = 32, n_train: int | None = None
            ) -> tuple[DataLoader, DataLoader]:
    """Digits pixels 0-16 times ``scale`` (a split that depends on ``seed``)."""
    xt, yt, xv, yv = load_digits_tensors(standardize=False, seed=seed)
    xt, xv = xt * scale, xv * scale
    if n_train is not None:
        xt, yt = xt[:n_train], yt[:n_train]
    train = DataLoader(TensorDataset(xt, yt), batch_size=batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(seed))
    return train, DataLoader(TensorDataset(xv, yv), batch_size=128)


class _Image(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.view(-1, 1, 8, 8)


def raw_pixel_cnn(seed: int) -> Built:
    """Raw 0-255 pixels into a CNN with BatchNorm right after its first convolution."""
    torch.manual_seed(seed)
    net = nn.Sequential(_Image(), nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(64, 10))
    train, val = _digits(seed, scale=255 / 16)
    return Classifier(net, lr=3e-3), train, val, {"max_epochs": 3}


def poly_regression(seed: int) -> Built:
    """A linear model on polynomial features x, x^2, x^3, x^4 of x in [-3, 3] (rms ~20) for a
    cubic target."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)

    def data(n: int) -> TensorDataset:
        x = torch.rand(n, 1, generator=g) * 6 - 3
        feats = torch.cat([x ** k for k in range(1, 5)], dim=1)
        y = 1 + 2 * x[:, 0] - x[:, 0] ** 2 + 0.5 * x[:, 0] ** 3
        return TensorDataset(feats, y)

    train = DataLoader(data(512), batch_size=32, shuffle=True,
                       generator=torch.Generator().manual_seed(seed))
    val = DataLoader(data(128), batch_size=128)
    return (Classifier(nn.Linear(4, 1), lr=1e-2, loss="mse"), train, val,
            {"max_epochs": 25})


def early_stopping(seed: int) -> Built:
    """A wide MLP on 200 digits for 40 epochs, stopped by ``EarlyStopping`` on ``val_loss`` and
    saved at its best by ``ModelCheckpoint``: the user handles overfitting."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    train, val = _digits(seed, scale=1 / 16, batch_size=20, n_train=200)
    callbacks = [EarlyStopping(monitor="val_loss", patience=3),
                 ModelCheckpoint(monitor="val_loss", save_top_k=1)]
    return (Classifier(net, lr=3e-3), train, val,
            {"max_epochs": 40, "callbacks": callbacks, "enable_checkpointing": True})


def overfit_batches(seed: int) -> Built:
    """``Trainer(overfit_batches=2)``: the user memorizes two batches on purpose."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    train, val = _digits(seed, scale=1 / 16)
    return Classifier(net, lr=3e-3), train, val, {"overfit_batches": 2, "max_epochs": 60}


def lbfgs(seed: int) -> Built:
    """L2-regularized logistic regression on digits, full batch, with LBFGS (up to 20 closure
    evaluations per step)."""
    torch.manual_seed(seed)
    train, val = _digits(seed, scale=1 / 16, batch_size=2000)
    return Classifier(nn.Linear(64, 10), optimizer="lbfgs"), train, val, {"max_epochs": 5}


FAMILIES: dict[str, Callable[[int], Built]] = {
    "bert": bert,
    "bert-recipe": lambda seed: bert(seed, recipe=True),
    "gpt2": gpt2,
    "gpt2-recipe": lambda seed: gpt2(seed, recipe=True),
    "raw-pixel-cnn": raw_pixel_cnn,
    "poly-regression": poly_regression,
    "early-stopping": early_stopping,
    "overfit-batches": overfit_batches,
    "lbfgs": lbfgs,
}


def _seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def run_one(name: str, seed: int) -> tuple[list[str], float, float]:
    """Fit one healthy run with ``Triage()``: the warning/error codes and the first and last
    training loss (mean of the first and last 10 steps)."""
    pl.seed_everything(seed, verbose=False)
    model, train, val, kwargs = FAMILIES[name](seed)
    root = Path(tempfile.mkdtemp(prefix="triage-false-alarms-"))
    triage = Triage(report_dir=root, verbose=False, overfit_time_budget=60.0)
    callbacks = [triage, *kwargs.pop("callbacks", [])]
    kwargs.setdefault("enable_checkpointing", False)
    trainer = pl.Trainer(callbacks=callbacks, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=root, accelerator="cpu",
                         num_sanity_val_steps=0, **kwargs)
    trainer.fit(model, train, val)
    report = triage.report.report
    assert report is not None
    problems = sorted({f["code"] for f in report["findings"] if f["severity"] != "info"})
    losses = [v for v in getattr(model, "losses", []) if math.isfinite(v)] or [math.nan]
    head, tail = losses[:10], losses[-10:]
    return problems, sum(head) / len(head), sum(tail) / len(tail)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="0-11", help="e.g. 0-9 or 0,1,2")
    parser.add_argument("--only", default="", help="comma-separated family names")
    args = parser.parse_args()
    torch.set_num_threads(1)
    seeds = _seeds(args.seeds)
    names = [n for n in FAMILIES if not args.only or n in args.only.split(",")]
    warnings.simplefilter("ignore")
    for logger in ("lightning", "lightning.pytorch", "lightning.fabric", "transformers"):
        logging.getLogger(logger).setLevel(logging.ERROR)
    per_code: Counter[str] = Counter()
    per_family: dict[str, Counter[str]] = {n: Counter() for n in names}
    flagged: Counter[str] = Counter()  # runs of each family with any warning or error
    runs = 0
    start = time.perf_counter()
    for name in names:
        for seed in seeds:
            t0 = time.perf_counter()
            problems, first, last = run_one(name, seed)
            per_code.update(problems)
            per_family[name].update(problems)
            flagged[name] += bool(problems)
            runs += 1
            print(f"{name:16s} seed {seed}: loss {first:.3g} -> {last:.3g} "
                  f"({time.perf_counter() - t0:.1f} s): {', '.join(problems) or '-'}", flush=True)
    print(f"\n{runs} healthy runs ({len(names)} families x {len(seeds)} seeds), "
          f"{time.perf_counter() - start:.0f} s")
    print("\n| family | runs with a warning or error | codes |\n|---|---|---|")
    for name in names:
        found = per_family[name]
        print(f"| {name} | {flagged[name]} / {len(seeds)} | "
              f"{', '.join(f'`{c}` {n}' for c, n in sorted(found.items())) or '-'} |")
    print("\n| code | false alarms | rate |\n|---|---|---|")
    for code, count in sorted(per_code.items()):
        print(f"| `{code}` | {count} / {runs} | {count / runs:.1%} |")
    if not per_code:
        print(f"| (any) | 0 / {runs} | 0% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
