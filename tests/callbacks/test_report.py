from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any, ClassVar

import jsonschema
import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor

from lightning_triage import InitialLossCheck, Triage, TriageConfigError, TriageReport
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.demo.broken import broken_run
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from lightning_triage.report import REPORT_SCHEMA, load_report
from tests.helpers import WATCHES, assert_ran_and_passed, codes, make_trainer


def read_report(directory: Path) -> dict[str, Any]:
    report = json.loads((directory / "triage_report.json").read_text())
    jsonschema.validate(report, REPORT_SCHEMA)
    assert load_report(directory) == report  # the loader's validator accepts it too
    return report


def test_report_is_written_and_valid(tmp_path: Path) -> None:
    model, train, val = broken_run("scaled-logits").build()  # the registry's broken run
    trainer = make_trainer(tmp_path, [Triage(strict=True, report_dir=tmp_path / "triage")])
    trainer.fit(model, train, val)
    report = read_report(tmp_path / "triage")
    assert report["schema"] == "lightning-triage/report/1"
    assert report["status"] == "completed"
    assert report["start_here"] == "init.loss_above_chance"
    assert report["run"]["model"] == "DigitsMLP"
    assert report["run"]["trainable_params"] == 64 * 32 + 32 + 32 * 10 + 10
    assert report["run"]["global_step"] == 4
    assert report["run"]["precision"] == "32-true"
    statuses = {c["check"]: c["status"] for c in report["checks"]}
    assert statuses["InitialLossCheck"] == "failed"
    assert statuses["BatchInspector"] == "passed"
    markdown = (tmp_path / "triage" / "triage_report.md").read_text()
    assert "## Start here: `init.loss_above_chance`" in markdown


def test_healthy_report_has_no_start_here(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train, val = digits_loaders()
    triage = Triage(strict=True)
    trainer = make_trainer(tmp_path, [triage])
    trainer.fit(DigitsMLP(), train, val)
    report = read_report(tmp_path)  # default: default_root_dir when there is no logger
    assert report["start_here"] is None
    assert report == triage.report.report
    assert "No problems found" in capsys.readouterr().out
    assert_ran_and_passed(report, *WATCHES, "InitialLossCheck", "GradientWiringCheck")


def test_report_dir_defaults_to_the_loggers_log_dir(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import CSVLogger

    train, _ = digits_loaders()
    logger = CSVLogger(tmp_path, name="exp")
    trainer = make_trainer(tmp_path, [Triage(strict=True, verbose=False)], logger=logger)
    trainer.fit(DigitsMLP(), train)
    assert (Path(logger.log_dir) / "triage_report.json").exists()


class Crashes(DigitsMLP):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        if self.global_step == 2:
            raise RuntimeError("boom at step 2")
        return super().training_step(batch, batch_idx)


def test_crash_in_training_step_still_writes_the_report(tmp_path: Path) -> None:
    train, _ = digits_loaders()
    trainer = make_trainer(tmp_path, [Triage(strict=True, verbose=False)])
    with pytest.raises(RuntimeError, match="boom at step 2"):
        trainer.fit(Crashes(logit_scale=100.0), train)
    report = read_report(tmp_path)
    assert report["status"] == "crashed"
    assert report["run"]["global_step"] == 2
    assert report["start_here"] == "init.loss_above_chance"


def test_keyboard_interrupt_writes_an_interrupted_report(tmp_path: Path) -> None:
    class Interrupted(DigitsMLP):
        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            if batch_idx == 1:
                raise KeyboardInterrupt
            return super().training_step(batch, batch_idx)

    train, _ = digits_loaders()
    trainer = make_trainer(tmp_path, [Triage(strict=True, verbose=False)])
    with pytest.raises(SystemExit):  # Lightning exits after a graceful shutdown
        trainer.fit(Interrupted(), train)
    assert read_report(tmp_path)["status"] == "interrupted"


class BrokenCheck(TriageCallback):
    @guarded
    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.mark_ran()
        raise ZeroDivisionError("bug inside the check")


def test_internal_error_in_a_check_does_not_stop_fit(tmp_path: Path) -> None:
    train, _ = digits_loaders()
    broken = BrokenCheck()
    trainer = make_trainer(tmp_path, [broken, TriageReport(verbose=False)])
    trainer.fit(DigitsMLP(), train)
    assert trainer.global_step == 4  # the run went on
    assert broken.disabled
    report = read_report(tmp_path)
    assert codes(report) == {"triage.check_error"}
    assert report["start_here"] is None  # our own bug is never where the user starts
    [status] = report["checks"]
    assert status["status"] == "error"
    assert "ZeroDivisionError" in status["detail"]


def test_internal_error_raises_with_strict(tmp_path: Path) -> None:
    train, _ = digits_loaders()
    trainer = make_trainer(tmp_path, [BrokenCheck(strict=True), TriageReport(verbose=False)])
    with pytest.raises(ZeroDivisionError, match="bug inside the check"):
        trainer.fit(DigitsMLP(), train)
    assert read_report(tmp_path)["status"] == "crashed"


def test_unwritable_report_dir_is_rejected_at_setup_when_strict(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    train, _ = digits_loaders()
    trainer = make_trainer(tmp_path, [Triage(report_dir=blocker / "triage", strict=True)])
    with pytest.raises(ValueError, match=r"`report_dir` '.*a_file/triage' is not writable"):
        trainer.fit(DigitsMLP(), train)


def test_unwritable_report_dir_warns_once_and_the_fit_goes_on(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    train, _ = digits_loaders()
    triage = Triage(report_dir=blocker / "triage", verbose=False)
    trainer = make_trainer(tmp_path, [triage], max_epochs=2)
    with pytest.warns(RuntimeWarning, match=r"`report_dir` '.*a_file/triage' is not writable") \
            as caught:
        trainer.fit(DigitsMLP(), train)
    assert trainer.state.finished and trainer.global_step == 8
    assert sum("is not writable" in str(w.message) for w in caught) == 1
    assert triage.report.report is not None and triage.report.paths == []
    assert blocker.read_text() == "not a directory"
    assert not list(tmp_path.rglob("triage_report.*"))


def test_resume_from_checkpoint_keeps_the_findings(tmp_path: Path) -> None:
    train, _ = digits_loaders()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer = make_trainer(tmp_path, [Triage(strict=True, verbose=False), ckpt],
                           enable_checkpointing=True)
    trainer.fit(DigitsMLP(logit_scale=100.0), train)

    resumed = Triage(strict=True, verbose=False)
    trainer = make_trainer(tmp_path / "resumed", [resumed], max_epochs=2)
    trainer.fit(DigitsMLP(logit_scale=100.0), train, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    check = resumed.check("InitialLossCheck")
    assert [f.code for f in check.findings] == ["init.loss_above_chance"]
    assert check.findings[0].global_step == 0
    report = read_report(tmp_path / "resumed")
    assert report["run"]["global_step"] == 8
    assert report["start_here"] == "init.loss_above_chance"
    assert [f["global_step"] for f in report["findings"] if f["code"] == "init.loss_above_chance"] == [0]


def test_callbacks_pickle_after_fit(tmp_path: Path) -> None:
    model, train, _ = broken_run("scaled-logits").build()
    triage = Triage(strict=True, verbose=False)
    make_trainer(tmp_path, [triage]).fit(model, train)
    clone = pickle.loads(pickle.dumps(triage))
    assert clone.check("InitialLossCheck").findings == triage.check("InitialLossCheck").findings
    state = triage.state_dict()
    fresh = Triage()
    fresh.load_state_dict(state)
    assert fresh.check("InitialLossCheck").findings == triage.check("InitialLossCheck").findings


def test_standalone_checks_and_report(tmp_path: Path) -> None:
    model, train, _ = broken_run("scaled-logits").build()
    check = InitialLossCheck(strict=True)
    trainer = make_trainer(tmp_path, [TriageReport(verbose=False), check])
    trainer.fit(model, train)
    assert codes(read_report(tmp_path)) == {"init.loss_above_chance"}


def test_bundle_configuration_errors() -> None:
    with pytest.raises(ValueError, match="`task` must be one of"):
        Triage(task="vision")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`num_classes` must be an integer >= 2"):
        Triage(num_classes=1)


def test_no_report_from_a_process_that_did_not_watch_the_run(tmp_path: Path) -> None:
    # e.g. the main process of `ddp_spawn`: its workers ran setup, watched and wrote the report
    report = TriageReport(report_dir=tmp_path, verbose=False)
    trainer = make_trainer(tmp_path, [report])
    report.on_exception(trainer, DigitsMLP(), RuntimeError("worker crashed"))
    assert not (tmp_path / "triage_report.json").exists()
    assert report.report is None


def test_a_default_fit_emits_no_warning_per_finding(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Findings reach the console once, ranked, in the summary: a broken run with the defaults
    emits no `RuntimeWarning` of the package; `warn_findings=True` opts in (once per code);
    `verbose=False` prints nothing at all."""
    import warnings

    def fit(triage: Triage) -> list[str]:
        model, train, val = broken_run("scaled-logits").build()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            make_trainer(tmp_path, [triage]).fit(model, train, val)
        return [str(w.message) for w in caught
                if issubclass(w.category, RuntimeWarning) and "lightning-triage" in str(w.message)]

    assert fit(Triage(verify_remedies=False)) == []
    assert "init.loss_above_chance" in capsys.readouterr().out  # in the summary, once
    assert fit(Triage(verify_remedies=False, verbose=False)) == []
    assert capsys.readouterr().out == ""
    loud = fit(Triage(verify_remedies=False, verbose=False, warn_findings=True))
    assert sum("init.loss_above_chance" in m for m in loud) == 1, loud
    with pytest.raises(TriageConfigError, match="warn_findings"):
        Triage(warn_findings="yes")  # type: ignore[arg-type]


def test_a_suspicion_warns_as_a_suspicion_while_the_run_goes_on() -> None:
    """With `warn_findings`, the warning emitted when a check first sees a suspicion says that
    the report settles it (a suspicion without a symptom ends as info); other problems warn as
    they are."""
    from lightning_triage.callbacks.base import TriageCallback

    check = TriageCallback()
    assert not check.warn_findings  # off by default
    check.warn_findings = True
    with pytest.warns(RuntimeWarning, match=r"data.unnormalized_input \(a suspicion: the report"):
        check.add_finding(None, "data.unnormalized_input", "rms 7.8")
    with pytest.warns(RuntimeWarning) as caught:
        check.add_finding(None, "init.loss_above_chance", "33.9 vs 2.303")
    assert "suspicion" not in str(caught[0].message)


def test_a_finding_carries_the_epoch_of_its_step(tmp_path: Path) -> None:
    """A finding recorded after its epoch ended (at the end of fit, about an earlier step) has
    its step's epoch, not the epoch current when it was recorded; a validation finding at the
    end of an epoch keeps that epoch."""
    from lightning.pytorch.callbacks import Callback

    class Late(TriageCallback):
        codes = ("triage.check_error",)

        def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            if trainer.current_epoch == 0 and not trainer.sanity_checking:
                self.add_finding(trainer, "triage.check_error", "val", global_step=trainer.global_step)

        def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            assert trainer.current_epoch == 2  # two epochs done: the epoch now is past the run's
            self.add_finding(trainer, "triage.check_error", "late, about step 1", global_step=1)
            self.add_finding(trainer, "triage.check_error", "late, about step 5", global_step=5)

    class Stepped(Callback):  # the steps at which each epoch started, as Lightning counts them
        starts: ClassVar[list[int]] = []

        def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self.starts.append(trainer.global_step)

    train, val = digits_loaders()
    report = TriageReport(report_dir=tmp_path, verbose=False, verify_remedies=False)
    stepped = Stepped()
    make_trainer(tmp_path, [Late(), report, stepped], max_epochs=2).fit(DigitsMLP(), train, val)
    assert stepped.starts == [0, 4]
    epochs = {f["message"]: f["epoch"] for f in read_report(tmp_path)["findings"]
              if f["code"] == "triage.check_error"}
    assert epochs == {"val": 0, "late, about step 1": 0, "late, about step 5": 1}
