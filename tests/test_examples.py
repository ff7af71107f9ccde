"""examples/: the complete example (a model and DataModule on digits, a plain script and a
LightningCLI one) trains and reports; configs/triage.yaml keeps the project's own callbacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("sklearn")
pytest.importorskip("jsonargparse")

from examples import train, train_cli
from lightning.pytorch.callbacks import EarlyStopping, ModelSummary

from lightning_triage import Triage

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=8", "--trainer.limit_val_batches=1",
        "--trainer.num_sanity_val_steps=0", "--trainer.enable_progress_bar=false"]


def test_train_script_reports_a_healthy_run(tmp_path: Path) -> None:
    triage = train.main(["--max-steps", "20", "--report-dir", str(tmp_path)])
    report = triage.report.report
    assert report is not None and report["status"] == "completed"
    assert report["start_here"] is None, [f["code"] for f in report["findings"]]
    assert {c["check"]: c["status"] for c in report["checks"]}["InitialLossCheck"] == "passed"
    assert (tmp_path / "triage_report.html").exists()


def test_train_script_diagnoses_learning_rate_50(tmp_path: Path) -> None:
    triage = train.main(["--lr", "50", "--max-steps", "20", "--report-dir", str(tmp_path)])
    assert triage.report.report is not None
    assert triage.report.report["start_here"] == "curve.diverging"


@pytest.mark.parametrize("order", ["project-first", "triage-first"])
def test_cli_example_keeps_the_projects_callbacks_in_either_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, order: str) -> None:
    monkeypatch.chdir(tmp_path)  # report_dir: runs/triage
    configs = [str(ROOT / "examples" / "config.yaml"), str(ROOT / "configs" / "triage.yaml")]
    if order == "triage-first":
        configs.reverse()
    cli = train_cli.main(["fit", *(f"--config={c}" for c in configs),
                          f"--trainer.default_root_dir={tmp_path}", *FAST])
    kinds = [type(cb) for cb in cli.trainer.callbacks]
    assert {EarlyStopping, ModelSummary, Triage} <= set(kinds), kinds
    report = json.loads((tmp_path / "runs" / "triage" / "triage_report.json").read_text())
    assert report["status"] == "completed" and report["run"]["seed"] == 0
