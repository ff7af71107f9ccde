"""What a finding code is: :class:`CodeSpec`, its severities and the remedy kinds."""


from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")
#: How a code's fix is verified on a copy of the run (docs/remedies.md): ``"lr_down"`` (every
#: param group's learning rate divided, the first replayed steps run again), ``"lr_up"`` (the
#: learning rate multiplied), ``"float32_replay"`` (the non-finite tracer's float32 replay of the
#: failing step is the verification), ``"causal"`` (the finding's own probe is already an
#: experiment on a copy: nothing to add), ``"none"`` (no mechanical remedy yet). The other
#: replayed ones: ``"lr_down_clip"`` (the learning rate divided *and* the gradients clipped at
#: the median norm the replay saw), ``"standardize_input"`` (the main input standardized per
#: channel with the recorded batches' statistics), ``"zero_grads"`` (the gradients zeroed before
#: every backward), ``"add_params"`` (the parameters no optimizer holds added to a param group),
#: ``"realign_labels"`` (the batch's labels moved by the offset the structure probe found).
#: The mode stage's, tried by the check at its probe: ``"eval_mode"`` (the validation path with
#: every layer in eval mode), ``"gate_dropout"`` (its dropout calls gated on the mode).
RemedyKind = Literal["lr_down", "lr_up", "lr_down_clip", "standardize_input", "zero_grads",
                     "add_params", "realign_labels", "eval_mode", "gate_dropout",
                     "float32_replay", "causal", "none"]
REMEDY_KINDS: tuple[RemedyKind, ...] = ("lr_down", "lr_up", "lr_down_clip", "standardize_input",
                                        "zero_grads", "add_params", "realign_labels",
                                        "eval_mode", "gate_dropout", "float32_replay", "causal",
                                        "none")


@dataclass(frozen=True)
class CodeSpec:
    """What the registry knows of a finding code: its stage, default severity, title, hint and
    when it fires. The registry is the one source of a code: the docs' code tables are generated
    from it (``docs/make_code_tables.py``)."""

    code: str
    severity: Severity
    title: str
    hint: str
    #: When the code fires, in one sentence for the docs (the thresholds are the rule's).
    when: str = ""
    #: How its fix is verified on a copy (:data:`RemedyKind`; docs/remedies.md).
    remedy: RemedyKind = "none"

    @property
    def stage(self) -> str:
        return self.code.split(".", 1)[0]


def spec(code: str, severity: Severity, title: str, hint: str, *, when: str = "",
          remedy: RemedyKind = "none") -> CodeSpec:
    return CodeSpec(code, severity, title, hint, when, remedy)


__all__ = ["REMEDY_KINDS", "SEVERITIES", "CodeSpec", "RemedyKind", "Severity", "spec"]
