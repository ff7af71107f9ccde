"""The structure stage's rules: verdicts, messages and evidence from what the probes measured."""

from __future__ import annotations

import torch

from lightning_triage.functional import structure_verdicts as rules
from lightning_triage.functional.padding import PaddingMask, RealChange
from lightning_triage.functional.padding_probe import PaddingLeak
from lightning_triage.functional.structure import (
    BatchDependence,
    CausalDependence,
    OutputChange,
)
from lightning_triage.functional.structure_verdicts import (
    Outcome,
    PartResult,
    StructureProbeResult,
    coupled_verdict,
    judge_batch_mixing,
    skipped,
)


def test_probe_skipped_names_the_part() -> None:
    whole = rules.probe_skipped("no input", "Pass `input_key=`.")
    part = rules.probe_skipped("too slow", "Raise it.", part="causal probe")
    assert (whole.code, whole.step, whole.evidence) == (
        "structure.probe_skipped", 0, {"reason": "no input", "part": "all"})
    assert part.message == "The causal probe did not run: too slow. Raise it."
    assert part.evidence["part"] == "causal probe"


def test_shape_mismatch_from_events_or_framework_warnings() -> None:
    assert rules.shape_mismatch([], [], "head") is None
    event = {"op": "mse_loss", "prediction_shape": [4, 1], "target_shape": [4],
             "result_shape": [4, 4]}
    v = rules.shape_mismatch([event], [], "head")
    assert v is not None and v.code == "structure.shape_mismatch"
    assert v.message.startswith("`mse_loss` combines predictions of shape (4, 1) with targets "
                                "of shape (4,), which broadcast silently to (4, 4)")
    assert v.evidence["head_module"] == "head" and v.evidence["broadcast_shape"] == [4, 4]
    warned = [("Using a target size (torch.Size([4, 1])) that is different to the input size "
               "(torch.Size([4])).", "UserWarning"), ("something else", "UserWarning")]
    framework = rules.framework_broadcasts(warned)
    assert len(framework) == 1 and framework[0]["category"] == "UserWarning"
    v2 = rules.shape_mismatch([], framework, None)
    assert v2 is not None and v2.evidence["op"] == "loss"
    assert v2.evidence["broadcast_shape"] == [4, 4]


def test_where_sentence_cases() -> None:
    assert rules.where_sentence("enc", "sees the future", False, "Net") == (
        " The first module whose output sees the future is `enc`.")
    assert "`Net.forward` itself" in rules.where_sentence("", "mixes examples", False, "Net")
    assert "`training_step` code" in rules.where_sentence(None, "mixes examples", True, "Net")
    assert rules.where_sentence(None, "mixes examples", False, "Net") == ""


def test_causal_reason() -> None:
    x = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    y = torch.tensor([[2, 3, 4, 9], [6, 7, 8, 9]])
    assert rules.causal_reason(True, x, None, -100) == "`causal=True`"
    reason = rules.causal_reason(None, x, y, -100)
    assert reason is not None and "(2 sequences of 4 tokens)" in reason
    assert rules.causal_reason(None, x, x, -100) is None
    assert rules.causal_reason(False, x, y, -100) is None


def test_gradient_verdicts_carry_numbers_and_layer() -> None:
    mix = BatchDependence(0, 1.0, 0.5, 0.5, 3, True, True)
    v = rules.batch_mixing("the output of `head`", "head", "norm", " where.", mix, "the batch", 8)
    assert v.code == "structure.batch_mixing" and v.layer == "head"
    assert "gradient norm 0.5 reaches them (largest: example 3) vs 1 for its own" in v.message
    assert v.message.endswith("for its own input. where.")
    assert v.evidence["batch_size"] == 8 and v.evidence["first_module"] == "norm"
    dep = CausalDependence(2, list(range(3, 13)), 1.0, 0.5, 0.5, True, True)
    c = rules.causal_leak("Net", None, None, "", dep, "`causal=True`", "x", 13, [0, 2])
    assert "Output position 2 of `Net` depends on later input positions " \
           "[3, 4, 5, 6, 7, 8, 9, 10]... (50.0% of" in c.message
    assert c.evidence["future_positions"] == list(range(3, 13))
    assert c.evidence["positions_probed"] == [0, 2]


def test_target_leak_message() -> None:
    change = OutputChange(True, 0.25, 0.1, 0.5, "all", [4, 3], [4, 3])
    v = rules.target_leak("head", "head", "head", change, "targets permuted across the batch",
                          None, [4])
    assert "changed (targets permuted across the batch, inputs unchanged): max |diff| 0.25" \
        in v.message
    seq = rules.target_leak("dec", "dec", "dec", change, "target positions 1..3 permuted", 1,
                            [4, 4])
    assert "inputs unchanged) at the first output position, which teacher forcing only feeds " \
           "the tokens before target position 1:" in seq.message
    assert seq.evidence["target_shape"] == [4, 4]


def test_padding_verdicts() -> None:
    pad = torch.tensor([[False, False, True], [False, True, True]])
    mask = PaddingMask(pad=pad, real=~pad, source="batch['attention_mask']", side="right",
                       pad_value=0, mask=None, pad_is_true=False)
    leak = PaddingLeak("content", RealChange("positions", 0.5, 0.25, True), "head", "enc")
    v = rules.padding_leak("head", "enc", "head", mask, [leak], 1e-7, [2, 3])
    assert v.code == "structure.padding_leak" and v.layer == "enc"
    assert "other token ids at the padded positions moved it at the real positions by up to " \
           "0.5 (25% of its largest value). The first module" in v.message
    assert v.evidence["padded_positions"] == 3
    why, skipped = rules.padding_nondeterministic(0.01)
    assert skipped.evidence == {"reason": why, "part": "padding probe", "noise": 0.01}
    assert rules.padding_unaligned("x").message.startswith("The padding probe could not compare")
    assert rules.padding_unfinished("x").message.startswith("The padding probe did not run to")


def test_labels_equal_to_inputs_need_a_shift_in_the_loss_to_be_next_token_data() -> None:
    from lightning_triage.functional.structure_verdicts import causal_reason

    ids = torch.tensor([[5, 6, 7, 8, 0, 0], [9, 3, 4, 2, 7, 1]])
    labels = ids.masked_fill(ids == 0, -100)
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:].reshape(-1)  # inside HF
    assert causal_reason(None, ids, labels, -100) is None  # nothing seen of the loss yet
    reason = causal_reason(None, ids, labels, -100, [shifted])
    assert reason is not None and "`labels = input_ids`" in reason
    assert causal_reason(None, ids, labels, -100, [labels[:, 1:]]) is not None  # older HF
    # an autoencoder: the loss compares each position with itself
    assert causal_reason(None, ids, labels, -100, [labels.reshape(-1)]) is None
    assert causal_reason(False, ids, labels, -100, [shifted]) is None
    # a masked-LM batch: ignore_index scattered, masked inputs
    mlm = torch.full_like(ids, -100)
    mlm[0, 1], mlm[1, 3] = 6, 2
    assert causal_reason(None, ids, mlm, -100, [mlm[:, 1:].reshape(-1)]) is None


# ---------------------------------------------------------------------- the probe's typed result
def test_each_part_reads_back_from_its_text() -> None:

    parts = [PartResult(Outcome.OK), PartResult(Outcome.MISMATCH), PartResult(Outcome.MIXING),
             PartResult(Outcome.LEAK, reason="next-token data"), skipped("a single example"),
             PartResult(Outcome.OK, score_matrix="the output of `SimCLR`")]
    texts = [str(p) for p in parts]
    assert texts[3] == "leak (next-token data)"
    assert texts[5] == ("ok: the output of `SimCLR` is an example-by-example score matrix "
                        "(in-batch pairs by design)")
    assert [PartResult.parse(t) for t in texts] == parts


def test_the_result_round_trips_and_sums_up_the_parts_in_order() -> None:

    result = StructureProbeResult(head=("classifier", [8, 3]), isolation="copy")
    result.causal = PartResult(Outcome.OK, reason="causal=True")
    result.shape = PartResult(Outcome.OK)
    result.target_leak = skipped("no targets found in the batch")
    result.user_code_calls = 3
    assert result.checked() == ("shape ok, target_leak skipped: no targets found in the batch, "
                                "causal ok (causal=True)")
    state = result.as_dict()
    assert state["head"] == {"module": "classifier", "shape": [8, 3]}
    assert "batch_mixing" not in state and "labels" not in state
    assert StructureProbeResult.from_dict(state) == result
    assert StructureProbeResult().as_dict() == {}


def test_the_score_matrix_exception_is_decided_here() -> None:

    x = torch.randn(6, 4, requires_grad=True)
    sim = x @ x.T  # a similarity matrix: example i's row reads every example, by design
    part, mixed = judge_batch_mixing([("the output of `Net`", "net", sim)], x, 1e-6)
    assert part == PartResult(Outcome.OK, score_matrix="the output of `Net`") and mixed is None
    verdict = coupled_verdict(StructureProbeResult(batch_mixing=part), "the output of `Net`",
                              coupled=False, batch_size=6)
    assert verdict is not None and verdict.code == "structure.batch_mixing"
    assert verdict.severity == "info"

    mixing = x - x.mean(0, keepdim=True)  # batch statistics in the forward: mixing
    part, mixed = judge_batch_mixing([("the output of `Net`", "net", mixing)], x, 1e-6)
    assert part.outcome is Outcome.MIXING and mixed is not None and mixed[1] == "net"
    assert coupled_verdict(StructureProbeResult(batch_mixing=part), "x", coupled=True) is None

    alone = x * 2.0  # each example on its own: ok, and nothing couples them
    part, mixed = judge_batch_mixing([("the output of `Net`", "net", alone)], x, 1e-6)
    assert part == PartResult(Outcome.OK) and mixed is None
    assert coupled_verdict(StructureProbeResult(batch_mixing=part), "x", coupled=False) is None
    assert judge_batch_mixing([("o", None, alone[:1])], x[:1], 1e-6)[0].outcome is Outcome.SKIPPED
