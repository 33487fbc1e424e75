"""Polarity-aware linear attention (PolaFormer), the graph form:
:func:`polarity_attention_pytorch`, the published formula in its cheap
algebraic form, in standard operations only.

It is what the op runs with the fast paths off and whenever a graph is
captured (ONNX export, ``torch.export``, ``torch.compile``), and the
reference that the CPU path (:mod:`.cpu`) and the kernels (:mod:`.triton`)
are tested equal to, beside the paper's own form (:mod:`.naive`).
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import observers
from ..features import EPS, split_signs

__all__ = ['polarity_attention_pytorch']

#: float32's smallest normal number (``torch.finfo(torch.float32).tiny``).
_FLOAT32_TINY = 1.1754943508222875e-38


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
    PyTorch operations: the reference of the CPU path and the kernels,
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
    11. (The paper's form, with the concatenated features, is
    :func:`~.naive.polarity_attention_naive`.)

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
