"""The objective a step optimizes, read by watching its loss calls (no Trainer): each loss's chance
level is the loss of uniform predictions (checked against the real function at zero logits), its
floor, its lower bound, and how the step's loss relates to the calls."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_triage._torch_compat import exit_function_mode
from lightning_triage.functional.draws import DrawWatch
from lightning_triage.functional.loss_terms import describe_call
from lightning_triage.functional.objective import (
    ObjectiveWatch,
    StepObjective,
    infer_objective,
    library_code,
    unwatched,
    watching,
)

G = torch.Generator().manual_seed(0)


def watched(fn):  # type: ignore[no-untyped-def]
    with ObjectiveWatch() as watch:
        loss = fn()
    return watch.objective(float(loss), loss.grad_fn), loss


def test_hard_targets_chance_is_ln_c_and_the_floor_zero() -> None:
    logits = torch.zeros(16, 10, requires_grad=True)
    y = torch.randint(0, 10, (16,), generator=G)
    objective, loss = watched(lambda: F.cross_entropy(logits, y))
    assert objective.match == "single" and objective.known
    assert objective.chance == pytest.approx(math.log(10)) == pytest.approx(float(loss))
    assert objective.floor == 0.0 and objective.lower_bound == 0.0 and objective.bounded_below
    assert objective.describe() == "cross-entropy over 10 classes"
    level = objective.chance_level()
    assert level is not None and level.describe() == "ln(10) = 2.303 for 10 classes"


def test_label_smoothing_floors_at_the_smoothed_targets_entropy() -> None:
    logits = torch.zeros(8, 10)
    objective, _ = watched(lambda: F.cross_entropy(logits, torch.arange(8) % 10,
                                                   label_smoothing=0.2))
    q = 0.2 / 10
    expected = -(0.8 + q) * math.log(0.8 + q) - 9 * q * math.log(q)
    assert objective.floor == pytest.approx(expected)
    assert objective.chance == pytest.approx(math.log(10))
    assert "label smoothing 0.2" in objective.describe()


def test_soft_targets_chance_ln_c_and_floor_their_entropy() -> None:
    soft = torch.softmax(torch.randn(8, 10, generator=G), 1)
    logits = torch.zeros(8, 10)
    objective, loss = watched(lambda: F.cross_entropy(logits, soft))
    term = objective.term
    assert term is not None and term.kind == "soft_targets" and term.target_form == "soft"
    assert objective.chance == pytest.approx(float(loss), rel=1e-5)
    entropy = float(-(soft * soft.log()).sum(1).mean())
    assert objective.floor == pytest.approx(entropy, rel=1e-5)
    # one-hot float targets are hard targets
    onehot = F.one_hot(torch.arange(8) % 10, 10).float()
    objective, _ = watched(lambda: F.cross_entropy(logits, onehot))
    assert objective.term is not None and objective.term.kind == "multiclass"
    assert objective.floor == 0.0


def test_masked_lm_counts_masked_positions_only() -> None:
    logits = torch.zeros(4, 12, 50)
    y = torch.full((4, 12), -100)
    y[:, ::4] = 7  # a quarter of the positions scored
    objective, loss = watched(lambda: F.cross_entropy(logits.transpose(1, 2), y))
    term = objective.term
    assert term is not None and term.kind == "masked_lm" and term.num_classes == 50
    assert term.facts["ignore_share"] == pytest.approx(0.75)
    assert objective.chance == pytest.approx(float(loss))
    assert "25% of positions" in objective.describe()


def test_in_batch_negatives_have_chance_ln_b_and_no_floor() -> None:
    a = F.normalize(torch.randn(32, 16, generator=G), dim=-1)
    b = F.normalize(torch.randn(32, 16, generator=G), dim=-1)
    labels = torch.arange(32)

    def clip(scale: float) -> torch.Tensor:
        logits = scale * a @ b.T
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2

    objective, loss = watched(lambda: clip(1 / 0.07))
    assert objective.match == "mean" and objective.known
    assert objective.chance == pytest.approx(math.log(32))
    assert objective.floor is None and not objective.has_floor
    assert "in-batch negatives" in objective.describe()
    # the scale applied twice: far above ln B
    _twice, hot = watched(lambda: clip((1 / 0.07) ** 2))
    assert float(hot) > 3 * math.log(32) > float(loss) / 2


def test_multilabel_bce_chance_from_pos_weight() -> None:
    y = (torch.rand(64, 8, generator=G) < 0.15).float()
    rate = y.mean(0).clamp_min(1 / 64)
    criterion = nn.BCEWithLogitsLoss(pos_weight=(1 - rate) / rate)
    logits = torch.zeros(64, 8)
    objective, loss = watched(lambda: criterion(logits, y))
    term = objective.term
    assert term is not None and term.kind == "multilabel" and term.target_form == "multilabel"
    assert objective.chance == pytest.approx(float(loss), rel=1e-5)
    assert objective.chance != pytest.approx(math.log(2), rel=0.05)
    assert term.facts["prior"] < objective.chance  # the best constant beats uniform
    assert "pos_weight" in objective.describe()


@pytest.mark.parametrize("reduction", ["batchmean", "mean", "sum"])
def test_kl_distillation_chance_is_the_kl_to_a_uniform_student(reduction: str) -> None:
    teacher = torch.softmax(torch.randn(8, 10, generator=G) / 4, 1)
    student = torch.full((8, 10), -math.log(10))
    objective, loss = watched(lambda: F.kl_div(student, teacher, reduction=reduction))
    assert objective.term is not None and objective.term.kind == "distillation"
    assert objective.chance == pytest.approx(float(loss), rel=1e-5, abs=1e-7)
    assert objective.floor == 0.0


def test_sum_reduction_scales_the_chance() -> None:
    logits = torch.zeros(16, 5)
    objective, loss = watched(lambda: F.cross_entropy(logits, torch.arange(16) % 5,
                                                      reduction="sum"))
    assert objective.chance == pytest.approx(float(loss)) == pytest.approx(16 * math.log(5))


def test_composite_and_scaled_losses() -> None:
    w = torch.zeros(8, 10, requires_grad=True)
    y = torch.arange(8) % 10
    teacher = torch.softmax(torch.randn(8, 10, generator=G), 1)

    def distill() -> torch.Tensor:
        kl = F.kl_div(F.log_softmax(w / 4, 1), teacher, reduction="batchmean")
        return 0.9 * kl * 16 + 0.1 * F.cross_entropy(w, y)

    objective, _ = watched(distill)
    assert objective.match == "composite" and not objective.known
    assert objective.recognized and objective.chance is None and objective.chance_level() is None
    assert "composite" in objective.describe() and "`kl_div`" in objective.describe()
    # a hand-written term added to one call: composite, not a scaled cross-entropy
    objective, _ = watched(lambda: 0.1 * F.cross_entropy(w, y) + w.pow(2).sum())
    assert objective.match == "composite"
    # the mean divided by the batch size again: the call times a constant, still judged
    objective, _loss = watched(lambda: F.cross_entropy(w, y) / 8)
    assert objective.match == "scaled" and objective.known
    assert objective.scale == pytest.approx(1 / 8)
    assert objective.chance == pytest.approx(math.log(10))
    assert "0.125x `cross_entropy`" in objective.describe()
    # a scaled KL (T^2) alone is not judged
    objective, _ = watched(lambda: F.kl_div(F.log_softmax(w, 1), teacher,
                                            reduction="batchmean") * 16)
    assert objective.match == "scaled" and not objective.known


def test_no_recognized_call_and_unknown_chances() -> None:
    x = torch.randn(8, 4, generator=G)
    objective, _ = watched(lambda: (x - 1).pow(2).mean())
    assert objective.match == "none" and not objective.recognized
    assert objective.describe() == "no recognized loss function"
    a, p, n = (torch.randn(8, 32, generator=G) for _ in range(3))
    objective, _ = watched(lambda: F.triplet_margin_loss(a, p, n))
    assert objective.known and objective.chance is None and objective.chance_level() is None
    assert objective.describe() == "a metric-learning loss"
    assert infer_objective([], None).match == "none"


def test_lower_bounds() -> None:
    mu, target = torch.zeros(8, 2), torch.randn(8, 2, generator=G)
    objective, _ = watched(lambda: F.gaussian_nll_loss(mu, target, torch.ones(8, 2)))
    assert objective.lower_bound == pytest.approx(0.5 * math.log(1e-6))
    assert objective.bounded_below
    objective, _ = watched(lambda: F.poisson_nll_loss(mu, target.abs()))
    assert not objective.bounded_below
    objective, _ = watched(lambda: F.mse_loss(mu, target))
    level = objective.chance_level()
    assert objective.lower_bound == 0.0 and level is not None and level.task == "regression"
    assert level.value == pytest.approx(float(target.double().var(unbiased=False)), rel=1e-6)


def test_fresh_draws_mean_no_floor() -> None:
    x0 = torch.randn(8, 4, generator=G)

    def step() -> torch.Tensor:
        noise = torch.randn_like(x0)
        t = torch.randint(0, 100, (8,))
        return F.mse_loss(x0 + noise * t[:, None] / 100, noise)

    objective, _ = watched(step)
    assert objective.fresh_draws and objective.draws == ("randn_like", "randint")
    assert objective.known and objective.floor is None and not objective.has_floor
    assert "fresh random draw" in objective.describe()


def test_the_watch_only_observes() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))

    def run(watch: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        torch.manual_seed(1)
        net.zero_grad()
        if watch:
            with ObjectiveWatch():
                loss = nn.CrossEntropyLoss(label_smoothing=0.1)(net(x), y)
        else:
            loss = nn.CrossEntropyLoss(label_smoothing=0.1)(net(x), y)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in net.parameters()]  # type: ignore[union-attr]

    (plain, grads), (seen, seen_grads) = run(False), run(True)
    assert torch.equal(plain, seen)
    assert all(torch.equal(a, b) for a, b in zip(grads, seen_grads, strict=True))


def test_unwatched_and_library_code_hide_the_block_from_outer_watches() -> None:
    assert not watching()
    with ObjectiveWatch() as outer:
        assert watching()
        with library_code():
            _ = torch.randn(2)
            with ObjectiveWatch() as inner:  # a probe's watch sees its own block
                _ = F.mse_loss(torch.zeros(2), torch.ones(2))
        with unwatched():
            _ = F.mse_loss(torch.zeros(2), torch.ones(2))
    assert not watching()
    assert outer.draws == [] and outer.calls == []
    assert [c.name for c in inner.calls] == ["mse_loss"]


def test_step_objective_across_hooks_and_compiled_modules() -> None:
    net = nn.Linear(3, 4)
    step = StepObjective()
    with library_code():  # a hook of the library starts the watch of the user's step
        step.start(net)
    other = DrawWatch()
    other.__enter__()  # a mode entered after ours, still on the stack when ours stops
    loss = F.cross_entropy(net(torch.randn(8, 3)), torch.arange(8) % 4)
    step.stop(loss)
    assert torch.overrides._get_current_function_mode_stack() == [other]
    exit_function_mode(other)
    objective = step.finish(float(loss))
    assert objective is not None and objective.match == "single" and not step.active
    compiled = nn.Linear(3, 4)
    compiled.compile()
    step.start(compiled)
    assert "compiled" in step.skipped and step.finish(1.0) is None


def test_calls_with_arguments_it_cannot_read_are_kept_unknown() -> None:
    call = describe_call(F.cross_entropy, (torch.zeros(2, 3),), {"bogus": 1}, torch.tensor(1.0))
    assert call is not None and call.kind == "other" and not math.isfinite(call.lower_bound)
    assert describe_call(torch.add, (), {}, torch.tensor(1.0)) is None


def test_a_robust_regression_loss_is_heavy_tailed_and_squared_error_is_not() -> None:
    pred, y = torch.zeros(16, requires_grad=True), torch.randn(16, generator=G)
    for loss_fn, heavy in ((nn.HuberLoss(), True), (nn.SmoothL1Loss(), True),
                           (nn.L1Loss(), True), (nn.MSELoss(), False)):
        objective, _ = watched(lambda loss_fn=loss_fn: loss_fn(pred, y))
        assert objective.heavy_tailed is heavy, loss_fn
        assert not objective.noisy, loss_fn  # its pace is still judged


def test_augmentation_in_a_classifier_step_is_not_a_noisy_objective() -> None:
    net, x = nn.Linear(4, 3), torch.randn(8, 4, generator=G)
    y = torch.randint(0, 3, (8,), generator=G)

    def augmented() -> torch.Tensor:  # input noise and a random feature drop, hard labels
        keep = torch.rand(8, 4) > 0.1
        return F.cross_entropy(net((x + 0.1 * torch.randn_like(x)) * keep), y,
                               label_smoothing=0.1)

    objective, _ = watched(augmented)
    assert objective.fresh_draws and objective.augmented and not objective.noisy

    def diffusion() -> torch.Tensor:  # the target itself is drawn
        noise = torch.randn_like(x)
        return F.mse_loss(net(x + noise)[:, :1].expand(8, 4), noise)

    def policy() -> torch.Tensor:  # the "labels" are actions sampled from the model
        logits = net(x)
        return F.cross_entropy(logits, torch.multinomial(logits.softmax(1), 1).squeeze(1))

    def mixup() -> torch.Tensor:  # soft targets drawn per step
        lam = float(torch.rand(()))
        return F.cross_entropy(net(x), lam * F.one_hot(y, 3).float()
                               + (1 - lam) * F.one_hot(y.flip(0), 3).float())

    def gan() -> torch.Tensor:  # real/fake labels made in the step, a latent drawn
        fake = net(torch.randn(8, 4))[:, 0]
        return F.binary_cross_entropy_with_logits(fake, torch.ones(8))

    for step in (diffusion, policy, mixup, gan):
        objective, _ = watched(step)
        assert not objective.augmented and objective.noisy, step.__name__


def test_nt_xent_pairs_are_in_batch_negatives() -> None:
    z = F.normalize(torch.randn(8, 4, generator=G), dim=1)
    sim = (z @ z.T).masked_fill(torch.eye(8, dtype=torch.bool), -1e9)
    targets = torch.cat([torch.arange(4, 8), torch.arange(0, 4)])  # view i pairs with i + N
    objective, _ = watched(lambda: F.cross_entropy(sim, targets))
    assert objective.term is not None and objective.term.kind == "in_batch_negatives"
    assert objective.noisy and objective.floor is None
