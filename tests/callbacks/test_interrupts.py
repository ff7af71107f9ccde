"""Never lose the report, never leave a stale one: SIGINT and SIGTERM sent at each phase of a
fit (the fit-start probes, the steps, the end-of-fit remedy trial, the writing) leave this fit's
report in the folder, status ``interrupted``, without a remedy block, never an earlier fit's;
the weights are those of the same run without ``Triage()``; a gated run that was interrupted
fails the gate (its process exits 1, also under SIGTERM, where Lightning alone exits 0)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor

from lightning_triage import Triage
from lightning_triage.callbacks import report as report_callback
from lightning_triage.callbacks.report import PENDING_NOTE, TRIAL_INTERRUPTED_NOTE
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from lightning_triage.report import load_report, minimal_report, stale_files, write_report

SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}


@pytest.fixture(autouse=True)
def _signal_handlers() -> Iterator[None]:
    """Lightning ignores SIGINT after a KeyboardInterrupt and puts its SIGTERM handler back at
    teardown: every test leaves both as it found them. A SIGTERM that no handler acts on is
    swallowed here instead of killing the test process (the test then fails on the report)."""
    saved = {s: signal.getsignal(s) for s in SIGNALS.values()}
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


class Signals(DigitsMLP):
    """The digits MLP at SGD lr 1e-5 (a lead whose remedy is replayed at the end of fit) that
    sends itself ``sig`` when its code runs in the phase ``when``: ``"probes"`` (a fit-start
    probe's copy), ``"step"`` (the real step of batch 2), ``"first_step"`` (the real step of
    batch 0: the plain twin of ``"probes"``), ``"trial"`` (the trial's copy, after the fit)."""

    def __init__(self, when: str, sig: int) -> None:
        super().__init__(lr=1e-5)
        self.when, self.sig, self.sent, self.ended = when, sig, False, False

    def _send(self) -> None:
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.sig)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        copy = self.trainer.lightning_module is not self
        real = self.trainer.lightning_module
        if copy and not real.sent and (self.when == "probes" or
                                       (self.when == "trial" and real.ended)):
            real._send()
        if not copy and ((self.when == "step" and batch_idx == 2) or
                         (self.when == "first_step" and batch_idx == 0)):
            self._send()
        return super().training_step(batch, batch_idx)

    def on_train_end(self) -> None:
        self.ended = True


def _fit(directory: Path, when: str, sig: int, triage: Triage | None) -> tuple[Any, Any]:
    """The model's weights and the ``SystemExit`` code (``"no exit"`` when fit returned)."""
    pl.seed_everything(0, verbose=False)
    model = Signals(when, sig)
    trainer = pl.Trainer(callbacks=[triage] if triage is not None else [], max_epochs=2,
                         limit_train_batches=10, limit_val_batches=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=directory,
                         num_sanity_val_steps=0)
    train, val = digits_loaders()
    code: Any = "no exit"
    try:
        trainer.fit(model, train, val)
    except SystemExit as exc:  # Lightning's graceful shutdown (or SIGTERMException)
        code = exc.code
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, code


def _earlier_report(directory: Path) -> None:
    """A completed report of another model, as an earlier fit left it in the folder."""
    write_report(minimal_report([], status="completed", run={"model": "EarlierModel"}),
                 directory)


#: (phase, the plain twin's phase): the twin without ``Triage()`` stops at the same point
#: (``None``: the twin runs to the end, as the phase comes after the last step).
PHASES = {"probes": "first_step", "step": "step", "trial": None, "write": None}


@pytest.mark.parametrize("sig_name", sorted(SIGNALS))
@pytest.mark.parametrize("phase", sorted(PHASES))
def test_an_interrupt_at_each_phase_leaves_this_fits_report(
        tmp_path: Path, phase: str, sig_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sig = SIGNALS[sig_name]
    out = tmp_path / "reports"
    _earlier_report(out)
    if phase == "write":  # the signal arrives as the final report is written
        real_write = report_callback.write_report
        sent: list[bool] = []

        def write(report: Any, *args: Any, **kwargs: Any) -> Any:
            if report.get("status") == "completed" and not sent:
                sent.append(True)
                os.kill(os.getpid(), sig)
            return real_write(report, *args, **kwargs)

        monkeypatch.setattr(report_callback, "write_report", write)
    # the overfit probe runs where it is the phase (it runs the user's step most)
    triage = Triage(report_dir=out, verbose=False, fail_on="error", overfit=phase == "probes")
    weights, code = _fit(tmp_path / "a", "none" if phase == "write" else phase, sig, triage)
    if phase == "write":
        weights_b, _ = _fit(tmp_path / "b", "none", sig, None)
    else:
        twin = PHASES[phase]
        weights_b, _ = _fit(tmp_path / "b", twin if twin is not None else "none", sig, None)
    assert weights.keys() == weights_b.keys()
    assert all(torch.equal(weights[k], weights_b[k]) for k in weights)
    report = load_report(out)
    assert report["status"] == "interrupted"
    assert report["run"]["model"] == "Signals"  # never the earlier fit's report
    assert not stale_files(out / "triage_report.json", report)
    assert not any("remedy" in f for f in report["findings"])
    if phase == "trial":
        assert TRIAL_INTERRUPTED_NOTE in report["notes"]
    if phase == "write":
        assert PENDING_NOTE in report["notes"]  # the report written before the trial stays
    assert code == 1  # gated: an interrupted run fails the gate, SIGTERM included


def test_an_ungated_run_keeps_lightnings_exit(tmp_path: Path) -> None:
    _, code = _fit(tmp_path, "step", signal.SIGTERM,
                   Triage(report_dir=tmp_path, verbose=False, overfit=False))
    assert code in (None, 0)
    assert load_report(tmp_path)["status"] == "interrupted"


def test_a_completed_fit_leaves_no_pending_note(tmp_path: Path) -> None:
    _earlier_report(tmp_path)
    _fit(tmp_path, "none", signal.SIGTERM, Triage(report_dir=tmp_path, verbose=False,
                                                  overfit=False))
    report = load_report(tmp_path)
    assert report["status"] == "completed" and "notes" not in report
    assert any("remedy" in f for f in report["findings"])  # the trial ran and was written


SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import lightning.pytorch as pl
    from lightning_triage import Triage
    from lightning_triage.demo.digits import DigitsMLP, digits_loaders

    class Killed(DigitsMLP):
        def training_step(self, batch, batch_idx):
            if batch_idx == 2:
                os.kill(os.getpid(), signal.SIGTERM)
            return super().training_step(batch, batch_idx)

    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(callbacks=[Triage(report_dir=sys.argv[1], verbose=False,
                                           fail_on=sys.argv[2])],
                         max_epochs=1, limit_train_batches=6, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=sys.argv[1])
    train, _ = digits_loaders()
    trainer.fit(Killed(), train)
""")


@pytest.mark.slow  # a fresh interpreter imports torch and Lightning (about 20 s on 2 busy cores)
def test_sigterm_fails_the_gate_of_a_process(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(script), str(tmp_path), "error"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "the gate fails" in done.stderr
    report = json.loads((tmp_path / "triage_report.json").read_text())
    assert report["status"] == "interrupted"
