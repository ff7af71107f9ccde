"""The finding codes of stage 5, structure: one ``spec(...)`` row per code."""

from __future__ import annotations

from lightning_triage.codes.spec import CodeSpec, spec

SPECS: tuple[CodeSpec, ...] = (
    spec("structure.batch_mixing", "error", "Outputs mix examples of the batch",
         "An operation mixes the batch dimension in eval mode: a softmax/log_softmax or "
         "normalization over `dim=0`, a `view`/`reshape` that merges the batch with another "
         "dimension, or batch and sequence dimensions swapped (an `nn.LSTM`/`nn.GRU`/`nn.RNN` "
         "fed `(N, T, F)` needs `batch_first=True`).",
         when="In eval mode, an example's output depends on the inputs of other examples of the batch.",
         remedy="causal"),
    spec("structure.causal_leak", "error", "Outputs see future positions",
         "Check the attention masks (upper triangle masked? its orientation? the encoder's too? "
         "cross-attention to an encoder that saw the whole sequence?) and every sublayer that mixes "
         "positions (convolutions need left padding).",
         when="An output position depends on later input positions, when the model is declared causal or "
              "the data is next-token prediction.",
         remedy="causal"),
    spec("structure.shape_mismatch", "error", "Prediction and target shapes broadcast silently",
         "Make prediction and target shapes equal before the loss (`pred.squeeze(-1)` a `(N, 1)` "
         "prediction for `(N,)` targets, or `target.view_as(pred)`).",
         when="Prediction and target shapes differ but broadcast against each other in the loss (e.g. "
              "`(N, 1)` against `(N,)`)."),
    spec("structure.target_leak", "error", "The targets reach the forward pass",
         "The targets reach the forward pass: feed the decoder the targets shifted right, and "
         "keep labels out of the features (expected only for label-conditioned models).",
         when="The model's outputs change when only the targets of the batch change.",
         remedy="causal"),
    spec("structure.label_misaligned", "error", "Language-model labels are misaligned with the inputs",
         "Shift the labels once. transformers' causal LMs (`*ForCausalLM`, `GPT2LMHeadModel`) shift "
         "`labels` inside their loss: pass `labels = input_ids` (with `-100` at padding), not "
         "`input_ids[:, 1:]`. A model that does not shift needs the shift in your loss: "
         "`cross_entropy(logits[:, :-1].flatten(0, 1), input_ids[:, 1:].flatten())`.",
         when="On the structure probe's pass over token inputs, the targets given to the loss lead "
              "the inputs by two positions (labels shifted twice), or are the inputs themselves "
              "while the model is causal (no shift: each position sees its own target).",
         remedy="realign_labels"),
    spec("structure.padding_leak", "warning", "Outputs at real positions depend on the padding",
         "Pass the padding mask to attention (`key_padding_mask`/`attention_mask`), pool over the "
         "real positions only (masked mean), and give padded targets `ignore_index`.",
         when="Outputs at real positions change when only the padded positions of the input change.",
         remedy="causal"),
    spec("structure.probe_skipped", "info", "Structure probe skipped",
         "Pass `forward_fn=` (callable(pl_module, batch) -> output; `Triage` takes it too) or "
         "`input_key=`/`target_key=` to `StructureProbe` so the probe can run the model.",
         when="A structure or padding probe could not run the model (no forward found, an exception, a "
              "non-deterministic output) (info)."),
)

__all__ = ["SPECS"]
