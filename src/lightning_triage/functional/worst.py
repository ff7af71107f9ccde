"""The worst validation errors: the examples with the highest loss, kept on the device.

Pure functions and a small buffer over tensors (no Lightning). :func:`example_losses` turns a
classification head output and its targets into per-example loss, prediction and confidence;
:class:`WorstBuffer` keeps the ``k`` highest-loss examples seen so far, merging batch by batch
with ``torch.topk`` on the device (no host synchronization until :meth:`WorstBuffer.rows`);
:func:`thumbnail` shrinks image-like inputs to a bounded picture for the report.

Example:
    >>> import torch
    >>> buf = WorstBuffer(k=2)
    >>> logits = torch.tensor([[4.0, 0.0], [0.0, 4.0], [4.0, 0.0]])
    >>> scored = example_losses(logits, torch.tensor([0, 0, 1]))
    >>> buf.add(scored, batch_idx=0)
    >>> [(r["position"], r["label"], r["prediction"]) for r in buf.rows()]
    [(1, 0, 1), (2, 1, 0)]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_triage.functional.verdict import Verdict

#: Largest side of a thumbnail kept for the report (pixels).
MAX_THUMBNAIL_SIDE = 32


@dataclass(frozen=True)
class ScoredExamples:
    """Per-example ``loss``, ``label``, ``prediction`` and ``confidence`` (the predicted class's
    probability) of one batch, and ``label_probability`` (the probability given to the label);
    all ``(N,)`` tensors on the batch's device. Rows whose target is ``ignore_index`` or not a
    valid class have loss ``-inf`` (they never rank among the worst); ``position`` is each
    example's row in the batch."""

    loss: Tensor
    label: Tensor
    prediction: Tensor
    confidence: Tensor
    label_probability: Tensor
    position: Tensor


def example_losses(output: Tensor, targets: Tensor, ignore_index: int = -100) -> ScoredExamples | None:
    """Per-example cross-entropy of a classification output, or ``None`` when the shapes are not
    those of one: ``(N, C)`` logits with ``(N,)`` integer class targets, or binary ``(N,)``/
    ``(N, 1)`` logits with ``N`` targets. Decided from shapes and dtypes only: no host
    synchronization (targets outside ``[0, C)`` or ``{0, 1}`` get loss ``-inf``).

    Example:
        >>> out = example_losses(torch.tensor([[2.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 0]))
        >>> [round(v, 3) for v in out.loss.tolist()], out.prediction.tolist()
        ([0.127, 2.127], [0, 1])
        >>> round(example_losses(torch.tensor([3.0, -3.0]), torch.tensor([1.0, 1.0])).loss[1].item(), 3)
        3.049
        >>> example_losses(torch.zeros(2, 3), torch.tensor([1, -100])).loss.tolist()[1]
        -inf
        >>> print(example_losses(torch.randn(4, 3), torch.randn(4)))
        None
    """
    n = output.shape[0] if output.dim() else 0
    if n == 0 or targets.dim() == 0 or targets.shape[0] != n or not output.is_floating_point():
        return None
    logits = output.detach().float()
    position = torch.arange(n, device=logits.device)
    invalid = torch.tensor(float("-inf"), device=logits.device)
    if logits.dim() == 2 and logits.shape[1] >= 2 and targets.dim() == 1 \
            and not targets.is_floating_point():
        y = targets.detach().to(logits.device).long()
        valid = (y >= 0) & (y < logits.shape[1]) & (y != ignore_index)
        y_safe = torch.where(valid, y, torch.zeros_like(y))
        log_probs = F.log_softmax(logits, dim=1)
        nll = -log_probs.gather(1, y_safe[:, None]).squeeze(1)
        confidence, prediction = log_probs.exp().max(dim=1)
        label_probability = (-nll).exp()
        loss = torch.where(valid, nll, invalid)
        return ScoredExamples(loss, y, prediction, confidence, label_probability, position)
    if logits.numel() != n or targets.numel() != n:
        return None
    binary = logits.reshape(n)
    y_float = targets.detach().reshape(n).to(logits.device).float()
    valid = (y_float == 0) | (y_float == 1)
    bce = F.binary_cross_entropy_with_logits(binary, y_float.clamp(0, 1), reduction="none")
    p1 = torch.sigmoid(binary)
    prediction = (p1 > 0.5).long()
    confidence = torch.where(prediction == 1, p1, 1 - p1)
    label_probability = torch.where(y_float == 1, p1, 1 - p1)
    loss = torch.where(valid, bce, invalid)
    return ScoredExamples(loss, y_float.long(), prediction, confidence, label_probability, position)


def thumbnail(inputs: Tensor, image_shape: tuple[int, ...] | None = None,
              max_side: int = MAX_THUMBNAIL_SIDE) -> Tensor | None:
    """Image-like inputs as ``(N, C, h, w)`` uint8 thumbnails (each image scaled to 0-255 by its
    own range, sides at most ``max_side``), else ``None``.

    Image-like: ``(N, C, H, W)`` with 1, 3 or 4 channels, ``(N, H, W)``, or flat ``(N, D)``
    features when ``image_shape`` (``(H, W)`` or ``(C, H, W)``) says how to fold them.

    Example:
        >>> thumbnail(torch.rand(2, 3, 64, 48)).shape
        torch.Size([2, 3, 32, 24])
        >>> thumbnail(torch.rand(5, 64), image_shape=(8, 8)).shape
        torch.Size([5, 1, 8, 8])
        >>> print(thumbnail(torch.rand(5, 64)))
        None
    """
    x = inputs.detach()
    if not x.is_floating_point():
        if x.dtype != torch.uint8:
            return None
        x = x.float()
    n = x.shape[0] if x.dim() else 0
    if n == 0:
        return None
    if image_shape is not None:
        shape = tuple(image_shape) if len(image_shape) == 3 else (1, *image_shape)
        if x[0].numel() != shape[0] * shape[1] * shape[2]:
            return None
        x = x.reshape(n, *shape)
    elif x.dim() == 3:
        x = x[:, None]
    elif not (x.dim() == 4 and x.shape[1] in (1, 3, 4)):
        return None
    if x.shape[-2] < 2 or x.shape[-1] < 2:
        return None
    x = x.float()
    h, w = x.shape[-2:]
    scale = max(h, w) / max_side
    if scale > 1:
        x = F.adaptive_avg_pool2d(x, (max(1, round(h / scale)), max(1, round(w / scale))))
    flat = x.reshape(n, -1)
    low, high = flat.min(dim=1).values, flat.max(dim=1).values
    span = (high - low).clamp_min(1e-12)
    x = (x - low[:, None, None, None]) / span[:, None, None, None]
    return (x * 255).round().clamp(0, 255).to(torch.uint8)


class WorstBuffer:
    """The ``k`` highest-loss examples seen, with their labels, predictions, confidences,
    dataset indices (``-1``: unknown), batch indices, positions and thumbnails.

    Everything stays on the device of the first batch added; each :meth:`add` is a concatenation
    and a ``torch.topk`` over at most ``k + batch size`` values; memory is bounded by ``k``.
    """

    def __init__(self, k: int = 20) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"`k` must be an integer >= 1, got {k!r}.")
        self.k = k
        self.seen = 0
        self._columns: dict[str, Tensor] | None = None
        self._thumbs: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self._columns is None else int(self._columns["loss"].shape[0])

    def add(self, scored: ScoredExamples, *, batch_idx: int, dataset_index: Tensor | None = None,
            thumbnails: Tensor | Callable[[Tensor], Tensor | None] | None = None) -> None:
        """Merge one batch's examples.

        Args:
            scored: the batch's per-example losses (:func:`example_losses`).
            batch_idx: the batch's index in the loader.
            dataset_index: each batch row's index in its dataset.
            thumbnails: each batch row's thumbnail, or a callable that makes the thumbnails of
                the batch rows it is given (called for at most ``k`` rows: the batch's worst).
        """
        m = scored.loss.shape[0]
        self.seen += m
        if m == 0:
            return
        device = scored.loss.device
        loss = torch.nan_to_num(scored.loss.float(), nan=float("inf"), neginf=float("-inf"))
        pick = torch.topk(loss, self.k).indices if m > self.k else torch.arange(m, device=device)
        rows = scored.position[pick]
        index = (dataset_index.to(device).long().reshape(-1)[rows]
                 if dataset_index is not None else torch.full_like(rows, -1))
        new = {"loss": loss[pick], "label": scored.label[pick].long(),
               "prediction": scored.prediction[pick].long(),
               "confidence": scored.confidence[pick].float(),
               "label_probability": scored.label_probability[pick].float(),
               "dataset_index": index, "position": rows.long(),
               "batch_idx": torch.full_like(rows, batch_idx, dtype=torch.long)}
        if callable(thumbnails):
            thumbs = thumbnails(rows)
        else:
            thumbs = None if thumbnails is None else thumbnails[rows.to(thumbnails.device)]
        thumbs = None if thumbs is None else thumbs.to(device)
        if self._columns is not None:
            new = {key: torch.cat([self._columns[key], value.to(self._columns[key].device)])
                   for key, value in new.items()}
            if thumbs is not None and self._thumbs is not None \
                    and thumbs.shape[1:] == self._thumbs.shape[1:]:
                thumbs = torch.cat([self._thumbs, thumbs.to(self._thumbs.device)])
            else:
                thumbs = None
        top = torch.topk(new["loss"], min(self.k, new["loss"].shape[0])).indices
        self._columns = {key: value[top] for key, value in new.items()}
        self._thumbs = None if thumbs is None else thumbs[top]

    def rows(self) -> list[dict[str, Any]]:
        """The kept examples, highest loss first, as plain Python values (one host transfer)."""
        if self._columns is None:
            return []
        host = {key: value.cpu().tolist() for key, value in self._columns.items()}
        thumbs = None if self._thumbs is None else self._thumbs.cpu()
        rows = []
        for i in range(len(host["loss"])):
            if host["loss"][i] == float("-inf"):
                continue  # fewer valid examples than `k`
            row: dict[str, Any] = {key: host[key][i] for key in host}
            if row["dataset_index"] < 0:
                row["dataset_index"] = None
            row["thumbnail"] = None if thumbs is None else thumbs[i].tolist()
            rows.append(row)
        return rows

    def reset(self) -> None:
        self.seen = 0
        self._columns, self._thumbs = None, None


def worst_errors_verdict(rows: Sequence[Mapping[str, Any]], seen: int, step: int | None,
                         k: int) -> Verdict:
    """``data.worst_errors`` (info): the validation examples with the highest loss.

    Args:
        rows: the worst examples, highest loss first (:meth:`WorstBuffer.rows`).
        seen: the validation examples seen.
        step: the global step of the validation run.
        k: how many examples were kept.

    Example:
        >>> row = {"loss": 4.5, "prediction": 5, "label": 9, "confidence": 0.95,
        ...        "dataset_index": 229, "batch_idx": 0, "position": 229, "thumbnail": None}
        >>> worst_errors_verdict([row], 359, 90, 20).message
        'The 1 validation examples with the highest loss (of 359 seen at step 90): loss 4.5 down \
to 4.5; 1 predicted as another class than their label, 1 of them with confidence above 0.9. The \
examples: 229.'
    """
    wrong = sum(1 for r in rows if r["prediction"] != r["label"])
    confident = sum(1 for r in rows if r["prediction"] != r["label"] and r["confidence"] > 0.9)
    ids = [r["dataset_index"] if r["dataset_index"] is not None
           else f"batch {r['batch_idx']} row {r['position']}" for r in rows[:8]]
    shown = ", ".join(str(i) for i in ids) + (f" and {len(rows) - 8} more" if len(rows) > 8 else "")
    return Verdict(
        "data.worst_errors", step,
        f"The {len(rows)} validation examples with the highest loss (of {seen} seen at step "
        f"{step}): loss {rows[0]['loss']:.3g} down to {rows[-1]['loss']:.3g}; {wrong} predicted "
        f"as another class than their label, {confident} of them with confidence above 0.9. The "
        f"examples: {shown}.",
        evidence={"k": k, "seen": seen, "wrong": wrong, "confident_wrong": confident,
                  "examples": list(rows),
                  "thumbnail_layout": "C x h x w uint8" if rows[0]["thumbnail"] else None})


__all__ = ["MAX_THUMBNAIL_SIDE", "ScoredExamples", "WorstBuffer", "example_losses", "thumbnail",
           "worst_errors_verdict"]
