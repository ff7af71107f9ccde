"""PyTorch's fused and fast paths under `Triage(strict=True)`: the probes that run the model in
eval mode (the eval contracts, the mode check, the structure and padding probes, the worst
errors, the overfit probe) meet `nn.TransformerEncoder`'s nested-tensor path (a padding mask in
eval mode), `nn.MultiheadAttention` with a key padding mask and an attention mask, `nn.LSTM` and
`nn.GRU` over packed sequences, and `scaled_dot_product_attention` with `is_causal`: no check
error, no false warning, and the weights are bit-identical with and without the callbacks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils.data import DataLoader

from tests.realmodels.models import (
    LENGTH,
    VOCAB,
    LossSteps,
    Tokens,
    problems,
    quiet_trainer,
    triage,
)

D = 32


def loaders(task: str, seed: int = 0) -> tuple[DataLoader, DataLoader]:
    train = DataLoader(Tokens(task, 128, seed), batch_size=16, shuffle=True,
                       generator=torch.Generator().manual_seed(seed))
    return train, DataLoader(Tokens(task, 32, seed + 100), batch_size=16)


class Classifier(LossSteps):
    """Embeds right-padded tokens, encodes them with ``kind``, mean-pools the real positions and
    classifies; ``training_step`` reads the dict batch."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.embed = nn.Embedding(VOCAB, D, padding_idx=0)
        self.pos = nn.Parameter(0.02 * torch.randn(LENGTH, D))
        if kind == "encoder":  # enable_nested_tensor=True (the default): the eval fast path
            layer = nn.TransformerEncoderLayer(D, 2, 64, dropout=0.0, batch_first=True)
            self.encoder: nn.Module = nn.TransformerEncoder(layer, 2)
        elif kind == "mha":
            self.encoder = nn.MultiheadAttention(D, 2, batch_first=True)
        elif kind == "lstm":
            self.encoder = nn.LSTM(D, D, batch_first=True)
        else:
            self.encoder = nn.GRU(D, D, batch_first=True)
        self.head = nn.Linear(D, 2)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        x = self.embed(input_ids) + self.pos[: input_ids.shape[1]]
        pad = attention_mask == 0
        if self.kind == "encoder":
            h = self.encoder(x, src_key_padding_mask=pad)
        elif self.kind == "mha":
            n = input_ids.shape[1]
            # a banded attention mask (each position sees 4 neighbours) and the padding mask
            idx = torch.arange(n, device=x.device)
            band = (idx[None, :] - idx[:, None]).abs() > 4
            h, _ = self.encoder(x, x, x, key_padding_mask=pad, attn_mask=band,
                                need_weights=False)
        else:
            lengths = attention_mask.sum(1).cpu()
            packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            out, _ = self.encoder(packed)
            h, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        keep = attention_mask.unsqueeze(-1) > 0
        # a padded query that sees only padded keys is NaN: where(), not a product with 0
        pooled = torch.where(keep, h, 0.0).sum(1) / keep.sum(1)
        return self.head(pooled)

    def _loss(self, batch: dict[str, Tensor]) -> Tensor:
        return F.cross_entropy(self(batch["input_ids"], batch["attention_mask"]), batch["labels"])

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=3e-3)


class CausalLM(LossSteps):
    """A one-block causal LM with ``F.scaled_dot_product_attention(is_causal=True)``, trained
    with ``labels = input_ids`` shifted in the loss (transformers' convention)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(0.02 * torch.randn(LENGTH, D))
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.norm = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 64), nn.GELU(), nn.Linear(64, D))
        self.out = nn.Linear(D, VOCAB)

    def forward(self, input_ids: Tensor) -> Tensor:
        b, n = input_ids.shape
        x = self.embed(input_ids) + self.pos[:n]
        q, k, v = self.qkv(x).view(b, n, 3, 2, D // 2).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, D))
        x = x + self.mlp(self.norm(x))
        return self.out(x)

    def _loss(self, batch: dict[str, Tensor]) -> Tensor:
        logits = self(batch["input_ids"])
        return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB),
                               batch["labels"][:, 1:].reshape(-1), ignore_index=-100)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=3e-3)


def build(kind: str) -> pl.LightningModule:
    return CausalLM() if kind == "sdpa" else Classifier(kind)


KINDS = ["encoder", "mha", "lstm", "gru", "sdpa"]


@pytest.mark.parametrize("kind", KINDS)
def test_eval_mode_probes_work_on_fast_paths(tmp_path: Path, kind: str) -> None:
    task = "lm" if kind == "sdpa" else "classify"
    finals = []
    report: dict[str, Any] | None = None
    for with_triage in (False, True):
        pl.seed_everything(0, verbose=False)
        model = build(kind)
        check = triage(tmp_path / str(with_triage)) if with_triage else None
        pl.seed_everything(0, verbose=False)
        quiet_trainer(tmp_path / str(with_triage), [check] if check else [],
                      max_epochs=1).fit(model, *loaders(task))
        finals.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        if check is not None:
            report = check.report.report
    assert report is not None
    errors = [c for c in report["checks"] if c["status"] == "error"]
    assert errors == []
    assert "triage.check_error" not in {f["code"] for f in report["findings"]}
    assert problems(report) == []
    statuses = {c["check"]: c for c in report["checks"]}
    # the eval-mode probes ran (or said why not in their detail)
    for name in ("EvalContractCheck", "EvalModeCheck", "StructureProbe", "OverfitBatchCheck"):
        entry = statuses[name]
        assert entry["status"] in ("passed", "skipped"), entry
        if entry["status"] == "skipped":
            assert entry["detail"], entry
    # the eval contracts compared every module call, the fast path's nested outputs included
    assert "deterministic over" in statuses["EvalContractCheck"]["detail"]
    for name in finals[0]:
        assert torch.equal(finals[0][name], finals[1][name]), name
