"""Know the objective: what a training step optimizes, read by watching the step.

Chance level and the memorization floor belong to the objective, not to "classification":
soft targets (mixup, cutmix, distillation) floor at their own entropy, multilabel BCE has its
chance from the label priors and ``pos_weight``, a contrastive loss with in-batch negatives
starts at ``ln B``, and objectives that draw a fresh noise, mask or timestep each step
(diffusion, flow matching, masked autoencoders) have no floor a one-batch probe can reach.

An :class:`ObjectiveWatch` (a torch function mode, like
:class:`~lightning_triage.functional.draws.DrawWatch`, which it extends) records the loss
functions the step calls (:func:`~lightning_triage.functional.loss_terms.describe_call`) and
its random draws; :meth:`ObjectiveWatch.objective` matches them with the loss the step returned
and gives an :class:`Objective`. When the step's loss is one recognized term (or the sum or the
mean of the recognized terms, as CLIP's two directions), the objective is *known*: its chance
level, floor and lower bound are the term's. Otherwise (several terms weighted and summed:
distillation ``KL * T^2 + 0.1 * CE``, an auxiliary load-balancing loss) it is *composite* and a
check that needs a chance level says it cannot judge. The watch only observes: every call runs
as it is, with the same arguments.

Example:
    >>> import torch
    >>> import torch.nn.functional as F
    >>> logits, y = torch.randn(32, 32, generator=torch.Generator().manual_seed(0)), torch.arange(32)
    >>> with ObjectiveWatch() as watch:
    ...     loss = (F.cross_entropy(logits, y) + F.cross_entropy(logits.T, y)) / 2
    >>> objective = watch.objective(float(loss))
    >>> objective.known, round(objective.chance, 3), objective.floor
    (True, 3.466, None)
    >>> objective.describe()
    'a contrastive loss with in-batch negatives (32 candidates) (the mean of 2 terms)'
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor, nn

from lightning_triage._torch_compat import exit_function_mode
from lightning_triage.functional.chance import ChanceLevel
from lightning_triage.functional.compiled import compiled_functions, compiled_parts
from lightning_triage.functional.draws import DrawWatch
from lightning_triage.functional.loss_terms import (
    LOSS_FUNCTIONS,
    ROBUST_LOSSES,
    LossCall,
    describe_call,
)

#: How the step's loss relates to the recognized calls.
Match = Literal["single", "sum", "mean", "scaled", "composite", "none"]
#: The kinds whose chance level still judges a loss that is their one call times a constant
#: (the mean divided by the batch size again is a bug); a scaled KL (``KL * T^2``) is not judged.
_SCALE_JUDGED = ("multiclass", "sequence", "masked_lm", "soft_targets", "in_batch_negatives",
                 "multilabel", "binary", "regression")
#: The kinds that score the batch's own hard labels (a draw in their step is augmentation).
_HARD_LABEL_KINDS = ("multiclass", "sequence", "binary", "multilabel")
_HARD_FORMS = ("indices", "one_hot", "binary", "multilabel")
#: Draws that sample from the model's outputs (an action, a token), not augmentation.
_SAMPLING_DRAWS = frozenset({"multinomial", "gumbel_softmax"})
#: At most this many loss calls are kept per watch.
MAX_CALLS = 32
#: Relative tolerance of "the step's loss is this term".
MATCH_RTOL = 1e-4
#: The functions (by ``__name__``) of a cross-entropy written by hand: log-probabilities from
#: scores (``-F.log_softmax(z, 1).gather(1, y)``, ``-log(softmax(z))``).
LOG_PROB_FUNCTIONS: frozenset[str] = frozenset({"log_softmax", "softmax", "logsumexp"})

_PAUSE = threading.local()
#: Watches entered and not yet exited (any thread): when none, nothing needs hiding from them.
_LIVE = [0]


def _pause_depth() -> int:
    return int(getattr(_PAUSE, "depth", 0))


def watching() -> bool:
    """Whether an :class:`ObjectiveWatch` is live (cheap: the library's hooks hide their own
    work from the watches with :func:`library_code` only then)."""
    return _LIVE[0] > 0


def library_code() -> AbstractContextManager[None]:
    """:func:`unwatched` while a watch is live, else a no-op: the library's own hooks run in it,
    so that a watch of the user's step sees the user's code only."""
    return unwatched() if _LIVE[0] > 0 else nullcontext()


@contextmanager
def unwatched() -> Iterator[None]:
    """Run the block unseen by the watches started before it (a probe's steps on a copy are not
    the user's step); a watch started inside the block sees the block.

    Example:
        >>> import torch
        >>> with ObjectiveWatch() as watch:
        ...     with unwatched():
        ...         _ = torch.randn(3)
        >>> watch.draws
        []
    """
    _PAUSE.depth = _pause_depth() + 1
    try:
        yield
    finally:
        _PAUSE.depth = _pause_depth() - 1


@dataclass(frozen=True)
class Objective:
    """What a training step optimizes, as seen by watching it.

    Attributes:
        calls: the recognized loss calls, in order.
        loss: the loss the step returned (``None`` if unknown).
        match: ``"single"`` (the loss is one call's value), ``"sum"`` / ``"mean"`` (of all the
            calls), ``"scaled"`` (the one call times a constant, see :attr:`scale`),
            ``"composite"`` (calls were made but the loss is none of these: weighted
            terms, a hand-written term added) or ``"none"`` (no recognized call).
        draws: the random functions the step called (other than dropout).
        dropouts: the dropout calls that dropped.
        log_probs: the softmax-family calls (:data:`LOG_PROB_FUNCTIONS`) the step made.
        compiled: the compiled function the step calls, when the step was not watched because
            of it (the objective is then unknown: nothing was seen).
    """

    calls: tuple[LossCall, ...] = ()
    loss: float | None = None
    match: Match = "none"
    draws: tuple[str, ...] = ()
    dropouts: tuple[str, ...] = ()
    log_probs: tuple[str, ...] = ()
    compiled: str = ""

    @property
    def terms(self) -> tuple[LossCall, ...]:
        """The calls that make the step's loss (one for ``"single"``, all for a sum or mean)."""
        if self.match == "single":
            return tuple(c for c in self.calls if _close(c.value, self.loss))[:1]
        return self.calls if self.match in ("sum", "mean", "scaled") else ()

    @property
    def scale(self) -> float:
        """The step's loss over its one call's value (1 unless :attr:`match` is ``"scaled"``).
        The chance level and floor are the call's, unscaled: a loss divided by the batch size
        twice shows as far below them."""
        if self.match != "scaled" or self.loss is None or not self.calls[0].value:
            return 1.0
        return self.loss / self.calls[0].value

    @property
    def term(self) -> LossCall | None:
        """The first term (the loss's kind when all terms are alike)."""
        terms = self.terms
        return terms[0] if terms else None

    @property
    def known(self) -> bool:
        """The step's loss is one recognized term, or the sum or mean of alike terms."""
        terms = self.terms
        if self.match == "scaled":
            return terms[0].kind in _SCALE_JUDGED
        return bool(terms) and len({t.kind for t in terms}) == 1

    @property
    def recognized(self) -> bool:
        """The step called at least one watched loss function."""
        return bool(self.calls)

    @property
    def hand_written_ce(self) -> bool:
        """The step called no watched loss function but turned scores into log-probabilities
        and drew nothing (a sampled action makes a policy-gradient surrogate, not a
        cross-entropy): a cross-entropy written by hand, which the labels' chance level
        judges."""
        return not self.calls and bool(self.log_probs) and not self.fresh_draws

    @property
    def fresh_draws(self) -> bool:
        """The step draws random numbers (noise, a mask, a timestep, a mix) each time."""
        return bool(self.draws)

    @property
    def augmented(self) -> bool:
        """The step draws, but its known objective scores the batch's hard labels (a
        cross-entropy or BCE against class indices or 0/1 labels): the draws perturb the inputs
        (random crops, noise: augmentation), not what is scored, and the floor stays 0. A draw
        that samples from the model's own outputs (``multinomial``, ``gumbel_softmax``: an
        action, a token) is not augmentation, nor a draw beside targets that are all one value
        (labels made in the step: a GAN's real/fake BCE against all ones or all zeros)."""
        term = self.term
        return self.fresh_draws and self.known and term is not None \
            and term.kind in _HARD_LABEL_KINDS and term.target_form in _HARD_FORMS \
            and not set(self.draws) & _SAMPLING_DRAWS \
            and not any(t.facts.get("constant_target") for t in self.terms)

    @property
    def noisy(self) -> bool:
        """The loss has per-step noise and an unknown floor by nature: a fresh draw per step
        (other than the augmentation of a hard-label classifier, see :attr:`augmented`), or
        in-batch negatives (each batch its own candidates)."""
        return (self.fresh_draws and not self.augmented) \
            or any(c.kind == "in_batch_negatives" for c in self.calls)

    @property
    def heavy_tailed(self) -> bool:
        """The step calls a robust regression loss (Huber, smooth L1, L1): one chosen for
        outlier targets, whose per-batch value swings with the outliers each batch holds."""
        return any(c.name in ROBUST_LOSSES for c in self.calls)

    def _combined(self, attr: str) -> float | None:
        values = [getattr(t, attr) for t in self.terms]
        if not self.known or any(v is None for v in values):
            return None
        total = float(sum(values))
        return total / len(values) if self.match == "mean" else total

    @property
    def chance(self) -> float | None:
        """The expected step-0 loss of uniform predictions (``None``: not known)."""
        return self._combined("chance")

    @property
    def floor(self) -> float | None:
        """The memorization floor: the least loss a model can reach on a fixed batch (0 for hard
        targets, the targets' entropy for soft ones). ``None`` when the objective has none a
        probe can reach (a fresh draw per step, in-batch negatives) or it is not known."""
        if self.fresh_draws or not self.known:
            return None
        return self._combined("floor")

    @property
    def floor_of_draw(self) -> float | None:
        """The floor on one fixed draw (the step's random draws replayed identically, as the
        overfit probe does): a mixup's soft targets of that draw floor at their entropy.
        ``None`` for in-batch negatives and unknown objectives."""
        return self._combined("floor") if self.known else None

    @property
    def has_floor(self) -> bool:
        """Whether a fixed batch can be memorized down to a known floor."""
        return self.floor is not None

    @property
    def lower_bound(self) -> float:
        """The least value the step's loss can take (``-inf``: unbounded or not known)."""
        bound = self._combined("lower_bound")
        return -math.inf if bound is None else bound

    @property
    def bounded_below(self) -> bool:
        """Whether the step's loss has a finite lower bound (likelihoods of continuous data and
        composite losses have none known)."""
        return math.isfinite(self.lower_bound)

    def chance_level(self) -> ChanceLevel | None:
        """The objective's chance level in the form the chance-level checks read (``None``
        when not known): a classification-like level with its formula, or the regression
        baselines of a regression loss's targets."""
        term = self.term
        if term is None or not self.known:
            return None
        if term.kind == "regression" and term.regression is not None \
                and self.match in ("single", "scaled"):
            return term.regression
        chance = self.chance
        if chance is None or chance <= 0:
            return None
        prior = term.facts.get("prior") if self.match in ("single", "scaled") else None
        what = term.describe()
        if term.kind in ("multiclass", "sequence", "masked_lm", "soft_targets",
                         "in_batch_negatives") and term.num_classes:
            formula = f"ln({term.num_classes}) = {chance:.3f} for {what}"
        else:
            formula = f"{chance:.4g} for {what}"
        task = "multiclass" if term.kind in ("multiclass", "in_batch_negatives") else term.kind
        if term.kind in ("multiclass", "sequence") and self.match in ("single", "scaled") \
                and not term.facts.get("label_smoothing"):
            return ChanceLevel(term.kind, chance, term.num_classes, prior)  # the plain wording
        return ChanceLevel(task, chance, term.num_classes, prior, formula=formula + self._how())

    def _how(self) -> str:
        n = len(self.terms)
        if self.match == "scaled":
            return f" (the step's loss is {self.scale:.4g}x `{self.calls[0].name}`)"
        return f" (the {self.match} of {n} terms)" if self.match in ("sum", "mean") else ""

    def describe(self) -> str:
        """The objective named for messages.

        Example:
            >>> Objective().describe()
            'no recognized loss function'
        """
        if self.compiled:
            return (f"a loss computed in compiled code (`{self.compiled}`, not watched: "
                    "torch.compile would trace the watch into its graph)")
        if self.match == "none":
            text = "no recognized loss function"
        elif self.known:
            text = self.terms[0].describe() + self._how()
        else:
            names = ", ".join(dict.fromkeys(f"`{c.name}`" for c in self.calls))
            text = (f"a composite loss (the step's loss {self.loss:.4g} is not one of the "
                    f"calls of {names}, nor their sum or mean)" if self.loss is not None
                    else f"a loss calling {names}")
        if self.fresh_draws:
            text += f", with a fresh random draw per step ({', '.join(self.draws[:3])})"
        return text


def _close(value: float, loss: float | None) -> bool:
    return loss is not None and math.isfinite(value) and \
        abs(value - loss) <= MATCH_RTOL * max(abs(loss), 1e-3)


def only_scaled(node: Any, target: Any, depth: int = 16) -> bool:
    """Whether the autograd node ``node`` (a loss's ``grad_fn``) reaches ``target`` (a loss
    call's ``grad_fn``) through operations of one input each (a multiplication or a division by
    a constant, a negation, a cast): the loss is that call times a constant, with no other term.

    Example:
        >>> import torch
        >>> w = torch.ones(3, requires_grad=True)
        >>> ce = (w * 2).sum()
        >>> only_scaled((ce / 32).grad_fn, ce.grad_fn), only_scaled((ce + w.sum()).grad_fn, ce.grad_fn)
        (True, False)
    """
    for _ in range(depth):
        if node is None:
            return False
        if node is target:
            return True
        inputs = [n for n, _ in getattr(node, "next_functions", ()) if n is not None]
        if len(inputs) != 1:
            return False
        node = inputs[0]
    return False


def infer_objective(calls: tuple[LossCall, ...] | list[LossCall], loss: float | None, *,
                    draws: tuple[str, ...] | list[str] = (),
                    dropouts: tuple[str, ...] | list[str] = (),
                    scaled: bool = False,
                    log_probs: tuple[str, ...] | list[str] = ()) -> Objective:
    """The :class:`Objective` of a step that made ``calls`` and returned ``loss``; ``scaled``:
    the loss is known to be its one call times a constant (see :func:`only_scaled`).

    Example:
        >>> from lightning_triage.functional.loss_terms import LossCall
        >>> ce = LossCall("cross_entropy", 2.31, "multiclass", "indices", 10, 2.303, 0.0)
        >>> infer_objective([ce], 2.31).match, infer_objective([ce], 2.31 / 32, scaled=True).match
        ('single', 'scaled')
        >>> infer_objective([ce], 0.1 * 2.31 + 6.2).match  # a hand-written term added
        'composite'
        >>> infer_objective([ce, ce], 2.31 * 2.5).match
        'composite'

    """
    calls = tuple(calls)
    match: Match = "none"
    if calls:
        total = sum(c.value for c in calls)
        if loss is None or not math.isfinite(loss):
            match = "composite"
        elif any(_close(c.value, loss) for c in calls):
            match = "single"
        elif len(calls) > 1 and _close(total, loss):
            match = "sum"
        elif len(calls) > 1 and _close(total / len(calls), loss):
            match = "mean"
        elif scaled and len(calls) == 1 and calls[0].value != 0 and math.isfinite(calls[0].value):
            match = "scaled"
        else:
            match = "composite"
    return Objective(calls, loss, match, tuple(draws), tuple(dropouts), tuple(log_probs))


class ObjectiveWatch(DrawWatch):
    """A torch function mode that records the loss calls and the random draws of the code it
    wraps (see :func:`unwatched` for code it should not see). It changes no call.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> with ObjectiveWatch() as watch:
        ...     x = torch.randn(4, 3)
        ...     loss = F.mse_loss(x, torch.zeros(4, 3))
        >>> [c.name for c in watch.calls], watch.draws
        (['mse_loss'], ['randn'])
        >>> watch.objective(float(loss)).describe()
        'a regression loss, with a fresh random draw per step (randn)'
    """

    def __init__(self, *, outermost: bool = False) -> None:
        super().__init__()
        self.calls: list[LossCall] = []
        self._nodes: list[Any] = []  # each call's autograd node, to tell a scaled loss apart
        self.log_probs: list[str] = []
        # the user's real step runs outside any `unwatched` block, whichever hook starts the
        # watch; a probe's watch sees the steps run where it was made
        self._depth = 0 if outermost else _pause_depth()
        self._live = False

    def __enter__(self) -> ObjectiveWatch:
        out = super().__enter__()
        if not self._live:
            self._live = True
            _LIVE[0] += 1
        return out

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self.released()

    def released(self) -> None:
        """Count the watch as no longer live (its mode was taken off the stack)."""
        if self._live:
            self._live = False
            _LIVE[0] -= 1

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _pause_depth() != self._depth:
            return func(*args, **kwargs)
        if func not in LOSS_FUNCTIONS:
            name = getattr(func, "__name__", "")
            if name in LOG_PROB_FUNCTIONS and len(self.log_probs) < MAX_CALLS:
                self.log_probs.append(name)
            return super().__torch_function__(func, types, args, kwargs)
        out = func(*args, **kwargs)
        if len(self.calls) < MAX_CALLS:
            try:
                call = describe_call(func, tuple(args), kwargs, out)
            except Exception:  # never break the step it watches
                call = None
            if call is not None:
                self.calls.append(call)
                self._nodes.append(getattr(out, "grad_fn", None))
        return out

    def objective(self, loss: float | None, node: Any = None) -> Objective:
        """The objective of what was watched, for a step that returned ``loss`` (``node``: its
        ``grad_fn``, which tells a loss that is its one call times a constant)."""
        scaled = len(self._nodes) == 1 and self._nodes[0] is not None and only_scaled(
            node, self._nodes[0])
        return infer_objective(self.calls, loss, draws=self.draws, dropouts=self.dropouts,
                               scaled=scaled, log_probs=self.log_probs)


class StepObjective:
    """An :class:`ObjectiveWatch` over one step of a module, started and stopped from separate
    hooks (start before the step, stop before its backward, :meth:`finish` with the loss).

    Nothing is watched when the module runs compiled code (a torch function mode would be
    traced into the user's graph): :attr:`skipped` says why and :meth:`finish` returns ``None``.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> net, step = nn.Linear(3, 4), StepObjective()
        >>> x, y = torch.randn(8, 3), torch.randint(0, 4, (8,))
        >>> step.start(net)
        >>> loss = F.cross_entropy(net(x), y)
        >>> step.stop()
        >>> step.finish(loss.item()).describe()
        'cross-entropy over 4 classes'
    """

    def __init__(self) -> None:
        self._watch: ObjectiveWatch | None = None
        self._done: ObjectiveWatch | None = None
        self._node: Any = None
        self._compiled = ""  # the compiled function that kept the step unwatched
        self.skipped = ""

    @property
    def active(self) -> bool:
        """Whether a step is being watched or waits for :meth:`finish`."""
        return self._watch is not None or self._done is not None or bool(self._compiled)

    def start(self, module: nn.Module) -> None:
        """Start watching (nothing when ``module`` holds compiled code or its code calls a
        compiled function: :meth:`finish` then returns an unknown :class:`Objective` naming
        it, so the checks judge no chance level from the batch's labels)."""
        self.close()
        self._compiled = ""
        compiled = compiled_parts(module)
        if compiled:
            self.skipped = (f"the module runs compiled code (`{compiled[0] or 'the module'}`): "
                            "the step is not watched")
            return
        functions = compiled_functions(module)
        if functions:  # dynamo would trace the watch's mode into the function's graph
            self._compiled = functions[0]
            self.skipped = (f"the step calls the compiled function `{functions[0]}`: dynamo "
                            "traces a torch function mode active at its call into the graph "
                            "it compiles (and guards on it), so the step is not watched")
            return
        self.skipped = ""
        self._watch = ObjectiveWatch(outermost=True)
        self._watch.__enter__()

    def stop(self, loss: Tensor | None = None) -> None:
        """Stop recording (the step's loss is computed; ``loss``: that tensor, with its graph);
        the record waits for :meth:`finish`."""
        if loss is not None and self._watch is not None:
            self._node = loss.grad_fn
        if self._watch is not None:
            exit_function_mode(self._watch)
            self._watch.released()
            self._done, self._watch = self._watch, None

    def finish(self, loss: float | None) -> Objective | None:
        """The step's objective (``None`` when nothing was watched); forgets the record."""
        self.stop()
        done, self._done = self._done, None
        node, self._node = self._node, None
        if done is None:
            compiled, self._compiled = self._compiled, ""
            return Objective(loss=loss, compiled=compiled) if compiled else None
        return done.objective(loss, node)

    def close(self) -> None:
        """Stop and forget (teardown, a crash inside the step)."""
        self.stop()
        self._done, self._node = None, None


__all__ = ["LOG_PROB_FUNCTIONS", "MATCH_RTOL", "Match", "Objective", "ObjectiveWatch", "StepObjective",
           "infer_objective", "library_code", "only_scaled", "unwatched", "watching"]
