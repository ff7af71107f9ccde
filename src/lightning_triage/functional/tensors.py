"""Read any tensor a hook can meet: sparse, nested, quantized, complex, integer, empty, meta.

Hooks that run inside the user's forward or backward see whatever the model produces: sparse
gradients (``nn.Embedding(sparse=True)``), empty outputs (a mixture-of-experts layer whose
expert got no tokens), nested tensors, quantized activations, meta tensors. These helpers give
the numbers the checks need from all of them, or ``None`` where there is nothing to read, and
never raise on an unusual layout or dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor

_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def plain_values(t: Tensor, coalesce: bool = False) -> Tensor | None:
    """The stored values of ``t`` as an ordinary (strided, dense) tensor, detached.

    Sparse tensors give their specified values (``coalesce=True`` first sums duplicate indices
    of a COO tensor, as its dense form would), nested tensors their packed values, quantized
    tensors their dequantized values. ``None`` for a tensor without data (``meta``).

    Example:
        >>> s = torch.sparse_coo_tensor([[0, 2]], [1.0, -3.0], (4,))
        >>> plain_values(s).tolist()
        [1.0, -3.0]
        >>> plain_values(torch.empty(2, device="meta")) is None
        True
    """
    t = t.detach()
    if t.is_meta:
        return None
    if t.is_nested:
        t = t.values()
    elif t.layout == torch.sparse_coo:
        t = (t.coalesce() if coalesce and not t.is_coalesced() else t)._values()
    elif t.layout in _COMPRESSED:
        t = t.values()
    elif t.layout != torch.strided:
        return None
    if t.is_quantized:
        t = t.dequantize()
    return None if t.is_meta else t


def abs_peak(t: Tensor) -> Tensor | None:
    """The largest ``|x|`` of any tensor as a 0-dim float32 device tensor (no host sync), or
    ``None`` when there are no values (empty, meta). NaN gives NaN.

    Example:
        >>> abs_peak(torch.tensor([1.0, -3.0]))
        tensor(3.)
        >>> abs_peak(torch.zeros(0, 4)) is None
        True
        >>> abs_peak(torch.tensor([3 + 4j]))
        tensor(5.)
    """
    values = plain_values(t)
    if values is None or values.numel() == 0:
        return None
    if values.dtype == torch.bool:
        values = values.to(torch.uint8)
    with torch.no_grad():
        return values.abs().amax().float()


def any_nonzero(t: Tensor) -> Tensor | None:
    """Whether any value of ``t`` is non-zero, as a 0-dim bool device tensor (no host sync);
    ``False`` for an empty tensor, ``None`` for a tensor without data (meta). A sparse COO
    tensor is coalesced first (duplicate entries that cancel are zero).

    Example:
        >>> bool(any_nonzero(torch.sparse_coo_tensor([[1]], [2.0], (3,))))
        True
        >>> bool(any_nonzero(torch.zeros(0)))
        False
    """
    values = plain_values(t, coalesce=True)
    if values is None:
        return None
    with torch.no_grad():
        return values.ne(0).any()


def dense(t: Tensor) -> Tensor:
    """``t`` as an ordinary strided tensor when it is a nested tensor (PyTorch's fast paths:
    ``nn.TransformerEncoder`` with a padding mask in eval mode runs its layers on nested
    tensors), padded with zeros at the positions it leaves out; any other tensor unchanged.

    Example:
        >>> n = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
        >>> dense(n).tolist()
        [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    """
    return t.to_padded_tensor(0.0) if t.is_nested else t


def is_plain(t: Tensor) -> bool:
    """An ordinary dense tensor with data: strided, not nested, not quantized, not meta.

    Example:
        >>> is_plain(torch.ones(2)), is_plain(torch.ones(2).to_sparse())
        (True, False)
    """
    return t.layout == torch.strided and not (t.is_nested or t.is_quantized or t.is_meta)


__all__ = ["abs_peak", "any_nonzero", "dense", "is_plain", "plain_values"]
