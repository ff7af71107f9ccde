"""The report's ``run`` section: the run's settings beside its findings (what
``lightning-triage diff`` compares), and the ``run.unseeded`` finding."""

from __future__ import annotations

import os
import platform
import uuid
from typing import Any

import lightning
import lightning.pytorch as pl
import torch

from lightning_triage.findings import Finding, _jsonable


def strategy_name(strategy: object) -> str:
    """Short strategy name: ``strategy_name`` where the class has one, else ``DDPStrategy`` ->
    ``ddp``, ``FSDPStrategy`` -> ``fsdp``."""
    name = getattr(type(strategy), "strategy_name", None)
    if isinstance(name, str):
        return name
    return type(strategy).__name__.removesuffix("Strategy").lower() or "unknown"


def global_seed() -> int | None:
    """The seed of ``lightning.seed_everything`` (it sets ``PL_GLOBAL_SEED``; so does
    LightningCLI's ``seed_everything``), or ``None`` when it was not called in this process.
    A seed set another way (``torch.manual_seed`` alone) cannot be seen."""
    value = os.environ.get("PL_GLOBAL_SEED")
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _short(value: Any, limit: int = 200) -> Any:
    """JSON-ready ``value`` with long strings and lists cut (the run record stays small)."""
    value = _jsonable(value)
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + "…"
    if isinstance(value, list):
        return [_short(v, limit) for v in value[:32]]
    if isinstance(value, dict):
        return {k: _short(v, limit) for k, v in list(value.items())[:64]}
    return value


def _optimizers(trainer: pl.Trainer) -> list[dict[str, Any]]:
    out = []
    for opt in trainer.optimizers:
        groups = opt.param_groups
        info: dict[str, Any] = {"class": type(opt).__name__, "param_groups": len(groups)}
        for key in ("lr", "momentum", "weight_decay", "betas", "eps", "nesterov"):
            values = [g[key] for g in groups if key in g]
            if key == "lr":
                values = [g.get("initial_lr", g["lr"]) for g in groups if "lr" in g]
            if values:
                info[key] = _short(values[0] if all(v == values[0] for v in values) else values)
        out.append(info)
    return out


def _schedulers(trainer: pl.Trainer) -> list[dict[str, Any]]:
    out = []
    for cfg in getattr(trainer, "lr_scheduler_configs", []) or []:
        sched = cfg.scheduler
        info: dict[str, Any] = {"class": type(sched).__name__, "interval": cfg.interval,
                                "frequency": cfg.frequency}
        for key in ("step_size", "gamma", "T_max", "max_lr", "total_steps", "milestones",
                    "warmup_steps", "eta_min", "factor", "patience"):
            if hasattr(sched, key):
                info[key] = _short(getattr(sched, key))
        out.append(info)
    return out


def _batch_size(trainer: pl.Trainer) -> int | None:
    loader = trainer.train_dataloader
    for candidate in (loader, getattr(loader, "loaders", None),
                      getattr(loader, "iterables", None)):
        size = getattr(candidate, "batch_size", None)
        if isinstance(size, int):
            return size
    return None


def run_info(trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
    """The ``run`` section of the report: the run's settings beside its findings (what
    ``lightning-triage diff`` compares)."""
    import numpy

    from lightning_triage._version import __version__

    strategy = trainer.strategy
    hparams: Any = {}
    try:
        hparams = _short({k: v for k, v in dict(pl_module.hparams).items()
                          if not str(k).startswith("_")})  # LightningCLI's `_instantiator`
    except Exception:  # hparams of unusual types: the report is no reason to fail
        hparams = {}
    return {
        "run_id": uuid.uuid4().hex,  # also in the Markdown and HTML written with the JSON
        "lightning": lightning.__version__,
        "torch": torch.__version__,
        "precision": str(trainer.precision),
        "strategy": strategy_name(strategy),
        "world_size": int(trainer.world_size),
        "global_step": int(trainer.global_step),
        "epochs": int(trainer.current_epoch),
        "model": type(pl_module).__name__,
        "trainable_params": int(sum(p.numel() for p in pl_module.parameters() if p.requires_grad)),
        "accelerator": type(trainer.accelerator).__name__.removesuffix("Accelerator").lower(),
        "devices": int(trainer.num_devices),
        "num_nodes": int(trainer.num_nodes),
        "seed": global_seed(),
        "hparams": hparams,
        "optimizers": _optimizers(trainer),
        "lr_schedulers": _schedulers(trainer),
        "batch_size": _batch_size(trainer),
        "accumulate_grad_batches": int(trainer.accumulate_grad_batches),
        "gradient_clip_val": _short(trainer.gradient_clip_val),
        "max_epochs": trainer.max_epochs,
        "max_steps": trainer.max_steps,
        "versions": {"python": platform.python_version(), "lightning": lightning.__version__,
                     "torch": torch.__version__, "numpy": numpy.__version__,
                     "lightning_triage": __version__},
    }


def unseeded_finding() -> Finding:
    """The ``run.unseeded`` info finding (no ``seed_everything`` call was seen)."""
    return Finding.create(
        "run.unseeded",
        "`PL_GLOBAL_SEED` is not set: `lightning.seed_everything` was not called, so a rerun "
        "will differ by chance as well as by what you changed (if you seed another way, "
        "ignore this).", check="TriageReport")
