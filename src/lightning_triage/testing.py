"""Test helpers: assert that a triage report is clean, for smoke-test trainings in CI; count
what ``torch.compile`` compiles, to assert that a callback adds no recompilation.

Example:
    >>> from lightning_triage.findings import Finding
    >>> from lightning_triage.report import build_report
    >>> run = {"lightning": "2.6", "torch": "2.5", "precision": "32-true", "model": "Net",
    ...        "strategy": "auto", "world_size": 1, "global_step": 10, "epochs": 1,
    ...        "trainable_params": 100}
    >>> ok = build_report([Finding.create("overfit.passed", "loss 0.01", check="OverfitBatchCheck")],
    ...                   status="completed", run=run)
    >>> assert_no_findings(ok, severity="warning")
    >>> bad = build_report([Finding.create("wiring.no_grad_params", "`enc.weight` got no gradient",
    ...                                    check="GradientWiringCheck", global_step=0)],
    ...                    status="completed", run=run)
    >>> assert_no_findings(bad)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lightning_triage.report.build.TriageGateError: lightning-triage found 1 finding(s) at severity ...
    - error wiring.no_grad_params (step 0): Trainable parameters got no gradient
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from lightning_triage.report.build import FailOn, TriageGateError, problems_at
from lightning_triage.report.load import find_report, load_report
from lightning_triage.report.schema import validate_report


def assert_no_findings(report: Mapping[str, Any] | str | os.PathLike[str] | Any,
                       severity: FailOn = "warning", ignore: Iterable[str] = ()) -> None:
    """Fail (raise :class:`~lightning_triage.report.TriageGateError`, an ``AssertionError``) when
    ``report`` holds findings at ``severity`` or worse.

    Args:
        report: a report dict, a path to ``triage_report.json`` or to a directory holding one,
            or a :class:`~lightning_triage.Triage` / :class:`~lightning_triage.TriageReport`
            after ``fit``.
        severity: ``"error"``, ``"warning"`` (default: errors and warnings) or ``"info"``.
        ignore: finding codes to leave out (e.g. ``["data.class_imbalance"]``).

    Raises:
        TriageGateError: findings at ``severity`` or worse, or a report of an interrupted run
            (status ``"interrupted"``: it may miss what the rest of the fit would have found),
            as ``lightning-triage show --fail-on`` (an ``AssertionError``).
        TriageReportError: ``report`` is not a valid report (a ``ValueError``: a broken gate
            input is not a test failure), with a one-line message.
        FileNotFoundError: no report at the path.
    """
    path = None
    if isinstance(report, (str, os.PathLike)):
        path = find_report(os.fspath(report))
        data: Mapping[str, Any] = load_report(path)
    elif isinstance(report, Mapping):
        data = report
    else:
        holder = getattr(report, "report", None)
        holder = getattr(holder, "report", holder)  # Triage -> TriageReport -> dict
        if not isinstance(holder, Mapping):
            raise TypeError(f"`report` must be a report dict, a path, or a Triage/TriageReport "
                            f"after fit, got {type(report).__name__} without a report.")
        data = holder
    if path is None:
        validate_report(data)
    skip = set(ignore)
    bad = [f for f in problems_at(data, severity) if f["code"] not in skip]
    interrupted = data.get("status") == "interrupted"
    if bad or interrupted:
        raise TriageGateError(bad, severity, path, interrupted=interrupted)


class CountingBackend:
    """A ``torch.compile`` backend that counts the graphs it compiles and the calls of the
    compiled code (one per compiled forward), compiling with inductor (``"inductor"``) or not at
    all (``"eager"``: the captured graph runs as it is; fast, no C compiler needed).

    A run watched by lightning-triage compiles exactly the graphs the bare run compiles and calls
    them as often: compare ``graphs`` and ``calls`` of the two fits.

    Args:
        compiler: ``"inductor"`` or ``"eager"``.

    Example:
        >>> backend = CountingBackend("eager")
        >>> f = torch.compile(lambda x: x * 2, backend=backend)
        >>> _ = f(torch.ones(3)), f(torch.ones(3))
        >>> backend.graphs, backend.calls
        (1, 2)
    """

    def __init__(self, compiler: str = "inductor") -> None:
        if compiler not in ("inductor", "eager"):
            raise ValueError(f"`compiler` must be 'inductor' or 'eager', got {compiler!r}")
        self.compiler = compiler
        self.graphs = 0
        self.calls = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        self.graphs += 1
        compiled: Callable[..., Any] = gm.forward
        if self.compiler == "inductor":
            from torch._inductor.compile_fx import compile_fx

            compiled = compile_fx(gm, example_inputs)  # type: ignore[assignment]

        def run(*args: Any) -> Any:
            self.calls += 1
            return compiled(*args)

        return run


__all__ = ["CountingBackend", "assert_no_findings"]
