"""The worst validation errors: the validation examples with the highest loss, for the report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from torch.utils.data import DataLoader, SequentialSampler
from typing_extensions import override

from lightning_triage.callbacks._args import BundleArg, check_batch_keys, check_int, fail, passes
from lightning_triage.callbacks.base import TriageCallback, guarded
from lightning_triage.functional.batch import BatchKey, locate_batch
from lightning_triage.functional.chance import IGNORE_INDEX
from lightning_triage.functional.hooks import HeadCapture
from lightning_triage.functional.worst import (
    MAX_THUMBNAIL_SIDE,
    WorstBuffer,
    example_losses,
    thumbnail,
    worst_errors_verdict,
)

#: Batch keys holding each example's index in its dataset.
INDEX_KEYS = ("index", "idx", "indices", "dataset_index", "sample_index", "example_index")


class WorstErrors(TriageCallback):
    """Keep the validation examples with the highest loss, with their labels, predictions and
    confidence: they often show label noise or a data problem.

    During each validation run (sanity check excluded, first dataloader only) the model's head
    output is captured with temporary forward hooks (registered at the start of the validation
    epoch, removed at its end: training pays nothing), turned into a per-example cross-entropy
    with the batch's targets, and merged into a top-``k`` buffer on the device
    (:class:`~lightning_triage.functional.worst.WorstBuffer`: no host synchronization per batch,
    memory bounded by ``k``). At the end of each validation run the ``k`` worst examples move to
    the host once and become one ``data.worst_errors`` info finding (replacing the previous
    run's): ``evidence.examples`` lists, highest loss first, ``loss``, ``label``, ``prediction``,
    ``confidence`` (probability of the predicted class), ``label_probability``,
    ``dataset_index`` (from an ``index``/``idx`` batch entry, or counted along a sequential
    validation loader; else ``None``), ``batch_idx``, ``position`` and, for image-like inputs,
    ``thumbnail`` (a ``C x h x w`` uint8 array, sides at most ``thumbnail_side``).

    Classification only: ``(N, C)`` logits with class targets, or binary logits with 0/1
    targets. For other tasks the check says so in its detail and stops capturing.

    Args:
        k: how many examples to keep.
        input_key: the batch entry holding the inputs (for thumbnails).
        target_key: the batch entry holding the targets.
        index_key: the batch entry holding each example's dataset index (default: found by
            name: ``index``, ``idx``...).
        image_shape: ``(H, W)`` or ``(C, H, W)`` to fold flat inputs into images for thumbnails
            (e.g. ``(8, 8)`` for scikit-learn digits); images ``(N, C, H, W)``/``(N, H, W)``
            need nothing.
        thumbnail_side: the largest side of a thumbnail (0: no thumbnails).
        ignore_index: target value of examples left out.
        strict: raise internal errors instead of disabling the check.

    Raises:
        TriageConfigError: for an invalid argument (named in the message).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[WorstErrors(k=20, image_shape=(8, 8))])

        In LightningCLI YAML::

            trainer:
              callbacks:
                - class_path: lightning_triage.WorstErrors
                  init_args: {k: 20}
    """

    stage: ClassVar[str] = "data"
    codes: ClassVar[tuple[str, ...]] = ("data.worst_errors",)
    # how `Triage` builds this check (TriageCallback.bundle_args)
    bundle_args: ClassVar[Mapping[str, BundleArg]] = passes(
        "input_key", "target_key")

    state_key_args = ("k", "input_key", "target_key", "index_key")

    def __init__(
        self,
        *,
        k: int = 20,
        input_key: BatchKey | None = None,
        target_key: BatchKey | None = None,
        index_key: BatchKey | None = None,
        image_shape: tuple[int, ...] | None = None,
        thumbnail_side: int = MAX_THUMBNAIL_SIDE,
        ignore_index: int = IGNORE_INDEX,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        check_int("k", k, 1, 1000)
        check_batch_keys(input_key=input_key, target_key=target_key, index_key=index_key)
        if image_shape is not None and (
                not isinstance(image_shape, (tuple, list)) or len(image_shape) not in (2, 3)
                or not all(isinstance(d, int) and d > 0 for d in image_shape)):
            raise fail("image_shape", image_shape, "(H, W) or (C, H, W) positive integers or None")
        check_int("thumbnail_side", thumbnail_side, 0, 128)
        check_int("ignore_index", ignore_index)
        self.k = k
        self.input_key = input_key
        self.target_key = target_key
        self.index_key = index_key
        self.image_shape = None if image_shape is None else tuple(image_shape)
        self.thumbnail_side = thumbnail_side
        self.ignore_index = ignore_index
        self.buffer = WorstBuffer(k)
        self.not_classification: str | None = None
        self._capture = HeadCapture()  # hooks only during a validation run
        self._offset = 0
        self._sequential = False

    # ------------------------------------------------------------------ validation
    def _active(self, trainer: pl.Trainer) -> bool:
        return not trainer.sanity_checking and trainer.state.fn == "fit" \
            and self.not_classification is None

    @override
    @guarded
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close()
        if not self._active(trainer):
            return
        self.buffer.reset()
        self._offset = 0
        self._sequential = self._is_sequential(trainer)
        self._capture.start(pl_module, None)
        if self._capture.traced:
            self.not_classification = ("the LightningModule is compiled as a whole: capturing its "
                                       "outputs would change the compiled graph")
            self.skip(f"skipped: {self.not_classification}")
            self._close()

    @staticmethod
    def _is_sequential(trainer: pl.Trainer) -> bool:
        loaders = trainer.val_dataloaders
        loader = loaders[0] if isinstance(loaders, (list, tuple)) and loaders else loaders
        return (trainer.world_size == 1 and isinstance(loader, DataLoader)
                and isinstance(loader.sampler, SequentialSampler))

    @override
    @guarded
    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                  batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._capture.take()  # an output of another forward than this batch's

    @override
    @guarded
    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                outputs: STEP_OUTPUT, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        if not self._capture.active or dataloader_idx != 0:
            return
        output = self._capture.take()
        layout = locate_batch(batch, self.input_key, self.target_key)
        x, y = layout.inputs, layout.targets
        n = None if x is None or x.dim() == 0 else x.shape[0]
        offset = self._offset
        self._offset += n or 0
        if output is None or y is None:
            return
        scored = example_losses(output, y, self.ignore_index)
        if scored is None:
            self.not_classification = (
                f"not a classification output: head output {tuple(output.shape)} with targets "
                f"{tuple(y.shape)} {str(y.dtype).replace('torch.', '')} (needs (N, C) logits and "
                "(N,) class targets, or binary logits and 0/1 targets)")
            self.skip(f"skipped: {self.not_classification}")
            self._close()
            return
        index = self._dataset_index(batch, scored.loss.shape[0], offset, scored.loss.device)
        thumbs = None
        if self.thumbnail_side and x is not None and x.shape[0] == scored.loss.shape[0]:
            images = x

            def thumbs(rows: Tensor) -> Tensor | None:  # only for the batch's worst rows
                return thumbnail(images[rows.to(images.device)], self.image_shape,
                                 self.thumbnail_side)

        self.buffer.add(scored, batch_idx=batch_idx, dataset_index=index, thumbnails=thumbs)

    def _dataset_index(self, batch: Any, n: int, offset: int,
                       device: torch.device) -> Tensor | None:
        if self.index_key is not None:
            found = locate_batch(batch, input_key=self.index_key).inputs
        else:
            found = None
            for name, tensor in locate_batch(batch).tensors:
                leaf = name.rsplit("[", 1)[-1].rsplit(".", 1)[-1].strip("]'\"").lower()
                if leaf in INDEX_KEYS:
                    found = tensor
                    break
        if found is not None and found.numel() == n and not found.is_floating_point():
            return found.reshape(n)
        if self._sequential:
            return torch.arange(offset, offset + n, device=device)  # no host-to-device copy
        return None

    @override
    @guarded
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._capture.active:
            return
        self._close()
        rows = self.buffer.rows()  # the one host transfer of this validation run
        if not rows:
            return
        self.findings = [f for f in self.findings if f.code != "data.worst_errors"]
        verdict = worst_errors_verdict(rows, self.buffer.seen, trainer.global_step, self.k)
        self.add_verdict(trainer, verdict)
        wrong = verdict.evidence["wrong"]
        self.mark_ran(f"{len(rows)} worst of {self.buffer.seen} validation examples at step "
                      f"{trainer.global_step}; {wrong} misclassified")

    @override
    @guarded
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.ran and not self.detail:
            self.skip("skipped: no validation run in this fit")

    # ------------------------------------------------------------------ hooks and state
    def _close(self) -> None:
        self._capture.close()

    @override
    def remove_handles(self) -> None:
        super().remove_handles()
        self._close()

    @override
    def extra_state(self) -> dict[str, Any]:
        return {"not_classification": self.not_classification}

    @override
    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.not_classification = state.get("not_classification")

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_capture"] = HeadCapture()
        state["buffer"] = WorstBuffer(self.k)
        return state


__all__ = ["WorstErrors"]
