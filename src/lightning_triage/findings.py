"""Findings: the protocol stages, the registry of public finding codes and the `Finding` record.

Pure Python, no Lightning import: a finding can be built, serialized and sorted from a plain
PyTorch loop or a test.

Example:
    >>> from lightning_triage.findings import Finding
    >>> f = Finding.create(
    ...     "init.loss_above_chance",
    ...     message="step-0 loss 33.9 is 14.7x the chance level ln(10) = 2.303",
    ...     check="InitialLossCheck",
    ...     global_step=0,
    ... )
    >>> f.severity, f.stage
    ('error', 'init')
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from lightning_triage.codes import REMEDY_KINDS, SEVERITIES, SPECS, CodeSpec, RemedyKind, Severity

#: The protocol stages, in the order findings are reported and fixed.
STAGES: tuple[str, ...] = (
    "data",
    "init",
    "wiring",
    "overfit",
    "structure",
    "mode",
    "curve",
    "grad",
    "numerics",
)
#: The question each protocol stage answers: the one wording the console, the Markdown and HTML
#: reports and the docs use.
STAGE_QUESTIONS: dict[str, str] = {
    "data": "Is the batch the model sees sane?",
    "init": "Is the loss at step 0 near chance level?",
    "wiring": "Does every trainable parameter receive a gradient?",
    "overfit": "Can the model memorize one small batch?",
    "structure": "Do outputs mix examples, see the targets, future positions or the padding, or "
                 "broadcast silently?",
    "mode": "Are the train/eval modes right during validation?",
    "curve": "What does the loss curve's shape say about the learning rate?",
    "grad": "Are gradient norms exploding, vanishing, spiking?",
    "numerics": "Where does the first NaN/Inf appear; is it precision?",
}
#: Findings about lightning-triage itself (a check that failed internally). Sorted after the
#: protocol and never chosen as ``start_here``.
META_STAGE = "triage"
#: Context about the run's settings (e.g. ``run.unseeded``): info only, sorted after the
#: protocol, never chosen as ``start_here``.
RUN_STAGE = "run"


# The table of codes (`CodeSpec`, one `spec(...)` row per code) is the `lightning_triage.codes` package
# (moved there by issue 33: the module-size limit); the registry built from it is below.
#: Every known finding code, with its stage, default severity, title and hint.
CODES: dict[str, CodeSpec] = {spec.code: spec for spec in SPECS}


def register_code(code: str, severity: Severity, title: str, hint: str, *,
                  when: str = "", remedy: RemedyKind = "none") -> CodeSpec:
    """Register a new finding code (codes are never renamed; new ones may be added).

    Raises:
        ValueError: if the code's stage is unknown, the severity is invalid, or the code exists
            with a different definition.
    """
    stage = code.split(".", 1)[0]
    if "." not in code or stage not in (*STAGES, META_STAGE, RUN_STAGE):
        raise ValueError(f"Finding code {code!r} must be `<stage>.<name>` with stage in {STAGES}.")
    if severity not in SEVERITIES:
        raise ValueError(f"`severity` must be one of {SEVERITIES}, got {severity!r}.")
    if remedy not in REMEDY_KINDS:
        raise ValueError(f"`remedy` must be one of {REMEDY_KINDS}, got {remedy!r}.")
    spec = CodeSpec(code, severity, title, hint, when, remedy)
    if code in CODES and CODES[code] != spec:
        raise ValueError(f"Finding code {code!r} is already registered differently.")
    CODES[code] = spec
    return spec


def stage_line(code: str) -> str:
    """The protocol stage of ``code`` and its question, for the reports ("" outside the protocol).

    Example:
        >>> stage_line("init.loss_above_chance")
        'stage 2 of 9, init: Is the loss at step 0 near chance level?'
    """
    stage = code.split(".", 1)[0]
    if stage not in STAGES:
        return ""
    return f"stage {STAGES.index(stage) + 1} of {len(STAGES)}, {stage}: {STAGE_QUESTIONS[stage]}"


def stage_index(stage: str) -> int:
    """Position of ``stage`` in the protocol (the meta stage sorts last)."""
    return STAGES.index(stage) if stage in STAGES else len(STAGES)


def _jsonable(value: Any) -> Any:
    """Convert evidence values (numpy/torch scalars, tuples, non-finite floats) to JSON types."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if hasattr(value, "tolist"):  # numpy arrays/scalars, torch tensors
        return _jsonable(value.tolist())
    if hasattr(value, "item"):
        return _jsonable(value.item())
    return str(value)


@dataclass(frozen=True)
class Finding:
    """One diagnosis: what was found, with the numbers, and what to check next.

    Build findings with :meth:`Finding.create`, which checks the code against the registry and
    fills in the default severity, title and hint.

    Example:
        >>> f = Finding.create("init.loss_above_chance", "step-0 loss 34.3 is 14.9x the chance level",
        ...                    check="InitialLossCheck", global_step=0, evidence={"loss": 34.3})
        >>> f.severity, f.stage, f.is_problem
        ('error', 'init', True)
        >>> f.title
        'Step-0 loss is far above chance level'
        >>> Finding.from_dict(f.to_dict()) == f
        True
    """

    code: str
    severity: Severity
    title: str
    message: str
    hint: str
    check: str
    global_step: int | None = None
    epoch: int | None = None
    rank: int = 0
    layer: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    explained_by: list[str] = field(default_factory=list)
    #: The lead's fix tried on a copy of the run (``None``: not tried; docs/remedies.md):
    #: ``{"kind", "change", "before", "after", "verdict", "reason"}`` and, for a fix that was
    #: not confirmed, ``"next_candidate"``.
    remedy: dict[str, Any] | None = None

    @classmethod
    def create(
        cls,
        code: str,
        message: str,
        *,
        check: str,
        severity: Severity | None = None,
        title: str | None = None,
        hint: str | None = None,
        global_step: int | None = None,
        epoch: int | None = None,
        rank: int = 0,
        layer: str | None = None,
        evidence: Mapping[str, Any] | None = None,
    ) -> Finding:
        """Create a finding for a registered ``code``.

        Raises:
            ValueError: if ``code`` is not registered or ``severity`` is not a known severity.
        """
        spec = CODES.get(code)
        if spec is None:
            raise ValueError(
                f"Unknown finding code {code!r}. Known codes: {', '.join(sorted(CODES))}."
            )
        severity = spec.severity if severity is None else severity
        if severity not in SEVERITIES:
            raise ValueError(f"`severity` must be one of {SEVERITIES}, got {severity!r}.")
        return cls(
            code=code,
            severity=severity,
            title=spec.title if title is None else title,
            message=message,
            hint=spec.hint if hint is None else hint,
            check=check,
            global_step=None if global_step is None else int(global_step),
            epoch=None if epoch is None else int(epoch),
            rank=int(rank),
            layer=layer,
            evidence=_jsonable(dict(evidence or {})),
        )

    @property
    def stage(self) -> str:
        """The protocol stage of the finding (the part of the code before the dot)."""
        return self.code.split(".", 1)[0]

    @property
    def is_problem(self) -> bool:
        """Whether the finding is an error or a warning (not context)."""
        return self.severity != "info"

    def to_dict(self) -> dict[str, Any]:
        """The finding as a JSON-ready dict (the report schema's ``findings[]`` item)."""
        out = asdict(self)
        out["explained_by"] = list(self.explained_by)
        data = {key: out[key] for key in _FIELD_ORDER}
        if self.remedy is not None:  # optional: reports without a remedy trial stay as they were
            data["remedy"] = _jsonable(self.remedy)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """Rebuild a finding from :meth:`to_dict` output (e.g. a checkpoint or report)."""
        values = {key: data[key] for key in _FIELD_ORDER if key in data}
        values["explained_by"] = list(values.get("explained_by") or [])
        remedy = data.get("remedy")
        return cls(**values, remedy=dict(remedy) if isinstance(remedy, Mapping) else None)


_FIELD_ORDER = (
    "code", "severity", "title", "message", "hint", "global_step", "epoch", "rank", "layer",
    "evidence", "check", "explained_by",
)


def epoch_of_step(finding: Finding, epoch_starts: Sequence[tuple[int, int]]) -> Finding:
    """``finding`` with the epoch of its step: a check that records a finding after its step
    (the curve window closing, a deferred read, the end of fit) records the epoch current then,
    one too many when the epoch has ended since. ``epoch_starts`` holds ``(global_step, epoch)``
    at each training epoch's start; the finding's epoch becomes the lower of the one recorded
    and the epoch whose training steps hold ``global_step`` (a validation finding at the end of
    epoch ``e`` has the next epoch's first step: its recorded ``e`` stays).

    Example:
        >>> f = Finding.create("curve.diverging", "inf", check="T", global_step=12, epoch=1)
        >>> epoch_of_step(f, [(0, 0), (13, 1)]).epoch, epoch_of_step(f, [(0, 0)]).epoch
        (0, 0)
        >>> epoch_of_step(f, [(0, 0), (10, 1)]).epoch, epoch_of_step(f, []).epoch
        (1, 1)
    """
    if finding.global_step is None or finding.epoch is None:
        return finding
    held = [epoch for start, epoch in epoch_starts if start <= finding.global_step]
    if not held or max(held) >= finding.epoch:
        return finding
    return replace(finding, epoch=max(held))


def sort_findings(findings: Sequence[Finding]) -> list[Finding]:
    """Sort by protocol stage, then ``global_step`` (unknown steps last), then severity."""

    def key(f: Finding) -> tuple[int, float, int]:
        step = math.inf if f.global_step is None else f.global_step
        return stage_index(f.stage), step, SEVERITIES.index(f.severity)

    return sorted(findings, key=key)

