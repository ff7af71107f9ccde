"""Fixed reports for the printed-output tests (golden files, HTML, CLI): built from findings
with `build_report`, so they do not depend on a training trajectory."""

from __future__ import annotations

import math
from typing import Any

from lightning_triage.findings import Finding
from lightning_triage.report import build_report

RUN: dict[str, Any] = {
    "lightning": "2.6.6", "torch": "2.13.0", "precision": "32-true", "strategy": "single_device",
    "world_size": 1, "global_step": 120, "epochs": 2, "model": "DigitsMLP",
    "trainable_params": 2410, "seed": 0, "hparams": {"lr": 50.0, "hidden": 32},
    "optimizers": [{"class": "SGD", "param_groups": 1, "lr": 50.0}], "lr_schedulers": [],
    "batch_size": 32,
}


def broken_report() -> dict[str, Any]:
    """Diverging run: long messages (wrapping), a layer, NaN frames, plots' details."""
    findings = [
        Finding.create(
            "data.unnormalized_input",
            "training batch 0 (step 0): float input `batch[0]` (float32 (32, 64)) has values in "
            "[0, 16], mean 4.947, std 6.043, root mean square 7.808: far from standardized "
            "(rms > 4; standardized inputs have rms ~1).",
            check="BatchInspector", global_step=0, epoch=0,
            evidence={"rms": 7.808, "mean": 4.947, "std": 6.043}),
        Finding.create(
            "curve.diverging",
            "the training loss became inf at step 12 so early that the learning rate is the first "
            "suspect (step-0 loss 2.329, last finite value 4.157e+34).",
            check="LossCurveMonitor", global_step=12, epoch=0,
            evidence={"first_nonfinite_step": 12, "step0": 2.329}),
        Finding.create(
            "grad.exploding", "gradient norms grew 1e9x in 12 steps (median 1.044e+09 before).",
            check="GradientMonitor", global_step=12, epoch=0, evidence={"median_before": 1.044e9}),
        Finding.create(
            "numerics.nonfinite_forward",
            "step 12: the output of module `net.2` (Linear) is the first non-finite value.",
            check="NonFiniteTracer", global_step=12, epoch=0, layer="net.2",
            evidence={"frames": [
                {"module": "net.0", "max_abs": 3.1e30, "nan": 0, "inf": 0, "numel": 1024,
                 "dtype": "float32", "inputs_finite": True},
                {"module": "net.1", "max_abs": 3.1e30, "nan": 0, "inf": 0, "numel": 1024,
                 "dtype": "float32", "inputs_finite": True},
                {"module": "net.2", "max_abs": 0.0, "nan": 0, "inf": 320, "numel": 320,
                 "dtype": "float32", "inputs_finite": True}]}),
        Finding.create("overfit.passed", "memorized 8 examples in 40 steps.",
                       check="OverfitBatchCheck", global_step=0),
    ]
    checks = [{"check": c, "status": s, "detail": d} for c, s, d in (
        ("BatchInspector", "failed", "inspected 13 training batches"),
        ("InitialLossCheck", "passed", "step-0 loss 2.329 vs chance ln(10) = 2.303 (1.01x)"),
        ("GradientWiringCheck", "passed", "4/4 parameter tensors got a gradient"),
        ("OverfitBatchCheck", "passed", "loss 2.3 -> 0.01 in 40 steps"),
        ("StructureProbe", "skipped", "no forward found"),
        ("EvalModeCheck", "passed", "0 layers in training mode"),
        ("LossCurveMonitor", "failed", ""), ("GradientMonitor", "failed", ""),
        ("NonFiniteTracer", "failed", ""))]
    steps = list(range(13))
    series = {
        "train_loss": [[s, 2.3 * 10 ** (3 * s)] for s in steps[:-1]] + [[12, math.inf]],
        "val_loss": [[6, 1e10]],
        "grad_norm": [[s, 10.0 ** s] for s in steps],
    }
    details = {
        "initial_loss": {"loss": 2.329, "chance": 2.303, "chance_formula": "ln(10) = 2.303"},
        "chance": {"chance": 2.303, "task": "multiclass"},
        "grad_layers": {"layers": ["net.0", "net.2"], "steps": steps,
                        "norms": [[10.0 ** s, 2 * 10.0 ** s] for s in steps]},
        "first_batch": {"split": "train", "batch_idx": 0, "global_step": 0, "tensor": "batch[0]",
                        "target": "batch[1]", "shape": [32, 64], "dtype": "float32",
                        "kind": "table", "examples": [[float(i + j) for j in range(16)]
                                                      for i in range(8)],
                        "image_shape": [8, 8],
                        "pixels": [[float((i * j) % 17) for j in range(64)] for i in range(8)],
                        "targets": list(range(8))},
    }
    report = build_report(findings, status="completed", run=dict(RUN, global_step=13),
                          checks=checks, series=series, details=details)
    for f in report["findings"]:  # as the "cause before symptom" ordering marks a symptom
        if f["code"] == "grad.exploding":
            f["explained_by"] = ["curve.diverging"]
    return report


def healthy_report() -> dict[str, Any]:
    findings = [
        Finding.create("overfit.passed", "memorized 8 examples in 40 steps.",
                       check="OverfitBatchCheck", global_step=0),
        Finding.create("curve.healthy", "the loss fell from 2.3 to 0.4.",
                       check="LossCurveMonitor", global_step=100),
    ]
    checks = [{"check": "InitialLossCheck", "status": "passed", "detail": "1.01x chance"},
              {"check": "LossCurveMonitor", "status": "passed", "detail": ""}]
    series = {"train_loss": [[s, 2.3 * 0.98 ** s] for s in range(0, 120, 5)]}
    run = dict(RUN, hparams={"lr": 0.1},
               optimizers=[{"class": "SGD", "param_groups": 1, "lr": 0.1}])
    return build_report(findings, status="completed", run=run,
                        checks=checks, series=series,
                        details={"initial_loss": {"loss": 2.31, "chance": 2.303}})
