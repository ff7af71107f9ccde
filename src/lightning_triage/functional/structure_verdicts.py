"""The structure stage's rules: from what the structure and padding probes measured to
:class:`~lightning_triage.functional.verdict.Verdict` s with their messages and evidence.

The probes (:mod:`lightning_triage.callbacks.structure_probe`,
:mod:`lightning_triage.callbacks.padding_probe`) run the user's code and measure; these
functions decide and word the findings ``structure.shape_mismatch``, ``structure.target_leak``,
``structure.batch_mixing``, ``structure.causal_leak``, ``structure.padding_leak`` and
``structure.probe_skipped``. Every verdict refers to step 0 (the probes run on the first batch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any

from torch import Tensor, nn

from lightning_triage.functional.padding import PaddingMask
from lightning_triage.functional.padding_probe import PaddingLeak
from lightning_triage.functional.structure import (
    BatchDependence,
    CausalDependence,
    OutputChange,
    broadcast_mismatch,
    example_dependence,
    is_next_token,
    labels_are_inputs,
    pairwise_output,
    parse_size_warning,
    target_shift,
)
from lightning_triage.functional.verdict import Verdict

#: Future positions named in a causal-leak message (the evidence lists them all).
SHOWN_POSITIONS = 8


def probe_skipped(why: str, what: str, part: str = "") -> Verdict:
    """``structure.probe_skipped``: the structure probe (or one ``part`` of it) did not run.

    Example:
        >>> probe_skipped("no input tensor found in the batch", "Pass `input_key=`.").message
        'The structure probe did not run: no input tensor found in the batch. Pass `input_key=`.'
    """
    return Verdict("structure.probe_skipped", 0,
                   f"The {part or 'structure probe'} did not run: {why}. {what}",
                   evidence={"reason": why, "part": part or "all"})


def framework_broadcasts(warned: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """The framework's warnings (``(message, category name)``) that report a loss broadcasting
    predictions against targets of another shape.

    Example:
        >>> w = ("Using a target size (torch.Size([4, 1])) that is different to the input size "
        ...      "(torch.Size([4])).", "UserWarning")
        >>> [(d["input_shape"], d["target_shape"]) for d in framework_broadcasts([w])]
        [([4], [4, 1])]
    """
    found: list[dict[str, Any]] = []
    for message, category in warned:
        parsed = parse_size_warning(message)
        if parsed is not None and broadcast_mismatch(*parsed) is not None:
            found.append({"message": message, "input_shape": parsed[0],
                          "target_shape": parsed[1], "category": category})
    return found


def shape_mismatch(events: list[dict[str, Any]], framework: list[dict[str, Any]],
                   head_name: str | None) -> Verdict | None:
    """``structure.shape_mismatch`` from the broadcasting operations between predictions and
    targets (``events``, as :class:`~lightning_triage.functional.structure.BroadcastEvent`
    dicts) and the framework's warnings; ``None`` when there is neither."""
    if not events and not framework:
        return None
    first: dict[str, Any] = events[0] if events else {
        "op": "loss", "prediction_shape": framework[0]["input_shape"],
        "target_shape": framework[0]["target_shape"],
        "result_shape": broadcast_mismatch(framework[0]["input_shape"],
                                           framework[0]["target_shape"])}
    pred, tgt, res = first["prediction_shape"], first["target_shape"], first["result_shape"]
    return Verdict(
        "structure.shape_mismatch", 0,
        f"`{first['op']}` combines predictions of shape {tuple(pred)} with targets of shape "
        f"{tuple(tgt)}, which broadcast silently to {tuple(res)}: every prediction is compared "
        f"with every target.",
        evidence={"prediction_shape": pred, "target_shape": tgt, "broadcast_shape": res,
                  "op": first["op"], "operations": events, "framework_warnings": framework,
                  "head_module": head_name},
    )


def target_leak(head_label: str, head_name: str | None, layer: str | None,
                change: OutputChange, redrawn: str, start: int | None,
                target_shape: list[int]) -> Verdict:
    """``structure.target_leak``: the head output (``head_label`` in the message) changed when
    only the targets changed (``redrawn`` says how), with ``start`` the first target position
    redrawn for sequence targets (only the first output position was compared)."""
    where = ("at the first output position, which teacher forcing only feeds the tokens "
             f"before target position {start}" if start is not None else "")
    return Verdict(
        "structure.target_leak", 0,
        f"The output of `{head_label}` changed when only the targets "
        f"changed ({redrawn}, inputs unchanged){' ' + where if where else ''}: max |diff| "
        f"{change.max_abs_diff:.4g} ({change.relative_diff:.3g} of its scale), "
        f"{100 * change.fraction_changed:.0f}% of the compared values changed.",
        layer=layer,
        evidence={"module": head_name, "compared": change.compared,
                  "max_abs_diff": change.max_abs_diff, "relative_diff": change.relative_diff,
                  "fraction_changed": change.fraction_changed, "replacement": redrawn,
                  "output_shape": change.shape_before, "output_shape_after": change.shape_after,
                  "target_shape": target_shape},
    )


def where_sentence(first: str | None, what: str, after_model: bool, root: str) -> str:
    """The sentence of a message that says where a problem first shows: ``first`` is the first
    module whose output shows it (``""``: the root's own ``forward``, ``root`` its class;
    ``None``: none found, after the model when ``after_model``).

    Example:
        >>> where_sentence("enc.norm", "mixes examples", False, "Net")
        ' The first module whose output mixes examples is `enc.norm`.'
    """
    if first:
        return f" The first module whose output {what} is `{first}`."
    if first == "":
        return (f" No submodule's output {what}: it happens in "
                f"`{root}.forward` itself, after its last submodule.")
    if after_model:
        return (f" No module's output {what}: it happens in `training_step` code after the "
                "model.")
    return ""


def time_major_rnn(model: nn.Module, first: str | None) -> tuple[str, str] | None:
    """The recurrent layer (``nn.RNN``/``nn.LSTM``/``nn.GRU``) built without
    ``batch_first=True`` that mixes the batch: ``first`` (the first module whose output mixes
    examples) when it is one, else, when no module was named, the model's only such layer:
    ``(name, type)``, or ``None``.

    Example:
        >>> net = nn.Sequential(nn.LSTM(4, 8))
        >>> time_major_rnn(net, "0"), time_major_rnn(nn.Sequential(nn.GRU(4, 8, batch_first=True)), None)
        (('0', 'LSTM'), None)
    """
    modules = dict(model.named_modules())
    if first is not None:
        sub = modules.get(first)
        candidates = [(first, sub)] if sub is not None else []
    else:
        candidates = list(modules.items())
    found = [(name, type(sub).__name__) for name, sub in candidates
             if isinstance(sub, nn.RNNBase) and not sub.batch_first]
    return found[0] if len(found) == 1 else None


def batch_mixing(label: str, layer: str | None, first: str | None, where: str,
                 mix: BatchDependence, probe_input: str, batch_size: int,
                 time_major: tuple[str, str] | None = None) -> Verdict:
    """``structure.batch_mixing``: ``label`` (an output) for example ``mix.example`` depends on
    the inputs of other examples; ``where`` is :func:`where_sentence` for ``first``;
    ``time_major`` the recurrent layer built without ``batch_first=True`` that mixes them
    (:func:`time_major_rnn`), named with the argument."""
    rnn = ""
    evidence: dict[str, Any] = {}
    if time_major is not None:
        name, kind = time_major
        rnn = (f" `{name}` is an `nn.{kind}` built without `batch_first=True`: it reads dim 0 "
               f"of its input as time, so fed batch-first `(N, T, ...)` tensors it runs over the "
               f"batch as a sequence (example i sees examples 0..i-1) whatever is read from it "
               f"afterwards; pass `batch_first=True` (or feed `(T, N, ...)`).")
        evidence = {"rnn": name, "argument": "batch_first"}
        layer = name
    return Verdict(
        "structure.batch_mixing", 0,
        f"In eval mode {label} for example {mix.example} depends on the inputs of other "
        f"examples: gradient norm {mix.other_grad_norm:.3g} reaches them (largest: example "
        f"{mix.worst_example}) vs {mix.own_grad_norm:.3g} for its own input.{where}{rnn}",
        layer=layer,
        evidence={"output": label, "first_module": first, "example": mix.example,
                  "own_grad_norm": mix.own_grad_norm,
                  "other_grad_norm": mix.other_grad_norm, "ratio": mix.ratio,
                  "worst_example": mix.worst_example, "probe_input": probe_input,
                  "batch_size": batch_size, **evidence},
    )


def coupled_by_design(judged: str, *, pairs: Sequence[Sequence[int]] = (),
                      statistics: Sequence[str] = (), score_matrix: str | None = None,
                      batch_size: int = 0) -> Verdict:
    """``structure.batch_mixing`` at info: the objective couples the batch's examples on purpose
    (``pairs``: the shapes of in-batch similarity matrices; ``statistics``: reductions over the
    batch; ``score_matrix``: an output that is an example-by-example score matrix), while
    ``judged`` (the per-example output the probe differentiated) is independent per example.

    Example:
        >>> v = coupled_by_design("the output of `image`", pairs=[(16, 16)], batch_size=16)
        >>> v.severity, v.evidence["in_batch_pairs"]
        ('info', [[16, 16]])
        >>> print(v.message)  # doctest: +NORMALIZE_WHITESPACE
        The objective couples the batch's examples on purpose: a (16, 16) matrix of scores
        between the batch's examples (in-batch negatives). In eval mode the output of `image`
        does not mix examples: coupled by design (as CLIP's InfoNCE, SimCLR's NT-Xent, VICReg or
        Barlow Twins), not batch mixing.
    """
    what = [f"{score_matrix} is an example-by-example score matrix"] if score_matrix else []
    what += [f"a ({a}, {b}) matrix of scores between the batch's examples (in-batch negatives)"
             for a, b in list(dict.fromkeys(tuple(p) for p in pairs))[:2]]
    stats = list(dict.fromkeys(statistics))[:4]
    if stats:
        what.append("statistics over the batch (" + ", ".join(f"`{s}`" for s in stats) + ")")
    return Verdict(
        "structure.batch_mixing", 0,
        f"The objective couples the batch's examples on purpose: {'; '.join(what)}. In eval mode "
        f"{judged} does not mix examples: coupled by design (as CLIP's InfoNCE, SimCLR's "
        "NT-Xent, VICReg or Barlow Twins), not batch mixing.",
        evidence={"by_design": True, "output": judged, "score_matrix": score_matrix,
                  "in_batch_pairs": [list(p) for p in dict.fromkeys(tuple(p) for p in pairs)],
                  "batch_statistics": stats, "batch_size": batch_size},
        severity="info",
    )


def causal_leak(head_label: str, layer: str | None, first: str | None, where: str,
                dep: CausalDependence, reason: str, probe_input: str, length: int,
                positions: list[int]) -> Verdict:
    """``structure.causal_leak``: output position ``dep.position`` of the head depends on later
    input positions; ``reason`` says why causality was checked."""
    shown = dep.future_positions[:SHOWN_POSITIONS]
    more = "..." if len(dep.future_positions) > SHOWN_POSITIONS else ""
    return Verdict(
        "structure.causal_leak", 0,
        f"Output position {dep.position} of `{head_label}` depends on "
        f"later input positions {shown}{more} ({100 * dep.ratio:.1f}% of its input "
        f"gradient norm comes from the future); checked because of {reason}.{where}",
        layer=layer,
        evidence={"position": dep.position, "future_positions": dep.future_positions,
                  "first_module": first,
                  "future_grad_norm": dep.future_grad_norm,
                  "past_grad_norm": dep.past_grad_norm, "future_share": dep.ratio,
                  "reason": reason, "probe_input": probe_input,
                  "sequence_length": length,
                  "positions_probed": positions},
    )


def causal_reason(causal: bool | None, inputs: Tensor, targets: Tensor | None,
                  ignore_index: int, loss_targets: Sequence[Tensor] = ()) -> str | None:
    """Why the causal probe runs: ``causal=True``, or (``causal=None``) next-token data: the
    targets are the inputs shifted by one, or the targets are the inputs (``labels =
    input_ids``) and a loss was given them shifted by one (``loss_targets``, as
    :class:`~lightning_triage.functional.structure.LossWatch` saw them: the model shifts
    inside); ``None``: it does not.

    Example:
        >>> import torch
        >>> x = torch.tensor([[1, 2, 3, 4]])
        >>> causal_reason(None, x, torch.tensor([[2, 3, 4, 5]]), -100)[:49]
        'next-token data: targets[:, :-1] == inputs[:, 1:]'
        >>> causal_reason(False, x, torch.tensor([[2, 3, 4, 5]]), -100) is None
        True
    """
    if causal is True:
        return "`causal=True`"
    if causal is None and targets is not None and is_next_token(inputs, targets, ignore_index):
        return (f"next-token data: targets[:, :-1] == inputs[:, 1:] on the probed batch "
                f"({targets.shape[0]} sequences of {targets.shape[1]} tokens), so the model must "
                "be causal")
    if causal is None and labels_are_inputs(inputs, targets, ignore_index) and any(
            target_shift(inputs, t, ignore_index) == 1 for t in loss_targets):
        assert targets is not None
        return (f"next-token data: the targets are the inputs (`labels = input_ids`, "
                f"{targets.shape[0]} sequences of {targets.shape[1]} tokens) and the loss "
                "compares each position with the next token, so the model must be causal")
    return None


# ---------------------------------------------------------------------- label alignment
def label_misaligned(shift: int, fn_name: str, *, user_shifted: bool, model: str,
                     sequences: int, length: int, causal_model: bool = False,
                     labels: Mapping[str, Any] | None = None) -> Verdict | None:
    """``structure.label_misaligned`` from the offset ``shift`` between the targets a loss
    function (``fn_name``) was given and the inputs, as a probe pass saw them: ``2`` (every
    position scored against the token two ahead: labels shifted by the user, then again by the
    model, as transformers' causal LMs shift ``labels`` inside), or ``0`` for a ``causal_model``
    (each position scored against its own token, which it sees: the shift is missing);
    ``None`` otherwise (``1`` is next-token prediction; ``0`` for a bidirectional model is a
    reconstruction). The evidence carries ``label_offset = shift - 1``, the positions the
    batch's labels must move later to be next-token labels (the realignment remedy's), and
    ``labels``: where they are (``label_entry``, ``input_entry``, ``labels_lead_by``,
    ``ignore_index``).

    Example:
        >>> v = label_misaligned(2, "cross_entropy", user_shifted=True, model="GPT2LMHeadModel",
        ...                      sequences=8, length=16)
        >>> v.code, v.evidence["loss_offset"], v.evidence["label_offset"]
        ('structure.label_misaligned', 2, 1)
        >>> label_misaligned(1, "cross_entropy", user_shifted=True, model="M", sequences=8,
        ...                  length=16) is None
        True
    """
    if shift == 2:
        who = ("`labels` were already shifted by one (labels[:, t] == input_ids[:, t + 1]) and "
               f"`{model}` shifts them again inside its loss" if user_shifted else
               "the targets are shifted twice before the loss")
        what = (f"the loss (`{fn_name}`) scores each position against the token two positions "
                f"ahead: {who}. Every position is trained to predict two tokens ahead, and "
                "validation measures the same wrong task")
    elif shift == 0 and causal_model:
        what = (f"the loss (`{fn_name}`) scores each position against its own input token "
                f"(`labels = input_ids`, not shifted), and `{model}` is causal: each position "
                "sees the token it must predict, so the model learns to copy, not to predict "
                "the next token")
    else:
        return None
    return Verdict(
        "structure.label_misaligned", 0,
        f"On {sequences} sequence(s) of {length} tokens, {what}.",
        evidence={"loss_offset": shift, "label_offset": shift - 1,
                  "labels_shifted_by_user": user_shifted, **(labels or {}),
                  "loss_function": fn_name, "model": model, "causal_model": causal_model,
                  "sequences": sequences, "length": length},
    )


# ---------------------------------------------------------------------- padding
def padding_skipped(message: str, why: str, **evidence: Any) -> Verdict:
    """``structure.probe_skipped`` for the padding probe (``message`` is the whole sentence)."""
    return Verdict("structure.probe_skipped", 0, message,
                   evidence={"reason": why, "part": "padding probe", **evidence})


def padding_unfinished(why: str) -> Verdict:
    """The padding probe stopped on an error (``why``)."""
    return padding_skipped(f"The padding probe did not run to the end: {why}. Pass "
                           "`forward_fn=` or `padding_mask_key=`.", why)


def padding_unaligned(why: str) -> Verdict:
    """The padding probe found no head output it could compare (``why``)."""
    return padding_skipped(f"The padding probe could not compare outputs: {why}. Pass "
                           "`forward_fn=` returning the model's per-position or pooled output.",
                           why)


def padding_nondeterministic(noise: float) -> tuple[str, Verdict]:
    """``(why, verdict)``: the same batch twice gave outputs ``noise`` apart (relative)."""
    why = (f"the model gave different outputs for the same batch twice in eval mode "
           f"(relative difference {noise:.3g}) with every RNG reset")
    return why, padding_skipped(f"The padding probe did not run: {why}; a perturbation could "
                                "not be told from the noise.", why, noise=noise)


def padding_leak(head_label: str, first_label: str, head: str, mask: PaddingMask,
                 leaks: list[PaddingLeak], noise: float, batch_shape: list[int]) -> Verdict:
    """``structure.padding_leak``: the head output (``head_label``) moved at the real positions
    (or pooled) when only the padding changed (``leaks``, one per perturbation)."""
    parts = []
    for leak in leaks:
        what = {"content": "other token ids at the padded positions",
                "amount": "more padded positions"}.get(leak.perturbation, "fewer padded positions")
        where = "at the real positions" if leak.change.compared == "positions" else "(pooled)"
        parts.append(f"{what} moved it {where} by up to {leak.change.max_abs_diff:.3g} "
                     f"({100 * leak.change.relative_diff:.3g}% of its largest value)")
    first = next((leak.first_module for leak in leaks if leak.first_module is not None), None)
    where_msg = (f" The first module whose output at the real positions moved is `{first_label}`."
                 if first else "")
    return Verdict(
        "structure.padding_leak", 0,
        f"The output of `{head_label}` depends on the padding "
        f"(mask {mask.source}): {'; '.join(parts)}.{where_msg}",
        layer=first or None,
        evidence={"mask": mask.source, "side": mask.side, "first_module": first,
                  "head": head,
                  "perturbations": [
                      {"perturbation": leak.perturbation, "compared": leak.change.compared,
                       "max_abs_diff": leak.change.max_abs_diff,
                       "relative_diff": leak.change.relative_diff,
                       "first_module": leak.first_module} for leak in leaks],
                  "noise": noise, "batch_shape": batch_shape,
                  "padded_positions": int(mask.pad.sum())},
    )


# ---------------------------------------------------------------------- the probe's result
_SCORE_MATRIX = " is an example-by-example score matrix (in-batch pairs by design)"


class Outcome(str, Enum):
    """How one part of the structure probe ended."""

    OK = "ok"
    LEAK = "leak"
    MIXING = "mixing"
    MISMATCH = "mismatch"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class PartResult:
    """One part of the structure probe (the shape check, the target-leak, batch-mixing or causal
    probe): its outcome and what qualifies it.

    Attributes:
        outcome: how it ended.
        why: for :attr:`Outcome.SKIPPED`, why it could not run.
        reason: why the part ran at all (the causal probe: ``"causal=True"``, next-token data).
        score_matrix: for batch mixing judged ``ok``: the output (in words) that is an
            example-by-example score matrix, mixing examples by design.

    Example:
        >>> str(PartResult(Outcome.SKIPPED, why="a single example"))
        'skipped: a single example'
        >>> PartResult.parse("leak (causal=True)") == PartResult(Outcome.LEAK, reason="causal=True")
        True
    """

    outcome: Outcome
    why: str = ""
    reason: str = ""
    score_matrix: str | None = None

    def __str__(self) -> str:
        if self.outcome is Outcome.SKIPPED:
            return f"skipped: {self.why}"
        text = self.outcome.value + (f" ({self.reason})" if self.reason else "")
        return text + (f": {self.score_matrix}{_SCORE_MATRIX}" if self.score_matrix is not None
                       else "")

    @classmethod
    def parse(cls, text: str) -> PartResult:
        """The part as :meth:`__str__` wrote it (a checkpoint's state)."""
        if text.startswith("skipped: "):
            return cls(Outcome.SKIPPED, why=text.removeprefix("skipped: "))
        if text.startswith("ok: ") and text.endswith(_SCORE_MATRIX):
            return cls(Outcome.OK, score_matrix=text[4:-len(_SCORE_MATRIX)])
        word, _, rest = text.partition(" (")
        return cls(Outcome(word), reason=rest[:-1] if rest.endswith(")") else "")


def skipped(why: str) -> PartResult:
    """A part that could not run, and why."""
    return PartResult(Outcome.SKIPPED, why=why)


#: the parts of the probe, in the order they run (and are summed up in the check's detail)
PARTS = ("shape", "target_leak", "batch_mixing", "causal")


@dataclass
class StructureProbeResult:
    """What the structure probe ran and found (``StructureProbe.result``).

    Attributes:
        shape: the shape check of the first pass.
        target_leak: the target-leak probe (pass 2).
        batch_mixing: the batch-mixing probe (pass 3).
        causal: the causal probe (pass 3), when causality was probed.
        labels: the label alignment seen (``"loss offset 2"``), when it was judged.
        head: the head output found: ``(module name, shape)``.
        probe_input: what was made an autograd leaf for the gradient probes.
        isolation: how the model was isolated (``"copy"`` or a snapshot's description).
        forward_passes: the forward passes run.
        user_code_calls: the calls of the user's code.
        skipped: why the whole probe was skipped.
        seconds: what the probe cost.

    Example:
        >>> result = StructureProbeResult(shape=PartResult(Outcome.OK))
        >>> result.batch_mixing = skipped("a single example")
        >>> result.as_dict()
        {'shape': 'ok', 'batch_mixing': 'skipped: a single example'}
        >>> StructureProbeResult.from_dict(result.as_dict()) == result
        True
    """

    shape: PartResult | None = None
    target_leak: PartResult | None = None
    batch_mixing: PartResult | None = None
    causal: PartResult | None = None
    labels: str | None = None
    head: tuple[str | None, list[int]] | None = None
    probe_input: str | None = None
    isolation: str | None = None
    forward_passes: int | None = None
    user_code_calls: int = 0
    skipped: str | None = None
    seconds: float | None = None

    def checked(self) -> str:
        """The parts that ran, for the check's detail (``"shape ok, target_leak leak"``)."""
        return ", ".join(f"{name} {part}" for name in PARTS
                         if (part := getattr(self, name)) is not None)

    def as_dict(self) -> dict[str, Any]:
        """Plain values (the checkpoint's state): the parts as their text, ``None`` left out."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or (f.name == "user_code_calls" and not value):
                continue
            if isinstance(value, PartResult):
                value = str(value)
            elif f.name == "head":
                value = {"module": value[0], "shape": list(value[1])}
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> StructureProbeResult:
        """Read :meth:`as_dict` (unknown keys ignored, missing ones at their defaults)."""
        result = cls()
        for name in PARTS:
            if isinstance(state.get(name), str):
                setattr(result, name, PartResult.parse(state[name]))
        head = state.get("head")
        if isinstance(head, Mapping):
            result.head = (head.get("module"), [int(d) for d in head.get("shape", [])])
        for name in ("labels", "probe_input", "isolation", "skipped"):
            if state.get(name) is not None:
                setattr(result, name, str(state[name]))
        if state.get("forward_passes") is not None:
            result.forward_passes = int(state["forward_passes"])
        result.user_code_calls = int(state.get("user_code_calls", 0))
        if state.get("seconds") is not None:
            result.seconds = float(state["seconds"])
        return result


def coupled_verdict(result: StructureProbeResult, judged: str, *, coupled: bool,
                    pairs: Sequence[Sequence[int]] = (), statistics: Sequence[str] = (),
                    batch_size: int = 0) -> Verdict | None:
    """``structure.batch_mixing`` at info when the examples are independent per output and the
    objective couples them on purpose: an output that is an example-by-example score matrix
    (``result.batch_mixing.score_matrix``), or ``coupled`` (in-batch similarities ``pairs``,
    batch ``statistics``); ``None`` when batch mixing was not judged ``ok`` or nothing couples
    the examples. See :func:`coupled_by_design`."""
    part = result.batch_mixing
    if part is None or part.outcome is not Outcome.OK:
        return None
    if part.score_matrix is None and not coupled:
        return None
    return coupled_by_design(judged, pairs=pairs, statistics=statistics,
                             score_matrix=part.score_matrix, batch_size=batch_size)


def mixes_examples(output: Tensor, leaf: Tensor, example: int, tolerance: float) -> bool:
    """Whether ``example``'s row of ``output`` depends on the other examples of ``leaf``, other
    than as an example-by-example score matrix (the graph is kept for the next question)."""
    if output.dim() < 1 or output.shape[0] <= example:
        return False
    dep = example_dependence(output, leaf, example=example, tolerance=tolerance,
                             retain_graph=True)
    return dep.mixing and not pairwise_output(output, leaf, column=dep.worst_example or 1,
                                              tolerance=tolerance, retain_graph=True)


def judge_batch_mixing(outputs: Sequence[tuple[str, str | None, Tensor]], leaf: Tensor,
                       tolerance: float) -> tuple[PartResult, tuple[str, str | None,
                                                                    BatchDependence] | None]:
    """Does an example's output depend on the other examples' inputs (``leaf``, the batch on
    dim 0)? ``outputs``: ``(label, module name, tensor)``, the head's first.

    Returns:
        The batch-mixing part (skipped for a single example; ``ok`` with the ``score_matrix``
        when the first output that mixes is an example-by-example score matrix, by design),
        and for ``mixing`` the output that mixes with its dependence, else ``None``.
    """
    if leaf.shape[0] < 2:
        return skipped("a single example"), None
    for label, out_name, out in outputs:
        # the first example, then the last: a recurrent layer that reads the batch axis as
        # time (no `batch_first=True`) leaves example 0 alone and feeds every earlier
        # example into the last one
        for example in (0, int(leaf.shape[0]) - 1):
            mix = example_dependence(out, leaf, example=example, tolerance=tolerance,
                                     retain_graph=True)  # freed with the probe's references
            if mix.mixing:
                break
        if not mix.mixing:
            continue
        if pairwise_output(out, leaf, column=mix.worst_example or 1, tolerance=tolerance,
                           retain_graph=True):
            return PartResult(Outcome.OK, score_matrix=label), None
        return PartResult(Outcome.MIXING), (label, out_name, mix)
    return PartResult(Outcome.OK), None


def lm_name(module: nn.Module) -> str:
    """The class of the language model inside (a transformers ``PreTrainedModel``, which
    documents its own label shift), else ``module``'s."""
    for m in module.modules():
        if type(m).__module__.startswith("transformers.") and \
                type(m).__name__.endswith(("ForCausalLM", "LMHeadModel")):
            return type(m).__name__
    return type(module).__name__


__all__ = [
    "PARTS",
    "SHOWN_POSITIONS",
    "Outcome",
    "PartResult",
    "StructureProbeResult",
    "batch_mixing",
    "causal_leak",
    "causal_reason",
    "coupled_by_design",
    "coupled_verdict",
    "framework_broadcasts",
    "judge_batch_mixing",
    "label_misaligned",
    "lm_name",
    "mixes_examples",
    "padding_leak",
    "padding_nondeterministic",
    "padding_unaligned",
    "padding_unfinished",
    "probe_skipped",
    "shape_mismatch",
    "skipped",
    "target_leak",
    "time_major_rnn",
    "where_sentence",
]
