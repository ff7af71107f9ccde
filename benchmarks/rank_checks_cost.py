"""Cost of the data-parallel checks, measured in one process (no process group needed).

- ``ReplicaCheck``: one check (the checksums of every parameter and buffer, the gather, the
  comparison and its one host read), against an AdamW step of the same model; the gather is
  a local stack (on a real run it adds one collective of ``3 x tensors`` float64 values), and
  the per-step hook between two checks (an integer compare).
- ``RankDataCheck``: the fingerprints of one batch (a hash of 256 sampled values per example).

Not a test: run it by hand and record the numbers in docs/benchmarks.md.

    PYTHONPATH=src python benchmarks/rank_checks_cost.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from lightning_triage import ReplicaCheck
from lightning_triage.functional.data import example_fingerprints


def _ms(fn: Callable[[], Any], n: int, rounds: int = 5) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t) / n * 1e3)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                        nn.Linear(1024, 10))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()

    trainer = SimpleNamespace(world_size=2, global_step=0, global_rank=0, is_global_zero=True,
                              current_epoch=0, strategy=SimpleNamespace(
                                  all_gather=lambda t: torch.stack([t, t.clone()])))
    check = ReplicaCheck(check_every_n_steps=100, strict=True)
    check.on_train_start(trainer, net)  # type: ignore[arg-type]
    step_ms = _ms(step, 20)
    check_ms = _ms(lambda: check._check(trainer, "bench"), 20)  # type: ignore[arg-type]
    trainer.global_step = 7
    hook_us = _ms(lambda: check.on_train_batch_start(trainer, net, None, 0), 20000) * 1e3  # type: ignore[arg-type]
    batch = torch.randn(64, 3, 32, 32)
    fp_ms = _ms(lambda: example_fingerprints(batch), 50)
    params = sum(p.numel() for p in net.parameters())
    print(f"MLP of {params} parameters: AdamW step {step_ms:.2f} ms; one replica check "
          f"{check_ms:.3f} ms ({check_ms / step_ms:.1%} of a step, {check_ms / step_ms / 100:.3%} "
          f"per step at every 100 steps); between checks {hook_us:.2f} us per step")
    print(f"fingerprints of a 64 x 3 x 32 x 32 batch: {fp_ms:.3f} ms")


if __name__ == "__main__":
    main()
