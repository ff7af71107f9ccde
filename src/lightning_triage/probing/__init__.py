"""Run probes on the user's model without changing the run.

Probes (overfit one batch, structure and leak probes, numerics replays) execute the user's own
code on a real batch. :func:`probe_module` runs them on a deep copy of the LightningModule (the
trainer, its loggers, callbacks and datamodule shared, not copied), so everything the module
holds (attributes, flags, hidden states, metrics, lists, generators, caches) stays with the
copy. When a copy would not fit in memory it falls back to :func:`isolated`: a complete
snapshot of the live module, always fully restored. While a probe runs the trainer's loggers
receive nothing and ``self.log`` is swallowed; side effects outside the module (files, prints)
still happen.

Submodules: :mod:`~lightning_triage.probing.state` (RNG, loggers, errors, shared objects),
:mod:`~lightning_triage.probing.isolation` (the copy, :func:`probe_module`),
:mod:`~lightning_triage.probing.snapshot` (the in-place snapshot, :func:`isolated`),
:mod:`~lightning_triage.probing.recording` (module hooks recording one run of the user's code),
:mod:`~lightning_triage.probing.replay` (running the user's step on a copy of the batch).
"""

from lightning_triage.probing.isolation import (
    COPY_MEMORY_FRACTION,
    Probe,
    SharedStorageError,
    check_no_shared_storage,
    copy_module,
    copy_optimizer,
    free_bytes,
    module_bytes,
    probe_module,
    without_our_hooks,
)
from lightning_triage.probing.replay import (
    STEP_CALLS,
    copy_first_examples,
    count_step_call,
    eval_copy,
    run_user_step,
    step_caller,
    step_loss,
)
from lightning_triage.probing.snapshot import MAX_SNAPSHOT_DEPTH, MAX_SNAPSHOT_ITEMS, isolated
from lightning_triage.probing.state import (
    ProbeUnavailableError,
    RngState,
    UserCodeError,
    _noop,
    quiet_loggers,
    rng_state,
    set_rng_state,
    shared_objects,
    silenced_logging,
    trainer_state,
    user_code,
)

__all__ = [
    "COPY_MEMORY_FRACTION",
    "MAX_SNAPSHOT_DEPTH",
    "MAX_SNAPSHOT_ITEMS",
    "STEP_CALLS",
    "Probe",
    "ProbeUnavailableError",
    "RngState",
    "SharedStorageError",
    "UserCodeError",
    "_noop",
    "check_no_shared_storage",
    "copy_first_examples",
    "copy_module",
    "copy_optimizer",
    "count_step_call",
    "eval_copy",
    "free_bytes",
    "isolated",
    "module_bytes",
    "probe_module",
    "quiet_loggers",
    "rng_state",
    "run_user_step",
    "set_rng_state",
    "shared_objects",
    "silenced_logging",
    "step_caller",
    "step_loss",
    "trainer_state",
    "user_code",
    "without_our_hooks",
]
