"""The label realignment remedy of ``structure.label_misaligned``: the labels of a batch moved
by the offset the structure probe found, on a copy.

The probe measures by how many positions the targets a loss receives lead the inputs (the
finding's ``loss_offset``: 2 when the labels are shifted twice, 0 when a causal model is scored
against its own tokens); next-token prediction is 1. The batch's labels therefore lead by
``label_offset = loss_offset - 1`` positions too many, whatever the model does to them inside
(transformers' causal LMs shift them once more): moving them ``label_offset`` positions later
(:func:`realign_labels`, the freed end filled with the loss's ``ignore_index``) makes the loss
score next-token prediction. The functions here are pure; the replay that tries it is
:func:`~lightning_triage.callbacks._remedy.run_trial`'s.

Example:
    >>> import torch
    >>> labels = torch.tensor([[6, 7, 8, -100]])  # input_ids [[5, 6, 7, 8]] shifted by the user
    >>> realign_labels(labels, 1).tolist()  # back to `labels = input_ids` for a model that shifts
    [[-100, 6, 7, 8]]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_triage.functional.batch import iter_tensors
from lightning_triage.functional.collection import map_tensors
from lightning_triage.functional.structure import target_shift


def realign_labels(labels: Tensor, offset: int, ignore_index: int = -100) -> Tensor:
    """``labels`` moved ``offset`` positions later along dim 1 (earlier for a negative one),
    the positions left without a label set to ``ignore_index``; a new tensor.

    Example:
        >>> import torch
        >>> realign_labels(torch.tensor([[5, 6, 7, 8]]), -1).tolist()  # `labels = input_ids`
        [[6, 7, 8, -100]]
    """
    out = torch.full_like(labels, ignore_index)
    length = labels.shape[1]
    if abs(offset) >= length:
        return out
    if offset >= 0:
        out[:, offset:] = labels[:, :length - offset]
    else:
        out[:, :length + offset] = labels[:, -offset:]
    return out


def entry(batch: Any, name: str) -> Tensor | None:
    """The tensor of ``batch`` at the path ``name`` (as :func:`~lightning_triage.functional.
    batch.locate_batch` names it, e.g. ``batch['labels']`` or ``batch[1]``); ``None`` if none.

    Example:
        >>> import torch
        >>> entry({"input_ids": torch.zeros(2, 3), "labels": torch.ones(2, 3)}, "batch['labels']").sum()
        tensor(6.)
    """
    return next((t for path, t in iter_tensors(batch) if path == name), None)


@dataclass(frozen=True)
class LabelPlan:
    """Where the labels are and how to realign them (from the finding's evidence).

    Attributes:
        labels: the labels' path in the batch (``batch['labels']``).
        inputs: the inputs' path.
        offset: positions the labels are moved later (``label_offset``).
        lead: by how many positions the batch's labels led the inputs at the probe.
        ignore_index: the value the loss ignores (for the freed positions).
    """

    labels: str
    inputs: str
    offset: int
    lead: int
    ignore_index: int

    def transform(self) -> Callable[[Any], Any]:
        """``batch -> batch`` with the labels realigned (other entries unchanged)."""
        def apply(batch: Any) -> Any:
            labels = entry(batch, self.labels)
            return map_tensors(lambda t: realign_labels(t, self.offset, self.ignore_index)
                               if t is labels else t, batch)

        return apply

    def describe(self) -> str:
        """The change, in the report's words."""
        where = "later" if self.offset > 0 else "earlier"
        end = "first" if self.offset > 0 else "last"
        n = abs(self.offset)
        return (f"the labels (`{self.labels}`) moved {n} position{'s' if n > 1 else ''} {where} "
                f"({self.ignore_index} at the {end} position{'s' if n > 1 else ''} of each row), "
                "the loss measured with the realigned labels")


def label_plan(evidence: Mapping[str, Any]) -> LabelPlan | str:
    """The realignment the finding's evidence allows, or why there is none (a string).

    Example:
        >>> label_plan({"label_offset": 1, "label_entry": "batch['labels']",
        ...             "input_entry": "batch['input_ids']", "labels_lead_by": 1,
        ...             "ignore_index": -100}).offset
        1
        >>> label_plan({"loss_offset": 2})[:40]
        'the finding does not say where the label'
    """
    offset, labels, inputs = (evidence.get(k) for k in ("label_offset", "label_entry",
                                                          "input_entry"))
    lead, ignore = evidence.get("labels_lead_by"), evidence.get("ignore_index", -100)
    if not isinstance(offset, int) or not isinstance(labels, str) or not isinstance(inputs, str):
        return ("the finding does not say where the labels are in the batch (a report from an "
                "earlier version, or the probe could not tell)")
    if not labels.startswith("batch"):
        return (f"the labels were taken from `{labels}`, not an entry of the batch: they cannot "
                "be replaced in the recorded batches")
    if not isinstance(lead, int):
        return (f"the batch's labels (`{labels}`) do not lead the inputs by 0 or 1 positions: "
                "the targets the loss received are not made from them alone")
    if offset == 0 or not isinstance(ignore, int):
        return "no offset to realign by"
    return LabelPlan(labels, inputs, offset, lead, ignore)


def label_symptom(plan: LabelPlan, batches: Sequence[Any]) -> tuple[bool, str] | str:
    """Whether the recorded batches show the misalignment the probe saw (their labels lead the
    inputs by ``plan.lead`` positions in every batch), and what they show; a string: the
    labels are not in the recorded batches (the remedy cannot be applied)."""
    leads = []
    for batch in batches:
        x, y = entry(batch, plan.inputs), entry(batch, plan.labels)
        if x is None or y is None or y.dim() != 2 or x.shape != y.shape \
                or x.is_floating_point() or y.is_floating_point():
            return (f"the recorded batches hold no `(N, T)` integer labels at `{plan.labels}` "
                    f"beside the inputs at `{plan.inputs}`")
        leads.append(target_shift(x, y, plan.ignore_index))
    same = sum(lead == plan.lead for lead in leads)
    ahead = plan.offset + 1  # the loss offset
    scored = "its own token" if ahead == 0 else f"the token {ahead} positions ahead"
    relation = "are the inputs themselves" if plan.lead == 0 else \
        f"lead the inputs by {plan.lead} position{'s' if plan.lead > 1 else ''}"
    if same == len(leads):
        return True, (f"the labels of all {len(leads)} recorded batches {relation}, as at the "
                      f"probe: the loss scores each position against {scored}")
    return False, (f"the labels of only {same} of the {len(leads)} recorded batches {relation}, "
                   "as at the probe")


__all__ = ["LabelPlan", "entry", "label_plan", "label_symptom", "realign_labels"]
