"""Extra memory and time of BatchInspector on huge batches (244 MiB of float32 per batch).

Run: PYTHONPATH=src python benchmarks/bench_batch_memory.py [batches]

Each configuration runs in a fresh subprocess (peak RSS is per process): a fit over
``batches`` pre-built batches of shape (500, 3, 200, 213) float32 (244 MiB) with integer
targets, through a model that pools the input (cheap, so the inspection dominates). The peak
RSS (VmHWM, reset just before ``fit``: Linux only) is measured from the start of ``fit``;
reported: the peak above the bare run's and the wall time per batch above the bare run's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

SHAPE = (500, 3, 200, 213)


def child(with_inspector: bool, batches: int) -> None:
    import warnings

    import lightning.pytorch as pl
    import torch
    from torch import nn

    from lightning_triage import BatchInspector

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(SHAPE, generator=g).mul_(3).add_(1),
             torch.randint(0, 10, (SHAPE[0],), generator=g)) for _ in range(batches)]

    class Pool(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Linear(3, 10)

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            x, y = batch
            return nn.functional.cross_entropy(self.head(x.mean((2, 3))), y)

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callbacks = [BatchInspector(probe=False)] if with_inspector else []
    trainer = pl.Trainer(max_epochs=1, callbacks=callbacks, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    before = _rss("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM) to the current RSS
        f.write("5")
    start = time.perf_counter()
    trainer.fit(Pool(), loader)
    elapsed = time.perf_counter() - start
    print(json.dumps({"seconds": elapsed, "peak_mib": _rss("VmHWM") - before,
                      "base_mib": before}))


def _rss(field: str) -> float:
    """A memory field of /proc/self/status in MiB (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2] == "1", int(sys.argv[3]))
        return
    batches = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    results = {}
    for flag in ("0", "1", "0", "1"):
        out = subprocess.run([sys.executable, __file__, "--child", flag, str(batches)],
                             capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        prev = results.get(flag)
        results[flag] = r if prev is None else {
            "seconds": min(prev["seconds"], r["seconds"]),
            "peak_mib": min(prev["peak_mib"], r["peak_mib"]), "base_mib": r["base_mib"]}
    bare, watched = results["0"], results["1"]
    mib = 4 * SHAPE[0] * SHAPE[1] * SHAPE[2] * SHAPE[3] / 2**20
    extra = watched["peak_mib"] - bare["peak_mib"]
    print(f"{batches} batches of {mib:.0f} MiB: peak RSS growth during fit: bare "
          f"{bare['peak_mib']:.0f} MiB, with BatchInspector {watched['peak_mib']:.0f} MiB: "
          f"+{extra:.0f} MiB "
          f"({extra / mib:.2f}x one batch); time +"
          f"{(watched['seconds'] - bare['seconds']) / batches:.2f} s per batch")


if __name__ == "__main__":
    main()
