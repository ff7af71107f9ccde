"""LightningCLI: the README's YAML snippet and the shipped ``configs/triage.yaml`` run for real
and write a report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

pytest.importorskip("jsonargparse")

import lightning.pytorch as pl
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.cli import LightningCLI

from lightning_triage import GradientMonitor, OverfitBatchCheck, Triage, TriageGateError
from lightning_triage.demo.digits import DigitsMLP, digits_loaders

ROOT = Path(__file__).resolve().parents[1]


class CLIDigits(DigitsMLP):
    """The demo MLP with typed arguments and saved hyperparameters, as a CLI model has."""

    def __init__(self, lr: float = 0.1, logit_scale: float = 1.0) -> None:
        super().__init__(lr=lr, logit_scale=logit_scale)
        self.save_hyperparameters()


class DigitsData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 32) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return digits_loaders()[0]

    def val_dataloader(self) -> DataLoader:
        return digits_loaders()[1]


def readme_yaml() -> str:
    text = (ROOT / "README.md").read_text()
    [snippet] = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    return snippet


def run_cli(tmp_path: Path, config: str, *extra: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config)
    LightningCLI(
        CLIDigits, DigitsData, args=[
            "fit", f"--config={path}", f"--trainer.default_root_dir={tmp_path}",
            "--trainer.max_epochs=1", "--trainer.limit_train_batches=4",
            "--trainer.limit_val_batches=2", "--trainer.num_sanity_val_steps=0",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
            "--trainer.enable_checkpointing=false", "--trainer.logger=false",
            "--trainer.accelerator=cpu", *extra],
        save_config_callback=None)


def test_readme_yaml_snippet_runs_and_writes_a_report(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the snippet's report_dir is relative: runs/triage
    run_cli(tmp_path, readme_yaml())
    report = json.loads((tmp_path / "runs" / "triage" / "triage_report.json").read_text())
    assert report["status"] == "completed"
    assert report["run"]["hparams"] == {"lr": 0.1, "logit_scale": 1.0}
    assert (tmp_path / "runs" / "triage" / "triage_report.html").exists()


def test_shipped_config_gates_a_broken_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PL_GLOBAL_SEED")  # the config's `seed_everything: 0` sets it
    config = (ROOT / "configs" / "triage.yaml").read_text()
    with pytest.raises(TriageGateError, match=r"init\.loss_above_chance") as exc:
        run_cli(tmp_path, config, "--model.logit_scale=100.0")
    report_path = tmp_path / "runs" / "triage" / "triage_report.json"
    assert exc.value.path is not None and exc.value.path.resolve() == report_path  # written first
    report = json.loads(report_path.read_text())
    assert report["run"]["seed"] == 0
    assert "run.unseeded" not in {f["code"] for f in report["findings"]}


def test_shipped_config_passes_a_healthy_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run_cli(tmp_path, (ROOT / "configs" / "triage.yaml").read_text())
    report = json.loads((tmp_path / "runs" / "triage" / "triage_report.json").read_text())
    assert not [f for f in report["findings"] if f["severity"] in ("error", "warning")]
    status = {c["check"]: c["status"] for c in report["checks"]}
    for check in ("BatchInspector", "InitialLossCheck", "GradientWiringCheck", "OverfitBatchCheck",
                  "EvalModeCheck", "LossCurveMonitor", "GradientMonitor", "NonFiniteTracer"):
        assert status[check] == "passed", (check, status)  # the checks ran, and found nothing
    assert "overfit.passed" in {f["code"] for f in report["findings"]}


PROJECT = """
trainer:
  {key}:
    - class_path: lightning.pytorch.callbacks.EarlyStopping
      init_args: {{monitor: val_loss}}
"""


def callbacks_of(tmp_path: Path, *configs: str) -> list[type]:
    args = []
    for i, text in enumerate(configs):
        path = tmp_path / f"config{i}.yaml"
        path.write_text(text)
        args.append(f"--config={path}")
    cli = LightningCLI(CLIDigits, DigitsData, run=False, save_config_callback=None, args=[
        *args, f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"])
    return [type(cb) for cb in cli.trainer.callbacks]


@pytest.mark.parametrize(("key", "triage_last"), [("callbacks", True), ("callbacks+", True),
                                                  ("callbacks+", False)])
def test_shipped_config_keeps_the_projects_callbacks(tmp_path: Path, key: str,
                                                     triage_last: bool) -> None:
    """configs/triage.yaml appends (`callbacks+:`): after a project's config, or before one that
    appends too, both the project's callbacks and Triage are kept (docs/templates.md)."""
    shipped = (ROOT / "configs" / "triage.yaml").read_text()
    project = PROJECT.format(key=key)
    kinds = callbacks_of(tmp_path, *((project, shipped) if triage_last else (shipped, project)))
    assert EarlyStopping in kinds and Triage in kinds, kinds


def test_a_plain_callbacks_list_after_the_shipped_config_replaces_it(tmp_path: Path) -> None:
    """What docs/templates.md warns about: a later plain `callbacks:` replaces the list."""
    kinds = callbacks_of(tmp_path, (ROOT / "configs" / "triage.yaml").read_text(),
                         PROJECT.format(key="callbacks"))
    assert EarlyStopping in kinds and Triage not in kinds


def test_keyword_only_arguments_and_their_names_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("""
trainer:
  callbacks:
    - class_path: lightning_triage.Triage
      init_args: {overfit_max_steps: 40, overfit_time_budget: 30.0, causal: null,
                  numerics_check_every_n_steps: 25, input_key: 0, target_key: 1}
    - class_path: lightning_triage.GradientMonitor
      init_args: {window_steps: 50, flush_every_n_steps: 20, ratio_every_n_steps: 5}
""")
    cli = LightningCLI(CLIDigits, DigitsData, run=False, save_config_callback=None, args=[
        f"--config={path}", f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false",
        "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false"])
    [triage] = [cb for cb in cli.trainer.callbacks if isinstance(cb, Triage)]
    [monitor] = [cb for cb in cli.trainer.callbacks if isinstance(cb, GradientMonitor)]
    overfit = triage.check("OverfitBatchCheck")
    assert isinstance(overfit, OverfitBatchCheck)
    assert (overfit.max_steps, overfit.time_budget, overfit.target_key) == (40, 30.0, 1)
    assert triage.check("StructureProbe").causal is None  # type: ignore[attr-defined]
    assert (monitor.flush_every_n_steps, monitor.ratio_every_n_steps) == (20, 5)
    assert monitor.state_key == "GradientMonitor{'window_steps': 50}"
