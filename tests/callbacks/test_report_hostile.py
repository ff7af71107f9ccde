"""The report is never lost, never stale, and the gate never fails open (issue 36): fits whose
objects (hyperparameters, optimizer, scheduler, data loader, the model's class, findings' text)
hold what a hostile user can put there."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning_triage.callbacks.report as report_callback
from lightning_triage import InitialLossCheck, Triage, TriageCallback, TriageGateError, TriageReport
from lightning_triage.callbacks.base import collect_checks
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from lightning_triage.report import load_report
from tests.helpers import make_trainer


class RaisingRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    __str__ = __repr__


class RaisingGetattr:
    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no attribute access ({name})")


SURROGATE = "caf\udce9-\udcff.csv"  # a latin-1 file name decoded the way Python decodes bytes
HOSTILE: dict[str, Any] = {
    "raising_repr": RaisingRepr(), "raising_getattr": RaisingGetattr(), "surrogate": SURROGATE,
    "huge_int": 10 ** 5000, "nan": math.nan, "enormous": "y" * (4 << 20),
}


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 3)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader(cls: type[DataLoader] = DataLoader) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 3, (32,), generator=g))
    return cls(data, batch_size=8)


class UserCheck(TriageCallback):
    """A check of the user's that records an error finding holding ``text`` and ``value``."""

    def __init__(self, text: str = "", value: Any = None) -> None:
        super().__init__()
        self.text, self.value = text, value

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.add_finding(trainer, "grad.exploding", f"exploded {self.text}", layer=self.text or None,
                         evidence={"value": self.value})


def _hparams(model: Tiny, value: Any) -> None:
    model.hparams["user"] = value


def _optimizer(model: Tiny, value: Any) -> None:
    def configure() -> Any:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        opt.param_groups[0]["eps"] = value  # SGD ignores it; the run record reads it
        return opt
    model.configure_optimizers = configure  # type: ignore[method-assign]


class HostileScheduler(torch.optim.lr_scheduler.StepLR):
    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no attribute {name}")


def _scheduler(model: Tiny, value: Any) -> None:
    def configure() -> Any:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        return {"optimizer": opt, "lr_scheduler": HostileScheduler(opt, step_size=1)}
    model.configure_optimizers = configure  # type: ignore[method-assign]


class HostileLoader(DataLoader):
    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no attribute {name}")


PLACES: dict[str, Callable[[Tiny, Any], None]] = {"hparams": _hparams, "optimizer": _optimizer}
CASES = [(place, kind) for place in PLACES for kind in HOSTILE] + [
    ("scheduler", "raising_getattr"), ("loader", "raising_getattr"), ("model_name", "bidi"),
    ("finding", "surrogate"), ("finding", "huge_int"), ("finding", "enormous"),
    ("crash", "surrogate")]


@pytest.mark.parametrize(("place", "kind"), CASES)
def test_every_fit_writes_a_report_with_every_finding(place: str, kind: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    value = HOSTILE.get(kind)
    model = Tiny()
    text = value if place in ("finding", "crash") and isinstance(value, str) else ""
    check = UserCheck(text=text, value=value if place == "finding" else None)
    if place in PLACES:
        PLACES[place](model, value)
    elif place == "scheduler":
        _scheduler(model, value)
    elif place == "model_name":
        model.__class__ = type("Evil\u202e\x1b[2J<b>", (Tiny,), {})
    elif place == "crash":
        def boom(batch: Any, batch_idx: int) -> Any:
            raise ValueError(f"cannot open {SURROGATE}")
        model.training_step = boom  # type: ignore[method-assign]
    report = TriageReport(fail_on="error", verbose=True)
    trainer = make_trainer(tmp_path, [check, report])
    data = loader(HostileLoader if place == "loader" else DataLoader)
    with pytest.raises(ValueError if place == "crash" else TriageGateError):
        trainer.fit(model, data)
    saved = load_report(tmp_path)  # valid against the schema
    held = {(f.code, f.check) for c in collect_checks(trainer.callbacks) for f in c.findings}
    assert held and held <= {(f["code"], f["check"]) for f in saved["findings"]}
    assert saved["status"] == ("crashed" if place == "crash" else "completed")
    out = capsys.readouterr().out
    assert "\u202e" not in out and "\x1b[2J" not in out
    if place != "crash":
        assert "Start here" in out  # the console summary was printed too


def test_a_report_that_cannot_be_built_fails_the_gate_and_writes_a_minimal_json(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("cannot build")
    monkeypatch.setattr(report_callback, "build_report", broken)
    trainer = make_trainer(tmp_path, [UserCheck(), TriageReport(fail_on="error", verbose=False)])
    with pytest.raises(TriageGateError) as err:
        trainer.fit(Tiny(), loader())
    assert {f["code"] for f in err.value.findings} >= {"grad.exploding", "triage.check_error"}
    saved = load_report(tmp_path)
    codes = {f["code"] for f in saved["findings"]}
    assert {"grad.exploding", "triage.check_error"} <= codes
    assert saved["start_here"] == "grad.exploding"


def test_a_build_error_fails_the_gate_of_a_healthy_run(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report_callback, "run_info", lambda *a: 1 / 0)
    trainer = make_trainer(tmp_path, [TriageReport(fail_on="error", verbose=False)])
    with pytest.raises(TriageGateError, match=r"triage\.check_error"):
        trainer.fit(Tiny(), loader())
    assert [f["check"] for f in load_report(tmp_path)["findings"]
            if f["code"] == "triage.check_error"] == ["TriageReport"]


@pytest.mark.parametrize("fails", ["write_report", "print_report", "render_markdown"])
def test_the_gate_holds_when_writing_or_showing_fails(fails: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError("disk full")
    monkeypatch.setattr(report_callback, fails, broken)
    trainer = make_trainer(tmp_path, [UserCheck(), TriageReport(fail_on="error", verbose=True)])
    with pytest.raises(TriageGateError, match=r"grad\.exploding"):
        trainer.fit(Tiny(), loader())


@pytest.mark.parametrize("bundle", [True, False])
def test_a_second_fit_reports_only_itself(bundle: bool, tmp_path: Path) -> None:
    train, val = digits_loaders()
    callbacks: list[Any] = [Triage(verbose=False, overfit=False)] if bundle else [
        InitialLossCheck(), TriageReport(verbose=False)]
    make_trainer(tmp_path / "broken", callbacks).fit(DigitsMLP(logit_scale=100.0), train, val)
    broken = json.loads((tmp_path / "broken" / "triage_report.json").read_text())
    assert "init.loss_above_chance" in {f["code"] for f in broken["findings"]}
    make_trainer(tmp_path / "fixed", callbacks).fit(DigitsMLP(), train, val)
    fixed = json.loads((tmp_path / "fixed" / "triage_report.json").read_text())
    assert not [f for f in fixed["findings"] if f["code"].startswith("init.")]
    assert all(c["status"] != "failed" for c in fixed["checks"])


def test_a_resumed_fit_keeps_the_state_of_its_checkpoint(tmp_path: Path) -> None:
    train, val = digits_loaders()
    triage = Triage(verbose=False, overfit=False)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    make_trainer(tmp_path / "a", [triage, ckpt], enable_checkpointing=True).fit(
        DigitsMLP(logit_scale=100.0), train, val)
    # the same instance resumes: the reset at setup comes before the checkpoint's state
    make_trainer(tmp_path / "b", [triage], max_epochs=2).fit(
        DigitsMLP(logit_scale=100.0), train, val, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    resumed = json.loads((tmp_path / "b" / "triage_report.json").read_text())
    assert "init.loss_above_chance" in {f["code"] for f in resumed["findings"]}
