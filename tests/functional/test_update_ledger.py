"""The update contracts' ledger (functional/update_ledger.py) on constructed sequences of
readings, and the late-freeze watch (functional/late_freeze.py) on a small module, without a
Trainer: each contract broken and kept."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from lightning_triage.functional.late_freeze import LateFreezeWatch
from lightning_triage.functional.update import FORWARD, STALLED_STEPS, tensor_norms
from lightning_triage.functional.update_ledger import Reading, UpdateLedger

NAMES = ["enc.weight", "head.weight"]
SIZES = {"enc.weight": 16, "head.weight": 4}
SGD = "optimizer 0 (SGD)"


def ledger(trainable: Sequence[bool] = (True, True), **kwargs: object) -> UpdateLedger:
    led = UpdateLedger(NAMES, SIZES, [1.0, 1.0], [SGD], **kwargs)  # type: ignore[arg-type]
    led.membership([[i for i, t in enumerate(trainable) if t]], list(trainable))
    return led


def batch(step: int, w: Sequence[float], *, moved: Sequence[float] = (0.1, 0.1),
          grads_before: Sequence[float] = (0.0, 0.0), grads: Sequence[float] = (1.0, 1.0),
          lr: float = 0.1, forward: Sequence[float] = (0.0, 0.0),
          after: Sequence[float] = (0.0, 0.0)) -> tuple[list[Reading], list[float]]:
    """One batch of readings starting from norms ``w``: the forward adds ``forward``, the step
    adds ``moved``, something after the step adds ``after``. Returns the readings and the
    norms at its end."""
    fwd = [a + b for a, b in zip(w, forward, strict=True)]
    post = [a + b for a, b in zip(fwd, moved, strict=True)]
    end = [a + b for a, b in zip(post, after, strict=True)]
    return [Reading("start", None, step, list(w)),
            Reading("backward", None, step, fwd, list(grads_before)),
            Reading("pre", 0, step, fwd, list(grads), lr=lr),
            Reading("post", 0, step, post),
            Reading("end", None, step + 1, end)], end


def run(led: UpdateLedger, n: int, **kwargs: object) -> list[str]:
    """``n`` batches; returns the codes decided on the way and at the end."""
    w: list[float] = [1.0, 1.0]
    codes = []
    for step in range(n):
        per = {k: (v(step) if callable(v) else v) for k, v in kwargs.items()}
        readings, w = batch(step, w, **per)  # type: ignore[arg-type]
        codes += [v.code for v in led.close_batch(readings, start_step=step)]
    return codes + [v.code for v in led.finish()]


def test_a_healthy_sequence_is_silent() -> None:
    led = ledger()
    assert run(led, 8) == []
    assert led.steps == 8


def test_gradients_never_zeroed() -> None:
    led = ledger()
    w = [1.0, 1.0]
    for step in range(6):  # every backward starts from the previous step's gradients
        readings, w = batch(step, w, grads_before=(1.0, 1.0) if step else (0.0, 0.0))
        assert led.close_batch(readings, start_step=step) == []
    (v,) = led.finish()
    assert (v.code, v.step, v.severity) == ("wiring.grads_not_zeroed", 1, "error")
    assert v.evidence["zeroed"] == [True] + [False] * 5


def test_zeroed_every_third_step_is_accumulation_and_validation_is_no_evidence() -> None:
    assert run(ledger(), 9, grads_before=lambda s: (0.0, 0.0) if s % 3 == 0 else (1.0, 1.0)) == []
    led = ledger()
    w = [1.0, 1.0]
    for step in range(4):  # never zeroed by the user, but validation ran before step 2
        if step == 2:
            led.validation()
        readings, w = batch(step, w, grads_before=(1.0, 1.0) if step else (0.0, 0.0))
        led.close_batch(readings, start_step=step)
    (v,) = led.finish()
    assert v.evidence["steps"] == [0, 1, 3]  # step 2 counts neither way


@pytest.mark.parametrize(("kwargs", "cause", "at"), [
    ({"moved": lambda s: (0.1, 0.1) if s < 3 else (0.0, 0.0)}, "no_effect", 3),
    ({"moved": lambda s: (0.1, 0.1) if s < 2 else (0.0, 0.0),
      "lr": lambda s: 0.1 if s < 2 else 0.0}, "zero_lr", 2),
    ({"moved": (0.0, 0.0), "grads": (0.0, 0.0)}, "skipped", 0),
])
def test_an_optimizer_that_stops_moving(kwargs: dict[str, object], cause: str, at: int) -> None:
    led = ledger()
    w = [1.0, 1.0]
    found = []
    for step in range(at + STALLED_STEPS + 2):
        per = {k: (v(step) if callable(v) else v) for k, v in kwargs.items()}
        readings, w = batch(step, w, **per)  # type: ignore[arg-type]
        found += led.close_batch(readings, start_step=step)
    (v,) = found  # decided once, when the fifth stalled step closes
    assert v.code == "wiring.optimizer_not_stepping" and v.step == at
    assert v.evidence["cause"] == cause


def test_a_step_counted_without_reaching_the_optimizer() -> None:
    led = ledger()
    found = []
    for step in range(STALLED_STEPS):
        readings = [Reading("start", None, step, [1.0, 1.0]),
                    Reading("backward", None, step, [1.0, 1.0], [0.0, 0.0]),
                    Reading("end", None, step + 1, [1.0, 1.0])]
        found += led.close_batch(readings, start_step=step, counted_lr=0.1)
    (v,) = found
    assert v.evidence["cause"] == "not_called" and v.step == 0
    # manual optimization: no step counted, no record
    assert ledger().close_batch(readings, start_step=0) == []


def test_changes_outside_the_step_by_phase() -> None:
    # the forward edits the head at every step: a warning (never a projection)
    led = ledger()
    assert run(led, 4, forward=(0.0, 0.01)) == ["wiring.params_changed_outside_step"]
    (v,) = led.finish()
    assert v.evidence["phase"] == FORWARD and v.severity == "warning"
    assert v.evidence["params"] == ["head.weight"] and v.step == 0
    # clipped after the step at every step: a projection, info
    led = ledger()
    assert run(led, 4, after=(-0.05, 0.0)) == ["wiring.params_changed_outside_step"]
    (v,) = led.finish()
    assert v.severity == "info" and v.evidence["phase"] == f"after the step of {SGD}"


def test_a_reset_between_batches_moves_back_toward_the_start() -> None:
    led = ledger()
    w = [1.0, 1.0]
    for step in range(6):
        readings, w = batch(step, w, moved=(0.5, 0.5))
        led.close_batch(readings, start_step=step)
        if step == 3:
            w = [1.0, 1.0]  # reloaded between batches
    (v,) = led.finish()
    assert v.step == 4 and v.evidence["phase"] == "between batches"
    assert v.severity == "warning" and "toward their initial scale" in v.message


def test_renormalized_embeddings_are_expected_in_the_forward() -> None:
    led = ledger(renormed={1})
    w = [1.0, 1.0]
    for step in range(4):
        readings, w = batch(step, w, forward=(0.0, -0.01))
        led.close_batch(readings, start_step=step)
    assert led.finish() == []


def test_frozen_parameters_moved_by_the_step_and_unfrozen_at_the_step() -> None:
    led = ledger(trainable=(False, True))
    led.opt_params = [[0, 1]]  # the optimizer still holds the frozen encoder
    w = [1.0, 1.0]
    for step in range(3):
        readings, w = batch(step, w, grads=(0.0, 1.0))
        led.close_batch(readings, start_step=step)
    (v,) = led.finish()
    assert v.code == "wiring.frozen_params_changed" and v.layer == "enc"
    assert "leftover `.grad`" in v.message
    # frozen at the batch start, trainable by its step (unfrozen in a batch-start hook)
    led = ledger(trainable=(False, True))
    led.membership([[0, 1]], [True, True], at_step=True)
    assert led.frozen == set()
    readings, _ = batch(0, [1.0, 1.0])
    led.close_batch(readings, start_step=0)
    assert led.finish() == []


# ---------------------------------------------------------------------- late freezing
def _watch(net: torch.nn.Module, **kwargs: object) -> LateFreezeWatch:
    named = dict(net.named_parameters())
    return LateFreezeWatch(list(named), list(named.values()),
                           tensor_norms(list(named.values())).tolist(),
                           {n: p.numel() for n, p in named.items()}, 10, module=net,
                           **kwargs)  # type: ignore[arg-type]


def _net() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4),
                               torch.nn.Linear(4, 2))


def test_a_freeze_after_training_steps_is_late() -> None:
    net = _net()
    watch = _watch(net)
    with torch.no_grad():
        net[0].weight.add_(0.1)
        net(torch.randn(8, 4))  # the running statistics move too
    assert watch.check(15) is None  # nothing frozen yet
    net[:2].requires_grad_(False)
    v = watch.check(15)
    assert v is not None and v.code == "wiring.frozen_late" and v.step == 15
    assert v.evidence["steps_trained"] == 5 and v.evidence["exact"]
    assert set(v.evidence["moved"]) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    assert v.evidence["moved"]["0.bias"] == 0.0 and v.evidence["moved"]["0.weight"] > 0.0
    assert list(v.evidence["running_stats_moved"]) == ["1"]
    assert watch.check(16) is None  # decided once


def test_a_freeze_before_any_step_or_after_an_epoch() -> None:
    net = _net()
    watch = _watch(net, snapshot_limit=0)
    net[0].requires_grad_(False)
    assert watch.check(10) is None and "0.weight" not in watch.names  # frozen from the start
    watch.epoch_end(14)  # a first epoch of 4 steps
    with torch.no_grad():
        net[2].weight.mul_(2.0)
    net[2].requires_grad_(False)
    v = watch.check(20)
    assert v is not None and v.severity == "info" and v.evidence["deliberate"]
    assert not v.evidence["exact"] and v.evidence["max_moved"] == pytest.approx(1.0)
