"""The label realignment remedy of ``structure.label_misaligned`` in real fits (seeds 0-2): labels
shifted twice (the user's shift, then GPT-2's own) and labels not shifted at all (`TinyLM`, a
causal model that does not shift) are realigned on a copy by the offset the structure probe
found, and the next-token loss the replay reaches drops; labels the recorded batches cannot be
read from are skipped with the reason; the user's run is bit-identical with and without the
trial; the fixed twin runs no realignment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.callbacks.test_label_alignment import _build
from tests.callbacks.test_remedy import fit, lead_of
from tests.helpers import seeds

pytest.importorskip("transformers")


def _case(kind: str, seed: int) -> Any:
    return lambda: _build(kind, seed)


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize(("kind", "offset", "entry"), [
    ("gpt2_shifted_twice", 1, "batch['labels']"), ("tiny_unshifted", -1, "batch[1]")])
def test_misaligned_labels_are_realigned_on_a_copy(tmp_path: Path, kind: str, offset: int,
                                                   entry: str, seed: int) -> None:
    triage, _, report = fit(_case(kind, seed), tmp_path, seed)
    lead = lead_of(report)
    assert lead["code"] == "structure.label_misaligned"
    ev = lead["evidence"]
    assert (ev["label_offset"], ev["label_entry"], ev["ignore_index"]) == (offset, entry, -100)
    remedy = lead["remedy"]
    assert (remedy["kind"], remedy["verdict"]) == ("realign_labels", "confirmed"), remedy
    where = "later" if offset > 0 else "earlier"
    assert f"the labels (`{entry}`) moved 1 position {where}" in remedy["change"]
    assert "the labels of all 30 recorded batches" in remedy["reason"]
    before, after = remedy["before"], remedy["after"]
    # the next-token loss (every replay measured on the realigned labels): far lower with the
    # remedy than the decision's 2% margin, and not above where the model started
    assert before["finite"] and after["finite"]
    assert after["loss"] < 0.9 * before["loss"], remedy
    assert after["loss"] < before["loss_start"], remedy
    assert triage.report.remedies.trials == 1
    assert "Remedy: confirmed on a copy: the labels (" in (tmp_path / "triage_report.md").read_text()


def labels_of(batch: Any) -> torch.Tensor:
    """A `target_key=` callable: the probe reads the labels through it, the replay cannot."""
    return batch[1]


def test_labels_the_replay_cannot_find_are_skipped_with_the_reason(tmp_path: Path) -> None:
    triage, _, report = fit(_case("tiny_unshifted", 0), tmp_path, 0, target_key=labels_of)
    lead = lead_of(report)
    assert lead["code"] == "structure.label_misaligned"
    assert lead["evidence"]["label_entry"] == "labels_of(batch)"
    remedy = lead["remedy"]
    assert (remedy["kind"], remedy["verdict"]) == ("realign_labels", "skipped"), remedy
    assert "not an entry of the batch" in remedy["reason"]
    assert triage.report.remedies.trials == 0
    assert "Remedy: remedy not tried: the labels were taken from `labels_of(batch)`" in \
        (tmp_path / "triage_report.md").read_text()


def test_the_fixed_twin_realigns_nothing(tmp_path: Path) -> None:
    _, _, report = fit(_case("tiny", 0), tmp_path, 0)
    assert not [f for f in report["findings"] if f["code"] == "structure.label_misaligned"]
    assert not [f for f in report["findings"]
                if (f.get("remedy") or {}).get("kind") == "realign_labels"]


def test_the_users_run_is_bit_identical_with_and_without_the_trial(tmp_path: Path) -> None:
    runs = []
    for verify in (True, False):
        triage, model, report = fit(_case("tiny_unshifted", 0), tmp_path / str(verify), 0,
                                    verify_remedies=verify)
        runs.append((triage, model, torch.get_rng_state(), report))
    (with_trial, model_a, rng_a, report_a), (without, model_b, rng_b, report_b) = runs
    assert with_trial.report.remedies.trials == 1 and without.report.remedies.trials == 0
    assert lead_of(report_a)["remedy"]["verdict"] == "confirmed"
    assert "remedy" not in lead_of(report_b)
    state_a, state_b = model_a.state_dict(), model_b.state_dict()
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert torch.equal(rng_a, rng_b)
    opt_a, opt_b = (m.trainer.optimizers[0].state_dict() for m in (model_a, model_b))
    assert all(torch.equal(opt_a["state"][k]["exp_avg"], opt_b["state"][k]["exp_avg"])
               for k in opt_a["state"])
