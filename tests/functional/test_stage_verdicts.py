"""The verdicts moved out of the callbacks (issue 33): wiring, init, the loss curve's late events
and validation notes, the worst validation examples. Each built from constructed inputs, without
a Trainer; the message holds the numbers and no advice (the registry's hint has it)."""

from __future__ import annotations

import math

import torch

from lightning_triage.findings import CODES
from lightning_triage.functional.chance import chance_level
from lightning_triage.functional.curve_verdicts import (
    ValidationSeen,
    late_event_verdict,
    validation_verdict,
)
from lightning_triage.functional.init_verdicts import chance_unknown_verdict, initial_loss_verdict
from lightning_triage.functional.spikes import SpikeEvent
from lightning_triage.functional.wiring import analyze_wiring
from lightning_triage.functional.wiring_verdicts import (
    detached_loss_verdict,
    wiring_verdicts,
    zero_partner_verdict,
)
from lightning_triage.functional.worst import worst_errors_verdict

SIZES = {"enc.weight": 64, "enc.bias": 8, "head.weight": 16, "head.bias": 2}


def test_wiring_verdicts_one_per_diagnosis() -> None:
    result = analyze_wiring(SIZES, {"emb.weight": 10}, {"head.weight", "head.bias", "enc.bias"},
                            {"head.weight", "head.bias"}, {"enc.bias", "enc.weight"})
    verdicts = wiring_verdicts(result, 3, backwards=1, optimizers=1)
    assert [(v.code, v.layer, v.step) for v in verdicts] == [
        ("wiring.no_grad_params", "enc", 3), ("wiring.zero_grad_params", "enc", 3),
        ("wiring.params_not_in_optimizer", "head", 3), ("wiring.frozen_params", None, 3)]
    outside = verdicts[2]
    assert outside.message == ("`head` (all 2 tensors, 18 values) receive gradients but belong "
                               "to no param group of the 1 optimizer(s) returned by "
                               "`configure_optimizers`: they are never updated.")
    assert "param group" in CODES["wiring.params_not_in_optimizer"].hint  # the advice moved
    assert verdicts[3].evidence["per_module"] == {"emb": 10}
    assert wiring_verdicts(result, 3, backwards=1, optimizers=1, report_frozen=False)[-1].code \
        == "wiring.params_not_in_optimizer"
    # a healthy backward: nothing
    healthy = analyze_wiring(SIZES, {}, set(SIZES), set(SIZES), set(SIZES))
    assert wiring_verdicts(healthy, 0, backwards=1, optimizers=1) == []


def test_a_detached_loss_is_reported_once() -> None:
    result = analyze_wiring(SIZES, {}, set(), set(), None)
    (v,) = wiring_verdicts(result, 0, backwards=2, optimizers=1)
    assert v.code == "wiring.loss_detached" and v.message.startswith("2 backward pass(es)")
    assert wiring_verdicts(result, 0, backwards=2, optimizers=1, loss_detached=False) == []
    v = detached_loss_verdict("`training_step`", 5, 2.302585, 4, 2)
    assert v.step == 5 and "value 2.303" in v.message and "; 2 parameter tensors are frozen" \
        in v.message


def test_a_zero_gradient_beside_a_partner_that_never_moved() -> None:
    sizes = {"a.lora_A.weight": 8, "a.lora_B.weight": 8}
    never = zero_partner_verdict(["a.lora_A.weight"], ["a.lora_B.weight"], ["a.lora_B.weight"],
                                 0, 3, sizes)
    moved = zero_partner_verdict(["a.lora_A.weight"], ["a.lora_B.weight"], [], 0, 3, sizes)
    assert "never moved" in never.message and "comes from elsewhere" in moved.message
    assert never.evidence["partners_still_zero"] == ["a.lora_B.weight"]
    assert moved.evidence["partners_still_zero"] == []


def test_the_step_0_loss_against_chance() -> None:
    ten = chance_level("multiclass", num_classes=10)
    assert initial_loss_verdict(2.4, ten) is None
    above = initial_loss_verdict(33.9, ten)
    assert above is not None and above.code == "init.loss_above_chance"
    assert above.evidence["ratio"] == 33.9 / math.log(10)
    below = initial_loss_verdict(0.3, ten)
    assert below is not None and below.severity is None and "a fresh model" in below.message
    peft = initial_loss_verdict(0.3, ten, peft=True)
    assert peft is not None and peft.severity == "info" and peft.evidence["peft"]
    assert "for regression" in CODES["init.loss_above_chance"].hint  # no per-finding hint


def test_chance_unknown_names_what_was_seen() -> None:
    v = chance_unknown_verdict(torch.zeros(4, 64), None)
    assert "((4, 64) torch.float32)" in v.message and "(none found)" in v.message
    assert v.evidence == {"output_shape": [4, 64], "target_shape": None}
    assert "compiled as a whole" in chance_unknown_verdict(None, None, compiled=True).message


def test_late_events_of_the_loss_curve() -> None:
    rise = SpikeEvent("sustained", 500, 9.0, 2.0, 0.1, 4.5, 507)
    assert late_event_verdict(rise, [], [], 3.0).code == "curve.diverging"  # type: ignore[union-attr]
    fall = SpikeEvent("sustained", 500, 1.0, 2.0, 0.1, 0.5, 507)
    assert late_event_verdict(fall, [], [], 3.0) is None
    nan = SpikeEvent("nonfinite", 3, math.nan, 2.0, 0.1, math.inf, 3)
    grown = late_event_verdict(nan, [0, 1, 2, 3], [2.0, 8.0, 30.0, math.nan], 3.0)
    assert grown is not None and grown.code == "curve.diverging" and grown.step == 3
    assert grown.evidence["after_window"] and grown.evidence["kind"] == "nonfinite"


def test_validation_notes() -> None:
    never_ran = ValidationSeen(0, 0, 0, 200, 1, check_val_every_n_epoch=5)
    v = validation_verdict(never_ran, 3)
    assert v is not None and v.code == "curve.no_validation" and v.step is None
    assert "validation never ran in 2 epoch(s) (`check_val_every_n_epoch` = 5" in v.message
    no_loss = validation_verdict(ValidationSeen(3, 0, 0, 200, 3), 3)
    assert no_loss is not None and "ran 3 time(s) but no loss was found" in no_loss.message
    assert validation_verdict(ValidationSeen(0, 0, 0, 200, 1, limit_val_batches_zero=True),
                              3).evidence["reason"] == "`limit_val_batches=0`"  # type: ignore[union-attr]
    assert validation_verdict(ValidationSeen(3, 3, 3, 200, 3), 3) is None


def test_worst_errors_lists_the_examples() -> None:
    rows = [{"loss": 5.0 - i / 10, "prediction": i % 3, "label": 0, "confidence": 0.95,
             "dataset_index": 100 + i, "batch_idx": 0, "position": i, "thumbnail": None}
            for i in range(10)]
    rows[3]["dataset_index"] = None
    v = worst_errors_verdict(rows, 359, 90, 10)
    assert v.step == 90 and v.evidence["wrong"] == 6 and v.evidence["confident_wrong"] == 6
    assert "The examples: 100, 101, 102, batch 0 row 3, 104, 105, 106, 107 and 2 more." \
        in v.message
