"""The report callback: collects every triage check's findings and writes one report."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import lightning
import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from lightning_triage.callbacks.base import TriageCallback, collect_checks
from lightning_triage.findings import Finding
from lightning_triage.report import ReportStatus, build_report, print_report, write_report


def strategy_name(strategy: object) -> str:
    """Short strategy name: ``strategy_name`` where the class has one, else ``DDPStrategy`` ->
    ``ddp``, ``FSDPStrategy`` -> ``fsdp``."""
    name = getattr(type(strategy), "strategy_name", None)
    if isinstance(name, str):
        return name
    return type(strategy).__name__.removesuffix("Strategy").lower() or "unknown"


def run_info(trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
    """The ``run`` section of the report."""
    strategy = trainer.strategy
    return {
        "lightning": lightning.__version__,
        "torch": torch.__version__,
        "precision": str(trainer.precision),
        "strategy": strategy_name(strategy),
        "world_size": int(trainer.world_size),
        "global_step": int(trainer.global_step),
        "epochs": int(trainer.current_epoch),
        "model": type(pl_module).__name__,
        "trainable_params": int(sum(p.numel() for p in pl_module.parameters() if p.requires_grad)),
    }


def _check_writable(directory: Path) -> str | None:
    """``None`` if files can be written in ``directory`` (created if missing), else the error."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".triage-write-test"):
            pass
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


class TriageReport(Callback):
    """Collect the findings of every triage check on the trainer and write the report.

    Writes ``triage_report.json`` (schema ``lightning-triage/report/1``) and
    ``triage_report.md`` into ``report_dir`` at the end of fit, and also when fit crashes or is
    interrupted (``status`` says which), and prints a summary that leads with "start here".
    Under DDP the findings of every rank are gathered and rank 0 writes the files (on a crash,
    without collectives: the crashing rank's findings only).

    Args:
        report_dir: where to write; default the trainer's ``log_dir``, else ``default_root_dir``.
        verbose: print the summary to the console (rank zero).
        strict: raise errors met while building or writing the report instead of warning.

    When ``report_dir`` cannot be written, setup warns once and the run goes on without files
    (the summary is still printed and :attr:`report` still built).

    Raises:
        ValueError: at setup, with ``strict=True``, if ``report_dir`` cannot be written.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> from lightning_triage import InitialLossCheck, TriageReport
        >>> trainer = Trainer(callbacks=[InitialLossCheck(), TriageReport(report_dir="runs/triage")])
    """

    def __init__(self, report_dir: str | os.PathLike[str] | None = None, verbose: bool = True,
                 *, strict: bool = False) -> None:
        self.strict = strict
        self.report_dir = None if report_dir is None else str(report_dir)
        self.verbose = verbose
        self.report: dict[str, Any] | None = None
        self.paths: list[Path] = []
        self._resolved_dir: Path | None = None
        self._no_files = False
        self._done = False

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._done = False
        self._resolved_dir = None
        self._no_files = False
        self.report = None
        # `log_dir` broadcasts: every rank calls it here, never on the crash path
        directory = Path(self.report_dir or trainer.log_dir or trainer.default_root_dir)
        error = _check_writable(directory) if trainer.is_global_zero else None
        if not trainer.strategy.reduce_boolean_decision(error is None, all=True):
            message = (f"`report_dir` {str(directory)!r} is not writable ({error or 'on rank 0'})"
                       ": pass a directory lightning-triage can create files in.")
            if self.strict:
                raise ValueError(message)
            rank_zero_warn(f"[lightning-triage] {message} The run goes on; the report is not "
                           "written to files.", category=RuntimeWarning)
            self._no_files = True
        self._resolved_dir = directory

    def _write(self, trainer: pl.Trainer, pl_module: pl.LightningModule, status: ReportStatus,
               gather: bool) -> None:
        directory = self._resolved_dir
        if self._done or directory is None:
            # no setup in this process: e.g. the main process of `ddp_spawn`, whose workers
            # watched the run and wrote the report; do not overwrite it with an empty one
            return
        self._done = True
        try:
            self._build_and_write(trainer, pl_module, status, gather, directory)
        except Exception as exc:  # never break the run (or mask its exception) over the report
            if self.strict:
                raise
            rank_zero_warn(f"[lightning-triage] could not write the report: "
                           f"{type(exc).__name__}: {exc}")

    def _build_and_write(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                         status: ReportStatus, gather: bool, directory: Path) -> None:
        checks: list[TriageCallback] = collect_checks(trainer.callbacks)  # type: ignore[attr-defined]
        findings = [f for check in checks for f in check.findings]
        if gather and trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, [f.to_dict() for f in findings])
            findings = [Finding.from_dict(d) for rank_list in gathered for d in rank_list]
        if not trainer.is_global_zero:
            return
        series: dict[str, list[list[float]]] = {}
        for check in checks:
            series.update(check.series())
        self.report = build_report(findings, status=status, run=run_info(trainer, pl_module),
                                   checks=[c.check_status() for c in checks], series=series)
        self.paths = [] if self._no_files else write_report(self.report, directory)
        if self.verbose:
            print_report(self.report, path=self.paths[0] if self.paths else None)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write(trainer, pl_module, "completed", gather=True)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        interrupted = isinstance(exception, (KeyboardInterrupt, SIGTERMException))
        self._write(trainer, pl_module, "interrupted" if interrupted else "crashed", gather=False)
