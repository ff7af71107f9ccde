"""The report's CI gate (`fail_on`), its loggers output, the run record and `run.unseeded`."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import lightning.pytorch as pl
import pytest
from lightning.pytorch.loggers import CSVLogger

from lightning_triage import Triage, TriageGateError, TriageReport
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from lightning_triage.testing import assert_no_findings
from tests.helpers import codes, make_trainer


def test_fail_on_error_raises_after_writing_the_report(tmp_path: Path) -> None:
    train, val = digits_loaders()
    triage = Triage(fail_on="error", verbose=False)
    trainer = make_trainer(tmp_path, [triage])
    with pytest.raises(TriageGateError) as exc:
        trainer.fit(DigitsMLP(logit_scale=100.0), train, val)
    message = str(exc.value)
    assert "init.loss_above_chance (step 0)" in message
    assert str(tmp_path / "triage_report.json") in message
    report = json.loads((tmp_path / "triage_report.json").read_text())
    assert report["status"] == "completed"  # the gate did not turn it into a crash report
    assert {f["code"] for f in exc.value.findings} == {
        f["code"] for f in report["findings"] if f["severity"] == "error"}
    with pytest.raises(AssertionError, match=r"init\.loss_above_chance"):
        assert_no_findings(tmp_path, severity="error")
    with pytest.raises(AssertionError):
        assert_no_findings(triage, severity="error")


def test_fail_on_stays_silent_on_a_healthy_run(tmp_path: Path) -> None:
    train, val = digits_loaders()
    triage = Triage(fail_on="warning", verbose=False)
    trainer = make_trainer(tmp_path, [triage])
    trainer.fit(DigitsMLP(), train, val)  # no exception
    assert trainer.state.finished
    assert_no_findings(tmp_path / "triage_report.json", severity="warning")
    assert_no_findings(triage.report.report, severity="warning")



def test_fail_on_none_never_raises_as_the_command_line_takes_it(tmp_path: Path) -> None:
    """`fail_on="none"` is `--fail-on none`: the broken run's report holds an error, no raise."""
    train, val = digits_loaders()
    triage = Triage(fail_on="none", verbose=False)
    assert triage.fail_on == "none" and triage.report.fail_on == "none"
    trainer = make_trainer(tmp_path, [triage])
    trainer.fit(DigitsMLP(logit_scale=100.0), train, val)  # no TriageGateError
    assert trainer.state.finished
    assert "init.loss_above_chance" in codes(triage.report.report)
    from lightning_triage.__main__ import main

    assert main(["show", str(tmp_path), "--fail-on", "none"]) == 0
    assert main(["show", str(tmp_path), "--fail-on", "error"]) == 1
    assert TriageReport(fail_on="none").fail_on == "none"

def test_fail_on_is_validated() -> None:
    with pytest.raises(ValueError, match=r"`fail_on` must be one of .* got 'fatal'"):
        TriageReport(fail_on="fatal")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`fail_on`"):
        Triage(fail_on="errors")  # type: ignore[arg-type]


def read_csv(logger: CSVLogger) -> list[dict[str, str]]:
    with open(Path(logger.log_dir) / "metrics.csv") as fh:
        return list(csv.DictReader(fh))


def test_findings_reach_a_csv_logger(tmp_path: Path) -> None:
    train, val = digits_loaders()
    logger = CSVLogger(tmp_path, name="exp")
    trainer = make_trainer(tmp_path, [Triage(verbose=False)], logger=logger)
    trainer.fit(DigitsMLP(logit_scale=100.0), train, val)
    rows = read_csv(logger)
    counted = [r for r in rows if r.get("triage/findings_error")]
    assert counted, "no triage/findings_error row"
    report = json.loads((Path(logger.log_dir) / "triage_report.json").read_text())
    errors = sum(f["severity"] == "error" for f in report["findings"])
    assert max(float(r["triage/findings_error"]) for r in counted) == errors
    # the first error (step 0) was logged when it happened, at its step
    assert any(r["step"] == "0" and float(r["triage/findings_error"]) >= 1 for r in counted)
    # the user's own rows keep their values: every row with a user metric is the user's row
    user = [r for r in rows if any(v and not k.startswith("triage/") and k not in ("epoch", "step")
                                   for k, v in r.items())]
    assert user and all(not r.get("triage/findings_error") for r in user)


def test_log_findings_false_leaves_the_logger_alone(tmp_path: Path) -> None:
    train, val = digits_loaders()
    logger = CSVLogger(tmp_path, name="exp")
    trainer = make_trainer(tmp_path, [Triage(verbose=False, log_findings=False)], logger=logger)
    trainer.fit(DigitsMLP(logit_scale=100.0), train, val)
    path = Path(logger.log_dir) / "metrics.csv"
    names: set[str] = set()
    if path.exists():
        with open(path) as fh:
            names = set(next(csv.reader(fh)))
    assert not {n for n in names if n.startswith("triage/findings_")}


def test_tensorboard_gets_the_findings_as_text(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import TensorBoardLogger

    train, val = digits_loaders()
    logger = TensorBoardLogger(tmp_path, name="tb")
    texts: list[tuple[str, str]] = []
    original = logger.experiment.add_text
    logger.experiment.add_text = lambda tag, text, global_step=None: (  # type: ignore[method-assign]
        texts.append((tag, text)), original(tag, text, global_step))
    trainer = make_trainer(tmp_path, [Triage(verbose=False)], logger=logger)
    trainer.fit(DigitsMLP(logit_scale=100.0), train, val)
    assert any(tag == "triage/findings" and "init.loss_above_chance" in t for tag, t in texts)
    assert any(tag == "triage/summary" for tag, _ in texts)


def test_run_record_and_unseeded_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PL_GLOBAL_SEED")
    train, val = digits_loaders()
    trainer = make_trainer(tmp_path, [Triage(verbose=False, overfit=False)],
                           accumulate_grad_batches=2, gradient_clip_val=1.0)
    trainer.fit(DigitsMLP(lr=0.05), train, val)
    report = json.loads((tmp_path / "triage_report.json").read_text())
    run = report["run"]
    assert run["seed"] is None
    assert run["optimizers"] == [{"class": "SGD", "param_groups": 1, "lr": 0.05, "momentum": 0,
                                  "weight_decay": 0, "nesterov": False}]
    assert run["batch_size"] == 32
    assert run["accumulate_grad_batches"] == 2 and run["gradient_clip_val"] == 1.0
    assert run["devices"] == 1 and run["accelerator"] == "cpu"
    assert set(run["versions"]) >= {"python", "torch", "lightning", "lightning_triage"}
    assert "run.unseeded" in codes(report)
    assert report["start_here"] != "run.unseeded"
    [f] = [f for f in report["findings"] if f["code"] == "run.unseeded"]
    assert f["severity"] == "info"
    assert report["findings"][-1]["code"] == "run.unseeded"  # after the protocol


def test_seeded_run_has_no_unseeded_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PL_GLOBAL_SEED")
    pl.seed_everything(3, verbose=False)
    train, val = digits_loaders()
    trainer = make_trainer(tmp_path, [Triage(verbose=False, overfit=False)])
    trainer.fit(DigitsMLP(), train, val)
    report = json.loads((tmp_path / "triage_report.json").read_text())
    assert report["run"]["seed"] == 3
    assert "run.unseeded" not in codes(report)


def test_per_layer_gradient_series_stays_bounded() -> None:
    import numpy as np

    from lightning_triage import GradientMonitor

    monitor = GradientMonitor()
    monitor._names = [f"blocks.{i}.lin.weight" for i in range(60)] + ["head.weight", "head.bias"]
    for chunk in range(100):  # 5000 steps in flushes of 50
        steps = list(range(chunk * 50, chunk * 50 + 50))
        per = np.full((50, len(monitor._names)), 3.0)
        monitor._record_layers(steps, per)
    details = monitor.report_details()["grad_layers"]
    assert len(details["layers"]) <= 40  # cut to a shallower depth: `blocks`, `head`
    assert details["layers"] == ["blocks", "head"]
    assert len(details["steps"]) <= 128 and details["steps"][0] == 0
    assert details["steps"][-1] >= 4900  # spread over the whole run
    # the layer norm is the norm of its parameters' norms
    assert details["norms"][0] == pytest.approx([3.0 * 60 ** 0.5, 3.0 * 2 ** 0.5])
