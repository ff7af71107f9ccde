"""Which layers behave differently in training mode."""

from __future__ import annotations

from torch import nn

from lightning_triage.functional.mode import mode_sensitive_in_training


def test_mode_sensitive_layers() -> None:
    net = nn.Sequential(nn.Linear(2, 4), nn.Dropout(0.0), nn.BatchNorm1d(4),
                        nn.BatchNorm1d(4, track_running_stats=False), nn.Dropout(0.5),
                        nn.MultiheadAttention(4, 2, dropout=0.1), nn.LayerNorm(4))
    assert mode_sensitive_in_training(net) == ["2", "4", "5"]
    net.eval()
    net[4].train()
    assert mode_sensitive_in_training(net) == ["4"]
