"""The published schema and the one loader: every report the library writes is valid; a
malformed one is a one-line error and exit code 2 in every command, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from lightning_triage import TriageReportError
from lightning_triage.__main__ import main
from lightning_triage.report import (
    REPORT_SCHEMA,
    TriageGateError,
    load_report,
    validate_report,
    write_report,
)
from lightning_triage.report.schema import ANNOTATIONS, KEYWORDS, MAX_DEPTH
from lightning_triage.testing import assert_no_findings
from tests.hostile import hostile_report
from tests.report_samples import broken_report, healthy_report

ROOT = Path(__file__).resolve().parents[1]


def test_the_schema_is_a_valid_json_schema_using_only_known_keywords() -> None:
    jsonschema.Draft202012Validator.check_schema(REPORT_SCHEMA)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("properties",):
                    for sub in value.values():
                        walk(sub)
                    continue
                assert key in KEYWORDS | ANNOTATIONS, key
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(REPORT_SCHEMA)


@pytest.mark.parametrize("make", [broken_report, healthy_report, hostile_report])
def test_sample_and_freshly_written_reports_are_valid(make: Callable[[], dict[str, Any]],
                                                      tmp_path: Path) -> None:
    report = make()
    write_report(report, tmp_path, html=False)
    saved = load_report(tmp_path)  # validates
    jsonschema.validate(saved, REPORT_SCHEMA)
    assert saved["run"]["run_id"]


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def edit(report: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node: Any = report
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is _DELETE:
            del node[last]
        else:
            node[int(last) if isinstance(node, list) else last] = value
    return edit


_DELETE = object()


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


#: (id, edit of the broken sample or raw file text, what the message names, beyond the schema)
MALFORMED: list[tuple[str, Any, str, bool]] = [
    ("findings-a-string", _set("findings", "boom"), "findings: expected array", False),
    ("unknown-severity", _set("findings/0/severity", "fatal"), "findings[0].severity", False),
    ("finding-without-severity", _set("findings/0/severity", _DELETE), "missing key 'severity'",
     False),
    ("finding-without-code", _set("findings/1/code", _DELETE), "missing key 'code'", False),
    ("series-values-as-strings", _set("series/train_loss/0/1", "2.3"), "series.train_loss[0][1]",
     False),
    ("step-a-string", _set("findings/0/global_step", "12"), "global_step", False),
    ("step-a-bool", _set("findings/0/global_step", True), "global_step", False),
    ("run-a-list", _set("run", []), "run: expected object", False),
    ("unknown-status", _set("status", "exploded"), "status", False),
    ("check-without-detail", _set("checks/0/detail", _DELETE), "checks[0]", False),
    ("huge-code", _set("findings/0/code", "a." + "b" * (8 << 20)), "longer than 200", False),
    ("start-here-names-nothing", _set("start_here", "curve.healthy"), "start_here", True),
    ("nested-too-deep", _set("run/hparams", _nested(MAX_DEPTH + 5)), "nested deeper", True),
    ("nan-step", '{"schema": "lightning-triage/report/1", "findings": [{"global_step": NaN}]}',
     "NaN is not a JSON number", True),
    ("nested-past-the-recursion-limit", "[" * 200_000 + "]" * 200_000, "nested too deeply", True),
    ("top-level-array", "[1, 2]", "expected object", False),
    ("empty-file", "", "not valid JSON", True),
    ("not-utf8", b"\xff\xfe{}", "not valid JSON", True),
    ("other-schema", '{"schema": "something/else"}', "not a lightning-triage report", True),
]


def _write(case: Any, path: Path) -> None:
    if isinstance(case, bytes):
        path.write_bytes(case)
    elif isinstance(case, str):
        path.write_text(case)
    else:
        report = broken_report()
        case(report)
        path.write_text(json.dumps(report))


@pytest.mark.parametrize(("case", "says", "beyond"), [m[1:] for m in MALFORMED],
                         ids=[m[0] for m in MALFORMED])
def test_malformed_report_is_one_line_and_exit_2(case: Any, says: str, beyond: bool,
                                                 tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "triage_report.json"
    _write(case, bad)
    good = tmp_path / "good"
    write_report(healthy_report(), good, html=False)
    for argv in (["show", str(bad)], ["html", str(bad), "-o", str(tmp_path / "x.html")],
                 ["diff", str(good), str(bad)], ["diff", str(bad), str(good)]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("lightning-triage: error: "), err[:300]
        assert says in err and len(err) < 600, err[:600]
    assert not (tmp_path / "x.html").exists()
    with pytest.raises(TriageReportError, match=r"triage_report\.json"):
        assert_no_findings(bad)
    if not beyond and not isinstance(case, (str, bytes)):  # the validator agrees with jsonschema
        report = broken_report()
        case(report)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(report, REPORT_SCHEMA)


def test_assert_no_findings_validates_a_report_dict() -> None:
    report = broken_report()
    report["findings"][0]["severity"] = "fatal"
    with pytest.raises(TriageReportError, match=r"findings\[0\]\.severity"):
        assert_no_findings(report)
    with pytest.raises(TriageReportError):
        validate_report({"schema": "lightning-triage/report/1", "findings": "x"})


def test_the_schema_ships_in_the_package_and_the_docs() -> None:
    shipped = ROOT / "src" / "lightning_triage" / "report" / "report_schema.json"
    assert json.loads(shipped.read_text()) == REPORT_SCHEMA
    assert "report_schema.json" in (ROOT / "docs" / "schema.md").read_text()


def test_the_cli_imports_neither_torch_nor_lightning(tmp_path: Path) -> None:
    write_report(broken_report(), tmp_path, html=False)
    code = (
        "import sys, time\n"
        "from lightning_triage.__main__ import main\n"
        f"for argv in (['show', {str(tmp_path)!r}], ['diff', {str(tmp_path)!r}, {str(tmp_path)!r}],"
        f" ['html', {str(tmp_path)!r}]):\n"
        "    main(argv)\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning',"
        " 'pytorch_lightning', 'torchmetrics'))\n"
        "print('HEAVY', heavy)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout
    assert "HEAVY []" in out


def test_assert_no_findings_fails_an_interrupted_run_as_the_cli_gate_does(tmp_path: Path) -> None:
    report = healthy_report()
    assert_no_findings(report)  # completed and clean: passes
    report["status"] = "interrupted"
    with pytest.raises(TriageGateError, match="interrupted run") as err:
        assert_no_findings(report)
    assert err.value.interrupted and err.value.findings == []
    write_report(report, tmp_path, html=False)
    assert main(["show", str(tmp_path), "--fail-on", "error"]) == 1
