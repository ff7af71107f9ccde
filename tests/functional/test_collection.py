"""One walk over a batch collection: every container kind rebuilt, leaves kept."""

from __future__ import annotations

from collections import OrderedDict, defaultdict, namedtuple
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import Tensor

from lightning_triage.functional.collection import map_tensors
from lightning_triage.functional.structure import replace_tensor
from lightning_triage.probing import copy_first_examples

Pair = namedtuple("Pair", ["x", "y"])


@dataclass
class Batch:
    x: Tensor
    ids: list[str]
    size: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.size = int(self.x.shape[0])


@dataclass(frozen=True)
class Frozen:
    x: Tensor
    name: str


class Tokens(list):  # type: ignore[type-arg]
    pass


class Strict(dict):  # type: ignore[type-arg]
    def __init__(self, a: Any, b: Any) -> None:  # not buildable from one dict
        super().__init__(a=a, b=b)


def _double(t: Tensor) -> Tensor:
    return t * 2


def test_tensor_alone_and_leaves() -> None:
    assert map_tensors(_double, torch.ones(2)).tolist() == [2.0, 2.0]
    for leaf in ("text", b"bytes", 3, 2.5, None, object):
        assert map_tensors(_double, leaf) is leaf


def test_nested_dicts_lists_tuples_keep_types_and_leaves() -> None:
    batch = OrderedDict(x=torch.ones(2), rest=[(torch.ones(1), "a"), 7], name="n")
    out = map_tensors(_double, batch)
    assert type(out) is OrderedDict and list(out) == ["x", "rest", "name"]
    assert out["x"].tolist() == [2.0, 2.0]
    assert isinstance(out["rest"], list) and isinstance(out["rest"][0], tuple)
    assert out["rest"][0][0].tolist() == [2.0] and out["rest"][0][1] == "a" and out["rest"][1] == 7
    assert out["name"] == "n"
    assert batch["x"].tolist() == [1.0, 1.0]  # the input is not modified


def test_namedtuple_and_subclasses() -> None:
    out = map_tensors(_double, Pair(torch.ones(1), Tokens([torch.ones(1)])))
    assert type(out) is Pair and out.x.tolist() == [2.0]
    assert type(out.y) is Tokens and out.y[0].tolist() == [2.0]


def test_mapping_types() -> None:
    dd: defaultdict[str, Any] = defaultdict(list, x=torch.ones(1))
    out = map_tensors(_double, dd)
    assert type(out) is defaultdict and out.default_factory is list and out["x"].tolist() == [2.0]
    strict = map_tensors(_double, Strict(torch.ones(1), 1))
    assert type(strict) is dict and strict["a"].tolist() == [2.0] and strict["b"] == 1


def test_dataclasses_rebuilt_from_init_fields() -> None:
    out = map_tensors(lambda t: t[:1], Batch(torch.zeros(3, 2), ["a", "b", "c"]))
    assert isinstance(out, Batch) and out.x.shape == (1, 2) and out.size == 1
    frozen = map_tensors(_double, Frozen(torch.ones(1), "f"))
    assert isinstance(frozen, Frozen) and frozen.x.tolist() == [2.0] and frozen.name == "f"


def test_lists_fn_applies_to_outermost_lists_only() -> None:
    seen: list[int] = []

    def cut(v: list[Any]) -> list[Any]:
        seen.append(len(v))
        return v[:2]

    batch = {"ids": [[1, 2, 3], [4, 5, 6], [7, 8, 9]], "t": (["a", "b", "c"],), "x": torch.ones(3)}
    out = map_tensors(_double, batch, lists=cut)
    assert out["ids"] == [[1, 2, 3], [4, 5, 6]]  # the inner lists are not cut
    assert out["t"] == (["a", "b"],)
    assert sorted(seen) == [3, 3]


def test_replace_tensor_by_identity() -> None:
    x, y = torch.zeros(2), torch.zeros(2)  # equal values, different objects
    new = torch.ones(2)
    out = replace_tensor(Pair(x, [y, "id"]), y, new)
    assert out.x is x and out.y[0] is new and out.y[1] == "id"


@pytest.mark.parametrize(("keep", "expected"), [(2, 2), (10, 4)])
def test_copy_first_examples_cuts_tensors_and_lists(keep: int, expected: int) -> None:
    x = torch.arange(8.0).view(4, 2)
    batch = Batch(x, ["a", "b", "c", "d"])
    small = copy_first_examples(batch, keep)
    assert small.x.shape[0] == expected and small.ids == ["a", "b", "c", "d"][:expected]
    assert small.x is not x and small.x.data_ptr() != x.data_ptr()
    shared = {"x": x, "mask": torch.ones(2, 2), "ids": list("abcd"), "other": [1, 2]}
    out = copy_first_examples(shared, keep)
    assert out["x"].shape[0] == expected and out["mask"].shape[0] == 2
    assert out["ids"] == list("abcd")[:expected] and out["other"] == [1, 2]
