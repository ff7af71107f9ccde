"""What `Triage()` costs a compiled fit (docs/benchmarks.md, "torch.compile").

The digits MLP of the demo with its network compiled by inductor (`torch.compile(net)`), fitted
with and without `Triage()` in the same process, interleaved: the fit's wall time, the graphs
the backend compiled (a recompilation caused by the callbacks would add one), the calls of
compiled code (the user's steps stay compiled), dynamo's graph-break count, and whether the
final weights are bit-identical. Each fit starts from empty dynamo caches; `--cold` turns
inductor's on-disk caches off too (every graph compiled from scratch).

    PYTHONPATH=src python benchmarks/compile_cost.py [--rounds 3] [--cold]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_triage import Triage
from lightning_triage.demo.digits import DigitsMLP, digits_loaders
from lightning_triage.testing import CountingBackend


def one_fit(with_triage: bool, root: Path, cold: bool) -> dict[str, Any]:
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    backend = CountingBackend("inductor")
    pl.seed_everything(0, verbose=False)
    model = DigitsMLP(lr=0.1)
    model.net = torch.compile(model.net, backend=backend)
    train, val = digits_loaders()
    callbacks = [Triage(report_dir=root, verbose=False)] if with_triage else []
    trainer = pl.Trainer(max_epochs=2, callbacks=callbacks, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=root)
    caches = inductor_config.patch(force_disable_caches=True) if cold else nullcontext()
    with caches:
        start = time.perf_counter()
        trainer.fit(model, train, val)
        seconds = time.perf_counter() - start
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {"fit_s": seconds, "graphs": backend.graphs, "calls": backend.calls,
            "graph_breaks": sum(counters["graph_break"].values()), "weights": weights,
            "steps": trainer.global_step}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="inductor's on-disk caches off")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        on, off = [], []
        for _ in range(args.rounds):  # interleaved: a shared machine drifts
            off.append(one_fit(False, Path(tmp) / "off", args.cold))
            on.append(one_fit(True, Path(tmp) / "on", args.cold))
    fit_on = statistics.median(r["fit_s"] for r in on)
    fit_off = statistics.median(r["fit_s"] for r in off)
    same = all(torch.equal(a["weights"], b["weights"]) for a, b in zip(on, off, strict=True))
    cache = "cold (inductor caches off)" if args.cold else "warm (inductor caches on)"
    print(f"compiled digits MLP, {on[0]['steps']} steps, {cache}, median of {args.rounds}:")
    print(f"  fit {fit_off:.2f} s without Triage, {fit_on:.2f} s with ({fit_on / fit_off:.2f}x)")
    print(f"  graphs compiled: {off[0]['graphs']} without, {on[0]['graphs']} with; compiled calls: "
          f"{off[0]['calls']} without, {on[0]['calls']} with")
    print(f"  graph breaks: {off[0]['graph_breaks']} without, {on[0]['graph_breaks']} with; "
          f"weights bit-identical: {same}")


if __name__ == "__main__":
    main()
