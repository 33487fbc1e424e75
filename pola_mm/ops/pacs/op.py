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

from .. import observers
from ..checks import (check_broadcastable, check_head_inputs, no_queries,
                      param_shape)
from ..dispatch import capturing, implementation
from ..launch import guarded
from ..precision import no_autocast
from . import triton as kernels
from .cpu import pacs_attention_cpu
from .naive import pacs_attention_pytorch

__all__ = ['pacs_attention']


@observers.reports_calls
def pacs_attention(q: Tensor, k: Tensor, v: Tensor, s1: Tensor, s2: Tensor,
                   sin: Optional[Tensor] = None,
                   cos: Optional[Tensor] = None) -> Tensor:
    """PaCS polarity attention of heads (the formula:
    :func:`~.naive.pacs_attention_pytorch`).

    The attention core of PolaFormer++ on tensors already split into heads:
    no projections, no gate, no depth-wise conv. The feature maps are
    ``exp(t * [relu(q), relu(-q)]) - 1`` with the per-channel temperatures
    ``t = sigmoid(s1)`` (same-signed flow) and ``sigmoid(s2)``
    (opposite-signed flow, halves swapped), the keys ``exp([relu(k),
    relu(-k)]) - 1``; each flow is divided by its own ``q' . mean(k')``.
    Unlike :func:`~pola_mm.ops.polarity_attention` there is no ``scale``
    here: divide ``q`` and ``k`` by a temperature before, if wanted. It
    picks its implementation by itself (``POLA_MM_OPS=graph`` or
    ``pola_mm.ops.use_implementation('graph')`` forces the formula as
    written).

    Args:
        q: ``(B, h, N, d)`` queries, ``d`` even.
        k, v: ``(B, h, n, d)`` keys and values (``n == N`` when the rotary
            tables are given).
        s1, s2: raw temperatures broadcastable to ``(1, h, 1, 2d)``
            (zeros: ``t = 1/2``, the authors' init).
        sin, cos: optional ``(N, 2d)`` rotary tables of the products
            (both or neither; e.g.
            :func:`~pola_mm.ops.rotary.rotary_tables`).

    Returns:
        ``(B, h, N, d)`` in the dtype of ``q``; computed in float32 at least.

    Raises:
        TypeError: when an input is not a tensor, or ``q``, ``k``, ``v``
            are not floating point.
        ValueError: on inputs of the wrong rank or mismatched shapes, with
            the expected shape and the received ones, and on keys without
            tokens. Queries without tokens give an empty output.
    """
    if not isinstance(q, torch.fx.Proxy):  # (nothing to check on a proxy)
        _check_inputs(q, k, v, s1, s2, sin, cos)
        if no_queries(q):
            return q.clone()
    key = None if isinstance(q, torch.fx.Proxy) else kernels.config(q, sin)
    path = implementation(
        q, kernel_fits=key is not None and kernels.fits(q, k, v, sin, cos),
        config=key, probe=kernels.probe,
        cpu_fits=k.shape[-2] == q.shape[-2])  # (as many keys as queries)
    dt = torch.promote_types(q.dtype, torch.float32)
    with no_autocast(q.device.type):
        if path == 'triton':  # q, k, v as given: float32 in registers
            tables = [None if t is None else t.to(dt) for t in (sin, cos)]
            args = (q, k, v, s1.to(dt), s2.to(dt), *tables)
            out = guarded(key, lambda: kernels.pacs_attention_triton(*args),
                          lambda: kernels.torch_form(
                              *[t.to(dt) for t in args[:3]], *args[3:]))
        else:
            args = [t.to(dt) for t in (q, k, v, s1, s2)]
            tables = [None if t is None else t.to(dt) for t in (sin, cos)]
            fn = pacs_attention_cpu if path == 'cpu' else \
                pacs_attention_pytorch
            out = fn(*args, *tables)
    return out.to(q.dtype)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, s1: Tensor, s2: Tensor,
                  sin: Optional[Tensor], cos: Optional[Tensor]) -> None:
    """The shape checks of :func:`pacs_attention` (ValueError naming the
    expected and the received shapes)."""
    eager = not capturing()
    rotary = sin is not None or cos is not None
    check_head_inputs('pacs_attention', q, k, v,
                      same_length='as many keys as queries with the rotary '
                      'tables' if rotary else '', eager=eager)
    target = param_shape(q, 2)
    for name, t in (('s1', s1), ('s2', s2)):
        check_broadcastable('pacs_attention', name, t, '(1, h, 1, 2d)',
                            target, eager)
    if rotary:
        if sin is None or cos is None:
            raise ValueError('pacs_attention: give both rotary tables sin '
                             'and cos, or neither; got only '
                             f"{'cos' if sin is None else 'sin'}")
        for name, t in (('sin', sin), ('cos', cos)):
            check_broadcastable('pacs_attention', name, t, '(N, 2d)',
                                (q.shape[2], 2 * q.shape[3]), eager)
