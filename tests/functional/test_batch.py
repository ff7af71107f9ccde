"""Finding inputs and targets in every batch structure users have."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch

from lightning_triage.functional.batch import iter_tensors, locate_batch, split_batch

X = torch.randn(4, 3)
Y = torch.tensor([0, 1, 2, 1])


def test_lone_tensor_is_inputs_only():
    layout = locate_batch(X)
    assert layout.inputs is X
    assert layout.targets is None
    assert layout.input_name == "batch"
    assert layout.note is None


@pytest.mark.parametrize("container", [tuple, list])
def test_pair_and_extras(container):
    idx = torch.arange(4)
    layout = locate_batch(container([X, Y, idx]))
    assert layout.inputs is X
    assert layout.targets is Y
    assert (layout.input_name, layout.target_name) == ("batch[0]", "batch[1]")
    assert [n for n, _ in layout.other_tensors()] == ["batch[2]"]


def test_non_tensor_entries_are_skipped():
    layout = locate_batch((["a", "b", "c", "d"], X, Y, 7))
    assert layout.inputs is X
    assert layout.targets is Y
    assert layout.input_name == "batch[1]"


@pytest.mark.parametrize(("in_key", "out_key"), [
    ("input", "target"), ("inputs", "targets"), ("x", "y"), ("image", "label"),
    ("images", "labels"), ("pixel_values", "labels"), ("input_ids", "labels"), ("Image", "Label"),
])
def test_dict_common_keys(in_key, out_key):
    batch = {"id": ["a", "b", "c", "d"], out_key: Y, in_key: X}
    layout = locate_batch(batch)
    assert layout.inputs is X
    assert layout.targets is Y
    assert layout.input_name == f"batch[{in_key!r}]"
    assert layout.target_name == f"batch[{out_key!r}]"


def test_nested_tuple_inputs():
    x2 = torch.zeros(4, 2)
    layout = locate_batch(((X, x2), Y))
    assert layout.inputs is X
    assert layout.targets is Y
    assert layout.input_name == "batch[0][0]"
    assert "batch[0][1]" in [n for n, _ in layout.other_tensors()]


def test_nested_dict_inputs():
    ids, mask = torch.randint(0, 9, (4, 5)), torch.ones(4, 5, dtype=torch.long)
    layout = locate_batch({"inputs": {"attention_mask": mask, "input_ids": ids}, "labels": Y})
    assert layout.inputs is ids
    assert layout.input_name == "batch['inputs']['input_ids']"
    assert layout.targets is Y


def test_list_holding_one_dict():
    layout = locate_batch([{"image": X, "label": Y}])
    assert layout.inputs is X
    assert layout.targets is Y
    assert layout.input_name == "batch[0]['image']"


@dataclass
class Sample:
    image: torch.Tensor
    label: torch.Tensor
    name: str


def test_dataclass():
    layout = locate_batch(Sample(X, Y, "s"))
    assert layout.inputs is X
    assert layout.targets is Y
    assert layout.input_name == "batch.image"


def test_namedtuple_by_name_and_by_position():
    Named = namedtuple("Named", ["label", "image"])
    layout = locate_batch(Named(Y, X))
    assert layout.inputs is X
    assert layout.targets is Y
    Other = namedtuple("Other", ["a", "b"])
    layout = locate_batch(Other(X, Y))
    assert layout.inputs is X
    assert layout.targets is Y


class GraphBatch:
    def __init__(self) -> None:
        self.x = X
        self.edge_index = torch.zeros(2, 6, dtype=torch.long)
        self.y = Y
        self._cache = torch.ones(1)


def test_object_with_tensor_attributes():
    layout = locate_batch(GraphBatch())
    assert layout.inputs is X
    assert layout.targets is Y
    assert layout.input_name == "batch.x"
    assert "batch._cache" not in [n for n, _ in layout.tensors]


class StoreBatch:
    """Keeps its tensors in a private store and exposes them through `to_dict()`."""

    def __init__(self) -> None:
        self._store = {"x": X, "y": Y, "num_nodes": 4}

    def to_dict(self) -> dict:
        return dict(self._store)


def test_object_with_to_dict():
    layout = locate_batch(StoreBatch())
    assert layout.inputs is X
    assert layout.targets is Y
    assert layout.input_name == "batch.x"


def test_explicit_keys_index_and_callable():
    batch = {"feats": X, "answer": Y}
    layout = locate_batch(batch, input_key="feats", target_key="answer")
    assert layout.inputs is X
    assert layout.targets is Y
    layout = locate_batch((Y, X), input_key=1, target_key=0)
    assert layout.inputs is X
    assert layout.targets is Y

    def pick_features(b):
        return b["feats"]

    layout = locate_batch(batch, input_key=pick_features, target_key="answer")
    assert layout.inputs is X
    assert layout.input_name == "pick_features(batch)"


def test_unknown_structure_says_why():
    layout = locate_batch({"a": X, "b": Y})
    assert layout.inputs is None
    assert "could not tell" in (layout.note or "")
    assert locate_batch(["text", 3]).note == "the batch holds no tensor"
    assert split_batch(None) == (None, None)


def test_iter_tensors_bounded_depth():
    deep: object = X
    for _ in range(20):
        deep = [deep]
    assert list(iter_tensors(deep)) == []
    assert len(list(iter_tensors([[X]]))) == 1


def test_split_batch_keeps_signature():
    x, y = split_batch((X, Y))
    assert x is X
    assert y is Y
