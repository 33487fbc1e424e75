"""PaCS polarity attention (PolaFormer++) exactly as written:
:func:`pacs_attention_pytorch`, the arbiter of the other forms (:mod:`.cpu`,
:mod:`.triton`), and also the graph form (standard operations) that runs
with the fast paths off and whenever a graph is captured: PaCS has no
cheaper algebraic form of its own.
"""
from typing import Optional

import torch
from torch import Tensor

from .. import observers
from ..features import EPS, pacs_features
from ..rotary import theta_shift

__all__ = ['pacs_attention_pytorch']


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
