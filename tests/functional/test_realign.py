"""The label realignment of functional.realign: labels moved by the probe's offset with the
loss's ignore index, the plan read from a finding's evidence (or why there is none), and the
symptom read off recorded batches."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lightning_triage.functional.realign import (
    LabelPlan,
    entry,
    label_plan,
    label_symptom,
    realign_labels,
)
from lightning_triage.functional.structure import target_shift

IDS = torch.tensor([[5, 6, 7, 8, 9], [1, 2, 3, 4, 0]])
SHIFTED = torch.cat([IDS[:, 1:], torch.full((2, 1), -100)], 1)  # the user's shift


def _evidence(**changes: Any) -> dict[str, Any]:
    ev = {"label_offset": 1, "label_entry": "batch['labels']", "input_entry": "batch['input_ids']",
          "labels_lead_by": 1, "ignore_index": -100}
    return {**ev, **changes}


def test_realigned_labels_are_next_token_labels_after_the_models_own_shift() -> None:
    # shifted twice (user, then a model that shifts inside): moved one later -> `labels = ids`
    fixed = realign_labels(SHIFTED, 1)
    assert fixed[:, 0].tolist() == [-100, -100]
    assert torch.equal(fixed[:, 1:], IDS[:, 1:])
    # not shifted (a model that does not shift): moved one earlier -> next-token labels
    fixed = realign_labels(IDS, -1, ignore_index=-1)
    assert target_shift(IDS, fixed, -1) == 1 and fixed[:, -1].tolist() == [-1, -1]
    assert realign_labels(IDS, 9).eq(-100).all()
    assert realign_labels(IDS, 0).equal(IDS) and realign_labels(IDS, 0) is not IDS


def test_the_transform_replaces_the_labels_only_on_a_copy() -> None:
    batch = {"input_ids": IDS.clone(), "labels": SHIFTED.clone(), "attention_mask": IDS > 0}
    plan = label_plan(_evidence())
    assert isinstance(plan, LabelPlan)
    out = plan.transform()(batch)
    assert torch.equal(out["labels"][:, 1:], IDS[:, 1:]) and torch.equal(out["input_ids"], IDS)
    assert torch.equal(batch["labels"], SHIFTED)  # the recorded batch is untouched
    assert entry((IDS, SHIFTED), "batch[1]") is not None and entry(batch, "batch['x']") is None


@pytest.mark.parametrize(("changes", "says"), [
    ({"label_entry": None}, "does not say where the labels are"),
    ({"label_entry": "labels_of(batch)"}, "not an entry of the batch"),
    ({"labels_lead_by": None}, "do not lead the inputs by 0 or 1 positions"),
    ({"label_offset": 0}, "no offset"),
])
def test_no_plan_says_why(changes: dict[str, Any], says: str) -> None:
    why = label_plan(_evidence(**changes))
    assert isinstance(why, str) and says in why


def test_the_symptom_must_hold_in_every_recorded_batch() -> None:
    plan = label_plan(_evidence())
    assert isinstance(plan, LabelPlan)
    shown = label_symptom(plan, [{"input_ids": IDS, "labels": SHIFTED}] * 3)
    assert shown == (True, "the labels of all 3 recorded batches lead the inputs by 1 position, "
                           "as at the probe: the loss scores each position against the token 2 "
                           "positions ahead")
    mixed = label_symptom(plan, [{"input_ids": IDS, "labels": SHIFTED},
                                 {"input_ids": IDS, "labels": IDS}])
    assert mixed[0] is False and "only 1 of the 2" in mixed[1]
    missing = label_symptom(plan, [{"input_ids": IDS, "labels": IDS.float()}])
    assert isinstance(missing, str) and "no `(N, T)` integer labels" in missing
    unshifted = label_plan(_evidence(label_offset=-1, labels_lead_by=0))
    assert isinstance(unshifted, LabelPlan)
    assert label_symptom(unshifted, [{"input_ids": IDS, "labels": IDS}])[1].endswith(
        "are the inputs themselves, as at the probe: the loss scores each position against its "
        "own token")
