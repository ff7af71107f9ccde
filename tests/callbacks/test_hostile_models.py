"""Models that hand the hooks unusual tensors: a seeded fit with and without ``Triage()`` must
give bit-identical weights, no crash and no false finding."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn

from lightning_triage import Triage
from lightning_triage.findings import Finding
from tests.helpers import loader, make_trainer


class SparseEmbeddingBag(pl.LightningModule):
    """Token classification over an ``nn.Embedding(sparse=True)``: sparse COO gradients."""

    def __init__(self, optimizer: str) -> None:
        super().__init__()
        self.optimizer = optimizer
        self.emb = nn.Embedding(50, 16, sparse=True)
        self.head = nn.Linear(16, 4)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(self.emb(tokens).mean(1))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        tokens, y = batch
        return nn.functional.cross_entropy(self(tokens), y)

    def configure_optimizers(self) -> Any:
        if self.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.5)
        # SparseAdam takes only sparse gradients: the dense head gets Adam (manual optimization)
        return [torch.optim.SparseAdam(list(self.emb.parameters()), lr=0.01),
                torch.optim.Adam(self.head.parameters(), lr=0.01)]


class ManualSparseAdam(SparseEmbeddingBag):
    def __init__(self) -> None:
        super().__init__("sparse_adam")
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        tokens, y = batch
        opts = self.optimizers()
        loss = nn.functional.cross_entropy(self(tokens), y)
        for opt in opts:
            opt.zero_grad()
        self.manual_backward(loss)
        for opt in opts:
            opt.step()
        return loss.detach()


def token_data(seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 50, (256, 6), generator=g)
    y = tokens[:, 0] % 4  # learnable from the first token
    return tokens, y


class MoE(pl.LightningModule):
    """Top-1 mixture of experts with a learned gate. Tokens go to one of the first three
    experts by a feature of the input; the fourth expert is routed to only for inputs above 10,
    which never come: it sees an empty ``(0, d)`` batch at every step."""

    def __init__(self, experts: int = 4, dim: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(8, dim)
        self.gate = nn.Linear(dim, experts)
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))
        self.head = nn.Linear(dim, classes)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.inp(x))
        choice = torch.bucketize(x[:, 2].contiguous(), torch.tensor([-0.5, 0.5, 10.0], device=x.device))
        weight = self.gate(h).softmax(-1).gather(1, choice[:, None])
        out = torch.zeros_like(h)
        for i, expert in enumerate(self.experts):
            rows = (choice == i).nonzero().flatten()
            out = out.index_add(0, rows, expert(h[rows]) * weight[rows])  # empty for expert 3
        return self.head(out + h)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def moe_data() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=g)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    return x, y


def fit(tmp_path: Path, make: Any, data: tuple[Tensor, ...], triage: Triage | None,
        **kwargs: Any) -> tuple[dict[str, Tensor], list[Finding]]:
    pl.seed_everything(0, verbose=False)
    model = make()
    trainer = make_trainer(tmp_path, [] if triage is None else [triage], max_epochs=2,
                           limit_train_batches=8, limit_val_batches=0, **kwargs)
    trainer.fit(model, loader(*data, batch_size=32, shuffle=True))
    findings = [] if triage is None else [f for c in triage.triage_checks for f in c.findings]
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, findings


def assert_identical(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("make", [lambda: SparseEmbeddingBag("sgd"), ManualSparseAdam],
                         ids=["sgd", "sparse_adam"])
def test_sparse_embedding(tmp_path: Path, make: Any) -> None:
    data = token_data()
    plain, _ = fit(tmp_path, make, data, None)
    triage = Triage(strict=True, verbose=False)
    watched, findings = fit(tmp_path, make, data, triage)
    assert_identical(plain, watched)
    problems = [f for f in findings if f.is_problem]
    assert problems == [], problems


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-true"])
def test_moe_with_an_empty_expert(tmp_path: Path, precision: str) -> None:
    data = moe_data()
    plain, _ = fit(tmp_path, MoE, data, None, precision=precision)
    triage = Triage(strict=True, verbose=False)
    watched, findings = fit(tmp_path, MoE, data, triage, precision=precision)
    assert_identical(plain, watched)
    problems = [f for f in findings if f.is_problem]
    # the expert that never gets a token really has a zero gradient: the one true finding
    assert [f.code for f in problems] == ["wiring.zero_grad_params"], problems
    assert problems[0].evidence["modules"] == ["experts.3"]


# ---------------------------------------------------------------------- every tensor kind
def tensor_kinds() -> dict[str, Tensor]:
    """The tensors a hook can meet that exist on CPU (non-zero values, one NaN-free each)."""
    dense = torch.tensor([[0.0, -2.0, 0.5], [1.0, 0.0, 0.0]])
    return {
        "dense": dense,
        "empty": torch.zeros(0, 16),
        "empty_half": torch.zeros(0, 16, dtype=torch.bfloat16),
        "sparse_coo": dense.to_sparse(),
        "sparse_coo_uncoalesced": torch.sparse_coo_tensor([[0, 0, 1]], [[1.0, 2.0, 0.0]] * 3,
                                                          (2, 3)),
        "sparse_csr": dense.to_sparse_csr(),
        "complex": torch.tensor([3 + 4j, 0j]),
        "integer": torch.tensor([0, -7, 2]),
        "bool": torch.tensor([False, True]),
        "quantized": torch.quantize_per_tensor(dense, 0.5, 0, torch.qint8),
        "meta": torch.empty(2, 3, device="meta"),
        "nested": torch.nested.nested_tensor([torch.ones(2, 3), -2 * torch.ones(1, 3)]),
        "nested_jagged": torch.nested.nested_tensor([torch.ones(2, 3), -2 * torch.ones(1, 3)],
                                                    layout=torch.jagged),
        "half": dense.half(),
    }


EXPECTED_PEAK = {"dense": 2.0, "empty": None, "empty_half": None, "sparse_coo": 2.0,
                 "sparse_coo_uncoalesced": 2.0, "sparse_csr": 2.0, "complex": 5.0,
                 "integer": 7.0, "bool": 1.0, "quantized": 2.0, "meta": None, "nested": 2.0,
                 "nested_jagged": 2.0, "half": 2.0}


@pytest.mark.parametrize("kind", sorted(EXPECTED_PEAK))
def test_tensor_readers_handle_every_kind(kind: str) -> None:
    from lightning_triage.functional.nonfinite import max_abs, tensor_stats
    from lightning_triage.functional.tensors import abs_peak, any_nonzero

    t = tensor_kinds()[kind]
    peak = abs_peak(t)
    expected = EXPECTED_PEAK[kind]
    assert (None if peak is None else float(peak)) == expected
    total = max_abs([t])
    assert (None if total is None else float(total)) == expected
    nonzero = any_nonzero(t)
    if kind == "meta":
        assert nonzero is None
    else:
        assert nonzero is not None and bool(nonzero) == (expected is not None)
    stats = tensor_stats(t)
    assert stats.nan == 0 and stats.inf == 0
    assert stats.max_abs == (expected or 0.0)


def test_uncoalesced_duplicates_that_cancel_are_zero() -> None:
    from lightning_triage.functional.tensors import any_nonzero

    cancel = torch.sparse_coo_tensor([[1, 1]], [2.0, -2.0], (3,))
    assert not bool(any_nonzero(cancel))


@pytest.mark.parametrize("kind", ["sparse_coo", "sparse_coo_uncoalesced", "nested", "half",
                                  "complex"])
def test_gradients_nonfinite_reads_any_gradient_layout(kind: str) -> None:
    from lightning_triage.functional.nonfinite import gradients_nonfinite

    finite = tensor_kinds()[kind]
    flag = gradients_nonfinite([finite, torch.ones(2)])
    assert flag is not None and float(flag) == 0.0
    bad = {"sparse_coo": torch.sparse_coo_tensor([[0]], [float("nan")], (3,)),
           "sparse_coo_uncoalesced": torch.sparse_coo_tensor([[0, 0]], [1.0, float("inf")], (3,)),
           "nested": torch.nested.nested_tensor([torch.ones(2), torch.tensor([float("nan")])]),
           "half": torch.tensor([float("inf")], dtype=torch.half),
           "complex": torch.tensor([complex(float("nan"), 0)])}[kind]
    flag = gradients_nonfinite([torch.ones(2), bad])
    assert flag is not None and float(flag) > 0


def test_alive_units_of_a_sparse_gradient() -> None:
    from lightning_triage.functional.gradients import alive_units

    emb = nn.Embedding(6, 3, sparse=True)
    emb(torch.tensor([1, 4, 4])).sum().backward()
    assert emb.weight.grad is not None and emb.weight.grad.is_sparse
    assert alive_units(emb.weight.grad).tolist() == [False, True, False, False, True, False]
    assert alive_units(torch.zeros(0, 3)).tolist() == []


class _Param:
    """Stands for a parameter in a post-accumulate-grad hook: only ``.grad`` is read."""

    def __init__(self, grad: Tensor) -> None:
        self.grad = grad


@pytest.mark.parametrize("kind", sorted(EXPECTED_PEAK))
def test_wiring_gradient_hook_handles_every_kind(kind: str) -> None:
    from lightning_triage import GradientWiringCheck

    check = GradientWiringCheck(strict=True)
    hook = check._make_hook(None, "w")  # type: ignore[arg-type]
    hook(_Param(tensor_kinds()[kind]))
    assert not check.disabled and check._received == {"w"}
    # an empty or data-less gradient is never reported as "exactly zero"
    assert bool(check._nonzero["w"]) is True


@pytest.mark.parametrize("kind", sorted(EXPECTED_PEAK))
def test_near_overflow_sampler_hook_handles_every_kind(kind: str) -> None:
    from lightning_triage import NonFiniteTracer

    tracer = NonFiniteTracer(strict=True)
    layer = nn.Identity()
    tracer._sample_outputs(None, layer)  # type: ignore[arg-type]
    layer(tensor_kinds()[kind])
    assert tracer._peaks is not None
    half = kind in ("half", "empty_half")
    assert [name for name, _ in tracer._peaks] == ([""] if kind == "half" else [])
    assert half or not tracer._peaks
    tracer.remove_handles()


@pytest.mark.parametrize("kind", sorted(EXPECTED_PEAK))
def test_head_capture_hook_handles_every_kind(kind: str) -> None:
    from lightning_triage.functional.hooks import capture_last_output

    layer = nn.Identity()
    t = tensor_kinds()[kind]
    with capture_last_output(layer) as captured:
        layer(t)
    # an ordinary floating tensor with a batch dimension is taken as the head output, and so is
    # a nested one (a fast path's output, e.g. `TransformerEncoder` in eval with a padding
    # mask), in its zero-padded strided form
    takes = kind in ("dense", "empty", "empty_half", "half", "nested", "nested_jagged")
    assert (captured.output is not None) == takes
    assert captured.output is None or not captured.output.is_nested


def test_a_failing_forward_hook_disables_its_check_and_never_reaches_the_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import lightning_triage.callbacks.nonfinite_tracer as tracer_module

    def broken(t: Tensor) -> Tensor:
        raise RuntimeError("injected fault in the sampler")

    data = moe_data()
    plain, _ = fit(tmp_path, MoE, data, None, precision="bf16-mixed")
    monkeypatch.setattr(tracer_module, "abs_peak", broken)
    triage = Triage(verbose=False)  # not strict: the fault must be contained
    watched, findings = fit(tmp_path, MoE, data, triage, precision="bf16-mixed")
    assert_identical(plain, watched)
    errors = [f for f in findings if f.code == "triage.check_error"]
    assert [(f.check, f.evidence["hook"]) for f in errors] == [("NonFiniteTracer",
                                                                 "forward hook")]
    tracer = next(c for c in triage.triage_checks if c.check_name == "NonFiniteTracer")
    assert tracer.disabled and tracer.check_status()["status"] == "error"
    others = [c for c in triage.triage_checks if c is not tracer]
    assert not any(c.disabled for c in others)


def test_a_failing_gradient_hook_disables_its_check_and_never_reaches_the_backward(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import lightning_triage.callbacks.gradient_wiring as wiring_module

    real = wiring_module.any_nonzero

    def broken(t: Tensor) -> Tensor:
        # only in the gradient hook (the check also reads the parameters' values at its start)
        caller = inspect.currentframe().f_back  # type: ignore[union-attr]
        if caller is not None and caller.f_code.co_name == "hook":
            raise RuntimeError("injected fault in the gradient hook")
        return real(t)

    data = token_data()
    make = lambda: SparseEmbeddingBag("sgd")  # noqa: E731
    plain, _ = fit(tmp_path, make, data, None)
    monkeypatch.setattr(wiring_module, "any_nonzero", broken)
    triage = Triage(verbose=False)
    watched, findings = fit(tmp_path, make, data, triage)
    assert_identical(plain, watched)
    errors = [(f.check, f.evidence["hook"]) for f in findings if f.code == "triage.check_error"]
    assert errors == [("GradientWiringCheck", "gradient hook")]
    assert not any(f.stage == "wiring" and f.code != "triage.check_error" for f in findings)
