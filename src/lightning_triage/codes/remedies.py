"""The registry's table of remedy kinds: every way a lead's fix is tried on a copy, declared once.

A code names its remedy in its ``spec(..., remedy=...)`` row (:class:`~lightning_triage.codes.spec.
CodeSpec`); this table says what each kind is (:class:`RemedySpec`): its family (who runs the trial
and how), what it changes in the report's words, how the replay applies it, the symptom the as-is
run must reproduce, and the margins of its decision. The trial (``callbacks/_remedy.py``,
``callbacks/_mode_remedy.py``), its decision (``functional/remedy.py``, ``functional/
remedy_plan.py``) and the report's remedy lines read it; none of them names a kind. The report
schema's ``remedy.kind`` enum is :data:`TRIED_KINDS` (checked by ``tests/functional/
test_remedy_table.py``). Pure Python, no torch: the report and the CLI read it.

Example:
    >>> REMEDIES["lr_down_clip"].family, REMEDIES["lr_down_clip"].lr, REMEDIES["lr_down_clip"].clip
    ('replay', 'down', True)
    >>> [k for k in REMEDY_KINDS if REMEDIES[k].direct]
    ['zero_grads', 'add_params', 'realign_labels']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

RemedyKind = Literal["lr_down", "lr_up", "lr_down_clip", "standardize_input", "zero_grads",
                     "add_params", "realign_labels", "eval_mode", "gate_dropout",
                     "float32_replay", "causal", "none"]
#: Who runs a kind's trial: ``"replay"`` (the report's trial: the fit's first recorded batches
#: replayed on a copy from its starting state, as they are and with the change), ``"eval"`` (the
#: mode stage's check, at its probe: the validation path on copies from two random states),
#: ``"float32"`` (the non-finite tracer's float32 replay of the failing step is the trial),
#: ``"causal"`` (the finding's own probe is already an experiment on a copy), ``"none"``.
RemedyFamily = Literal["replay", "eval", "float32", "causal", "none"]
#: Where a replayed kind reads its symptom: the as-is replay's losses, the recorded inputs'
#: scale, the gradients the as-is replay found left from earlier steps, the parameters no param
#: group holds, the recorded labels against the structure probe's offset.
SymptomSource = Literal["losses", "inputs", "stale_grads", "missing_params", "labels"]


@dataclass(frozen=True)
class RemedyThresholds:
    """The margins of a replayed remedy's decision (the curve classifier's where they mean the
    same thing).

    Attributes:
        low_progress: the as-is replay makes "no real progress" when its loss falls by less
            than this fraction of the starting loss (the curve classifier's ``low_progress``).
        rise_ratio: the as-is replay "rose" when a step's loss exceeds this multiple of the
            starting loss (the curve classifier's ``rise_ratio``).
        min_gain: a remedy works only if its final loss is below the as-is one by at least this
            fraction of the as-is loss...
        z: ...and by this many standard errors of the per-batch paired differences.
        factors: the learning-rate factors tried, in order (divided for ``lr_down``, multiplied
            for ``lr_up``); the first that works is reported.
    """

    low_progress: float = 0.1
    rise_ratio: float = 1.2
    min_gain: float = 0.02
    z: float = 3.0
    factors: tuple[float, ...] = (10.0, 100.0, 1000.0)


@dataclass(frozen=True)
class RemedySpec:
    """One remedy kind.

    Attributes:
        kind: its name (a code's ``CodeSpec.remedy``, the report's ``remedy.kind``).
        family: who runs its trial (:data:`RemedyFamily`).
        change: what it changes, in the report's words (before the numbers are known).
        symptom: the symptom the as-is run must show, in words (docs/remedies.md), or the trial
            is ``"inconclusive"``.
        short: the change in a few words, for the report's one-line summary of a mode-stage
            trial (empty: ``change``).
        label: the remedied replay's label (``tried``); learning-rate kinds label each factor.
        lr: ``"down"``/``"up"``: the replay divides/multiplies every param group's learning
            rate by each of the thresholds' ``factors`` in turn.
        clip: the replay also clips the gradients at the median norm of the as-is replay.
        transform: the replay changes every recorded batch: ``"standardize"`` (the main input
            per channel, with the recorded batches' statistics) or ``"realign"`` (the labels
            moved by the structure probe's offset; every loss is measured on them).
        zero_grads: the replay zeroes the gradients before every backward itself.
        add_missing: the replay adds the parameters no param group holds to a new group.
        symptom_from: where a replayed kind reads its symptom (:data:`SymptomSource`).
        direct: the symptom is the cause observed on the copy: a replay that does not end lower
            in the short window does not refute it (``"inconclusive"``, never ``"not
            confirmed"``).
        rises_because: why its short replay may end *higher* although the finding is real
            (said in the trial's reason).
        force_eval: the mode-stage remedy runs every layer in eval mode (forced at each layer's
            forward).
        gate_dropout: the mode-stage remedy gates the dropout calls on the mode.
        passes_in_eval: the mode-stage passes run the copy in eval mode (as the determinism
            probe did), not in the modes the check saw.
        buffers: the mode-stage symptom includes running statistics a pass updates.
        left_over: what a mode-stage remedy that does not cure the symptom leaves, in words.
        thresholds: the margins of a replayed kind's decision.
        placebo: a confirmation must also beat a placebo: the same batches replayed unchanged
            in another order must not pass the same margin (a factor-1 change needs no replay:
            the as-is replay is one, identical from the same state).
        cannot_cure: the codes whose finding, when it remains in the run, makes a confirmation
            of this kind partial: the change speeds the loss up around a cause it cannot
            remove (a part that never trains, a loss fed probabilities).
    """

    kind: RemedyKind
    family: RemedyFamily
    change: str = ""
    symptom: str = ""
    short: str = ""
    label: str = ""
    lr: Literal["down", "up"] | None = None
    clip: bool = False
    transform: Literal["standardize", "realign"] | None = None
    zero_grads: bool = False
    add_missing: bool = False
    symptom_from: SymptomSource = "losses"
    direct: bool = False
    rises_because: str | None = None
    force_eval: bool = False
    gate_dropout: bool = False
    passes_in_eval: bool = False
    buffers: bool = False
    left_over: str = ""
    thresholds: RemedyThresholds = field(default_factory=RemedyThresholds)
    placebo: bool = False
    cannot_cure: tuple[str, ...] = ()

    @property
    def tried(self) -> bool:
        """Whether a trial of this kind can put a ``remedy`` block on a finding."""
        return self.family in ("replay", "eval", "float32")


_BLOWS_UP = ("the as-is replay's loss goes non-finite, rises above `rise_ratio` x its start, or "
             "falls by less than `low_progress`")
#: What a learning-rate change cannot cure: parts of the model that never train, a loss fed
#: probabilities (the rest of the model learns faster around them).
_STRUCTURAL = ("wiring.unregistered_params", "wiring.frozen_at_init", "wiring.no_grad_params",
               "overfit.loss_on_probabilities")
_TABLE: tuple[RemedySpec, ...] = (
    RemedySpec("lr_down", "replay", "every param group's learning rate / 10",
               _BLOWS_UP,
               lr="down", placebo=True, cannot_cure=_STRUCTURAL),
    RemedySpec("lr_up", "replay", "every param group's learning rate x 10",
               "the as-is replay's loss stays finite and falls by less than `low_progress`",
               lr="up", placebo=True, cannot_cure=_STRUCTURAL),
    RemedySpec("lr_down_clip", "replay",
               "every param group's learning rate / 10 and the gradients clipped at the median "
               "norm of the as-is replay",
               _BLOWS_UP,
               lr="down", clip=True, placebo=True, cannot_cure=_STRUCTURAL),
    RemedySpec("standardize_input", "replay",
               "the main input standardized per channel with the recorded batches' statistics",
               "the recorded inputs are far from standardized (the data stage's scale rules)",
               label="standardized", transform="standardize", symptom_from="inputs",
               placebo=True),
    RemedySpec("zero_grads", "replay", "the gradients zeroed before every backward",
               "the as-is replay finds gradients of earlier steps at a backward",
               label="zeroed", zero_grads=True, symptom_from="stale_grads", direct=True,
               rises_because="higher, as expected over a short replay: gradients never zeroed "
                             "add up like momentum without decay, so the first steps run faster "
                             "as is; the harm, an unstable curve, comes later"),
    RemedySpec("add_params", "replay",
               "the parameters no optimizer holds added to a param group (the first group's "
               "hyperparameters)",
               "trainable parameters of the copy are in no param group of its optimizer",
               label="added", add_missing=True, symptom_from="missing_params", direct=True),
    RemedySpec("realign_labels", "replay",
               "the batch's labels moved by the offset the structure probe found",
               "the recorded batches' labels match the inputs at the probe's offset",
               label="realigned", transform="realign", symptom_from="labels", direct=True),
    RemedySpec("eval_mode", "eval",
               "the validation path run with every layer in eval mode (forced at each layer's "
               "forward, whatever `.train()` the hooks call)",
               "the validation outputs differ between two random states, or a pass updates "
               "running statistics",
               short="every layer in eval mode", label="eval mode", force_eval=True,
               buffers=True,
               left_over="a source of randomness besides the layers left in training mode"),
    RemedySpec("gate_dropout", "eval",
               "the validation path run with its dropout calls gated on the mode (`F.dropout*` "
               "as in eval mode, `scaled_dot_product_attention` with `dropout_p=0`)",
               "the validation outputs in eval mode differ between two random states",
               short="the dropout calls gated on the mode", label="dropout gated",
               gate_dropout=True, passes_in_eval=True,
               left_over="randomness that is not a dropout call (noise drawn with "
                         "`torch.rand*`/`randn*`, sampling)"),
    RemedySpec("float32_replay", "float32",
               "the failing step replayed in float32 (the non-finite tracer's replay)",
               "the failing step is non-finite in the run's precision"),
    RemedySpec("causal", "causal"),
    RemedySpec("none", "none"),
)
#: Every remedy kind, by name (the table's one source).
REMEDIES: dict[str, RemedySpec] = {s.kind: s for s in _TABLE}
#: The kinds, in the table's order (``CodeSpec.remedy`` must be one).
REMEDY_KINDS: tuple[RemedyKind, ...] = tuple(s.kind for s in _TABLE)
#: The kinds a trial can put in a finding's ``remedy`` block (the report schema's enum).
TRIED_KINDS: tuple[RemedyKind, ...] = tuple(s.kind for s in _TABLE if s.tried)


def remedy_spec(kind: object) -> RemedySpec:
    """The table's row of ``kind`` (an unknown kind, e.g. from a newer report: ``"none"``'s)."""
    return REMEDIES.get(str(kind), REMEDIES["none"])


__all__ = ["REMEDIES", "REMEDY_KINDS", "TRIED_KINDS", "RemedyFamily", "RemedyKind", "RemedySpec",
           "RemedyThresholds", "SymptomSource", "remedy_spec"]
