"""The ``Triage`` bundle: the default set of checks and the report, from one config."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_triage._compat import skip_hook, unskip_hooks
from lightning_triage.callbacks._args import aliases, check_bool, state_key_of
from lightning_triage.callbacks._checks import CHECKS
from lightning_triage.callbacks._shared import validate_task
from lightning_triage.callbacks._step import StepState
from lightning_triage.callbacks.base import TriageCallback
from lightning_triage.callbacks.gradient_monitor import OnSpike
from lightning_triage.callbacks.nonfinite_tracer import Mode, OnNonFinite
from lightning_triage.callbacks.report import GateOn, TriageReport
from lightning_triage.callbacks.structure_probe import ForwardFn
from lightning_triage.errors import TriageConfigError
from lightning_triage.functional.batch import BatchKey
from lightning_triage.functional.chance import Task
from lightning_triage.functional.objective import library_code

_PER_STEP = frozenset({"on_train_batch_start", "on_train_batch_end", "on_before_backward",
                       "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad"})


def _needs(callback: Callback, hook: str) -> bool:
    """Whether a member (a check, or the report's recorder) still needs the per-step ``hook``."""
    needs = getattr(callback, "needs_hook", None)
    return bool(needs(hook)) if callable(needs) else not getattr(callback, "idle", False)


class Triage(Callback):
    """Run the whole triage protocol and write one report: add this to your ``Trainer``.

    Builds the default checks (each also usable alone) and a :class:`TriageReport`, and forwards
    every Lightning hook to them in protocol order, the report last.

    Args:
        report_dir: where the report is written (default: the trainer's ``log_dir``, else
            ``default_root_dir``).
        task: ``"auto"`` (infer from the first batch), ``"multiclass"``, ``"binary"``,
            ``"regression"`` or ``"sequence"`` (token-level classification, language modeling).
        num_classes: class count (vocabulary size for ``"sequence"``).
        causal: as in :class:`StructureProbe`: ``True``: the model must not look at future
            positions, always run the causal probe; ``None`` (default): run it when the data is
            next-token prediction (targets are the inputs shifted by one position); ``False``:
            never run it.
        strict: raise internal errors of checks instead of disabling them (for tests).
        verbose: print the report summary at the end of fit (``False``: nothing is printed;
            the report files are still written).
        warn_findings: also emit a Python ``RuntimeWarning`` the first time each problem code
            is found, as it is found (off by default: each finding reaches the console once,
            ranked, in the summary at the end of fit).
        input_key: where the inputs are in a batch the checks cannot read by themselves: a key
            or attribute name, an index, or a callable ``batch -> tensor`` (passed to every check
            that reads the batch).
        target_key: where the targets are, the same way.
        overfit: run the overfit-one-batch probe (:class:`OverfitBatchCheck`).
        overfit_batch_size: examples of the first batch the probe memorizes.
        overfit_max_steps: most steps of the overfit probe.
        overfit_time_budget: seconds the overfit probe may take (skipped when a step says it
            would not fit).
        forward_fn: ``callable(pl_module, batch) -> output`` running the model on a batch, for
            the structure probes and :class:`AutocastCheck` when they cannot find the forward
            through ``training_step`` (manual optimization).
        on_nonfinite: what :class:`NonFiniteTracer` does when a step goes NaN/Inf: ``"stop"``
            (report, drop the step's update, stop fit), ``"skip"`` (drop it and go on) or
            ``"warn"`` (report only).
        numerics_mode: ``"auto"`` (sync on CPU, deferred on accelerators), ``"sync"`` (check and
            localize every step; one host sync per step on GPU) or ``"deferred"`` (flags stay on
            the device, read every ``numerics_check_every_n_steps`` steps, no localization).
        numerics_check_every_n_steps: how often deferred mode reads its device flags.
        window_epochs: epochs of the first-epochs window of the curve and gradient monitors
            (the window is the longer of ``window_epochs`` and ``window_steps``).
        window_steps: optimizer steps of that window.
        watch: keep watching loss and gradient norms for spikes after the window.
        on_spike: ``"warn"`` or ``"skip"`` (zero the gradients of a step whose norm spikes).
        stochastic_eval: evaluation is random on purpose (MC dropout, test-time augmentation):
            :class:`EvalContractCheck` does not probe it for determinism.
        padding_mask_key: the batch entry holding the padding mask, for the padding probe
            (:class:`PaddingProbe`) when it cannot find the mask by name.
        fail_on: ``"error"``, ``"warning"`` or ``"info"``: a CI gate, raising
            :class:`~lightning_triage.report.TriageGateError` at the end of fit (after the report
            is written) when findings at that severity or worse were found; an interrupted
            fit fails it too (exit 1, also under SIGTERM); ``"none"`` or ``None``: never (as
            ``--fail-on none`` on the command line).
        html: also write the self-contained ``triage_report.html``.
        log_findings: send findings and the summary to the trainer's loggers as they happen
            (``triage/findings_<severity>`` counts; text on TensorBoard).
        verify_remedies: try the lead's fix on a copy of the run before the report is written
            (a learning-rate lead: the first 30 batches replayed from the fit's starting state
            with the learning rate divided or multiplied by 10, then 100); the finding gets a
            ``remedy`` block. See :class:`TriageReport` and docs/remedies.md.

    Raises:
        TriageConfigError: for an argument out of range or of the wrong type; the message names
            it as ``Triage`` does (``overfit_max_steps``, not the check's own ``max_steps``).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> from lightning_triage import Triage
        >>> trainer = Trainer(callbacks=[Triage(task="multiclass", num_classes=10)])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.Triage
                  init_args:
                    task: multiclass
                    num_classes: 10
                    report_dir: runs/triage
                    fail_on: error
    """

    def __init__(
        self,
        *,
        report_dir: str | os.PathLike[str] | None = None,
        task: Task = "auto",
        num_classes: int | None = None,
        causal: bool | None = None,
        strict: bool = False,
        verbose: bool = True,
        warn_findings: bool = False,
        input_key: BatchKey | None = None,
        target_key: BatchKey | None = None,
        overfit: bool = True,
        overfit_batch_size: int = 8,
        overfit_max_steps: int = 300,
        overfit_time_budget: float = 5.0,
        forward_fn: ForwardFn | None = None,
        on_nonfinite: OnNonFinite = "stop",
        numerics_mode: Mode = "auto",
        numerics_check_every_n_steps: int = 50,
        window_epochs: int = 2,
        window_steps: int = 200,
        watch: bool = True,
        on_spike: OnSpike = "warn",
        stochastic_eval: bool = False,
        padding_mask_key: BatchKey | None = None,
        fail_on: GateOn | None = None,
        html: bool = True,
        log_findings: bool = True,
        verify_remedies: bool = True,
    ) -> None:
        args = dict(locals())  # the bundle's arguments, by name: each check takes its own
        del args["self"]
        validate_task(task, num_classes)
        check_bool("overfit", overfit)
        check_bool("verify_remedies", verify_remedies)
        check_bool("warn_findings", warn_findings)
        self.report_dir = None if report_dir is None else str(report_dir)
        self.task = task
        self.num_classes = num_classes
        self.causal = causal
        self.strict = strict
        self.verbose = verbose
        self.warn_findings = warn_findings
        self.overfit = overfit
        self.overfit_batch_size = overfit_batch_size
        self.overfit_max_steps = overfit_max_steps
        self.overfit_time_budget = overfit_time_budget
        self.forward_fn = forward_fn
        self.on_nonfinite = on_nonfinite
        self.numerics_mode = numerics_mode
        self.numerics_check_every_n_steps = numerics_check_every_n_steps
        self.window_epochs = window_epochs
        self.window_steps = window_steps
        self.watch = watch
        self.on_spike = on_spike
        self.stochastic_eval = stochastic_eval
        self.input_key = input_key
        self.target_key = target_key
        self.padding_mask_key = padding_mask_key
        self.checks: list[TriageCallback] = build_checks(args)
        for check in self.checks:
            check.warn_findings = warn_findings
        self.fail_on = fail_on
        self.html = html
        self.log_findings = log_findings
        self.verify_remedies = verify_remedies
        self.report = TriageReport(report_dir=report_dir, verbose=verbose, html=html,
                                   log_findings=log_findings, fail_on=fail_on, strict=strict,
                                   verify_remedies=verify_remedies)
        # one step path: the watches that stay on read the loss and the gradient norms once per
        # step together (the first to ask computes, the others read)
        self.step_state = StepState()
        for check in self.checks:
            if isinstance(getattr(check, "step_state", None), StepState):
                check.step_state = self.step_state  # type: ignore[attr-defined]
        self._callees_by_hook: dict[str, list[tuple[Callback, Callable[..., Any], bool]]] = {}
        self._active: dict[str, list[tuple[Callback, Callable[..., Any], bool]]] = {}
        self._active_version = -1

    @property
    def triage_checks(self) -> Sequence[TriageCallback]:
        """The checks this bundle drives (read by :class:`TriageReport`)."""
        return self.checks

    def check(self, name: str) -> TriageCallback:
        """The bundled check of class ``name`` (e.g. ``"InitialLossCheck"``)."""
        for check in self.checks:
            if type(check).__name__ == name:
                return check
        raise KeyError(f"No check named {name!r}; have {[type(c).__name__ for c in self.checks]}.")

    def _callees(self, hook: str) -> list[tuple[Callback, Callable[..., Any], bool]]:
        """``(callback, function, guarded)`` for every callback that implements ``hook``: a
        :func:`~lightning_triage.callbacks.base.guarded` hook as its undecorated function (the
        bundle applies the guard itself: one Python call less per check and step), any other
        as the bound method. Lightning's no-op hooks are left out."""
        callees: list[tuple[Callback, Callable[..., Any], bool]] = []
        default = getattr(Callback, hook)
        for cb in (*self.checks, self.report):
            fn = getattr(type(cb), hook)
            raw = getattr(fn, "guarded_hook", None)
            if hook in vars(cb) or raw is None or not isinstance(cb, TriageCallback):
                if hook in vars(cb) or fn is not default:
                    callees.append((cb, getattr(cb, hook), False))
            else:
                callees.append((cb, raw, True))
        return callees

    def _each(self, hook: str, trainer: pl.Trainer, *args: Any) -> None:
        """Call ``hook`` on every check that implements it, the report last; per-step hooks
        skip the checks that are done with their per-step work (``idle``)."""
        if hook in _PER_STEP:
            if self._active_version != TriageCallback.idle_version:
                self._refresh_active()
            callees = self._active[hook]
        else:
            callees = self._all_callees(hook)
        for cb, fn, guarded in callees:
            if not guarded:
                fn(trainer, *args)
                continue
            assert isinstance(cb, TriageCallback)
            if cb.disabled:
                continue
            try:
                with library_code():  # unseen by a watch of the user's step
                    fn(cb, trainer, *args)
            except Exception as exc:
                cb.hook_failed(trainer, hook, exc)

    def _refresh_active(self) -> None:
        """Rebuild the per-step callees (at the first step, then when a check goes idle). A
        per-step hook left with none is set to ``None`` on this instance for the rest of the fit:
        Lightning skips a hook that is not callable, so the step does not pay its dispatch (a
        check that went idle stays idle until the next ``setup``, which restores the hooks)."""
        self._active, self._active_version = {}, TriageCallback.idle_version
        for hook in _PER_STEP:
            callees = self._active[hook] = [
                c for c in self._all_callees(hook) if _needs(c[0], hook)]
            if not callees and self._in_fit:
                skip_hook(self, hook)

    def _restore_hooks(self) -> None:
        """Undo :meth:`_refresh_active`'s ``None`` hooks (end of fit, exception, pickling)."""
        unskip_hooks(self, _PER_STEP)

    def _all_callees(self, hook: str) -> list[tuple[Callback, Callable[..., Any], bool]]:
        callees = self._callees_by_hook.get(hook)
        if callees is None:
            callees = self._callees_by_hook[hook] = self._callees(hook)
        return callees

    # ------------------------------------------------------------------ state
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_callees_by_hook"] = {}  # functions and bound methods: rebuilt on first use
        state["_active"], state["_active_version"] = {}, -1
        state["_in_fit"] = False
        for hook in _PER_STEP:
            state.pop(hook, None)
        return state

    @property
    @override
    def state_key(self) -> str:
        """``Triage``, followed by ``report_dir`` and ``fail_on`` where they differ from their
        defaults (as Lightning's ``EarlyStopping`` does): a second ``Triage`` that differs there
        reaches :meth:`setup`, which says what to do, instead of Lightning's "more than one
        stateful callback" error."""
        return state_key_of(self, ("report_dir", "fail_on"))

    @override
    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        """A checkpoint written when the key was ``Triage`` alone resumes with its state."""
        states = checkpoint.get("callbacks") or {}
        if self.state_key not in states and isinstance(states.get("Triage"), dict):
            self.load_state_dict(states["Triage"])
        self._each("on_load_checkpoint", trainer, pl_module, checkpoint)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {check.state_key: check.state_dict() for check in self.checks}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for check in self.checks:
            if check.state_key in state_dict:
                check.load_state_dict(state_dict[check.state_key])

    # ------------------------------------------------------------------ hooks
    # Every other hook of Lightning's `Callback` is forwarded by `_forwarder` (below the class).
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._callees_by_hook = {}  # `checks` may have been edited since the last fit
        self._active, self._active_version = {}, -1
        self._restore_hooks()
        self._in_fit = stage == "fit"
        others = [cb for cb in getattr(trainer, "callbacks", []) or []
                  if isinstance(cb, Triage) and cb is not self]
        if others:
            shown = ", ".join(f"Triage(report_dir={cb.report_dir!r}, fail_on={cb.fail_on!r})"
                              for cb in (self, *others))
            raise TriageConfigError(
                f"`Triage` appears {len(others) + 1} times in the Trainer's callbacks ({shown}): "
                "keep one. One `Triage` runs every check and writes one report; for a second "
                "gate, run `lightning-triage show REPORT_DIR --fail-on SEVERITY` on its report; "
                "with LightningCLI, a config's `trainer.callbacks` list is appended to the "
                "template's: set the template's `Triage` arguments instead of adding one.",
                argument="callbacks", value=len(others) + 1)
        for check in self.checks:
            if self._in_fit:  # one report per fit (before a checkpoint's state is restored)
                check.start_fit()
            check.idle = False
        self._each("setup", trainer, pl_module, stage)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._in_fit = False
        self._restore_hooks()
        self._each("teardown", trainer, pl_module, stage)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self._in_fit = False
        self._restore_hooks()
        self._each("on_exception", trainer, pl_module, exception)


def build_checks(args: dict[str, Any]) -> list[TriageCallback]:
    """The bundle's checks, in the order of :data:`~lightning_triage.callbacks.CHECKS`, each
    built from the bundle's arguments ``args`` as its class declares (``bundle_args``,
    ``bundle_switch``; ``strict`` always). A check switched off is still built, so its
    arguments are validated; the errors name the arguments as ``Triage`` does."""
    renamed = {own: theirs for cls in CHECKS for own, theirs in cls.bundle_args.items()
               if isinstance(theirs, str) and own != theirs}
    with aliases(**renamed):
        built = [(cls, cls(**{own: args[theirs] if isinstance(theirs, str) else theirs(args)
                              for own, theirs in cls.bundle_args.items()},
                           strict=args["strict"]))
                 for cls in CHECKS]
    return [check for cls, check in built
            if cls.bundle_switch is None or args[cls.bundle_switch]]


#: The hooks of Lightning's ``Callback`` the bundle forwards to its checks and report as they
#: come (everything but the state, which the bundle keeps per check, and the hooks it defines
#: itself above).
FORWARDED_HOOKS: tuple[str, ...] = tuple(
    name for name, value in vars(Callback).items()
    if callable(value) and not name.startswith("_")
    and name not in ("state_dict", "load_state_dict", "setup", "teardown", "on_exception",
                     "on_load_checkpoint"))


def _forwarder(hook: str) -> Callable[..., None]:
    def forward(self: Triage, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        self._each(hook, trainer, *args, *kwargs.values())

    forward.__name__ = forward.__qualname__ = hook
    forward.__doc__ = f"Forward ``{hook}`` to the checks that implement it, the report last."
    return forward


for _hook in FORWARDED_HOOKS:
    setattr(Triage, _hook, _forwarder(_hook))
del _hook
