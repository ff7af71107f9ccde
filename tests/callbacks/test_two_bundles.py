"""Two ``Triage`` in one Trainer (a config that appends one to a template that has one, or two
with their own ``report_dir``/``fail_on``) fail at the fit's setup with a
``TriageConfigError`` that says what to do, before anything runs or is written; a single
``Triage`` keeps its state key, and a checkpoint written under the old key resumes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lightning_triage import Triage, TriageConfigError
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from tests.helpers import make_trainer

PAIRS = {
    "report_dir": (dict(report_dir="a"), dict(report_dir="b")),
    "fail_on": (dict(), dict(fail_on="error")),
    "template_and_config": (dict(report_dir="runs/triage"), dict(report_dir="runs/triage",
                                                                 fail_on="warning")),
}


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_two_bundles_fail_at_setup_saying_what_to_do(tmp_path: Path, pair: str) -> None:
    first, second = ({**kw, "report_dir": tmp_path / kw["report_dir"]} if "report_dir" in kw
                     else kw for kw in PAIRS[pair])
    bundles = [Triage(verbose=False, **first), Triage(verbose=False, **second)]
    assert bundles[0].state_key != bundles[1].state_key
    trainer = make_trainer(tmp_path, bundles)  # Lightning accepts them: the keys differ
    train, _ = digits_loaders()
    model = DigitsMLP()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TriageConfigError, match=r"appears 2 times.*keep one") as err:
        trainer.fit(model, train)
    assert "lightning-triage show" in str(err.value) and err.value.argument == "callbacks"
    assert all(v.equal(before[k]) for k, v in model.state_dict().items())  # nothing ran
    assert not list(tmp_path.rglob("triage_report.json"))


def test_the_state_key_names_what_differs() -> None:
    assert Triage().state_key == "Triage"  # checkpoints of a default bundle are unchanged
    assert Triage(task="binary").state_key == "Triage"
    key = Triage(report_dir="runs/x", fail_on="error").state_key
    assert "runs/x" in key and "error" in key


def test_a_checkpoint_under_the_old_key_resumes(monkeypatch: pytest.MonkeyPatch) -> None:
    old = Triage().state_dict()
    bundle = Triage(report_dir="runs/x")
    loaded: list[dict[str, Any]] = []
    monkeypatch.setattr(bundle, "load_state_dict", loaded.append)
    bundle.on_load_checkpoint(None, None, {"callbacks": {"Triage": old}})  # type: ignore[arg-type]
    assert loaded == [old]
    loaded.clear()
    bundle.on_load_checkpoint(None, None,  # type: ignore[arg-type]
                              {"callbacks": {bundle.state_key: old, "Triage": old}})
    assert loaded == []  # its own key: Lightning loads it
