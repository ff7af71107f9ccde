"""The ranking uses the trial in a real fit (seeds 0-2): the demo's raw-pixel digits (0-16, SGD
lr 0.5) saturate and the curve settles at chance; standardizing the inputs, tried on a copy, cures
it, so the input scale leads and the curve finding is marked explained by it."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_triage.demo import SCENARIOS
from tests.callbacks.test_remedy import fit, lead_of
from tests.helpers import seeds

RAW = next(s for s in SCENARIOS if s.name == "raw-pixels")


@pytest.mark.parametrize("seed", seeds())
def test_a_confirmed_input_remedy_explains_the_curve_it_cured(tmp_path: Path, seed: int) -> None:
    _, _, report = fit(RAW.build, tmp_path, seed)
    lead = lead_of(report)
    assert lead["code"] == "data.unnormalized_input"
    assert (lead["remedy"]["kind"], lead["remedy"]["verdict"]) == ("standardize_input",
                                                                   "confirmed")
    curves = [f for f in report["findings"] if f["code"].startswith("curve.")
              and f["severity"] != "info"]
    assert curves  # the saturated curve: at chance, or stuck
    for f in curves:
        assert "data.unnormalized_input" in f["explained_by"], f
        assert "Explained by `data.unnormalized_input`" in f["message"]
