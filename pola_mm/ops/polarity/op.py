"""Polarity-aware linear attention (PolaFormer): the op the models call.

:func:`polarity_attention` checks its inputs and runs one of three
implementations, picked by :func:`~pola_mm.ops.dispatch.implementation`
(the one rule for every attention op):

- :mod:`.triton`: fused kernels, the feature maps in registers (CUDA with
  Triton; ``meta`` and fake CUDA tensors take it too);
- :mod:`.cpu`: torch operations rearranged, the feature maps recomputed in
  backward and cache-sized runs in CPU inference (the CPU, GPUs without
  Triton, head widths the kernels do not take);
- :mod:`.graph`: the published formula in standard operations, with the
  fast paths off and whenever a graph is captured (export,
  ``torch.export``, ``torch.compile``).

All three equal the paper's form (:mod:`.naive`) in the tests. Under
fp16/bf16 autocast all compute in float32 (powers of fp16 overflow): the
kernels in registers, the others on float32 copies.
"""
from typing import Optional

import torch
from torch import Tensor

from .. import observers
from ..checks import (check_broadcastable, check_head_inputs, no_queries,
                      param_shape)
from ..dispatch import capturing, implementation
from ..launch import guarded
from ..precision import no_autocast
from . import triton as kernels
from .cpu import polarity_attention_cpu
from .graph import polarity_attention_pytorch

__all__ = ['polarity_attention']


@observers.reports_calls
def polarity_attention(q: Tensor,
                       k: Tensor,
                       v: Tensor,
                       scale: Tensor,
                       power: Tensor,
                       alpha: float,
                       k_bias: Optional[Tensor] = None) -> Tensor:
    """Polarity-aware linear attention of heads: the feature maps with the
    learned power, the same-signed and opposite-signed flows and their
    concatenation (the formula: :func:`~.graph.polarity_attention_pytorch`).

    The attention core only, on tensors already split into heads: no input
    or output projection, no gate and no depth-wise conv (those are
    :class:`~pola_mm.models.layers.PolarityAttention`'s). The normalisation
    is inside: each flow is divided by its own ``q' . mean(k')``. It picks
    its implementation by itself; ``POLA_MM_OPS=graph`` or ``with
    pola_mm.ops.use_implementation('graph'):`` forces the graph form,
    ``POLA_MM_OPS=cpu`` leaves the kernels out
    (:mod:`~pola_mm.ops.dispatch`).

    Args:
        q: ``(B, h, N, d)`` queries, ``d`` even.
        k, v: ``(B, h, n, d)`` keys and values (``n`` may differ from
            ``N``); the first half of each head's value channels feeds the
            same-signed flow, the second half the opposite-signed one.
        scale: the raw ``scale`` parameter, broadcastable to
            ``(1, h, 1, d)``; queries and keys are divided by
            ``softplus(scale)`` (zeros: ``ln 2``).
        power: the raw ``power`` parameter, ``(1, h, 1, d)``: the
            exponent of the feature maps ``relu(+-t)^p`` is
            ``p = 1 + alpha * sigmoid(power)``.
        alpha: exponent range; ``p`` lies in ``(1, 1 + alpha)``.
        k_bias: optional table broadcastable to ``k``, added to the keys
            (PolaFormer's ``positional_encoding``).

    Returns:
        ``(B, h, N, d)`` in the dtype of ``q``; computed in float32 at least.

    Raises:
        TypeError: when an input is not a tensor, or ``q``, ``k``, ``v``
            are not floating point.
        ValueError: on inputs of the wrong rank or mismatched shapes, with
            the expected shape and the received ones (sizes that are
            symbolic while a graph is captured are not compared), and on
            keys without tokens (``n == 0``). Queries without tokens
            (``N == 0``) give an empty output.
    """
    if not isinstance(q, torch.fx.Proxy):  # (nothing to check on a proxy)
        _check_inputs(q, k, v, scale, power, k_bias)
        if no_queries(q):
            return q.clone()
    key = None if isinstance(q, torch.fx.Proxy) else kernels.config(q, k_bias)
    path = implementation(q, kernel_fits=key is not None
                          and kernels.fits(q, k, v), config=key,
                          probe=kernels.probe)
    with no_autocast(q.device.type):
        if path == 'triton':  # the torch form where a kernel fails
            out = guarded(
                key, lambda: kernels.polarity_attention_triton(
                    q, k, v, scale, power, alpha, k_bias=k_bias),
                lambda: polarity_attention_cpu(q, k, v, scale, power, alpha,
                                               k_bias=k_bias))
        elif path == 'cpu':
            out = polarity_attention_cpu(q, k, v, scale, power, alpha,
                                         k_bias=k_bias)
        else:
            dt = torch.promote_types(q.dtype, torch.float32)
            out = polarity_attention_pytorch(
                q.to(dt), k.to(dt), v.to(dt), scale.to(dt), power.to(dt),
                alpha, k_bias=None if k_bias is None else k_bias.to(dt))
    return out.to(q.dtype)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, scale: Tensor,
                  power: Tensor, k_bias: Optional[Tensor]) -> None:
    """The shape checks of :func:`polarity_attention` (``ValueError``
    naming the expected and the received shapes)."""
    eager = not capturing()
    op = 'polarity_attention'
    check_head_inputs(op, q, k, v, eager=eager)
    target = param_shape(q)
    check_broadcastable(op, 'power', power, '(1, h, 1, d)', target, eager,
                        exact=True)
    check_broadcastable(op, 'scale', scale, '(1, h, 1, d)', target, eager)
    if k_bias is not None:
        check_broadcastable(op, 'k_bias', k_bias, 'k (B, h, n, d)',
                            tuple(k.shape), eager)
