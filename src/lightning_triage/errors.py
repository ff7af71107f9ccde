"""The exception raised for bad arguments of the callbacks and of :class:`~lightning_triage.Triage`."""

from __future__ import annotations

from typing import Any


class TriageConfigError(ValueError):
    """An argument of a triage callback is out of range or of the wrong type.

    The message names the argument (as the user spelled it: ``Triage``'s own name when the check
    was built by :class:`~lightning_triage.Triage`), shows the value and says what is allowed.
    A :class:`ValueError`, so code catching that keeps working.

    Attributes:
        argument: the argument's name, as in the message.
        value: the value given.

    Example:
        >>> from lightning_triage import Triage, TriageConfigError
        >>> try:
        ...     Triage(overfit_max_steps=0)
        ... except TriageConfigError as err:
        ...     print(err.argument, "|", err)
        overfit_max_steps | `overfit_max_steps` must be an integer >= 2, got 0.
    """

    def __init__(self, message: str, *, argument: str, value: Any = None) -> None:
        super().__init__(message)
        self.argument = argument
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across ddp_spawn workers
        return _rebuild, (str(self), self.argument, self.value)


def _rebuild(message: str, argument: str, value: Any) -> TriageConfigError:
    return TriageConfigError(message, argument=argument, value=value)


class TriageReportError(ValueError):
    """A saved report cannot be used: not JSON, not a lightning-triage report, or not valid
    against the schema ``lightning-triage/report/1``
    (:data:`~lightning_triage.report.REPORT_SCHEMA`).

    Raised by :func:`~lightning_triage.report.load_report` and
    :func:`~lightning_triage.report.validate_report`, hence by every command of the command line
    (which prints the message on one line and exits with code 2) and by
    :func:`~lightning_triage.testing.assert_no_findings`. The message is one line: the file,
    where in the report (a JSON path such as ``findings[0].severity``) and what is wrong.
    A :class:`ValueError`, so code catching that keeps working.

    Example:
        >>> from lightning_triage.report import validate_report
        >>> try:
        ...     validate_report({"schema": "lightning-triage/report/1"})
        ... except TriageReportError as err:
        ...     print(err)
        not a valid lightning-triage report: (top level): missing key 'status'
    """
