"""Polarity-aware linear attention (PolaFormer): the op.

:func:`polarity_attention` is what the models call. It runs the fast
implementation (:func:`~.polarity_fast.polarity_attention_fast`: same
outputs and gradients, the ``(B, h, N, 2d)`` feature maps recomputed in
backward instead of stored, cache-sized runs in CPU inference) or, with
the fast paths off and whenever a graph is captured (export,
``torch.export``, ``torch.compile``), its plain reference
:func:`polarity_attention_pytorch` beside it. It decides itself
(:func:`~.dispatch.use_fast`); under fp16/bf16 autocast both compute in
float32 (powers of fp16 overflow).
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import observers
from .checks import (check_broadcastable, check_head_inputs, no_queries,
                     param_shape)
from .dispatch import capturing, use_fast
from .features import EPS, split_signs
from .polarity_fast import polarity_attention_fast
from .precision import no_autocast

__all__ = ['polarity_attention', 'polarity_attention_pytorch']

#: float32's smallest normal number (``torch.finfo(torch.float32).tiny``).
_FLOAT32_TINY = 1.1754943508222875e-38


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
    concatenation (the formula: :func:`polarity_attention_pytorch`).

    The attention core only, on tensors already split into heads: no input
    or output projection, no gate and no depth-wise conv (those are
    :class:`~pola_mm.models.layers.PolarityAttention`'s). The normalisation
    is inside: each flow is divided by its own ``q' . mean(k')``. It runs
    the fast implementation or the plain reference by itself;
    ``POLA_MM_FAST_PATHS=0`` or ``with pola_mm.ops.plain_paths():`` forces
    the reference (:mod:`~pola_mm.ops.dispatch`).

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
    with no_autocast(q.device.type):
        if use_fast(q):
            out = polarity_attention_fast(q, k, v, scale, power, alpha,
                                          k_bias=k_bias)
        else:
            dt = torch.promote_types(q.dtype, torch.float32)
            out = polarity_attention_pytorch(
                q.to(dt), k.to(dt), v.to(dt), scale.to(dt), power.to(dt),
                alpha, k_bias=None if k_bias is None else k_bias.to(dt))
    return out.to(q.dtype)


@observers.reports_calls
def polarity_attention_pytorch(q: Tensor,
                               k: Tensor,
                               v: Tensor,
                               scale: Tensor,
                               power: Tensor,
                               alpha: float,
                               eps: float = EPS,
                               k_bias: Optional[Tensor] = None) -> Tensor:
    """Polarity-aware linear attention (the published formula) in plain
    PyTorch operations: the reference of :func:`polarity_attention_fast`,
    and what runs with the fast paths off and in captured graphs (export).

    With ``h`` heads of width ``d`` (even), ``s = softplus(scale)``,
    ``p = 1 + alpha * sigmoid(power)``, ``f+(t) = relu(t)^p``,
    ``f-(t) = relu(-t)^p``, ``k <- k + k_bias`` (when given),
    ``q_sim = [f+(q/s), f-(q/s)]``, ``q_opp = [f-(q/s), f+(q/s)]``,
    ``k' = [f+(k/s), f-(k/s)]`` and ``v = [v1, v2]`` split per head::

        x_sim = q_sim (k'^T v1 / n) / (q_sim . mean(k') + eps)
        x_opp = q_opp (k'^T v2 / n) / (q_opp . mean(k') + eps)
        out   = [x_sim, x_opp]

    written in its cheap algebraic form, which touches each query and key
    only with ``abs``, one power (``exp((p - 1) log|t|)``), one product,
    the sign split (a clamp and a difference; elementwise) and two matrix
    products:

    - ``|t / s|^p = c |t|^p`` with the per-channel ``c = (1 / s)^p``, so
      ``c`` scales rows of the small matrices below instead of every token;
    - ``f+`` and ``f-`` have disjoint supports: both come from the one
      signed power ``u = t |t|^(p - 1) = sign(t) |t|^p``, as ``relu(u)``
      and ``relu(u) - u`` (each exactly ``|t|^p`` or 0);
    - the opposite-signed flow uses the same key products with the roles of
      ``f+(q)`` and ``f-(q)`` swapped, so both flows and both normalisers
      are two products of the query features with small ``(d, d + 2)``
      matrices::

        [num_sim, num_opp, z_sim, z_opp] = f+(q) [P1, Q2, kp, kn]
                                         + f-(q) [Q1, P2, kn, kp]

    with ``P = f+(k)^T v``, ``Q = f-(k)^T v`` (halves 1, 2 of the value
    channels), ``kp``, ``kn`` the sums of ``f+(k)``, ``f-(k)`` over keys,
    and ``z + eps n`` dividing its flow's half of the channels.
    No feature map is concatenated; every operation exports to ONNX opset
    11. (The paper's form, with the concatenated features, is kept in the
    tests as the arbiter.)

    The computation runs token-major on the inputs as given: no transposed
    copy of a token map (in ONNX Runtime a ``Transpose`` of a token map
    costs as much as an elementwise pass), and the sums over keys are
    products with a row of ones (a ``ReduceSum`` over the token axis is
    several times slower there than a product).

    Args:
        q: ``(B, h, N, d)`` queries.
        k: ``(B, h, n, d)`` keys (``n`` may differ from ``N``).
        v: ``(B, h, n, d)`` values.
        scale: raw ``scale`` broadcastable to ``(1, h, 1, d)``.
        power: raw ``power``, ``(1, h, 1, d)``.
        alpha: exponent range; ``p`` lies in ``(1, 1 + alpha)``.
        eps: added to the normalisers (of the means over keys).
        k_bias: optional tensor broadcastable to ``k``, added to the keys
            (a positional table).

    Returns:
        ``(B, h, N, d)``.
    """
    if k_bias is not None:
        k = k + k_bias
    p = 1 + alpha * torch.sigmoid(power)  # (1, h, 1, d)
    c = ((1 / F.softplus(scale)).expand_as(p) ** p).transpose(-2, -1)
    n = k.shape[-2]
    d = q.shape[-1]
    half = d // 2

    qp, qn = _signed_powers(q, p)  # f+(q) / c, f-(q) / c; (B, h, N, d)
    kp, kn = _signed_powers(k, p)  # (B, h, n, d)
    ones = torch.ones_like(v[..., :1]).transpose(-2, -1)  # (B, h, 1, n)
    P = c * (kp.transpose(-2, -1) @ v)  # f+(k)^T v, (B, h, d, d); c: rows
    Q = c * (kn.transpose(-2, -1) @ v)  # f-(k)^T v
    sp = c * (ones @ kp).transpose(-2, -1)  # (B, h, d, 1)
    sn = c * (ones @ kn).transpose(-2, -1)
    m_pos = torch.cat([P[..., :half], Q[..., half:], sp, sn], -1)
    m_neg = torch.cat([Q[..., :half], P[..., half:], sn, sp], -1)
    # (B, h, N, d + 2): the flows' numerators, then their normalisers
    u = qp @ (c * m_pos) + qn @ (c * m_neg)
    z = u[..., d:] + eps * n  # n (mean + eps) = sum + eps n
    B, h, N = u.shape[0], u.shape[1], u.shape[2]
    return (u[..., :d].reshape(B, h, N, 2, half) / z.unsqueeze(-1)).reshape(
        B, h, N, d)


def _signed_powers(t: Tensor, p: Tensor,
                   tiny: float = _FLOAT32_TINY) -> Tuple[Tensor, Tensor]:
    """``relu(t)^p`` and ``relu(-t)^p`` from one signed power.

    The signed power ``sign(t) |t|^p`` is ``t exp((p - 1) log|t|)`` with
    ``|t|`` clamped to ``tiny`` (float32's smallest normal number) inside
    the logarithm, as in the fast backward: the same values (the clamp
    changes no ``|t| >= 1.2e-38``; at ``t = 0`` the product is 0) and
    finite gradients everywhere (zero at ``t = 0``, as ``|t|^p``'s for
    ``p > 1``). In ONNX Runtime ``Log``, ``Mul``, ``Exp`` take about half
    the time of ``Pow`` with a per-channel exponent, and the product with
    ``t`` about a third of ``Sign`` and its product. The two are split by
    sign (:func:`~.features.split_signs`: each exactly ``|t|^p`` or 0).
    """
    return split_signs(t * torch.exp((p - 1) * torch.log(
        t.abs().clamp_min(tiny))))


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
