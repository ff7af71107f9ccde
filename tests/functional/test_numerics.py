"""The numerics stage's rules (functional/numerics.py): broken inputs fire, healthy ones stay silent."""

from __future__ import annotations

import torch
from torch import nn

from lightning_triage.findings import CODES
from lightning_triage.functional.nonfinite import float32_state, localize_nonfinite
from lightning_triage.functional.numerics import (
    GRAD,
    LOSS,
    PARAMS,
    DeferredFlags,
    DeferredRead,
    deferred_verdict,
    describe_module,
    describe_tracer,
    localized_verdict,
    near_overflow_verdicts,
    nonfinite_batch_verdicts,
    nonfinite_params_verdict,
    not_localized_verdict,
    precision_overflow_verdict,
    step_healthy,
)

NAN, INF = float("nan"), float("inf")


def test_every_code_is_registered() -> None:
    x = torch.ones(4, 3)
    x[1, 0] = NAN
    y = torch.ones(4)
    y[3] = INF
    codes = [v.code for v in nonfinite_batch_verdicts(x, y, step=2, batch_idx=2)]
    codes.append(deferred_verdict(DeferredRead(GRAD, 5), read_at=10, every=10).code)
    for code in codes:
        assert code in CODES


def test_batch_verdicts_name_the_bad_examples_and_stay_silent_on_a_finite_batch() -> None:
    x = torch.ones(40, 3)
    x[5:38, 1] = NAN
    x[7, 2] = INF
    (v,) = nonfinite_batch_verdicts(x, torch.zeros(40, dtype=torch.long), step=3, batch_idx=1)
    assert v.code == "data.nonfinite_input" and v.step == 3
    assert v.evidence["num_examples"] == 33 and len(v.evidence["examples"]) == 32
    assert v.evidence["nan"] == 33 and v.evidence["inf"] == 1
    assert "(first 32)" in v.message
    assert nonfinite_batch_verdicts(torch.ones(4, 3), torch.ones(4), step=0, batch_idx=0) == []
    assert nonfinite_batch_verdicts(None, None, step=0, batch_idx=0) == []


def test_localized_verdicts_follow_the_localization() -> None:
    net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    forward = localize_nonfinite(net, lambda: net(torch.tensor([[NAN, 1.0]])).sum())
    v = localized_verdict(forward, net, step=4, evidence={"x": 1}, also_fp32=True)
    assert v is not None and v.code == "numerics.nonfinite_forward" and v.layer == "0"
    assert "module `0` (Linear)" in v.message and "float32 too" in v.message
    assert v.evidence == {"x": 1}
    loss = localize_nonfinite(net, lambda: torch.log(net(torch.ones(3, 2)) - 1e9).sum())
    v = localized_verdict(loss, net, step=4, evidence={}, also_fp32=False)
    assert v is not None and v.code == "numerics.nonfinite_loss" and v.layer is None
    backward = localize_nonfinite(net, lambda: torch.sqrt(net(torch.ones(3, 2)) * 0.0).sum())
    v = localized_verdict(backward, net, step=4, evidence={}, also_fp32=False)
    assert v is not None and v.code == "numerics.nonfinite_backward" and "SqrtBackward" in v.message
    healthy = localize_nonfinite(net, lambda: net(torch.ones(3, 2)).sum())
    assert localized_verdict(healthy, net, step=4, evidence={}, also_fp32=False) is None


def test_precision_overflow_names_the_layer_and_its_float32_peak() -> None:
    net = nn.Sequential(nn.Linear(2, 2))
    run = localize_nonfinite(net, lambda: (net(torch.ones(1, 2)) * INF).sum())
    ref = localize_nonfinite(net, lambda: net(torch.ones(1, 2)).sum())
    ref.max_abs_by_layer = {"0": 1e5}
    run.layer = "0"
    v = precision_overflow_verdict(run, ref, torch.float16, net, step=7, precision="16-mixed",
                                   batch_idx=7)
    assert v.code == "numerics.precision_overflow" and v.layer == "0"
    assert v.evidence["exceeding_in_float32"] == {"0": 1e5}
    assert v.evidence["dtype"] == "float16" and "1.53x" in v.message


def test_precision_overflow_inside_a_layer_whose_output_fits() -> None:
    """An exp inside a module overflows float16 while the module's own output (a softmax) stays
    small: the message says a value inside it overflowed, not "0.00x the largest value"."""
    net = nn.Sequential(nn.Linear(2, 2))
    run = localize_nonfinite(net, lambda: (net(torch.ones(1, 2)) * INF).sum())
    ref = localize_nonfinite(net, lambda: net(torch.ones(1, 2)).sum())
    ref.max_abs_by_layer = {"0": 0.9997}
    run.layer = "0"
    v = precision_overflow_verdict(run, ref, torch.float16, net, step=7, precision="16-mixed",
                                   batch_idx=7)
    assert "0.00x" not in v.message
    assert "within float16's 65504: a value computed inside it overflows" in v.message


def test_not_localized_and_params_verdicts() -> None:
    v = not_localized_verdict("gradients", "why", step=2, batch_idx=2, grad_peak=INF)
    assert v.code == "numerics.nonfinite_detected" and "(max |grad| = inf)" in v.message
    names = [f"layer{i}.weight" for i in range(9)]
    v = nonfinite_params_verdict(names, 20, [0.1], update_step=None, seen_at_step=0,
                                 applied_bad=False, on_nonfinite="stop")
    assert v.step == 0 and "before the first optimizer step" in v.message and ", ..." in v.message
    v = nonfinite_params_verdict(names[:1], 20, [0.1], update_step=3, seen_at_step=4,
                                 applied_bad=True, on_nonfinite="warn")
    assert v.step == 3 and v.layer == "layer0" and "`on_nonfinite='warn'`" in v.message


def test_near_overflow_fires_once_per_module_above_the_ratio_only() -> None:
    seen: set[str] = set()
    pairs = [("a", 30000.0), ("b", 100.0), ("c", 70000.0)]  # c: beyond fp16, already inf
    (v,) = near_overflow_verdicts(pairs, torch.float16, 0.25, step=3, reported=seen)
    assert v.layer == "a" and v.code == "numerics.near_overflow" and seen == {"a"}
    assert near_overflow_verdicts(pairs, torch.float16, 0.25, step=4, reported=seen) == []
    assert near_overflow_verdicts([("b", 1.0)], torch.bfloat16, 0.25, step=0, reported=set()) == []


def test_deferred_flags_keep_the_first_bad_step_and_every_signal() -> None:
    flags = DeferredFlags()
    ok = [torch.ones(3)]
    flags.note_step(1, ok, ok, ok)
    assert flags.read() == DeferredRead(0, -1)  # healthy: silent
    flags.note_step(2, ok, [torch.tensor([INF])], ok)
    flags.note_step(3, [torch.tensor(NAN)], ok, ok)
    read = flags.read()
    assert read == DeferredRead(GRAD | LOSS, 2)
    v = deferred_verdict(read, read_at=10, every=10)
    assert v.step == 2 and v.evidence["signals"] == ["loss", "gradients"]
    flags.clear()
    flags.flag_params()
    assert flags.read() == DeferredRead(PARAMS, -1)
    assert deferred_verdict(flags.read(), read_at=9, every=3).step == 9


def test_step_health() -> None:
    assert step_healthy(torch.tensor(1.0), torch.tensor(2.0))
    assert not step_healthy(torch.tensor(NAN), None)
    assert not step_healthy(None, torch.tensor(INF))
    assert step_healthy(None, None)


def test_float32_state_restores_the_same_tensors() -> None:
    net = nn.Linear(2, 2).half()
    weight, data = net.weight, net.weight.data
    net.weight.grad = torch.ones(2, 2).half()
    with float32_state(net):
        assert net.weight.dtype == torch.float32 and net.weight.grad is None
    assert net.weight is weight and net.weight.data.data_ptr() == data.data_ptr()
    assert net.weight.grad is not None


def test_describe() -> None:
    assert describe_module(nn.Linear(1, 1), "") == "the root module `Linear` (its own `forward` code)"
    assert describe_module(nn.Linear(1, 1), None).startswith("the loss computation")
    assert describe_tracer(sync=False, every=5, nonfinite_steps=0, first_step=None, skipped=0,
                           scaler_skips=2, replay_calls=0) == (
        "mode deferred (read every 5 steps), 0 non-finite step(s), 2 gradient-scaler skip(s) (normal)")
