"""Build the report dict, the smallest valid one, and the CI gate over it.

:func:`build_report` ranks the findings (:func:`~lightning_triage.ranking.rank`: cause before
symptom, then protocol order) and assembles the schema's dict; :func:`minimal_report` is what is
written when the full report cannot be built; :func:`problems_at` and :class:`TriageGateError`
are the gate (``Triage(fail_on=...)``, :func:`lightning_triage.testing.assert_no_findings`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from lightning_triage.findings import SEVERITIES, Finding
from lightning_triage.ranking import rank
from lightning_triage.report.schema import SCHEMA_ID
from lightning_triage.report.text import plain

ReportStatus = Literal["completed", "interrupted", "crashed"]
#: The lowest severity that fails a CI gate (``fail_on``), or ``None`` for never.
FailOn = Literal["error", "warning", "info"]


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _agree(check: Mapping[str, str], findings: Sequence[Finding]) -> dict[str, str]:
    """A check's entry, ``failed`` only while one of its findings is still a problem (a
    suspicion the run did not confirm is info)."""
    out = dict(check)
    if out.get("status") == "failed" and not any(
            f.is_problem for f in findings if f.check == out.get("check")):
        out["status"] = "passed"
    return out


def build_report(
    findings: Sequence[Finding],
    *,
    status: ReportStatus,
    run: Mapping[str, Any],
    checks: Sequence[Mapping[str, str]] = (),
    series: Mapping[str, Sequence[Sequence[float]]] | None = None,
    details: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble the report dict: each suspicion that the run does not confirm made info
    (:func:`~lightning_triage.ranking.settle_suspicions`), findings sorted by stage then
    step, each symptom's ``explained_by`` set
    (:func:`~lightning_triage.ranking.explain_findings`), ``start_here`` computed (cause
    before symptom, then protocol order), and a ``failed`` check whose findings all became info
    reported ``passed``.

    ``details`` (optional, JSON-ready, bounded) holds what the HTML report draws beyond the
    series: ``first_batch``, ``grad_layers``, ``initial_loss``, ``chance``.

    Example:
        >>> f = Finding.create("init.loss_above_chance", "loss 33.9", check="InitialLossCheck",
        ...                    global_step=0)
        >>> report = build_report([f], status="completed", run={})
        >>> report["start_here"], report["schema"]
        ('init.loss_above_chance', 'lightning-triage/report/1')
    """
    ordered, lead = rank(findings)
    return {
        "schema": SCHEMA_ID,
        "status": status,
        "start_here": lead,
        "run": dict(run),
        "findings": [f.to_dict() for f in ordered],
        "checks": [_agree(c, ordered) for c in checks],
        "series": {
            name: [[int(step), _finite_or_none(float(value))] for step, value in points]
            for name, points in (series or {}).items()
        },
        "details": dict(details or {}),
    }


def problems_at(report: Mapping[str, Any], severity: FailOn) -> list[dict[str, Any]]:
    """The findings of ``report`` at ``severity`` or worse (``"warning"``: warnings and errors).

    Example:
        >>> f = Finding.create("curve.lr_too_high", "noisy", check="LossCurveMonitor")
        >>> report = build_report([f], status="completed", run={})
        >>> [x["code"] for x in problems_at(report, "error")], len(problems_at(report, "warning"))
        ([], 1)
    """
    if severity not in SEVERITIES:
        raise ValueError(f"`severity` must be one of {SEVERITIES}, got {severity!r}.")
    worst = SEVERITIES.index(severity)
    return [dict(f) for f in report.get("findings", []) if SEVERITIES.index(f["severity"]) <= worst]


def describe_findings(findings: Sequence[Mapping[str, Any]]) -> str:
    """One line per finding: ``severity code (step N, layer L): title``."""
    lines = []
    for f in findings:
        where = ", ".join(x for x in (
            "" if f.get("global_step") is None else f"step {f['global_step']}",
            f"layer `{plain(f['layer'])}`" if f.get("layer") else "") if x)
        lines.append(f"- {f['severity']} {f['code']}" + (f" ({where})" if where else "")
                     + f": {plain(f['title'])}")
    return "\n".join(lines)


class TriageGateError(AssertionError):
    """Raised at the end of fit by ``Triage(fail_on=...)`` when the report holds findings at or
    above that severity (after the report is written), and by
    :func:`lightning_triage.testing.assert_no_findings`.

    Attributes:
        findings: the offending findings (report dicts).
        path: the written JSON report, when there is one.
        interrupted: the report is of an interrupted run (status ``"interrupted"``), which
            fails a gate whatever its findings, as ``lightning-triage show --fail-on`` does.

    Example:
        >>> err = TriageGateError([{"code": "init.loss_above_chance", "severity": "warning",
        ...                         "title": "Step-0 loss is far above chance level"}], "warning")
        >>> len(err.findings), err.severity
        (1, 'warning')
    """

    def __init__(self, findings: Sequence[Mapping[str, Any]], severity: str,
                 path: str | Path | None = None, *, interrupted: bool = False) -> None:
        self.findings = [dict(f) for f in findings]
        self.severity = severity
        self.path = None if path is None else Path(path)
        self.interrupted = interrupted
        where = f"; full report: {self.path}" if self.path is not None else ""
        head = (f"lightning-triage found {len(self.findings)} finding(s) at severity "
                f"'{severity}' or worse{where}")
        if interrupted:  # a run that did not end may miss what the rest of the fit would find
            head = (f"lightning-triage: the report is of an interrupted run (it may miss "
                    f"findings), with {len(self.findings)} finding(s) at severity '{severity}' "
                    f"or worse{where}")
        super().__init__(f"{head}\n{describe_findings(self.findings)}".rstrip("\n"))


def minimal_report(findings: Sequence[Finding | Mapping[str, Any]], *, status: ReportStatus,
                   run: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The smallest valid report holding ``findings`` as they are (not settled, not explained):
    what is written when the full report cannot be built. ``run`` values of the wrong type are
    replaced by placeholders.

    Example:
        >>> f = Finding.create("grad.exploding", "norm 1e9", check="GradientMonitor")
        >>> r = minimal_report([f], status="crashed")
        >>> r["start_here"], r["run"]["model"]
        ('grad.exploding', 'unknown')
    """
    run_in = dict(run or {})
    placeholders: dict[str, Any] = {"lightning": "unknown", "torch": "unknown",
                                    "precision": "unknown", "strategy": "unknown",
                                    "world_size": 1, "global_step": 0, "epochs": 0,
                                    "model": "unknown", "trainable_params": 0}
    out_run: dict[str, Any] = {}
    for key, default in placeholders.items():
        value = run_in.get(key, default)
        ok = isinstance(value, type(default)) and not isinstance(value, bool) and (
            not isinstance(value, int) or value >= (1 if key == "world_size" else 0))
        out_run[key] = value if ok else default
    for key, value in run_in.items():
        out_run.setdefault(key, value)
    items: list[dict[str, Any]] = []
    for f in findings:
        item = f.to_dict() if isinstance(f, Finding) else dict(f)
        items.append(item)
    items = [f for f in items if isinstance(f.get("code"), str)]
    order = {sev: i for i, sev in enumerate(SEVERITIES)}
    problems = sorted((f for f in items if f.get("severity") in ("error", "warning")),
                      key=lambda f: order[f["severity"]])
    return {"schema": SCHEMA_ID, "status": status,
            "start_here": problems[0]["code"] if problems else None,
            "run": out_run, "findings": items, "checks": [], "series": {}, "details": {}}
