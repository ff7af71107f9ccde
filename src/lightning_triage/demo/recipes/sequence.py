"""Healthy sequence recipes: an LSTM classifier (``batch_first=True``), a transformer encoder
classifier with a padding mask, BERT-style masked and GPT-style next-token language models on
Markov-chain token sequences, and CTC on synthetic frames."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_triage.demo.recipes.common import Recipe, RecipeModule, loaders, sklearn_split

Built = tuple[RecipeModule, Any, Any]
VOCAB, MASK, LENGTH = 16, 16, 16


class LSTMClassifier(RecipeModule):
    """The digits' 8 rows as a sequence of 8 features, an LSTM, its last state classified
    (``batch_first=False``: the broken twin, which reads the batch as time)."""

    def __init__(self, batch_first: bool = True) -> None:
        super().__init__(lr=1e-2)
        self.batch_first = batch_first
        self.lstm = nn.LSTM(8, 16, batch_first=batch_first)
        self.head = nn.Linear(16, 10)

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.lstm(x.view(-1, 8, 8))
        return self.head(out[:, -1])

    def loss(self, batch: Any) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)


def lstm_classifier(seed: int) -> Built:
    xt, yt, xv, yv = sklearn_split("digits", seed)
    return LSTMClassifier(), *loaders((xt, yt), (xv, yv), seed)


def encoder(dim: int = 16, layers: int = 1, dropout: float = 0.1) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(dim, 2, 32, dropout=dropout, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


class PaddedClassifier(RecipeModule):
    """Token sequences of varying length padded with 0, ``src_key_padding_mask``, mean pooled
    over the real tokens; three classes."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 16, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(12, 16) * 0.02)
        self.encoder = encoder()
        self.head = nn.Linear(16, 3)

    def forward(self, tokens: Tensor) -> Tensor:
        pad = tokens == 0
        h = self.encoder(self.embed(tokens) + self.pos, src_key_padding_mask=pad)
        real = (~pad).float()[..., None]
        return self.head((h * real).sum(1) / real.sum(1))

    def loss(self, batch: Any) -> Tensor:
        tokens, y = batch
        return F.cross_entropy(self(tokens), y)


def _padded(n: int, seed: int) -> tuple[Tensor, Tensor]:
    """Sequences of 4-12 tokens in 1..7; the class: which of tokens 1, 2, 3 is most frequent."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 8, (n, 12), generator=g)
    lengths = torch.randint(4, 13, (n,), generator=g)
    tokens[torch.arange(12)[None] >= lengths[:, None]] = 0
    counts = torch.stack([(tokens == k).sum(1) for k in (1, 2, 3)], 1)
    return tokens, counts.argmax(1)


def transformer_padding(seed: int) -> Built:
    x, y = _padded(800, seed)
    return PaddedClassifier(), *loaders((x[160:], y[160:]), (x[:160], y[:160]), seed)


def _markov(n: int, seed: int) -> Tensor:
    """Sequences of a Markov chain over ``VOCAB`` tokens in which each token has two equally
    likely, distinct successors (fixed by the seed): the best next-token loss is ln 2."""
    g = torch.Generator().manual_seed(seed)
    first = torch.randperm(VOCAB, generator=g)
    second = (first + torch.randint(1, VOCAB, (VOCAB,), generator=g)) % VOCAB
    successors = torch.stack([first, second], 1)
    tokens = torch.zeros(n, LENGTH + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
    for i in range(LENGTH):
        pick = torch.randint(0, 2, (n,), generator=g)
        tokens[:, i + 1] = successors[tokens[:, i], pick]
    return tokens


class LanguageModel(RecipeModule):
    """A one-layer transformer over tokens; ``causal``: next-token prediction under a causal
    mask, otherwise masked-token prediction (labels ``-100`` off the masked positions)."""

    def __init__(self, causal: bool) -> None:
        super().__init__(lr=5e-3)
        self.causal = causal
        self.embed = nn.Embedding(VOCAB + 1, 32)
        self.pos = nn.Parameter(torch.randn(LENGTH + 1, 32) * 0.02)
        self.encoder = encoder(dim=32, dropout=0.0)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, tokens: Tensor) -> Tensor:
        n = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=tokens.device) \
            if self.causal else None
        h = self.encoder(self.embed(tokens) + self.pos[:n], mask=mask, is_causal=self.causal)
        return self.head(h)

    def loss(self, batch: Any) -> Tensor:
        tokens, labels = batch
        return F.cross_entropy(self(tokens).flatten(0, 1), labels.flatten(), ignore_index=-100)


def mask_tokens(examples: list[tuple[Tensor, ...]]) -> tuple[Tensor, Tensor]:
    """A BERT collator: 15% of the positions (at least one) masked, labels ``-100`` elsewhere;
    of the masked, 80% become ``[MASK]``, 10% a random token, 10% stay."""
    tokens = torch.stack([e[0] for e in examples])
    chosen = torch.rand(tokens.shape) < 0.15
    chosen[torch.arange(len(tokens)), torch.randint(0, tokens.shape[1], (len(tokens),))] = True
    labels = torch.where(chosen, tokens, torch.full_like(tokens, -100))
    roll = torch.rand(tokens.shape)
    inputs = torch.where(chosen & (roll < 0.8), torch.full_like(tokens, MASK), tokens)
    random = torch.randint(0, VOCAB, tokens.shape)
    inputs = torch.where(chosen & (roll >= 0.8) & (roll < 0.9), random, inputs)
    return inputs, labels


def masked_lm(seed: int) -> Built:
    seqs = _markov(800, seed)
    train, val = loaders((seqs[160:],), (seqs[:160],), seed, collate_fn=mask_tokens)
    return LanguageModel(causal=False), train, val


def gpt_lm(seed: int) -> Built:
    seqs = _markov(800, seed)
    x, y = seqs[:, :-1], seqs[:, 1:]
    return LanguageModel(causal=True), *loaders((x[160:], y[160:]), (x[:160], y[:160]), seed)


class CTCModel(RecipeModule):
    """A bidirectional GRU over frames, ``F.ctc_loss`` on ``(T, N, C)`` log-probabilities."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(8, 16, batch_first=True, bidirectional=True)
        self.head = nn.Linear(32, 6)

    def loss(self, batch: Any) -> Tensor:
        frames, frame_lengths, targets, target_lengths = batch
        out, _ = self.rnn(frames)
        log_probs = self.head(out).log_softmax(-1).transpose(0, 1)
        return F.ctc_loss(log_probs, targets, frame_lengths, target_lengths, zero_infinity=True)


def _frames(n: int, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Label sequences of 2-4 symbols in 1..5, each symbol emitted for 2-3 noisy frames of its
    prototype (2 in sequences of 4), blank frames between; padded to 16 frames."""
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(6, 8, generator=g)
    frames, targets = torch.zeros(n, 16, 8), torch.zeros(n, 4, dtype=torch.long)
    frame_lengths, target_lengths = torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long)
    for i in range(n):
        k = int(torch.randint(2, 5, (1,), generator=g))
        symbols = torch.randint(1, 6, (k,), generator=g)
        seq = []
        for s in symbols.tolist():
            seq += [0] * int(torch.randint(0, 2, (1,), generator=g))
            seq += [s] * int(torch.randint(2, 3 if k == 4 else 4, (1,), generator=g))
        frames[i, :len(seq)] = protos[seq] + 0.3 * torch.randn(len(seq), 8, generator=g)
        targets[i, :k], frame_lengths[i], target_lengths[i] = symbols, len(seq), k
    return frames, frame_lengths, targets, target_lengths


def ctc(seed: int) -> Built:
    parts = _frames(600, seed)
    return CTCModel(), *loaders(tuple(p[120:] for p in parts), tuple(p[:120] for p in parts), seed)


SEQUENCE_RECIPES: list[Recipe] = [
    Recipe("lstm-classifier", "sequence", "digits rows through an LSTM (`batch_first=True`)",
           lstm_classifier),
    Recipe("transformer-padding", "sequence",
           "transformer encoder classifier, `src_key_padding_mask`", transformer_padding),
    Recipe("masked-lm", "sequence", "BERT-style masked LM, labels -100 off the masked positions",
           masked_lm),
    Recipe("gpt-lm", "sequence", "GPT-style next-token LM under a causal mask", gpt_lm),
    Recipe("ctc", "sequence", "CTC on synthetic frames, a bidirectional GRU", ctc),
]
