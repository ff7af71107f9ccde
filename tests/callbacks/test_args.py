"""Argument validation (``callbacks/_args.py``): one error type whose message names the argument
as the user spelled it, keyword-only constructors, and ``state_key``s that let two instances of
a check share a Trainer."""

from __future__ import annotations

import inspect
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_triage import (
    AutocastCheck,
    BaselineCheck,
    BatchInspector,
    DataLoaderCheck,
    EvalContractCheck,
    EvalModeCheck,
    GradientMonitor,
    GradientWiringCheck,
    InitialLossCheck,
    LossCurveMonitor,
    MetricSyncCheck,
    NonFiniteTracer,
    OverfitBatchCheck,
    PaddingProbe,
    RankDataCheck,
    ReplicaCheck,
    StructureProbe,
    Triage,
    TriageConfigError,
    TriageReport,
    UpdateContractCheck,
    WorstErrors,
)
from lightning_triage.callbacks import CHECKS
from lightning_triage.callbacks._args import aliases, check_number
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from tests.helpers import make_trainer

KEY = 1.5  # not a key, an index nor a callable
#: For every public class, a bad value of each of its arguments.
BAD: dict[type, dict[str, Any]] = {
    AutocastCheck: dict(forward_fn=3, input_key=KEY, target_key=KEY, max_examples=0, strict="no"),
    BaselineCheck: dict(input_key=KEY, target_key=KEY, max_train_batches=0, max_val_batches=0,
                        max_examples=1, min_steps=-1, strict="no"),
    DataLoaderCheck: dict(num_batches=0, strict="no"),
    EvalContractCheck: dict(stochastic_eval="yes", task="nope", num_classes=1, ignore_index=1.5,
                            input_key=KEY, target_key=KEY, max_examples=0, min_steps=-1,
                            verify_remedy="yes", strict="no"),
    UpdateContractCheck: dict(window=1, strict="no"),
    BatchInspector: dict(num_batches=0, fingerprint_batches=-1, max_fingerprints=0, num_classes=1,
                         ignore_index="x", input_key=KEY, target_key=KEY, max_rms=1.0,
                         duplicate_fraction=0.0, probe="yes", probe_examples=10, strict="no"),
    EvalModeCheck: dict(verify_remedy="yes", strict=1),
    GradientMonitor: dict(window_epochs=-1, window_steps=0, max_window_steps=5, watch="yes",
                          on_spike="stop", flush_every_n_steps=0, ratio_every_n_steps=0,
                          max_points=1, strict=None),
    GradientWiringCheck: dict(check_optimizer=1, report_frozen=None, check_unregistered="yes",
                              check_frozen_init=0, strict="no"),
    InitialLossCheck: dict(task="nope", num_classes=1, ignore_index=1.5, above_ratio=1.0,
                           below_ratio=1.0, input_key=KEY, target_key=KEY, strict="no"),
    LossCurveMonitor: dict(task="nope", num_classes=True, ignore_index=None, input_key=KEY,
                           target_key=KEY, window_epochs=-1, window_steps=0, max_window_steps=5,
                           watch="yes", flush_every_n_steps=0, val_key=3, max_points=1,
                           strict="no"),
    NonFiniteTracer: dict(on_nonfinite="raise", mode="fast", check_every_n_steps=0,
                          check_params="yes", precision_replay="yes",
                          near_overflow_every_n_steps=0, near_overflow_ratio=1.0,
                          max_localized=-1, input_key=KEY, target_key=KEY, strict="no"),
    OverfitBatchCheck: dict(batch_size=0, max_steps=1, time_budget=0.0, tolerance=1.0, min_steps=0,
                            task="nope", num_classes=1, input_key=KEY, target_key=KEY,
                            strict="no"),
    PaddingProbe: dict(padding_mask_key=KEY, forward_fn=3, input_key=KEY, target_key=KEY,
                       max_examples=0, tolerance=0.0, ignore_index="x", strict="no"),
    StructureProbe: dict(causal="yes", forward_fn=3, input_key=KEY, target_key=KEY,
                         max_examples=1, tolerance=1.0, time_budget=0, ignore_index="x",
                         strict="no"),
    MetricSyncCheck: dict(max_checks=0, strict="no"),
    RankDataCheck: dict(num_batches=0, input_key=KEY, target_key=KEY, strict="no"),
    ReplicaCheck: dict(check_every_n_steps=0, strict="no"),
    TriageReport: dict(report_dir=3, verbose="yes", html="yes", log_findings="yes", verify_remedies="yes",
                       fail_on="fatal", strict="no"),
    WorstErrors: dict(k=0, input_key=KEY, target_key=KEY, index_key=KEY, image_shape=(0, 8),
                      thumbnail_side=200, ignore_index="x", strict="no"),
    Triage: dict(report_dir=3, task="nope", num_classes=1, causal="yes", strict="no",
                 verbose="yes", input_key=KEY, target_key=KEY, overfit="yes",
                 overfit_batch_size=0, overfit_max_steps=1, overfit_time_budget=0.0, forward_fn=3,
                 on_nonfinite="raise", numerics_mode="fast", numerics_check_every_n_steps=0,
                 window_epochs=-1, window_steps=0, watch="yes", on_spike="stop",
                 stochastic_eval="yes", padding_mask_key=KEY, fail_on="fatal", html="yes",
                 log_findings="yes", verify_remedies="yes", warn_findings="yes"),
}
CASES = [pytest.param(cls, name, value, id=f"{cls.__name__}.{name}")
         for cls, bad in BAD.items() for name, value in bad.items()]


def test_every_public_argument_has_a_bad_value() -> None:
    assert set(CHECKS) | {Triage, TriageReport} <= set(BAD), "a check without bad values"
    for cls, bad in BAD.items():
        assert set(bad) == set(inspect.signature(cls).parameters), cls.__name__


@pytest.mark.parametrize("cls", list(BAD))
def test_constructors_are_keyword_only(cls: type) -> None:
    kinds = {p.kind for p in inspect.signature(cls).parameters.values()}
    assert kinds == {inspect.Parameter.KEYWORD_ONLY}, cls.__name__
    with pytest.raises(TypeError):
        cls(None)


@pytest.mark.parametrize(("cls", "name", "value"), CASES)
def test_a_bad_argument_raises_one_error_type_naming_it(cls: type, name: str, value: Any) -> None:
    with pytest.raises(TriageConfigError) as info:
        cls(**{name: value})
    err = info.value
    assert isinstance(err, ValueError)
    assert err.argument == name  # `Triage`'s own name, never the check's
    assert str(err).startswith(f"`{name}` must be ")
    assert str(err).endswith(f", got {value!r}.")


def test_triage_names_its_own_arguments_and_the_aliases_do_not_leak() -> None:
    with pytest.raises(TriageConfigError, match=r"^`overfit_max_steps` must be an integer >= 2"):
        Triage(overfit_max_steps=0)
    with pytest.raises(TriageConfigError, match=r"^`numerics_check_every_n_steps` "):
        Triage(numerics_check_every_n_steps=0)
    with pytest.raises(TriageConfigError, match=r"^`max_steps` must be an integer >= 2") as info:
        OverfitBatchCheck(max_steps=0)
    assert info.value.argument == "max_steps"


def test_the_error_pickles_and_the_messages_read_well() -> None:
    err = pickle.loads(pickle.dumps(TriageConfigError("`k` must be 1, got 0.", argument="k",
                                                      value=0)))
    assert (str(err), err.argument, err.value) == ("`k` must be 1, got 0.", "k", 0)
    with pytest.raises(TriageConfigError, match=r"must be a number of seconds > 0, got -1\."):
        check_number("time_budget", -1, 0, unit="seconds")
    with pytest.raises(TriageConfigError, match=r"must be in \(0, 1\], got nan\."):
        check_number("fraction", float("nan"), 0, 1, high_open=False)
    with aliases(fraction="my_fraction"), pytest.raises(TriageConfigError, match=r"^`my_fraction`"):
        check_number("fraction", 2, 0, 1)
    with pytest.raises(TriageConfigError, match=r"`num_classes` is required with "
                                                r"task='multiclass' \(an integer >= 2\), got None\."):
        InitialLossCheck(task="multiclass")


def test_state_key_names_the_arguments_that_tell_instances_apart() -> None:
    assert LossCurveMonitor().state_key == "LossCurveMonitor"  # older checkpoints still load
    assert LossCurveMonitor(window_steps=50).state_key == "LossCurveMonitor{'window_steps': 50}"
    assert LossCurveMonitor(max_points=50).state_key == "LossCurveMonitor"  # not an identity
    key = WorstErrors(input_key=lambda batch: batch[0]).state_key  # stable across processes
    assert "0x" not in key and "<lambda>" in key
    assert StructureProbe(causal=True).state_key != StructureProbe(causal=False).state_key
    assert len({c.state_key for c in Triage().checks}) == len(Triage().checks)


def test_two_instances_of_a_check_share_a_trainer_and_resume_their_own_state(
        tmp_path: Path) -> None:
    def monitors() -> tuple[LossCurveMonitor, LossCurveMonitor]:
        return (LossCurveMonitor(window_epochs=0, window_steps=10, max_window_steps=10,
                                 flush_every_n_steps=5, strict=True),
                LossCurveMonitor(window_epochs=0, window_steps=100, flush_every_n_steps=5,
                                 strict=True))

    torch.manual_seed(0)
    short, long = monitors()
    train, val = digits_loaders()
    trainer = make_trainer(tmp_path, [short, long], limit_train_batches=20)
    trainer.fit(DigitsMLP(lr=0.1), train, val)
    ckpt = tmp_path / "two.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = torch.load(ckpt, weights_only=False)["callbacks"]
    assert {short.state_key, long.state_key} <= set(saved)
    windows = short.extra_state()["window_n"], long.extra_state()["window_n"]
    assert windows == (10, 20)  # the two states differ
    assert short.findings == [] and long.findings != []

    short2, long2 = monitors()
    trainer = make_trainer(tmp_path, [short2, long2], limit_train_batches=20, max_epochs=2)
    trainer.fit(DigitsMLP(lr=0.1), train, val, ckpt_path=ckpt)
    assert trainer.global_step == 40  # resumed, then went on
    assert (short2.extra_state()["window_n"], long2.extra_state()["window_n"]) == windows
    assert long2.findings[:len(long.findings)] == long.findings
    assert not {f.code for f in short2.findings} & {f.code for f in long.findings}


@pytest.mark.parametrize("causal", [True, None, False])
def test_triage_causal_means_what_it_means_in_structure_probe(causal: bool | None) -> None:
    probe = Triage(causal=causal).check("StructureProbe")
    assert isinstance(probe, StructureProbe) and probe.causal is causal


def test_triage_passes_the_batch_keys_to_every_check_that_reads_the_batch() -> None:
    def inputs(batch: Any) -> Any:
        return batch["x"]

    triage = Triage(input_key=inputs, target_key="y")
    readers = [c for c in triage.checks if "input_key" in inspect.signature(type(c)).parameters]
    assert {type(c).__name__ for c in readers} == {
        "BatchInspector", "WorstErrors", "InitialLossCheck", "OverfitBatchCheck", "StructureProbe",
        "PaddingProbe", "EvalContractCheck", "LossCurveMonitor", "NonFiniteTracer", "AutocastCheck",
        "BaselineCheck", "RankDataCheck"}
    for check in readers:
        assert (check.input_key, check.target_key) == (inputs, "y"), type(check).__name__
