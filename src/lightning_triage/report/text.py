"""The phrases every output of the report shares: the remedy line under the lead, the hint
with the factor its trial measured, the baselines line, the run-id marker each file carries, and
report text made safe for a terminal (:func:`plain`).

The console (:mod:`~lightning_triage.report.console`), the Markdown
(:mod:`~lightning_triage.report.markdown`) and the HTML (:mod:`~lightning_triage.report.html`)
read these, so that the three say the same thing.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any

from lightning_triage.codes.remedies import REMEDIES, remedy_spec
from lightning_triage.findings import CODES
from lightning_triage.report.safe import describe, terminal_text


# ---------------------------------------------------------------------------- remedy
def _loss_text(entry: Any) -> str:
    if not isinstance(entry, dict):
        return "?"
    if entry.get("finite") is False or entry.get("loss") is None:
        at = entry.get("nonfinite_at_step")
        return "non-finite" + ("" if at is None else f" (step {at})")
    return f"{float(entry['loss']):.4g}"


def _outputs_text(entry: dict[str, Any]) -> str:
    if entry.get("deterministic"):
        return "identical"
    diff = entry.get("difference")
    return (f"differ (largest difference {diff:.3g} of the output's magnitude)"
            if isinstance(diff, (int, float)) else "differ")


def _eval_trial_text(remedy: dict[str, Any], before: dict[str, Any],
                     after: dict[str, Any]) -> str:
    """A mode-stage trial (two validation passes from two random states, each way)."""
    text = (f"{remedy_spec(remedy.get('kind')).short or remedy.get('change', '')}, "
            f"validation outputs from two random states {_outputs_text(before)} -> "
            f"{_outputs_text(after)}")
    if before.get("buffers_changed"):
        text += (f", running statistics updated ({before['buffers_changed']}) -> "
                 f"{after.get('buffers_changed') or 'none'}")
    if isinstance(before.get("loss"), (int, float)) and isinstance(after.get("loss"), (int, float)):
        text += f", validation loss {before['loss']:.4g} -> {after['loss']:.4g}"
    return text


def remedy_line(code: str, remedy: dict[str, Any] | None) -> str | None:
    """One line on the remedy trial of a finding, for the console, the Markdown and the HTML
    (``None``: nothing to say). Codes whose evidence is causal say so without a trial.

    Example:
        >>> remedy_line("curve.lr_too_high", {"kind": "lr_down", "verdict": "confirmed",
        ...     "change": "every param group's learning rate / 10 (lr 0.1 -> 0.01)",
        ...     "before": {"lr": 0.1, "loss": 4.1, "finite": True, "steps": 30},
        ...     "after": {"lr": 0.01, "loss": 0.62, "finite": True, "steps": 30}, "reason": ""})
        ... # doctest: +NORMALIZE_WHITESPACE
        "confirmed on a copy: lr 0.1 -> 0.01, loss after replaying the fit's first 30 steps from
        its start: 4.1 -> 0.62"
        >>> remedy_line("mode.nondeterministic_eval", {"kind": "gate_dropout",
        ...     "verdict": "confirmed", "change": "...", "reason": "",
        ...     "before": {"deterministic": False, "difference": 0.7, "loss": 2.47},
        ...     "after": {"deterministic": True, "difference": 0.0, "loss": 2.41}})[58:]
        ... # doctest: +NORMALIZE_WHITESPACE
        "validation outputs from two random states differ (largest difference 0.7 of the
        output's magnitude) -> identical, validation loss 2.47 -> 2.41"
        >>> remedy_line("structure.causal_leak", None)[:55]
        'no remedy trial needed: the evidence is already causal '
    """
    if remedy is None:
        spec = CODES.get(code)
        if spec is not None and REMEDIES[spec.remedy].family == "causal":
            return ("no remedy trial needed: the evidence is already causal (a probe on a copy "
                    "changed one input and watched the outputs)")
        return None
    verdict = remedy.get("verdict")
    if verdict == "skipped":
        return f"remedy not tried: {remedy.get('reason', '')}"
    before, after = remedy.get("before") or {}, remedy.get("after") or {}
    replayed = (f"replaying the fit's first {before['steps']} steps from its start"
                if isinstance(before.get("steps"), int) else "")
    if verdict == "inconclusive":
        where = f" ({replayed})" if replayed and "deterministic" not in before else ""
        return f"remedy inconclusive on a copy{where}: {remedy.get('reason', '')}"
    if remedy_spec(remedy.get("kind")).family == "float32":
        return f"{verdict} on a copy: the failing step is finite when replayed in float32"
    if "deterministic" in before:
        return f"{verdict} on a copy: " + _eval_trial_text(remedy, before, after)
    text = f"{verdict} on a copy: "
    if isinstance(before.get("lr"), (int, float)) and isinstance(after.get("lr"), (int, float)) \
            and before["lr"] != after["lr"]:
        text += f"lr {before['lr']:.3g} -> {after['lr']:.3g}, "
        if isinstance(after.get("clip"), (int, float)):
            text += f"gradients clipped at norm {after['clip']:.3g}, "
    else:
        text += f"{remedy.get('change', '')}, "
    text += (f"loss after {replayed or 'the replay'}: {_loss_text(before)} -> {_loss_text(after)}")
    if verdict == "not confirmed":
        tried = remedy.get("tried") or []
        if tried:
            text += f" (tried {', '.join(str(t) for t in tried)})"
        nxt = remedy.get("next_candidate")
        text += (f"; next candidate: `{nxt}`" if nxt else
                 "; no other candidate in this report")
    return text


_HINT_FACTOR = re.compile(r" \((?:\d+-)?\d+x\)| by (?:\d+-)?\d+x")


def trial_hint(lead: Mapping[str, Any]) -> str:
    """A finding's hint as the report shows it: where its learning-rate remedy was confirmed on
    a copy, the factor the trial measured replaces the registry's generic one, so that the hint
    and the remedy line agree.

    Example:
        >>> trial_hint({"hint": "Lower the learning rate (3-10x), add warmup.", "remedy": {
        ...     "verdict": "confirmed", "before": {"lr": 50.0}, "after": {"lr": 0.5}}})
        'Lower the learning rate (100x: lr 50 -> 0.5 worked on a copy), add warmup.'
        >>> trial_hint({"hint": "Raise the learning rate by 10x.", "remedy": None})
        'Raise the learning rate by 10x.'
    """
    hint = str(lead.get("hint", ""))
    remedy = lead.get("remedy")
    if not isinstance(remedy, Mapping) or remedy.get("verdict") != "confirmed":
        return hint
    given = [(remedy.get(side) or {}).get("lr") for side in ("before", "after")]
    lrs = [float(v) for v in given if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(lrs) != 2 or not all(math.isfinite(v) and v > 0 for v in lrs) or lrs[0] == lrs[1]:
        return hint
    old, new = lrs
    factor = max(old, new) / min(old, new)
    times = f"{round(factor):,}x" if abs(factor - round(factor)) < 1e-3 * factor else f"{factor:.3g}x"
    measured = f"{times}: lr {old:.3g} -> {new:.3g} worked on a copy"
    shown, n = _HINT_FACTOR.subn(f" ({measured})", hint, count=1)
    return shown if n else f"{hint} (Measured on a copy: lr {old:.3g} -> {new:.3g}.)"


def lead_trial(report: Mapping[str, Any], lead: Mapping[str, Any]) -> str | None:
    """The remedy line shown under the report's lead: its own trial (:func:`remedy_line`), or,
    for a lead that became the lead because another finding's remedy was not confirmed on a
    copy (it names the lead as its next candidate), that trial with the finding's code.

    Example:
        >>> low = {"code": "curve.lr_too_low", "remedy": {"kind": "lr_up", "verdict":
        ...        "not confirmed", "change": "lr x 10", "next_candidate": "overfit.loss_floor",
        ...        "before": {"steps": 30, "loss": 2.31}, "after": {"steps": 30, "loss": 2.28},
        ...        "tried": ["x10"]}}
        >>> floor = {"code": "overfit.loss_floor"}
        >>> lead_trial({"findings": [floor, low]}, floor)[:61]
        'on `curve.lr_too_low`: not confirmed on a copy: lr x 10, loss'
    """
    own = remedy_line(lead["code"], lead.get("remedy"))
    if own is not None:
        return own
    for f in report.get("findings", []):
        remedy = f.get("remedy")
        if isinstance(remedy, Mapping) and remedy.get("verdict") == "not confirmed" \
                and remedy.get("next_candidate") == lead["code"]:
            line = remedy_line(f["code"], dict(remedy))
            return None if line is None else f"on `{f['code']}`: {line}"
    return None


def plain(text: Any, limit: int = 200) -> str:
    """Report text for a terminal: control characters (escape sequences, newlines) and invisible
    format characters (bidi overrides, zero-width characters) replaced by a space, cut to
    ``limit`` characters. Print it as :class:`rich.text.Text` (no markup). Never raises."""
    text = describe(text) if not isinstance(text, str) else text
    more = len(text) - limit
    text = terminal_text(text[:limit])
    return text + (f"… ({more} more characters in the files)" if more > 0 else "")


def lead_finding(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """The finding the report's ``start_here`` names, or ``None``."""
    first = report.get("start_here")
    return next((f for f in report.get("findings", []) if f["code"] == first), None) \
        if first else None


def baseline_line(report: Mapping[str, Any]) -> str | None:
    """The simple baselines beside the model's validation metric, in one line (``None`` when
    the report has none: ``details.baselines``, written by ``BaselineCheck``).

    Example:
        >>> details = {"baselines": {"values": {
        ...     "task": "classification", "metric": "accuracy", "val_examples": 256,
        ...     "scores": {"majority": 0.1, "nearest_centroid": 0.87, "linear": 0.88}},
        ...     "model": {"step": 180, "value": 0.92}}}
        >>> print(baseline_line({"details": details}))  # doctest: +NORMALIZE_WHITESPACE
        baselines (accuracy on 256 validation examples): majority 0.1, nearest-centroid 0.87,
        linear 0.88; model 0.92 at step 180
    """
    info = (report.get("details") or {}).get("baselines")
    if not isinstance(info, Mapping) or not isinstance(info.get("values"), Mapping):
        return None
    values = info["values"]
    scores = values.get("scores") or {}
    shown = ", ".join(f"{str(k).replace('_', '-')} {_number(v)}" for k, v in scores.items())
    line = (f"baselines ({values.get('metric', '?')} on {values.get('val_examples', '?')} "
            f"validation examples): {shown}")
    model = info.get("model")
    if isinstance(model, Mapping):
        line += f"; model {_number(model.get('value'))} at step {model.get('step')}"
    return line


def _number(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else str(value)


# ---------------------------------------------------------------------------- run id
_SAFE_ID = re.compile(r"[0-9A-Za-z_-]{1,64}\Z")


def marker_id(run_id: str) -> str:
    """``run_id`` as the files carry it: as it is when it is 1-64 characters of
    ``[0-9A-Za-z_-]``, else ``sha256-`` and 40 hex digits of its SHA-256 (a custom id with any
    other character still ties the files of one write together).

    Example:
        >>> marker_id("3f2a"), marker_id("my run/1")[:14]
        ('3f2a', 'sha256-7e01178')
    """
    if _SAFE_ID.match(run_id):
        return run_id
    digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"sha256-{digest[:40]}"


def run_id_marker(run_id: str, fmt: str) -> str:
    """The line that carries ``run_id`` (:func:`marker_id`) in a Markdown (``fmt="md"``) or
    HTML file."""
    shown = marker_id(run_id)
    if fmt == "md":
        return f"<!-- lightning-triage-run-id: {shown} -->"
    return f'<meta name="lightning-triage-run-id" content="{shown}">'
