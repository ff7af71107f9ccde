"""The finding codes of the run's settings (`run.*`, context) and of the library itself
(`triage.*`): one ``spec(...)`` row per code."""

from __future__ import annotations

from lightning_triage.codes.spec import CodeSpec, spec

SPECS: tuple[CodeSpec, ...] = (
    spec("run.unseeded", "info", "No global seed was set",
         "Call `lightning.seed_everything(seed)` (or `seed_everything: <seed>` in LightningCLI) "
         "so a rerun that changes one setting can be compared with this one.",
         when="No `seed_everything` call was seen before the fit (info)."),
    spec("run.ranks_missing", "info", "The findings of some ranks are not in the report",
         "Look at the log of the ranks named: they ended without leaving their findings (stuck "
         "in a collective, killed, or writing to another machine's disk). Give every rank a "
         "shared `report_dir` to have their findings merged.",
         when="Under several ranks, the fit ended by an exception before the ranks gathered "
              "their findings, and rank 0 found no rank file of these ranks beside the report "
              "(info: the crash itself is the problem)."),
    # meta
    spec("triage.check_error", "warning", "A triage check failed internally and was disabled",
         "The training run was not affected. Please report it with the evidence; pass "
         "`strict=True` to raise instead.",
         when="A check raised internally; it is disabled and the run goes on (`strict=True` raises "
              "instead)."),
)

__all__ = ["SPECS"]
