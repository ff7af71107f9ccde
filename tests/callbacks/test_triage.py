from __future__ import annotations

from lightning_triage import Triage


def test_bundle_runs_every_check_in_protocol_order() -> None:
    names = [type(c).__name__ for c in Triage().checks]
    assert names == [
        "BatchInspector",  # data
        "InitialLossCheck",  # init
        "GradientWiringCheck",  # wiring
        "OverfitBatchCheck",  # overfit
        "StructureProbe",  # structure
        "EvalModeCheck",  # mode
        "LossCurveMonitor",  # curve
        "GradientMonitor",  # grad
        "NonFiniteTracer",  # numerics
    ]
    assert "OverfitBatchCheck" not in [type(c).__name__ for c in Triage(overfit=False).checks]


def test_bundle_state_keys_are_distinct() -> None:
    keys = [c.state_key for c in Triage().checks]
    assert len(set(keys)) == len(keys)
