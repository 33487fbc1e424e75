"""Polarity-aware linear attention exactly as the paper (and the authors'
code) write it: :func:`polarity_attention_naive`, the arbiter that every
other form (:mod:`.graph`, :mod:`.cpu`, :mod:`.triton`) is tested equal to.

Slow and memory-hungry on purpose: the concatenated feature maps
``(B, h, N, 2d)`` of both flows, two key products, nothing rearranged.
"""
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..features import EPS

__all__ = ['polarity_attention_naive', 'feature_params', 'polarity_features']


def feature_params(scale: Tensor, power: Tensor,
                   alpha: float) -> Tuple[Tensor, Tensor]:
    """The divisor ``s = softplus(scale)`` of queries and keys and the
    exponent ``p = 1 + alpha sigmoid(power)`` of the feature maps, from the
    raw parameters (any shape; elementwise)."""
    return F.softplus(scale), 1 + alpha * torch.sigmoid(power)


def polarity_features(t: Tensor, p: Tensor) -> Tuple[Tensor, Tensor]:
    """``f+(t) = relu(t)^p`` and ``f-(t) = relu(-t)^p`` of scaled queries
    or keys ``t`` ``(..., d)``, ``p`` broadcastable to ``t``."""
    return F.relu(t)**p, F.relu(-t)**p


def polarity_attention_naive(q: Tensor, k: Tensor, v: Tensor, scale: Tensor,
                             power: Tensor, alpha: float,
                             eps: float = EPS) -> Tensor:
    """PolaFormer's attention of heads, as published.

    With ``s = softplus(scale)``, ``p = 1 + alpha sigmoid(power)``,
    ``f+(t) = relu(t)^p``, ``f-(t) = relu(-t)^p`` of ``t = q / s`` and
    ``k / s``::

        q_sim = [f+(q), f-(q)],  q_opp = [f-(q), f+(q)],  k' = [f+(k), f-(k)]
        x_sim = q_sim (k'^T v1 / n) / (q_sim . mean(k') + eps)
        x_opp = q_opp (k'^T v2 / n) / (q_opp . mean(k') + eps)
        out   = [x_sim, x_opp]

    (``v = [v1, v2]`` split per head; like the authors, ``k'`` and ``v``
    are each scaled by ``n^-1/2`` before their product).

    Args:
        q: ``(B, h, N, d)``.
        k, v: ``(B, h, n, d)`` (a positional table already added to ``k``).
        scale: raw, broadcastable to ``(1, h, 1, d)``.
        power: raw, ``(1, h, 1, d)``.
        alpha: exponent range.
        eps: added to the normalisers.

    Returns:
        ``(B, h, N, d)``.
    """
    n = k.shape[-2]
    s, p = feature_params(scale, power, alpha)
    q_pos, q_neg = polarity_features(q / s, p)
    k_pos, k_neg = polarity_features(k / s, p)
    q_sim = torch.cat([q_pos, q_neg], dim=-1)
    q_opp = torch.cat([q_neg, q_pos], dim=-1)
    kk = torch.cat([k_pos, k_neg], dim=-1)
    v1, v2 = torch.chunk(v, 2, dim=-1)
    k_mean = kk.mean(dim=-2, keepdim=True).transpose(-2, -1)
    kt = kk.transpose(-2, -1) * n**-0.5
    x_sim = q_sim @ (kt @ (v1 * n**-0.5)) / (q_sim @ k_mean + eps)
    x_opp = q_opp @ (kt @ (v2 * n**-0.5)) / (q_opp @ k_mean + eps)
    return torch.cat([x_sim, x_opp], dim=-1)
