"""Products summed over tokens, split so that they fill a GPU.

The linear attentions reduce over tokens: ``k'^T v`` and its normaliser in
the forward, ``f^T du`` in the backward. Each is a batched product whose
output is only ``(2d, d + 1)`` (one 128x128 tile) per image and head while
its inner dimension ``K`` is the token count (67200 at stage 1 of an
800x1344 image). With ``B * h`` between 2 and 6 such products a GPU runs
2 to 6 thread blocks for ``K`` steps each and leaves the rest of its
multiprocessors idle (cuBLAS picks no split-K kernel for batched products).

:func:`token_product` splits ``K`` instead: the tokens are cut into ``c``
chunks that become part of the batch (views, no copy when the chunks are
equal), the ``B * h * c`` products run at once and their partial results
are summed in float32 (then returned in the inputs' dtype). ``c`` is
chosen so that the products have about two waves of output tiles on the
device (:func:`split_count`), or chunks of
``4 max(M, N)`` tokens where fewer suffice. On the CPU, and where the
products already fill the device, it is the one product.

:func:`token_product_pytorch` is the plain product, its reference.
"""
import functools
import math
from typing import Optional

import torch
from torch import Tensor

__all__ = ['token_product', 'token_product_pytorch', 'split_count',
           'TILE', 'META_MULTIPROCESSORS']

#: Output tile edge of the GEMM kernels the split is sized for.
TILE = 128
#: Multiprocessors assumed on the ``meta`` device (shapes only: structure
#: tests and estimates see the split of the GPU the project was measured
#: on, an H200).
META_MULTIPROCESSORS = 132


@functools.lru_cache(maxsize=None)
def _cuda_multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of ``device``: the CUDA device's own, 132
    on ``meta`` and on fake CUDA tensors where no GPU is present (memory
    estimates), 0 elsewhere (no split)."""
    if device.type == 'cuda' and not torch.cuda.is_available():
        return META_MULTIPROCESSORS
    if device.type == 'cuda':
        index = device.index
        if index is None:
            index = torch.cuda.current_device()
        return _cuda_multiprocessors(index)
    if device.type == 'meta':
        return META_MULTIPROCESSORS
    return 0


def _tiles(m: int, n: int) -> int:
    return math.ceil(m / TILE) * math.ceil(n / TILE)


def split_count(batch: int, m: int, n: int, k: int,
                device: torch.device) -> int:
    """Chunks of the token dimension for ``batch`` products ``(m, k) @ (k,
    n)`` on ``device``; 1 means the plain product.

    No split where the device has no multiprocessors (the CPU), where the
    products already have one tile per multiprocessor, or where ``k`` is
    short (below ``8 max(m, n)``). Else enough chunks for two waves of
    tiles, but none shorter than ``4 max(m, n)`` tokens; among the counts
    up to twice that, one that divides ``k`` (the chunks are then views of
    the inputs).
    """
    sms = multiprocessors(device)
    tiles = batch * _tiles(m, n)
    edge = max(m, n)
    if sms == 0 or tiles >= sms or k < 8 * edge:
        return 1
    want = min(math.ceil(2 * sms / tiles), k // (4 * edge))
    for c in range(want, 2 * want + 1):
        if k % c == 0:
            return c
    return want


def token_product_pytorch(a: Tensor, b: Tensor) -> Tensor:
    """``a^T b`` over the token axis: ``(..., K, M)``, ``(..., K, N)`` ->
    ``(..., M, N)``; one product."""
    return a.transpose(-2, -1) @ b


def token_product(a: Tensor, b: Tensor, ones: bool = False,
                  chunks: Optional[int] = None) -> Tensor:
    """``a^T b`` over the token axis, split into chunks of tokens on a GPU.

    Args:
        a: ``(..., K, M)``.
        b: ``(..., K, N)``, broadcastable with ``a`` in the leading dims.
        ones: append a column of ones to ``b``: the last column of the
            result is then ``a`` summed over tokens (a normaliser in the
            same product).
        chunks: the number of chunks (default: :func:`split_count` for
            the device of ``a``; tests force a split on the CPU).

    Returns:
        ``(..., M, N)`` (``N + 1`` with ``ones``), in the promoted dtype of
        ``a`` and ``b``, as the one product; a split sums its partial
        products in float32 first.
    """
    if ones:
        b = torch.cat([b, b.new_ones(b.shape[:-1] + (1, ))], -1)
    K, M, N = a.shape[-2], a.shape[-1], b.shape[-1]
    if chunks is None:
        batch = math.prod(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        chunks = split_count(batch, M, N, K, a.device)
    dt = torch.promote_types(a.dtype, b.dtype)
    acc = torch.promote_types(dt, torch.float32)
    if chunks <= 1:
        return token_product_pytorch(a, b)
    step = K // chunks
    whole = step * chunks

    def cut(t: Tensor) -> Tensor:  # (..., K, w) -> (..., chunks, step, w)
        return t[..., :whole, :].unflatten(-2, (chunks, step))

    out = token_product_pytorch(cut(a), cut(b)).sum(-3, dtype=acc)
    if whole < K:  # the last K % chunks tokens
        out = out + token_product_pytorch(a[..., whole:, :],
                                          b[..., whole:, :])
    return out.to(dt)
