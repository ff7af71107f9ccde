"""Which layers behave differently in training mode."""

from __future__ import annotations

from torch import nn

from lightning_triage.findings import CODES
from lightning_triage.functional.mode import mode_sensitive_in_training, train_mode_in_eval


def test_mode_sensitive_layers() -> None:
    net = nn.Sequential(nn.Linear(2, 4), nn.Dropout(0.0), nn.BatchNorm1d(4),
                        nn.BatchNorm1d(4, track_running_stats=False), nn.Dropout(0.5),
                        nn.MultiheadAttention(4, 2, dropout=0.1), nn.LayerNorm(4))
    assert mode_sensitive_in_training(net) == ["2", "4", "5"]
    net.eval()
    net[4].train()
    assert mode_sensitive_in_training(net) == ["4"]


def test_train_mode_rule_returns_a_verdict_with_the_numbers_and_no_advice() -> None:
    net = nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4), nn.Dropout(0.5)).eval()
    assert train_mode_in_eval(net, 3) is None
    net.train()
    v = train_mode_in_eval(net, 3, phase="the sanity check", when="at the first validation batch")
    assert v is not None and v.code == "mode.train_mode_in_eval" and v.step == 3
    assert v.layer == "1" and v.evidence["num_modules"] == 2
    assert v.evidence["module_types"] == ["BatchNorm1d", "Dropout"]
    assert v.message == ("During the sanity check (at the first validation batch), 2 mode-sensitive "
                         "layer(s) were in training mode: `1`, `2` (BatchNorm1d, Dropout).")
    assert ".train()" in CODES[v.code].hint  # the advice is the registry's
