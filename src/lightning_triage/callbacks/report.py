"""The report callback: collects every triage check's findings and writes one report."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import lightning
import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from lightning_triage._compat import batches_completed
from lightning_triage.callbacks._args import check_bool, check_choice, fail
from lightning_triage.callbacks._rank_files import (
    merge_rank_files,
    remove_rank_files,
    write_rank_file,
)
from lightning_triage.callbacks._remedy import RemedyRecorder, verify_lead
from lightning_triage.callbacks._run_info import (
    global_seed,
    run_info,
    strategy_name,
    unseeded_finding,
)
from lightning_triage.callbacks.base import TriageCallback, collect_checks
from lightning_triage.findings import SEVERITIES, Finding, epoch_of_step
from lightning_triage.probing import STEP_CALLS
from lightning_triage.ranking import settle_suspicions
from lightning_triage.report.build import (
    FailOn,
    ReportStatus,
    TriageGateError,
    build_report,
    minimal_report,
)
from lightning_triage.report.console import print_report
from lightning_triage.report.files import write_report
from lightning_triage.report.markdown import render_markdown
from lightning_triage.report.safe import describe

#: ``fail_on`` as the callbacks take it: a severity, or ``"none"`` / ``None`` for never (the
#: command line's ``--fail-on none``).
GateOn = Literal["error", "warning", "info", "none"]
_FAIL_ON = (None, "none", *SEVERITIES)


def _severity_metrics(counts: Mapping[str, int]) -> dict[str, float]:
    return {f"triage/findings_{sev}": float(counts.get(sev, 0)) for sev in SEVERITIES}


def _check_writable(directory: Path) -> str | None:
    """``None`` if files can be written in ``directory`` (created if missing), else the error."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".triage-write-test"):
            pass
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


#: The note of a report written before its fit ended (at setup, and before the remedy trial):
#: a report that still carries it is the report of a fit that did not end as planned.
PENDING_NOTE = ("written before the fit ended (status \"interrupted\" until then): the report "
                "is rewritten when the fit ends; if this note is still here, the process was "
                "stopped before it could write again")
#: The note of a report whose remedy trial was interrupted.
TRIAL_INTERRUPTED_NOTE = ("interrupted during the remedy trial, after the fit's last step: the "
                          "findings are the fit's, without a remedy block")


@contextlib.contextmanager
def _terminate_raises() -> Iterator[None]:
    """SIGTERM raises ``SIGTERMException`` inside the block (the end of fit runs after
    Lightning has put the default handler back, which would kill the process before the
    report is rewritten); the earlier handler is put back after. Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise SIGTERMException()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):  # no signals here (an embedded interpreter)
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signal.SIGTERM, previous)


def _with_notes(report: dict[str, Any], *notes: str) -> dict[str, Any]:
    old = report.get("notes")
    return {**report, "notes": [*(old if isinstance(old, list) else []), *notes]}


class TriageReport(Callback):
    """Collect the findings of every triage check on the trainer and write the report.

    Writes ``triage_report.json`` (schema ``lightning-triage/report/1``) and
    ``triage_report.md`` into ``report_dir`` at the end of fit, and also when fit crashes or is
    interrupted (``status`` says which), and prints a summary that leads with "start here".
    Under DDP the findings of every rank are gathered and rank 0 writes the files. On a crash
    no collective is called: every other rank leaves its findings in a rank file beside the
    report (``.triage_rank<N>.json``), and rank 0 merges those it finds (waiting up to 2 s) and
    names the ranks that left none (``run.ranks_missing``, info).

    Its own findings: ``run.ranks_missing`` (info, above) and ``run.unseeded`` (info: no
    ``seed_everything`` call was seen before the fit). Findings reach the trainer's loggers as
    they happen (``log_findings``): every logger gets the running counts
    ``triage/findings_error``, ``triage/findings_warning`` and ``triage/findings_info``
    through ``log_metrics`` at the finding's step, and a ``TensorBoardLogger`` also gets the
    finding as text (tag ``triage/findings``); at the end the same counts and, on TensorBoard,
    the Markdown report (tag ``triage/summary``).

    Args:
        report_dir: where to write; default the trainer's ``log_dir``, else ``default_root_dir``.
        verbose: print the summary to the console (rank zero).
        html: also write the self-contained ``triage_report.html`` (plots need matplotlib).
        log_findings: send findings and the summary to the trainer's loggers.
        fail_on: ``"error"``, ``"warning"`` or ``"info"``: raise :class:`TriageGateError` at the
            end of fit (after the report is written) when the report holds findings at that
            severity or worse; ``"none"`` or ``None`` (default): never (as ``--fail-on none``
            on the command line). A gated run that is interrupted (Ctrl-C, SIGTERM) fails the
            gate too: its process exits 1 (Lightning alone exits 0 under SIGTERM).
        strict: raise errors met while building or writing the report instead of warning.
        verify_remedies: try the lead's fix on a copy of the run before writing the report
            (docs/remedies.md): for a learning-rate lead, the fit's first recorded batches are
            replayed from its starting state as they were and with the learning rate divided
            (or multiplied) by 10, then 100; the lead's finding gets a ``remedy`` block
            (confirmed, not confirmed, inconclusive or skipped, and why). It keeps the fit's
            starting state and first 30 batches on the host; a run with no such lead runs
            nothing. Under DDP rank 0 runs it on its own batches, with no collective.

    When ``report_dir`` cannot be written, setup warns once and the run goes on without files
    (the summary is still printed and :attr:`report` still built).

    Write first, try second: setup replaces any earlier report in ``report_dir`` with one of this
    fit (status ``"interrupted"`` and a note, until the fit ends), and before the remedy trial
    the report is written without it, then rewritten after it; an interrupt during the trial
    leaves the report of this fit, ``"interrupted"``, without a ``remedy`` block.

    Raises:
        TriageConfigError: for an unknown ``fail_on`` or an argument of the wrong type.
        ValueError: at setup, with ``strict=True``, if ``report_dir`` cannot be written.
        TriageGateError: at the end of fit, with ``fail_on``, listing the findings.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> from lightning_triage import InitialLossCheck, TriageReport
        >>> trainer = Trainer(callbacks=[InitialLossCheck(), TriageReport(report_dir="runs/triage")])
    """

    #: The report owns the run-settings context codes (``run.*``), which it builds itself.
    stage: ClassVar[str] = "run"
    codes: ClassVar[tuple[str, ...]] = ("run.unseeded", "run.ranks_missing")

    def __init__(self, *, report_dir: str | os.PathLike[str] | None = None, verbose: bool = True,
                 html: bool = True, log_findings: bool = True, fail_on: GateOn | None = None,
                 strict: bool = False, verify_remedies: bool = True) -> None:
        if report_dir is not None and not isinstance(report_dir, (str, os.PathLike)):
            raise fail("report_dir", report_dir, "a path or None")
        for name, flag in (("verbose", verbose), ("html", html), ("log_findings", log_findings),
                           ("strict", strict), ("verify_remedies", verify_remedies)):
            check_bool(name, flag)
        check_choice("fail_on", fail_on, _FAIL_ON)
        self.strict = strict
        self.report_dir = None if report_dir is None else str(report_dir)
        self.verbose = verbose
        self.html = html
        self.log_findings = log_findings
        self.fail_on = fail_on
        self.verify_remedies = verify_remedies
        #: the fit's starting state and first batches, for the remedy trial
        self.remedies = RemedyRecorder()
        self._logged: dict[str, int] = dict.fromkeys(SEVERITIES, 0)
        self.report: dict[str, Any] | None = None
        self.paths: list[Path] = []
        self._resolved_dir: Path | None = None
        self._no_files = False
        self._done = False
        #: the findings the gate decides from (set when the report is built) and the report's
        #: own error while building it
        self._gate_findings: list[Finding] | None = None
        self._build_error: Finding | None = None
        #: ``(global_step, epoch)`` at each training epoch's start: a finding's epoch is its step's
        self._epoch_starts: list[tuple[int, int]] = []
        self._exception: BaseException | None = None

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
        if error is None and trainer.is_global_zero and trainer.world_size > 1:
            remove_rank_files(directory)  # an earlier fit's (before any rank of this one writes)
        self._exception = None
        if not trainer.strategy.reduce_boolean_decision(error is None, all=True):
            message = (f"`report_dir` {str(directory)!r} is not writable ({error or 'on rank 0'})"
                       ": pass a directory lightning-triage can create files in.")
            if self.strict:
                raise ValueError(message)
            rank_zero_warn(f"[lightning-triage] {message} The run goes on; the report is not "
                           "written to files.", category=RuntimeWarning)
            self._no_files = True
        self._resolved_dir = directory
        if trainer.is_global_zero and not self._no_files:
            self._write_placeholder(trainer, pl_module, directory)
        self._logged = dict.fromkeys(SEVERITIES, 0)
        self.remedies.reset()
        self._step_calls = dict(STEP_CALLS)
        self.idle = not self.verify_remedies
        self.paths = []
        self._gate_findings = None
        self._build_error = None
        self._epoch_starts = []
        listener = self._on_finding if self.log_findings else None
        for check in collect_checks(trainer.callbacks):  # type: ignore[attr-defined]
            check.finding_listener = listener

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_starts.append((int(trainer.global_step), int(trainer.current_epoch)))

    @property
    def idle(self) -> bool:
        """``True`` once the remedy recorder has what it needs: the :class:`~lightning_triage.
        Triage` bundle then stops calling :meth:`on_train_batch_start`."""
        return getattr(self, "_idle", False)

    @idle.setter
    def idle(self, value: bool) -> None:
        if value != getattr(self, "_idle", False):
            TriageCallback.idle_version += 1
            self._idle = value

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.idle or self._resolved_dir is None:
            return
        try:
            self.remedies.record(trainer, pl_module, batch)
        except Exception as exc:  # never break the run over the recording
            if self.strict:
                raise
            self.remedies.reason = f"recording failed: {type(exc).__name__}: {exc}"
            self.remedies.done = True
        if self.remedies.done:
            self.idle = True

    # ------------------------------------------------------------------ loggers
    def _on_finding(self, trainer: pl.Trainer, finding: Finding) -> None:
        """Send a new finding to the loggers (rank zero; never raises into the check)."""
        if not trainer.loggers or not trainer.is_global_zero:
            return
        self._logged[finding.severity] = self._logged.get(finding.severity, 0) + 1
        step = trainer.global_step if finding.global_step is None else finding.global_step
        text = (f"**{finding.severity}** `{finding.code}` (step {step}"
                + (f", layer `{finding.layer}`" if finding.layer else "") + f"): {finding.title}."
                f"\n\n{finding.message}\n\nNext: {finding.hint}")
        self._to_loggers(trainer, _severity_metrics(self._logged), step, "triage/findings", text)

    def _to_loggers(self, trainer: pl.Trainer, metrics: Mapping[str, float], step: int,
                    tag: str, text: str) -> None:
        from lightning.pytorch.loggers import TensorBoardLogger

        for logger in trainer.loggers:
            try:
                logger.log_metrics(dict(metrics), step=step)
                if isinstance(logger, TensorBoardLogger):
                    logger.experiment.add_text(tag, text, global_step=step)
            except Exception as exc:  # a logger's failure must not break the run
                if self.strict:
                    raise
                rank_zero_warn(f"[lightning-triage] could not log to {type(logger).__name__}: "
                               f"{type(exc).__name__}: {exc}")

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
                           f"{type(exc).__name__}: {describe(exc)[:500]}")

    def _write_placeholder(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           directory: Path) -> None:
        """Every fit starts fresh: the report of an earlier fit in ``directory`` is replaced by
        one of this fit that says it has not ended (never breaks the run)."""
        try:
            report = _with_notes(minimal_report([], status="interrupted",
                                                run=self._fallback_run(trainer, pl_module)),
                                 PENDING_NOTE)
            write_report(report, directory, html=self.html)
        except Exception as exc:
            if self.strict:
                raise
            rank_zero_warn(f"[lightning-triage] could not replace the earlier report in "
                           f"{str(directory)!r}: {type(exc).__name__}: {describe(exc)[:300]}")

    def _held_findings(self, trainer: pl.Trainer, gather: bool) -> tuple[
            list[TriageCallback], list[Finding]]:
        """The checks and the findings they hold (every rank's, gathered, when ``gather``)."""
        checks: list[TriageCallback] = collect_checks(trainer.callbacks)  # type: ignore[attr-defined]
        starts = getattr(self, "_epoch_starts", [])
        findings = [epoch_of_step(f, starts) for check in checks for f in check.findings]
        if gather and trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, [f.to_dict() for f in findings])
            findings = [Finding.from_dict(d) for rank_list in gathered for d in rank_list]
        return checks, findings

    def _report_error(self, exc: Exception, what: str) -> Finding:
        """A ``triage.check_error`` finding of the report itself (``what`` failed)."""
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
        error = describe(exc)[:2000]
        return Finding.create(
            "triage.check_error",
            f"`TriageReport` raised {type(exc).__name__} while {what}: {error}. The report "
            "holds the findings of the checks as they are (not settled or explained), without "
            "run settings, series or details.",
            check="TriageReport",
            evidence={"hook": "report", "exception": type(exc).__name__, "error": error,
                      "where": where})

    def _build_and_write(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                         status: ReportStatus, gather: bool, directory: Path) -> None:
        checks, findings = self._held_findings(trainer, gather)
        notes: list[str] = []
        if not gather and trainer.world_size > 1 and not self._no_files:
            if not trainer.is_global_zero:  # no collective on a crash: a file beside the report
                write_rank_file(directory, int(trainer.global_rank), status,
                                int(trainer.global_step), self._exception, findings)
            else:
                findings, notes = merge_rank_files(directory, int(trainer.world_size), findings)
        if global_seed() is None:
            findings.append(unseeded_finding())
        self._gate_findings = list(findings)
        if not trainer.is_global_zero:
            return
        if self.verify_remedies and status != "interrupted":
            first = list(findings)

            def write_first() -> None:  # the report without the trial, should it not end
                self._build_report(trainer, pl_module, "interrupted", checks, first,
                                   PENDING_NOTE)
                self._write_files(directory)

            # rank 0 alone, on a copy, with no collective (the other ranks wait in the gate)
            try:
                findings = verify_lead(trainer, pl_module, self.remedies, findings,
                                       strict=self.strict, before_trial=write_first)
            except (KeyboardInterrupt, SystemExit):  # this fit's report, without the trial
                self._build_report(trainer, pl_module, "interrupted", checks, first,
                                   TRIAL_INTERRUPTED_NOTE)
                self._write_files(directory)
                raise
        self._build_report(trainer, pl_module, status, checks, findings, *notes)
        self._write_files(directory)
        for step in (self._print, self._log_summary):
            try:
                step(trainer)
            except Exception as exc:  # the files are written: the console and loggers are extra
                if self.strict:
                    raise
                rank_zero_warn(f"[lightning-triage] could not show the report: "
                               f"{type(exc).__name__}: {describe(exc)[:500]}")

    def _write_files(self, directory: Path) -> None:
        if not self._no_files and self.report is not None:
            self.paths = write_report(self.report, directory, html=self.html)

    def _build_report(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                      status: ReportStatus, checks: list[TriageCallback],
                      findings: list[Finding], *notes: str) -> None:
        """Build :attr:`report` (the minimal report of the findings as they are, with a
        ``triage.check_error`` of the report's own, when the full one cannot be built)."""
        try:
            self.report = self._build(trainer, pl_module, status, checks, findings)
        except Exception as exc:
            if self.strict:
                raise
            error = self._report_error(exc, "building the report")
            self._build_error = error
            self._gate_findings = [*findings, error]
            rank_zero_warn(f"[lightning-triage] {error.message}", category=RuntimeWarning)
            self.report = minimal_report(self._gate_findings, status=status,
                                         run=self._fallback_run(trainer, pl_module))
        if notes:
            self.report = _with_notes(self.report, *notes)

    def _build(self, trainer: pl.Trainer, pl_module: pl.LightningModule, status: ReportStatus,
               checks: list[TriageCallback], findings: list[Finding]) -> dict[str, Any]:
        series: dict[str, list[list[float]]] = {}
        details: dict[str, Any] = {}
        for check in checks:
            series.update(check.series())
            details.update(check.report_details())
        run = run_info(trainer, pl_module)
        run["training_step_calls"] = self._step_counts(trainer)
        if run["batch_size"] is None and isinstance(details.get("first_batch"), Mapping):
            shape = details["first_batch"].get("shape") or []
            run["batch_size"] = shape[0] if shape else None
        return build_report(findings, status=status, run=run,
                            checks=[c.check_status() for c in checks], series=series,
                            details=details)

    def _step_counts(self, trainer: pl.Trainer) -> dict[str, int]:
        """The user's ``training_step`` calls in this fit: the real steps, the probes' and the
        remedy trial's on copies."""
        since = getattr(self, "_step_calls", {})
        return {"fit": batches_completed(trainer), **{k: v - since.get(k, 0) for k, v in STEP_CALLS.items()}}

    @staticmethod
    def _fallback_run(trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        """What of the run record can still be read (each value on its own)."""
        run: dict[str, Any] = {"run_id": uuid.uuid4().hex, "lightning": lightning.__version__,
                               "torch": torch.__version__, "seed": global_seed()}
        readers: dict[str, Callable[[], Any]] = {
            "precision": lambda: str(trainer.precision),
            "strategy": lambda: strategy_name(trainer.strategy),
            "world_size": lambda: int(trainer.world_size),
            "global_step": lambda: int(trainer.global_step),
            "epochs": lambda: int(trainer.current_epoch),
            "model": lambda: type(pl_module).__name__,
        }
        for key, read in readers.items():
            try:
                run[key] = read()
            except Exception:
                continue
        return run

    def _print(self, trainer: pl.Trainer) -> None:
        if self.verbose and self.report is not None:
            print_report(self.report, path=self.paths[0] if self.paths else None)

    def _log_summary(self, trainer: pl.Trainer) -> None:
        if self.log_findings and trainer.loggers and self.report is not None:
            counts: dict[str, int] = {
                sev: sum(f["severity"] == sev for f in self.report["findings"]) for sev in SEVERITIES}
            self._to_loggers(trainer, _severity_metrics(counts), int(trainer.global_step),
                             "triage/summary", render_markdown(self.report))

    def _gate(self, trainer: pl.Trainer) -> None:
        """``fail_on``: raise :class:`TriageGateError` listing the findings at that severity.

        Decided from the findings the checks hold (settled as in the report), not from the
        built report: a report that could not be built fails the gate with its
        ``triage.check_error``, and so does an error while deciding (fails closed). Every rank
        decides together."""
        if self.fail_on in (None, "none") or self._resolved_dir is None:
            return
        severity: FailOn = self.fail_on  # type: ignore[assignment]  # "none" returned above
        try:
            findings = self._gate_findings
            if findings is None:  # the report was not built in this process: ask the checks
                findings = [f for c in collect_checks(trainer.callbacks)  # type: ignore[attr-defined]
                            for f in c.findings]
            with contextlib.suppress(Exception):  # unsettled: a suspicion stays (fails closed)
                findings = settle_suspicions(findings)
            worst = SEVERITIES.index(severity)
            bad = [f.to_dict() for f in findings if SEVERITIES.index(f.severity) <= worst]
            if self._build_error is not None and not any(
                    f["code"] == "triage.check_error" and f["check"] == "TriageReport" for f in bad):
                bad.append(self._build_error.to_dict())
        except Exception as exc:  # the gate cannot tell: it does not pass the run
            bad = [self._report_error(exc, "deciding `fail_on`").to_dict()]
        if trainer.strategy.reduce_boolean_decision(bool(bad), all=False):
            raise TriageGateError(bad, severity, self.paths[0] if self.paths else None)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        with _terminate_raises():  # SIGTERM during the trial or the writing: still a report
            self._write(trainer, pl_module, "completed", gather=True)
        self._gate(trainer)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for check in collect_checks(trainer.callbacks):  # type: ignore[attr-defined]
            check.finding_listener = None

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        interrupted = isinstance(exception, (KeyboardInterrupt, SIGTERMException))
        self._exception = exception
        self._write(trainer, pl_module, "interrupted" if interrupted else "crashed", gather=False)
        if interrupted and self.fail_on not in (None, "none") and self._resolved_dir is not None:
            self._fail_interrupted(trainer, exception)

    def _fail_interrupted(self, trainer: pl.Trainer, exception: BaseException) -> None:
        """A gated run that was interrupted fails the gate: its process exits 1. Lightning
        exits 1 after ``KeyboardInterrupt`` and re-raises ``SIGTERMException`` (a
        ``SystemExit``, code 0): its exit code becomes 1."""
        if isinstance(exception, SystemExit) and exception.code in (None, 0):
            exception.code = 1
        if trainer.is_global_zero:
            where = f" (report: {self.paths[0]})" if self.paths else ""
            print(f"lightning-triage: the run was interrupted and `fail_on={self.fail_on!r}` "
                  f"is set: the gate fails, exit 1{where}", file=sys.stderr)
