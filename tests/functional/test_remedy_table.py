"""The remedy table (codes/remedies.py) is the one source of the remedy kinds: the type, the
report schema's enum, the registry's codes and the trial's modules agree with it, and no module
branches on a kind's name."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

from lightning_triage.codes.remedies import (
    REMEDIES,
    REMEDY_KINDS,
    TRIED_KINDS,
    RemedyKind,
    remedy_spec,
)
from lightning_triage.findings import CODES
from lightning_triage.report.schema import REPORT_SCHEMA

SRC = Path(__file__).resolve().parents[2] / "src" / "lightning_triage"


def test_the_kind_type_and_the_schema_enum_are_the_table() -> None:
    assert typing.get_args(RemedyKind) == REMEDY_KINDS == tuple(REMEDIES)
    kind = REPORT_SCHEMA["properties"]["findings"]["items"]["properties"]["remedy"][
        "properties"]["kind"]
    assert tuple(kind["enum"]) == TRIED_KINDS
    assert {spec.remedy for spec in CODES.values()} <= set(REMEDY_KINDS)


def test_every_row_says_what_it_changes_and_what_it_must_reproduce() -> None:
    for kind, spec in REMEDIES.items():
        assert spec.kind == kind
        if spec.tried:
            assert spec.change and spec.symptom, kind
        if spec.family == "replay":
            assert spec.lr is not None or spec.label, kind  # a label for `tried`
        if spec.family == "eval":
            assert spec.short and spec.left_over and (spec.force_eval or spec.gate_dropout)
    assert {k for k, s in REMEDIES.items() if s.family == "replay"} == {
        "lr_down", "lr_up", "lr_down_clip", "standardize_input", "zero_grads", "add_params",
        "realign_labels"}
    assert {k for k, s in REMEDIES.items() if s.family == "eval"} == {"eval_mode", "gate_dropout"}
    assert {k for k, s in REMEDIES.items() if s.lr is not None} == {"lr_down", "lr_up",
                                                                      "lr_down_clip"}
    assert {k for k, s in REMEDIES.items() if s.direct} == {"zero_grads", "add_params",
                                                             "realign_labels"}
    assert remedy_spec("from-a-newer-version").family == "none"


def _kind_tests(path: Path) -> list[str]:
    """The comparisons of a variable named ``kind`` (or a ``.get("kind")``) with a string."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        left = node.left
        named = (isinstance(left, ast.Name) and left.id == "kind") or (
            isinstance(left, ast.Call) and isinstance(left.func, ast.Attribute)
            and left.func.attr == "get" and left.args
            and isinstance(left.args[0], ast.Constant) and left.args[0].value == "kind")
        if named and any(isinstance(c, (ast.Constant, ast.Tuple, ast.Set))
                         for c in node.comparators):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_the_trial_and_the_report_read_the_table_instead_of_naming_kinds() -> None:
    modules = [SRC / "callbacks" / "_remedy.py", SRC / "callbacks" / "_mode_remedy.py",
               SRC / "functional" / "remedy.py", SRC / "functional" / "remedy_plan.py"]
    modules += [SRC / "report" / "text.py"]
    assert [hit for m in modules for hit in _kind_tests(m)] == []
