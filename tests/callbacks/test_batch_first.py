"""A recurrent layer built without `batch_first=True` fed batch-first tensors (issue 42): the
structure probe catches it whatever the model reads from it (the last step, the mean over steps,
every step) and names the layer and the argument; the same model with `batch_first=True` is
silent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from lightning_triage import StructureProbe
from lightning_triage.demo.broken.structure import RowsLSTM
from lightning_triage.demo.digits import digits_loaders
from lightning_triage.functional.structure_verdicts import time_major_rnn
from tests.helpers import make_trainer, seeds


def probe(tmp_path: Path, model: Any, seed: int = 0) -> StructureProbe:
    torch.manual_seed(seed)
    check = StructureProbe(strict=True)
    train, val = digits_loaders()
    make_trainer(tmp_path, [check], limit_train_batches=1, limit_val_batches=1).fit(
        model, train, val)
    return check


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("readout", ["last", "mean", "every"])
def test_an_lstm_reading_the_batch_as_time_is_named_with_its_argument(
        tmp_path: Path, readout: str, seed: int) -> None:
    found = [f for f in probe(tmp_path / "broken", RowsLSTM(readout=readout), seed).findings
             if f.code == "structure.batch_mixing"]
    assert len(found) == 1
    f = found[0]
    assert f.layer == "rnn" and f.evidence["rnn"] == "rnn"
    assert f.evidence["argument"] == "batch_first"
    assert "`batch_first=True`" in f.message
    fixed = probe(tmp_path / "fixed", RowsLSTM(batch_first=True, readout=readout), seed)
    assert [f.code for f in fixed.findings if f.stage == "structure"] == []


def test_only_a_time_major_recurrent_layer_is_named() -> None:
    net = nn.ModuleDict({"a": nn.GRU(4, 4), "b": nn.LSTM(4, 4, batch_first=True)})
    assert time_major_rnn(net, "a") == ("a", "GRU")
    assert time_major_rnn(net, "b") is None
    assert time_major_rnn(net, None) == ("a", "GRU")
    assert time_major_rnn(nn.ModuleList([nn.RNN(2, 2), nn.GRU(2, 2)]), None) is None
