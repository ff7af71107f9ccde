"""The rules of the update contracts (functional/update.py), without Lightning."""

from __future__ import annotations

import torch
from torch import nn

from lightning_triage.functional.update import (
    FORWARD,
    STALLED_STEPS,
    Change,
    StepRecord,
    frozen_change_verdict,
    frozen_running_stats,
    outside_change_verdicts,
    stepping_verdict,
    tensor_norms,
    zeroing_verdict,
)


def test_tensor_norms_reads_every_layout_in_float32() -> None:
    sparse = torch.sparse_coo_tensor([[0, 2]], [3.0, 4.0], (5,), check_invariants=True)
    half = torch.full((1000,), 0.1, dtype=torch.bfloat16)
    bumped = half.clone()
    bumped[0] += 0.001  # one bf16 ulp: a bf16 norm would not see it
    out = tensor_norms([torch.ones(4), None, sparse, half, bumped, torch.empty(0)])
    assert out.dtype == torch.float32
    assert out[:3].tolist() == [2.0, 0.0, 5.0]
    assert out[3] != out[4]
    assert out[5] == 0.0
    p = nn.Parameter(torch.ones(3))
    assert not tensor_norms([p]).requires_grad  # no autograd graph on the user's parameters


def test_zeroing_never_regular_and_irregular() -> None:
    steps = list(range(8))
    never = zeroing_verdict("opt", steps, [True] + [False] * 7, ["w"], {"w": 3})
    assert never is not None and never.step == 1 and never.severity == "error"
    # zeroed every 2nd or 3rd step, equally spaced: deliberate accumulation
    assert zeroing_verdict("opt", steps, [i % 2 == 0 for i in steps], [], {}) is None
    assert zeroing_verdict("opt", steps, [i % 3 == 0 for i in steps], [], {}) is None
    assert zeroing_verdict("opt", steps, [True] * 8, [], {}) is None
    odd = [True, False, True, False, False, False, True, False]
    irregular = zeroing_verdict("opt", steps, odd, ["w"], {"w": 3})
    assert irregular is not None and irregular.severity == "warning" and irregular.step == 1
    # a period that is not seen to the end of the window is not regular
    assert zeroing_verdict("opt", steps, [True, False, True] + [False] * 5, ["w"],
                           {"w": 3}) is not None


def _records(kinds: str, start: int = 0) -> list[StepRecord]:
    """One record per letter: m moved, s stalled (ran, finite grads), n no grads, z zero LR,
    c not called, i non-finite grads (skipped by a gradient scaler)."""
    make = {
        "m": lambda s: StepRecord(s, True, "ok", True, 0.1),
        "s": lambda s: StepRecord(s, True, "ok", False, 0.1),
        "n": lambda s: StepRecord(s, True, "none", False, 0.1),
        "z": lambda s: StepRecord(s, True, "ok", False, 0.0),
        "c": lambda s: StepRecord(s, False, "ok", False, 0.1),
        "i": lambda s: StepRecord(s, True, "nonfinite", False, 0.1),
    }
    return [make[k](start + i) for i, k in enumerate(kinds)]


def test_stepping_needs_a_run_of_stalled_steps() -> None:
    assert STALLED_STEPS == 5
    # one skipped batch, a zero-LR first warm-up step, a gradient scaler skipping 8 steps
    for kinds in ("mmmnmmmmmm", "zmmmmmmmm", "mmiiiiiiiimmm", "mmmmssssmmmm"):
        assert stepping_verdict("opt", _records(kinds)) is None, kinds
    for kinds, cause, step in (("mmmnnnnnn", "skipped", 3), ("zzzzzz", "zero_lr", 0),
                               ("mmsssss", "no_effect", 2), ("ccccc", "not_called", 0)):
        v = stepping_verdict("optimizer 0 (SGD)", _records(kinds))
        assert v is not None and v.code == "wiring.optimizer_not_stepping", kinds
        assert (v.evidence["cause"], v.step) == (cause, step)
        assert "optimizer 0 (SGD)" in v.message


def test_outside_changes_projection_reset_and_forward() -> None:
    universe = {"d.weight": 8, "h.weight": 4}
    clip = [Change(s, "after the step of opt", ("d.weight",), 0.01) for s in range(6)]
    (v,) = outside_change_verdicts(clip, {"after the step of opt": 6}, universe)
    assert v.severity == "info" and v.evidence["projection"] and v.layer == "d"
    reset = [Change(4, "between batches", ("d.weight", "h.weight"), 0.1, toward_init=True)]
    (v,) = outside_change_verdicts(reset, {"between batches": 9}, universe)
    assert v.severity == "warning" and "initial scale" in v.message and v.step == 4
    forward = [Change(s, FORWARD, ("h.weight",), 0.01) for s in range(6)]
    (v,) = outside_change_verdicts(forward, {FORWARD: 6}, universe)
    assert v.severity == "warning" and not v.evidence["projection"]
    assert outside_change_verdicts([], {}, universe) == []


def test_frozen_changes_name_the_step_of_the_optimizer() -> None:
    assert frozen_change_verdict([], {}) is None
    v = frozen_change_verdict([Change(3, "during the step of optimizer 0 (AdamW)",
                                      ("enc.weight",), 0.01)], {"enc.weight": 9, "h.b": 1})
    assert v is not None and v.step == 3 and "leftover `.grad`" in v.message


def test_frozen_running_stats_follows_the_fine_tuning_recipes() -> None:
    def backbone(track: bool = True) -> nn.Sequential:
        return nn.Sequential(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2,
                             track_running_stats=track)), nn.Linear(2, 1))

    net = backbone()
    net[0].requires_grad_(False)
    assert frozen_running_stats(net) == ["0.1"]
    net[0][1].requires_grad_(True)  # BackboneFinetuning(train_bn=True): BatchNorm trains
    assert frozen_running_stats(net) == []
    net = backbone(track=False)
    net[0].requires_grad_(False)
    assert frozen_running_stats(net) == []
    net = backbone()
    net[0].requires_grad_(False)
    net[0].eval()
    assert frozen_running_stats(net) == []
