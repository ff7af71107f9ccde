"""The ranking policy's tables: every problem code has a role, every row names registered codes."""

from __future__ import annotations

from lightning_triage.findings import CODES, Finding
from lightning_triage.ranking import (
    EXPLANATIONS,
    STANDALONE,
    SUSPICIONS,
    rank,
    role,
    start_here,
)


def test_every_warning_and_error_code_has_a_role() -> None:
    problems = sorted(code for code, spec in CODES.items() if spec.severity != "info")
    missing = [code for code in problems if role(code) is None]
    assert missing == [], ("declare each code's role in lightning_triage.ranking: name it in "
                           "EXPLANATIONS (a cause or a symptom) or list it in STANDALONE")


def test_a_standalone_code_neither_explains_nor_is_explained() -> None:
    both = [code for code in STANDALONE if role(code) != "standalone"]
    assert both == []
    assert role("data.unknown_batch_structure") is None  # info: no role needed
    assert role("overfit.failed") == "symptom" and role("grad.vanishing") == "cause"
    assert role("numerics.nonfinite_backward") == "cause"  # through the layered numerics rows


def test_every_table_names_registered_codes() -> None:
    named = set(STANDALONE) | set(SUSPICIONS) | set(EXPLANATIONS)
    for rule in SUSPICIONS.values():
        named |= rule.confirmed_by | rule.cleared_by | rule.overruled_by
    for rows in EXPLANATIONS.values():
        for row in rows:
            assert row.code in EXPLANATIONS
            named |= row.explained_by
    assert sorted(named - set(CODES)) == []


def test_rank_settles_explains_sorts_and_leads() -> None:
    scale = Finding.create("data.unnormalized_input", "rms 70", check="T")
    passed = Finding.create("overfit.passed", "memorized", check="T")
    spike = Finding.create("curve.loss_spike", "spike", check="T", global_step=20)
    nan = Finding.create("numerics.nonfinite_loss", "inf", check="T", global_step=23)
    ordered, lead = rank([passed, scale])
    assert [f.code for f in ordered] == ["data.unnormalized_input", "overfit.passed"]
    assert ordered[0].severity == "info" and lead is None  # nothing confirmed the suspicion
    ordered, lead = rank([nan, spike, passed, scale])
    assert [f.code for f in ordered] == ["data.unnormalized_input", "overfit.passed",
                                         "curve.loss_spike", "numerics.nonfinite_loss"]
    assert ordered[0].severity == "warning"  # a NaN confirms it: the scale leads
    assert ordered[2].explained_by == ["numerics.nonfinite_loss"]
    assert lead == "data.unnormalized_input" == start_here(ordered)
    assert rank([]) == ([], None)


def test_an_unconfirmed_remedy_yields_to_the_others_of_its_stage() -> None:
    low = Finding.create("curve.lr_too_low", "slow", check="T", global_step=90)
    high = Finding.create("curve.lr_too_high", "fast", check="T", global_step=95)
    tried = Finding(**{**low.__dict__, "remedy": {"verdict": "not confirmed"}})
    assert rank([low, high])[1] == "curve.lr_too_low"
    assert rank([tried, high])[1] == "curve.lr_too_high"
