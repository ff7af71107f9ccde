"""Broken runs of stage 4, the structure: examples that see each other, targets that leak into
the inputs, shapes that broadcast, attention that shows the future."""

from __future__ import annotations

import functools
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightning_triage.demo.broken.common import HEALTHY, Loaders, fit
from lightning_triage.demo.digits import DigitsMLP
from lightning_triage.demo.scenario import Scenario
from lightning_triage.demo.sequences import TinyLM, random_token_loaders


class BatchMeanMLP(DigitsMLP):
    """Subtracts the batch mean from the logits: every output depends on the whole batch."""

    def forward(self, x: Tensor) -> Tensor:
        z = self.net(x)
        return z - z.mean(dim=0, keepdim=True)


class TargetInInputMLP(DigitsMLP):
    """``training_step`` feeds the labels into the model."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        x = x.clone()
        x[:, 0] = y.float()
        return F.cross_entropy(self(x), y)


class ShapeMismatchRegressor(DigitsMLP):
    """Regresses the digit value with MSE between a ``(N, 1)`` prediction and ``(N,)`` targets
    (``squeeze``: the prediction squeezed to ``(N,)``, the fix)."""

    def __init__(self, squeeze: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.squeeze = squeeze
        self.net[2] = nn.Linear(32, 1)

    def _loss(self, batch: Any) -> Tensor:
        x, y = batch
        pred = self(x)
        return F.mse_loss(pred.squeeze(1) if self.squeeze else pred, y.float())

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._loss(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch))


def unshifted_token_loaders() -> Loaders:
    """Token data whose targets are the inputs, for a model that does not shift."""
    train, val = random_token_loaders()
    x, xv = train.dataset.tensors[0], val.dataset.tensors[0]  # type: ignore[attr-defined]
    return (DataLoader(TensorDataset(x, x.clone()), batch_size=32),
            DataLoader(TensorDataset(xv, xv.clone()), batch_size=32))


class BatchSoftmaxMLP(DigitsMLP):
    """Log-softmax over dim 0 (the batch) instead of the classes, then `F.nll_loss`."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.nll_loss(torch.log_softmax(self(x), dim=0), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.nll_loss(torch.log_softmax(self(x), dim=0), y))


class BroadcastRegressor(pl.LightningModule):
    """A regression MLP whose `(N, 1)` prediction meets `(N,)` targets in `F.mse_loss`: the loss
    broadcasts to `(N, N)` and every prediction is pulled to the batch mean (``squeeze``: the
    prediction squeezed to `(N,)`, the fix)."""

    def __init__(self, features: int, lr: float = 1e-2, squeeze: bool = False) -> None:
        super().__init__()
        self.lr, self.squeeze = lr, squeeze
        self.net = nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: Tensor) -> Tensor:
        pred = self.net(x)
        return pred.squeeze(1) if self.squeeze else pred

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.mse_loss(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


@functools.lru_cache(maxsize=1)
def _diabetes() -> tuple[Tensor, Tensor]:
    from sklearn.datasets import load_diabetes

    data = load_diabetes()
    x = torch.tensor(data.data, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.float32)
    x = (x - x.mean(0)) / x.std(0)
    return x, (y - y.mean()) / y.std()


def mse_broadcast(squeeze: bool = False) -> tuple[pl.LightningModule, Any, Any]:
    """:class:`BroadcastRegressor` on scikit-learn's diabetes data (360 train, 82 validation)."""
    x, y = _diabetes()
    gen = torch.Generator().manual_seed(0)
    train = DataLoader(TensorDataset(x[:360], y[:360]), batch_size=32, shuffle=True, generator=gen)
    val = DataLoader(TensorDataset(x[360:], y[360:]), batch_size=128)
    return BroadcastRegressor(x.shape[1], squeeze=squeeze), train, val


# The language models' twins are not full fixes: a causal LM cannot learn random tokens, and the
# curve says so (curve.lr_too_low).
class RowsLSTM(DigitsMLP):
    """Reads each 8x8 digit as a sequence of 8 rows with an LSTM built without
    ``batch_first=True`` (``batch_first``: built with it, the fix), fed ``(N, 8, 8)``
    batch-first tensors; ``readout`` is what the head reads: the last step, the mean over
    steps, or every step (flattened)."""

    def __init__(self, batch_first: bool = False, readout: str = "last",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.readout = readout
        self.net = nn.Sequential()  # unused: the layers below replace it
        self.rnn = nn.LSTM(8, 32, batch_first=batch_first)
        self.head = nn.Linear(32 * 8 if readout == "every" else 32, 10)

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.rnn(x.view(-1, 8, 8))
        feats = {"last": lambda: out[:, -1], "mean": lambda: out.mean(dim=1),
                 "every": lambda: out.flatten(1)}[self.readout]()
        return self.head(feats)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class PaddedTokens(Dataset):
    """Examples ``{"input_ids", "padding_mask", "labels"}`` of ``ids`` (0 = pad)."""

    def __init__(self, ids: Tensor) -> None:
        self.ids, self.pad = ids, ids == 0
        self.labels = torch.stack([(ids == k).sum(1) for k in (1, 2, 3)], 1).argmax(1)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {"input_ids": self.ids[i], "padding_mask": self.pad[i], "labels": self.labels[i]}


def padded_token_loaders() -> Loaders:
    """640 training and 160 validation examples of :class:`PaddedTokens`, all distinct: 3-9
    tokens in 1..7 padded with 0 to 12 positions (every row has padding, ``padding_mask`` true
    at the pads); the label is which of the tokens 1, 2, 3 is most frequent."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 8, (1000, 12), generator=g)
    ids[torch.arange(12)[None] >= torch.randint(3, 10, (1000, 1), generator=g)] = 0
    rows = list(dict.fromkeys(map(tuple, ids.tolist())))[:800]
    ids = torch.tensor(rows)
    return (DataLoader(PaddedTokens(ids[:640]), batch_size=32, shuffle=True,
                       generator=torch.Generator().manual_seed(0)),
            DataLoader(PaddedTokens(ids[640:]), batch_size=80))


class PaddedEncoderClassifier(pl.LightningModule):
    """A transformer encoder over padded tokens, mean pooled over the real tokens. ``inverted``:
    the code treats the loader's ``padding_mask`` (true at the pads) as an attention mask (true
    at the tokens) and inverts it, ``~mask``: attention and pooling read the pads only."""

    def __init__(self, inverted: bool = False, lr: float = 3e-3) -> None:
        super().__init__()
        self.inverted, self.lr = inverted, lr
        self.embed = nn.Embedding(8, 16)
        self.pos = nn.Parameter(torch.randn(12, 16) * 0.02)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        pad = ~mask if self.inverted else mask
        h = self.encoder(self.embed(ids) + self.pos, src_key_padding_mask=pad)
        keep = (~pad).float()[..., None]
        return self.head((h * keep).sum(1) / keep.sum(1))

    def _loss(self, batch: dict[str, Tensor]) -> Tensor:
        return F.cross_entropy(self(batch["input_ids"], batch["padding_mask"]), batch["labels"])

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._loss(batch)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


STRUCTURE_RUNS: list[Scenario] = [
    Scenario("batch-mean-logits", "logits minus their batch mean", "structure.batch_mixing",
             fit(lambda: BatchMeanMLP(lr=0.1)), fixed=HEALTHY),
    Scenario("target-in-input", "labels written into the first input feature",
             "structure.target_leak", fit(lambda: TargetInInputMLP(lr=0.1)), fixed=HEALTHY),
    Scenario("mse-shape-mismatch", "MSE between (N, 1) predictions and (N,) targets",
             "structure.shape_mismatch", fit(lambda: ShapeMismatchRegressor(lr=0.01)),
             triage_kwargs={"task": "regression"},
             fixed=fit(lambda: ShapeMismatchRegressor(squeeze=True, lr=0.01))),
    Scenario("future-mask-lm", "transformer LM whose attention mask shows the future",
             "structure.causal_leak", fit(lambda: TinyLM(mask="future"), random_token_loaders),
             fixed=fit(TinyLM, random_token_loaders), full_fix=False),
    Scenario("unshifted-lm",
             "a causal transformer LM trained with `labels = input_ids` and no shift",
             "structure.label_misaligned", fit(TinyLM, unshifted_token_loaders),
             fixed=fit(TinyLM, random_token_loaders), full_fix=False),
    # issue 14's causes: the report leads with them and the probe's failure names them
    Scenario("batch-softmax", "log-softmax over the batch axis", "structure.batch_mixing",
             fit(lambda: BatchSoftmaxMLP(lr=0.1)), fixed=HEALTHY, lead=True),
    Scenario("mse-broadcast", "MSE between `(N, 1)` predictions and `(N,)` targets (diabetes)",
             "structure.shape_mismatch", mse_broadcast,
             fixed=lambda: mse_broadcast(squeeze=True), lead=True),
    # yunjey/pytorch-tutorial#196 (and pytorch/pytorch#1538): an MNIST row-LSTM tutorial with
    # `batch_first=True` turned to False, still fed `(N, T, F)`: accuracy 11%. The LSTM runs
    # over the batch as time; the probe reads the last example, which sees every other one
    Scenario("lstm-without-batch-first",
             "an `nn.LSTM` without `batch_first=True` fed `(N, T, F)` batches",
             "structure.batch_mixing", fit(lambda: RowsLSTM(lr=1e-2)),
             fixed=fit(lambda: RowsLSTM(batch_first=True, lr=1e-2))),
    # a key-padding mask inverted twice: the loader's mask is already true at the pads, the
    # model inverts it as if it were an attention mask (`~mask`) and reads the pads only (the
    # torch convention, true = ignore, against the Hugging Face one, 1 = attend: e.g.
    # pytorch/pytorch#41508). The padding probe's finding leads and explains the failed probe
    Scenario("inverted-padding-mask",
             "an encoder given `~padding_mask`: attention and pooling read the pads only",
             "structure.padding_leak",
             fit(lambda: PaddedEncoderClassifier(inverted=True), padded_token_loaders),
             fixed=fit(PaddedEncoderClassifier, padded_token_loaders), max_epochs=3, lead=True),
]
