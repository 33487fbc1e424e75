"""PaCS polarity attention (PolaFormer++): the op the models call.

:func:`pacs_attention` checks its inputs and runs one of three
implementations, picked by :func:`~pola_mm.ops.dispatch.implementation`:

- :mod:`.triton`: fused kernels, the feature maps in registers (CUDA with
  Triton; ``meta`` and fake CUDA tensors take it too);
- :mod:`.cpu`: torch operations rearranged, the feature maps recomputed in
  backward (the CPU, GPUs without Triton; as many keys as queries);
- :mod:`.naive`: the formula as written, with ``POLA_MM_OPS=graph``, whenever
  a graph is captured, and where neither fast path fits.

Under fp16/bf16 autocast all compute in float32 (``exp`` of fp16 overflows
above 11): the kernels in registers, the others on float32 copies.
"""
from typing import Optional

import torch
from torch import Tensor

from ...type_aliases import Size2
from .. import observers
from ..checks import (check_broadcastable, check_head_inputs, no_queries,
                      param_shape)
from ..dispatch import capturing, implementation
from ..launch import guarded
from ..precision import no_autocast
from . import triton as kernels
from .cpu import pacs_attention_torch

__all__ = ['pacs_attention']


@observers.reports_calls
def pacs_attention(q: Tensor, k: Tensor, v: Tensor, s1: Tensor, s2: Tensor,
                   *, hw: Optional[Size2] = None,
                   scale: Optional[Tensor] = None,
                   k_bias: Optional[Tensor] = None) -> Tensor:
    """PaCS polarity attention of heads (the formula:
    :func:`~.naive.pacs_attention_pytorch`).

    The attention core of PolaFormer++ on tensors already split into heads:
    no projections, no gate, no depth-wise conv. The feature maps are
    ``exp(t * [relu(q), relu(-q)]) - 1`` with the per-channel temperatures
    ``t = sigmoid(s1)`` (same-signed flow) and ``sigmoid(s2)``
    (opposite-signed flow, halves swapped), the keys ``exp([relu(k),
    relu(-k)]) - 1``; each flow is divided by its own ``q' . mean(k')``.
    It picks its implementation by itself (``POLA_MM_OPS=graph`` or
    ``pola_mm.ops.use_implementation('graph')`` forces the formula as
    written).

    Args:
        q: ``(B, h, N, d)`` queries, ``d`` even.
        k, v: ``(B, h, n, d)`` keys and values (``n == N`` with ``hw``).
        s1, s2: raw temperatures broadcastable to ``(1, h, 1, 2d)``
            (zeros: ``t = 1/2``, the authors' init).
        hw: the ``(H, W)`` map of the tokens (``H W = N``, row-major) for
            PolaFormer++'s 2-D rotary encoding of the products
            (:func:`~pola_mm.ops.rotary.rotary_tables` of width ``2d``), or
            None: no rotary encoding.
        scale: optional raw ``scale`` broadcastable to ``(1, h, 1, d)``:
            ``q`` and ``k + k_bias`` are divided by ``softplus(scale)``
            (PolaFormer's ``scale``, as
            :class:`~pola_mm.models.layers.PolarityAttention` with
            ``feature_map='pacs'`` uses it).
        k_bias: optional, broadcastable to ``k``, added to the keys
            (PolaFormer's ``positional_encoding``).

    Returns:
        ``(B, h, N, d)`` in the dtype of ``q``; computed in float32 at least
        (the kernels in registers: no float32 copy of ``q`` or ``k`` under
        autocast).

    Raises:
        TypeError: when an input is not a tensor, or ``q``, ``k``, ``v``
            are not floating point.
        ValueError: on inputs of the wrong rank or mismatched shapes, with
            the expected shape and the received ones, and on keys without
            tokens. Queries without tokens give an empty output.
    """
    if not isinstance(q, torch.fx.Proxy):  # (nothing to check on a proxy)
        _check_inputs(q, k, v, s1, s2, hw, scale, k_bias)
        if no_queries(q):
            return q.clone()
    scaled = scale is not None or k_bias is not None
    key = (None if isinstance(q, torch.fx.Proxy) else
           kernels.config(q, hw, scaled))
    path = implementation(
        q, kernel_fits=key is not None and kernels.fits(q, k, v, hw, k_bias),
        config=key, probe=kernels.probe,
        cpu_fits=k.shape[-2] == q.shape[-2])  # (as many keys as queries)
    args = (q, k, v, s1, s2, scale, k_bias, hw)
    with no_autocast(q.device.type):
        if path == 'triton':  # q, k, v as given: float32 in registers
            out = guarded(key, lambda: kernels.pacs_attention_triton(*args),
                          lambda: pacs_attention_torch(*args))
        else:
            out = pacs_attention_torch(*args, formula=path != 'cpu')
    return out.to(q.dtype)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, s1: Tensor, s2: Tensor,
                  hw: Optional[Size2], scale: Optional[Tensor],
                  k_bias: Optional[Tensor]) -> None:
    """The shape checks of :func:`pacs_attention` (ValueError naming the
    expected and the received shapes)."""
    eager = not capturing()
    op = 'pacs_attention'
    check_head_inputs(op, q, k, v, eager=eager,
                      same_length='as many keys as queries with the rotary '
                      'map hw' if hw is not None else '')
    for name, t in (('s1', s1), ('s2', s2)):
        check_broadcastable(op, name, t, '(1, h, 1, 2d)', param_shape(q, 2),
                            eager)
    if scale is not None:
        check_broadcastable(op, 'scale', scale, '(1, h, 1, d)',
                            param_shape(q), eager)
    if k_bias is not None:
        check_broadcastable(op, 'k_bias', k_bias, 'k (B, h, n, d)',
                            tuple(k.shape), eager)
    if hw is not None:
        if isinstance(hw, Tensor) or len(hw) != 2:
            raise ValueError(
                'pacs_attention: hw is the (H, W) map of the rotary encoding,'
                f' got {type(hw).__name__}; the op builds the rotary tables '
                'itself (pass hw=(H, W) instead of sin and cos)')
        if eager and int(hw[0]) * int(hw[1]) != q.shape[2]:
            raise ValueError(
                f'pacs_attention: hw={tuple(int(x) for x in hw)} has '
                f'{int(hw[0]) * int(hw[1])} tokens, but q has '
                f'{q.shape[2]} (N = H * W, row-major)')
