"""PaCS polarity attention (PolaFormer++): the op.

:func:`pacs_attention` is what the models call. It runs the memory-lean
implementation (:func:`~.pacs_fast.pacs_attention_fast`: same outputs and
gradients, feature maps recomputed in backward) or, with the fast paths off
and whenever a graph is captured, its plain reference
:func:`pacs_attention_pytorch` beside it; it decides itself
(:func:`~.dispatch.use_fast`). Under fp16/bf16 autocast both compute in
float32 (``exp`` of fp16 overflows above 11).
"""
from typing import Optional

import torch
from torch import Tensor

from . import observers
from .checks import (check_broadcastable, check_head_inputs, no_queries,
                     param_shape)
from .dispatch import capturing, use_fast
from .features import EPS, pacs_features
from .pacs_fast import pacs_attention_fast
from .precision import no_autocast
from .rotary import theta_shift

__all__ = ['pacs_attention', 'pacs_attention_pytorch']


@observers.reports_calls
def pacs_attention(q: Tensor, k: Tensor, v: Tensor, s1: Tensor, s2: Tensor,
                   sin: Optional[Tensor] = None,
                   cos: Optional[Tensor] = None) -> Tensor:
    """PaCS polarity attention of heads (the formula:
    :func:`pacs_attention_pytorch`).

    The attention core of PolaFormer++ on tensors already split into heads:
    no projections, no gate, no depth-wise conv. The feature maps are
    ``exp(t * [relu(q), relu(-q)]) - 1`` with the per-channel temperatures
    ``t = sigmoid(s1)`` (same-signed flow) and ``sigmoid(s2)``
    (opposite-signed flow, halves swapped), the keys ``exp([relu(k),
    relu(-k)]) - 1``; each flow is divided by its own ``q' . mean(k')``.
    Unlike :func:`~.polarity_attention.polarity_attention` there is no
    ``scale`` here: divide ``q`` and ``k`` by a temperature before, if
    wanted. The fast implementation runs when ``n == N`` and the fast
    paths are on, else the plain reference (``pola_mm.ops.plain_paths()``
    forces it).

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
    dt = torch.promote_types(q.dtype, torch.float32)
    with no_autocast(q.device.type):
        args = [t.to(dt) for t in (q, k, v, s1, s2)]
        tables = [None if t is None else t.to(dt) for t in (sin, cos)]
        if use_fast(q) and k.shape[-2] == q.shape[-2]:
            # (the fast implementation assumes as many keys as queries)
            out = pacs_attention_fast(*args, *tables)
        else:
            out = pacs_attention_pytorch(*args, *tables)
    return out.to(q.dtype)


@observers.reports_calls
def pacs_attention_pytorch(q: Tensor, k: Tensor, v: Tensor, s1: Tensor,
                           s2: Tensor, sin: Optional[Tensor] = None,
                           cos: Optional[Tensor] = None,
                           eps: float = EPS) -> Tensor:
    """PaCS polarity attention, the formula as written (float32 or float64).

    With ``h`` heads of width ``d``, ``t1 = sigmoid(s1)``,
    ``t2 = sigmoid(s2)``:

    - ``q_sim = exp([relu(q), relu(-q)] * t1) - 1``,
      ``q_opp = exp([relu(-q), relu(q)] * t2) - 1``,
      ``k' = exp([relu(k), relu(-k)]) - 1`` (``(B, h, N, 2d)``);
    - normalisers on the maps as they are:
      ``z_sim = q_sim . mean_N(k')``, ``z_opp = q_opp . mean_N(k')``;
    - products on the rotary-encoded maps ``R(.)`` (:func:`theta_shift`,
      when ``sin``/``cos`` are given, else the identity):
      ``x_sim = R(q_sim) (R(k')^T v1 / N) / (z_sim + eps)``, ``x_opp`` the
      same with ``q_opp`` and ``v2`` (``v = [v1, v2]`` split per head);
    - output per head ``[x_sim, x_opp]``.

    Like the authors, ``R(k')`` and ``v`` are each scaled by ``N^-1/2``
    before their product.

    Args:
        q, k: ``(B, h, N, d)``.
        v: ``(B, h, N, d)``, ``d`` even.
        s1, s2: raw temperatures broadcastable to ``(1, h, 1, 2d)``.
        sin, cos: optional ``(N, 2d)`` rotary tables.
        eps: added to the normalisers.

    Returns:
        ``(B, h, N, d)``.
    """
    N = q.shape[-2]
    q_sim = pacs_features(q, torch.sigmoid(s1))
    q_opp = pacs_features(q, torch.sigmoid(s2), swap=True)
    kk = pacs_features(k)
    k_mean = kk.mean(dim=-2, keepdim=True).transpose(-2, -1)  # (B,h,2d,1)
    z_sim = q_sim @ k_mean
    z_opp = q_opp @ k_mean
    if sin is not None and cos is not None:
        q_sim = theta_shift(q_sim, sin, cos)
        q_opp = theta_shift(q_opp, sin, cos)
        kk = theta_shift(kk, sin, cos)
    v1, v2 = torch.chunk(v, 2, dim=-1)
    kt = kk.transpose(-2, -1) * N**-0.5
    x_sim = q_sim @ (kt @ (v1 * N**-0.5)) * (1 / (z_sim + eps))
    x_opp = q_opp @ (kt @ (v2 * N**-0.5)) * (1 / (z_opp + eps))
    return torch.cat([x_sim, x_opp], dim=-1)


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
