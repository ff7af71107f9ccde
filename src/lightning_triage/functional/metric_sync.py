"""Monitored metrics agree across ranks: a value logged without ``sync_dist=True`` differs
between ranks (each holds the mean of its own shard), and a checkpoint or early-stopping
callback that monitors it decides from one rank's shard.

Pure Python over the values each rank holds (gathered by the callback,
:class:`~lightning_triage.MetricSyncCheck`); no Lightning, no collective.

Example:
    >>> v = unsynced_rule([{"val_loss": 0.9}, {"val_loss": 1.1}], {"val_loss": ["ModelCheckpoint"]},
    ...                   step=40)
    >>> v[0].code, v[0].evidence["values"]
    ('mode.unsynced_metric', [0.9, 1.1])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lightning_triage.functional.verdict import Verdict

#: Relative spread of a metric across ranks reported (a synced value is the same on every rank).
RTOL = 1e-6


def unsynced_rule(values: Sequence[Mapping[str, float]], monitored: Mapping[str, Sequence[str]],
                  step: int, ranks: Sequence[int] | None = None,
                  logged: Sequence[str] = ()) -> list[Verdict]:
    """``mode.unsynced_metric`` for each metric whose value differs between ranks (``values``:
    one ``{name: value}`` per rank; ``monitored``: name -> the callbacks that monitor it;
    ``logged``: the other metrics logged in the validation run). A warning for a monitored
    metric (the callbacks decide from one rank's shard); info for one nothing monitors (only
    what is logged and shown is one rank's).

    Example:
        >>> unsynced_rule([{"acc": 0.5}, {"acc": 0.5}], {"acc": ["EarlyStopping"]}, step=1)
        []
        >>> v = unsynced_rule([{"f1": 0.5}, {"f1": 0.6}], {}, step=1, logged=["f1"])
        >>> v[0].severity, v[0].evidence["monitored_by"]
        ('info', [])
    """
    names = list(ranks) if ranks is not None else list(range(len(values)))
    readers_of = {**{m: list(r) for m, r in monitored.items()},
                  **{m: [] for m in logged if m not in monitored}}
    verdicts = []
    for metric, readers in readers_of.items():
        seen = [v.get(metric) for v in values]
        if len(seen) < 2 or any(x is None or x != x for x in seen):
            continue
        got = [float(x) for x in seen if x is not None]
        spread = max(got) - min(got)
        if spread <= RTOL * max(abs(x) for x in got):
            continue
        shown = [float(f'{x:.6g}') for x in got]
        if readers:
            message = (f"`{metric}` differs between ranks {names} at step {step}: {shown}: it "
                       f"is logged without `sync_dist=True`, so "
                       f"{' and '.join(f'`{r}`' for r in readers)} decide(s) from one rank's "
                       "shard of the validation data.")
        else:
            message = (f"`{metric}` differs between ranks {names} at step {step}: {shown}: it "
                       "is logged without `sync_dist=True`, so the value logged and shown is "
                       "rank 0's shard of the validation data. Nothing monitors it (no "
                       "`ModelCheckpoint` or `EarlyStopping`): no decision depends on it.")
        verdicts.append(Verdict(
            "mode.unsynced_metric", step, message, severity=None if readers else "info",
            evidence={"metric": metric, "ranks": names, "values": got, "monitored_by": readers}))
    return verdicts


__all__ = ["RTOL", "unsynced_rule"]
