"""Shared behaviour of every triage callback.

A :class:`TriageCallback` keeps its findings, saves them in checkpoints, turns an internal error
into a ``triage.check_error`` finding (and disables itself) instead of breaking the user's run,
and removes every hook it registered when fit ends, tears down or crashes.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Concatenate, Literal, ParamSpec, TypeVar

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.hooks import RemovableHandle
from typing_extensions import override

from lightning_triage.callbacks._args import BundleArg, check_bool, state_key_of
from lightning_triage.findings import Finding, Severity
from lightning_triage.functional.objective import library_code
from lightning_triage.functional.verdict import Verdict
from lightning_triage.ranking import SUSPICIONS
from lightning_triage.report.safe import safe_str

CheckStatus = Literal["passed", "failed", "skipped", "error"]
#: A check whose detail starts with this did not do its work (the rest says why): its status is
#: ``"skipped"`` unless it found a problem before it stopped.
SKIPPED_PREFIX = "skipped:"

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound="TriageCallback")


def guarded(
    hook: Callable[Concatenate[C, pl.Trainer, P], R],
) -> Callable[Concatenate[C, pl.Trainer, P], R | None]:
    """Run a hook so that an internal error disables the check instead of breaking fit.

    With ``strict=True`` the error is re-raised (the tests run strict).
    """

    @functools.wraps(hook)
    def wrapper(self: C, trainer: pl.Trainer, *args: P.args, **kwargs: P.kwargs) -> R | None:
        if self.disabled:
            return None
        try:
            with library_code():  # unseen by a watch of the user's step
                return hook(self, trainer, *args, **kwargs)
        except Exception as exc:
            self.hook_failed(trainer, hook.__name__, exc)
            return None

    wrapper.guarded_hook = hook  # type: ignore[attr-defined]  # bundles call it directly
    return wrapper


class TriageCallback(Callback):
    """Base class of the triage checks.

    Args:
        strict: raise internal errors of the check instead of reporting them as a
            ``triage.check_error`` finding and disabling the check.

    Example:
        A check of your own records findings with registered codes; `TriageReport` collects it
        with the others:

        >>> from lightning.pytorch import Trainer
        >>> from lightning_triage import TriageCallback, TriageReport
        >>> class NeedsTargets(TriageCallback):
        ...     def on_train_start(self, trainer, pl_module):
        ...         if getattr(pl_module, "num_classes", None) is None:
        ...             self.add_finding(trainer, "init.chance_unknown", "the model has no `num_classes`")
        >>> trainer = Trainer(callbacks=[NeedsTargets(), TriageReport()])
        >>> check = NeedsTargets()
        >>> check.add_finding(None, "init.chance_unknown", "no targets in the batch").severity
        'info'
    """

    def __init__(self, *, strict: bool = False) -> None:
        check_bool("strict", strict)
        self.strict = strict
        self.findings: list[Finding] = []
        self.disabled = False
        self.ran = False
        self.detail = ""
        self._idle = False
        self._warned: set[str] = set()
        #: Also emit a Python ``RuntimeWarning`` the first time each problem code is found
        #: (off by default: findings reach the user once, ranked, in the report's summary;
        #: ``Triage(warn_findings=True)`` turns it on for every bundled check).
        self.warn_findings = False
        self._handles: list[RemovableHandle] = []
        self._in_setup = False  # inside `setup` (see `_starting_fit`)
        #: Called with ``(trainer, finding)`` for each new finding (set by :class:`TriageReport`
        #: to send findings to the loggers as they happen).
        self.finding_listener: Callable[[pl.Trainer, Finding], None] | None = None

    #: Bumped whenever a check's ``idle`` flag changes (bundles cache their per-step callees).
    idle_version = 0

    #: The protocol stage this check belongs to (one of ``findings.STAGES``). The base class
    #: owns the meta stage: every check may report ``triage.check_error``, built here.
    stage: ClassVar[str] = "triage"
    #: The finding codes this check owns and may report (each registered in ``findings``; each
    #: registered code is declared by exactly one check, see ``callbacks.code_owners``). A check
    #: that does not declare its own inherits the base's, and the docs tests fail.
    codes: ClassVar[tuple[str, ...]] = ("triage.check_error",)
    #: Codes owned by another check that this one may report too (the NaN tracer reports the
    #: non-finite batch of the failing step with the data stage's codes).
    shared_codes: ClassVar[tuple[str, ...]] = ()

    #: The arguments that tell two instances apart: those not at their defaults join the class
    #: name in :attr:`state_key` (as in Lightning's ``EarlyStopping``).
    state_key_args: ClassVar[tuple[str, ...]] = ()

    #: How the :class:`~lightning_triage.Triage` bundle builds this check from its own
    #: arguments: the check's argument -> the bundle's argument passed to it (its name), or a
    #: function of all the bundle's arguments (a value derived from them). ``strict`` is always
    #: passed; an argument not named here keeps the check's default.
    bundle_args: ClassVar[Mapping[str, BundleArg]] = {}
    #: The bundle's boolean argument that leaves this check out when ``False`` (``None``: the
    #: bundle always runs it).
    bundle_switch: ClassVar[str | None] = None
    #: Attributes that belong to this process and this epoch, set to ``None`` when the check
    #: is pickled (a check that keeps a per-epoch view of the trainer names it here).
    unpicklable: ClassVar[tuple[str, ...]] = ()

    @property
    @override
    def state_key(self) -> str:
        """The key of this check's state in a checkpoint: the class name, followed by the
        :attr:`state_key_args` that differ from their defaults (two instances of a check can
        then share a Trainer and each resume its own state)."""
        return state_key_of(self, self.state_key_args)

    @property
    def idle(self) -> bool:
        """``True`` once the check has no per-step work left in this fit: the :class:`Triage`
        bundle stops calling its per-step hooks (a cost every training step would pay)."""
        return self._idle

    @idle.setter
    def idle(self, value: bool) -> None:
        if value != self._idle:
            TriageCallback.idle_version += 1
            self._idle = value

    def needs_hook(self, hook: str) -> bool:
        """Whether the :class:`Triage` bundle must still call the per-step ``hook`` on this
        check (read at the first step and whenever a check goes :attr:`idle`): ``False`` once
        idle; a check whose per-step hook only serves one set-up says so for that hook."""
        return not self.idle

    # ------------------------------------------------------------------ findings
    @property
    def check_name(self) -> str:
        """The name reported in ``findings[].check`` and ``checks[].check``."""
        return type(self).__name__

    def add_finding(
        self,
        trainer: pl.Trainer | None,
        code: str,
        message: str,
        *,
        severity: Severity | None = None,
        hint: str | None = None,
        layer: str | None = None,
        evidence: Mapping[str, Any] | None = None,
        global_step: int | None = None,
        epoch: int | None = None,
    ) -> Finding:
        """Record a finding (step, epoch and rank default to the trainer's); with
        :attr:`warn_findings`, also warn once per problem code."""
        if trainer is not None:
            global_step = trainer.global_step if global_step is None else global_step
            epoch = trainer.current_epoch if epoch is None else epoch
            rank = trainer.global_rank
        else:
            rank = 0
        finding = Finding.create(
            code,
            message,
            check=self.check_name,
            severity=severity,
            hint=hint,
            layer=layer,
            evidence=evidence,
            global_step=global_step,
            epoch=epoch,
            rank=rank,
        )
        self.findings.append(finding)
        listener = getattr(self, "finding_listener", None)
        if listener is not None and trainer is not None:
            try:
                listener(trainer, finding)
            except Exception:  # logging a finding is never a reason to break the run
                if self.strict:
                    raise
        if getattr(self, "warn_findings", False) and finding.is_problem \
                and code not in self._warned:
            self._warned.add(code)
            # a suspicion is a warning only if the run shows the trouble: the report settles it
            kind = " (a suspicion: the report says whether the run confirms it)" \
                if code in SUSPICIONS else ""
            # made encodable: a message holding a surrogate-escaped file name must not make
            # the warning (written to stderr) raise into the user's run
            rank_zero_warn(safe_str(f"[lightning-triage] {code}{kind}: {message}"),
                           category=RuntimeWarning)
        return finding

    def add_verdict(self, trainer: pl.Trainer | None, verdict: Verdict, **evidence: Any) -> Finding:
        """Record a verdict of the functional core as a finding (keyword arguments are added to
        its evidence: what only the callback knows)."""
        return self.add_finding(trainer, verdict.code, verdict.message, severity=verdict.severity,
                                hint=verdict.hint, layer=verdict.layer,
                                evidence={**verdict.evidence, **evidence},
                                global_step=verdict.step)

    def add_verdicts(self, trainer: pl.Trainer | None,
                     verdicts: Verdict | Iterable[Verdict] | None) -> None:
        """:meth:`add_verdict` for each of ``verdicts`` (one, several or ``None``)."""
        for v in [verdicts] if isinstance(verdicts, Verdict) else verdicts or ():
            self.add_verdict(trainer, v)

    def has_finding(self, code: str) -> bool:
        return any(f.code == code for f in self.findings)

    # ------------------------------------------------------------------ status
    def mark_ran(self, detail: str = "") -> None:
        """Record that the check ran (its status is then passed or failed by its findings)."""
        self.ran = True
        if detail:
            self.detail = detail

    def skip(self, detail: str) -> None:
        """Record why the check did not run."""
        self.detail = detail

    def check_status(self) -> dict[str, str]:
        """This check's entry of the report's ``checks`` list."""
        status: CheckStatus
        problem = any(f.is_problem for f in self.findings if f.code != "triage.check_error")
        if self.disabled:
            status = "error"
        elif not self.ran or (not problem and self.detail.startswith(SKIPPED_PREFIX)):
            status = "skipped"  # a detail that says "skipped: ..." is never "passed"
        elif problem:
            status = "failed"
        else:
            status = "passed"
        return {"check": self.check_name, "stage": self.stage, "status": status, "detail": self.detail}

    def series(self) -> dict[str, list[list[float]]]:
        """Named ``[[step, value], ...]`` series this check contributes to the report."""
        return {}

    def report_details(self) -> dict[str, Any]:
        """Bounded, JSON-ready extras for the report's ``details`` (what the HTML draws)."""
        return {}

    # ------------------------------------------------------------------ one report per fit
    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        setup = cls.__dict__.get("setup")
        if setup is not None and not getattr(setup, "starts_fit", False):
            cls.setup = _starting_fit(setup)  # type: ignore[method-assign]

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """At the start of each ``fit``: :meth:`start_fit` (a subclass's own ``setup`` does the
        same, first)."""
        if stage == "fit" and not getattr(self, "_in_setup", False):
            self.start_fit()

    #: Attributes :meth:`start_fit` leaves alone besides the ``__init__`` arguments: wiring set
    #: by the bundle or the report, and tuning a user may edit between fits.
    kept_between_fits: ClassVar[frozenset[str]] = frozenset({
        "strict", "step_state", "finding_listener", "thresholds", "_handles", "_fresh",
        "_in_setup"})

    def _config_names(self) -> set[str]:
        names: set[str] = set()
        for klass in type(self).__mro__:
            init = klass.__dict__.get("__init__")
            if init is not None and klass is not object:
                try:
                    names.update(inspect.signature(init).parameters)
                except (TypeError, ValueError):  # pragma: no cover - a builtin's __init__
                    continue
        return names

    def start_fit(self) -> None:
        """Forget the previous fit: findings, status, windows and every piece of state go back
        to what they were when this check's first fit started (its arguments, the tuning in
        ``thresholds`` and the bundle's wiring stay). Called at ``setup`` for ``"fit"``, before
        Lightning restores a checkpoint's state (``load_state_dict``), so a resumed fit goes on
        with the state it saved, and a second ``fit`` of the same check reports only itself."""
        self.remove_handles()
        keep = self.kept_between_fits | self._config_names()
        fresh = getattr(self, "_fresh", None)
        if fresh is None:  # the first fit: what the check holds now is its fresh state
            self._fresh = fresh = {}
            for key, value in self.__dict__.items():
                if key in keep or callable(value):  # config, wiring, functions: not state
                    continue
                with contextlib.suppress(Exception):  # what cannot be copied is left alone
                    fresh[key] = copy.deepcopy(value)
            return
        for key in [k for k in self.__dict__ if k not in keep and k not in fresh]:
            if key.startswith("_") and not callable(self.__dict__[key]):  # made in the last fit
                delattr(self, key)
        for key, value in fresh.items():
            setattr(self, key, copy.deepcopy(value))
        self.idle = False

    # ------------------------------------------------------------------ hooks
    def add_handle(self, handle: RemovableHandle) -> None:
        """Keep a hook handle so it is removed on teardown or crash."""
        self._handles.append(handle)

    def remove_handles(self) -> None:
        """Remove every hook this check registered."""
        while self._handles:
            self._handles.pop().remove()

    def guard_hook(self, trainer: pl.Trainer | None, where: str,
                   hook: Callable[..., object]) -> Callable[..., None]:
        """Wrap a hook that runs inside the user's forward or backward (a module or tensor
        hook): an internal error disables this check (``triage.check_error``) and never reaches
        the user's step; ``strict`` raises it. The wrapper returns ``None`` whatever ``hook``
        returns, so it can never replace an output or a gradient, and does nothing once the
        check is disabled."""

        def run(*args: Any, **kwargs: Any) -> None:
            if self.disabled:
                return
            try:
                hook(*args, **kwargs)
            except Exception as exc:
                self.hook_failed(trainer, where, exc)

        return run

    def hook_failed(self, trainer: pl.Trainer | None, hook: str, exc: Exception) -> None:
        """What :func:`guarded` does with an internal error: raise it (``strict``) or disable the
        check with a ``triage.check_error`` finding."""
        if self.strict:
            raise exc
        self._disable_after_error(trainer, hook, exc)

    def _disable_after_error(self, trainer: pl.Trainer | None, hook: str, exc: Exception) -> None:
        self.remove_handles()
        self.disabled = True
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
        self.detail = f"internal error in `{hook}`: {type(exc).__name__}: {exc}"
        self.add_finding(
            trainer,
            "triage.check_error",
            f"`{self.check_name}.{hook}` raised {type(exc).__name__}: {exc}. The check was "
            "disabled; training goes on.",
            evidence={"hook": hook, "exception": type(exc).__name__, "error": str(exc),
                      "where": where},
        )

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.remove_handles()

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.remove_handles()

    # ------------------------------------------------------------------ state
    def extra_state(self) -> dict[str, Any]:
        """Check-specific picklable state saved beside the findings (override)."""
        return {}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`extra_state` saved; read keys with defaults (override)."""

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "findings": [f.to_dict() for f in self.findings],
            "ran": self.ran,
            "detail": self.detail,
            "disabled": self.disabled,
            "extra": self.extra_state(),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.findings = [Finding.from_dict(f) for f in state_dict.get("findings", [])]
        self._warned = {f.code for f in self.findings}
        self.ran = bool(state_dict.get("ran", self.ran))
        self.detail = str(state_dict.get("detail", self.detail))
        self.disabled = bool(state_dict.get("disabled", self.disabled))
        self.load_extra_state(state_dict.get("extra", {}))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = []  # hook handles hold weak references and are per-process
        state["finding_listener"] = None  # the report's bound method: set again at setup
        for name in type(self).unpicklable:
            if name in state:
                state[name] = None
        return state


def _starting_fit(setup: Callable[..., None]) -> Callable[..., None]:
    """``setup`` that first calls :meth:`TriageCallback.start_fit` for ``"fit"`` (once, however
    many subclasses' ``setup`` run through ``super()``)."""

    @functools.wraps(setup)
    def wrapper(self: TriageCallback, trainer: pl.Trainer, pl_module: pl.LightningModule,
                stage: str) -> None:
        outer = not getattr(self, "_in_setup", False)  # False also for an old pickle
        if outer and stage == "fit":
            self.start_fit()
        self._in_setup = True
        try:
            setup(self, trainer, pl_module, stage)
        finally:
            if outer:
                self._in_setup = False

    wrapper.starts_fit = True  # type: ignore[attr-defined]
    return wrapper


def collect_checks(callbacks: Iterable[Callback]) -> list[TriageCallback]:
    """Every triage check among ``callbacks``, looking inside bundles (``triage_checks``).

    Pass ``trainer.callbacks``.
    """
    found: list[TriageCallback] = []
    for cb in callbacks:
        children: Sequence[Callback] | None = getattr(cb, "triage_checks", None)
        if children is not None:
            found.extend(collect_checks(children))
        elif isinstance(cb, TriageCallback):
            found.append(cb)
    return found
