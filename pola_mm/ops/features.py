"""The pieces of the attention formulas that the plain references and the
fast implementations share, written once.

- :data:`EPS`, added to the normalisers of both attentions;
- :func:`split_signs`: ``relu(u)`` and ``relu(-u)`` of a signed tensor,
  the split of every polarity feature map (PolaFormer's ``relu(+-t)^p``
  from ``u = sign(t) |t|^p``, PaCS's ``[relu(x), relu(-x)]``), with its
  adjoint :func:`split_signs_grad`;
- :func:`pacs_features`, the PaCS feature map (PolaFormer++), computed
  through :func:`polar_halves`;
- :func:`sum_to`: a broadcast parameter's gradient reduced to its shape
  (the hand-written backwards).

The references (:mod:`~.polarity.graph`, :mod:`~.pacs.naive`) and the
fast implementations (:mod:`~.polarity.cpu`, :mod:`~.pacs.cpu` and the
kernels' wrappers) import from here; nothing here imports any of them.
"""
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from .dispatch import records_grad

__all__ = ['EPS', 'split_signs', 'split_signs_grad', 'polar_halves',
           'pacs_features', 'sum_to']

#: Added to the normalisers (``q' . mean(k') + EPS``) of both attentions.
EPS = 1e-6


def split_signs(u: Tensor, out: Optional[Sequence[Tensor]] = None
                ) -> Tuple[Tensor, Tensor]:
    """``relu(u)`` and ``relu(-u)``, the latter as ``relu(u) - u`` (exact:
    the two have disjoint supports).

    Args:
        u: ``(..., d)``.
        out: two ``(..., d)`` tensors to write them into (no autograd),
            for example the halves of one ``(..., 2d)`` buffer; else new
            tensors.

    Returns:
        ``(relu(u), relu(-u))``.
    """
    pos = torch.clamp_min(u, 0, out=None if out is None else out[0])
    return pos, torch.sub(pos, u, out=None if out is None else out[1])


def split_signs_grad(df: Tensor, x: Tensor, swap: bool = False) -> Tensor:
    """Adjoint of :func:`polar_halves`: ``dL/dx`` ``(..., d)`` from ``df =
    dL/d[relu(x), relu(-x)]`` ``(..., 2d)`` (halves swapped with
    ``swap``); zero where ``x = 0``."""
    d = x.shape[-1]
    first, second = df[..., :d], df[..., d:]
    if swap:  # [relu(-x), relu(x)]
        first, second = second, first
    return first * (x > 0) - second * (x < 0)


def polar_halves(x: Tensor, swap: bool = False) -> Tensor:
    """``[relu(x), relu(-x)]`` as a new tensor (halves swapped with
    ``swap``): ``(..., d)`` -> ``(..., 2d)``, the two halves of
    :func:`split_signs` concatenated (no write into a buffer: a traced
    graph, the TorchScript exporter's, keeps it)."""
    pos, neg = split_signs(x)
    return torch.cat([neg, pos] if swap else [pos, neg], dim=-1)


def pacs_features(x: Tensor, t: Optional[Tensor] = None,
                  swap: bool = False) -> Tensor:
    """The PaCS feature map ``exp([relu(x), relu(-x)] * t) - 1`` (halves
    swapped with ``swap``; ``t = 1`` when None).

    The queries take it with the temperatures ``t = sigmoid(s1)`` (same-
    signed flow) and ``sigmoid(s2)`` with ``swap`` (opposite-signed flow),
    the keys without temperature. Where autograd records nothing (the
    fast implementation, inference) the temperature and ``exp(.) - 1``
    apply in place on the new tensor; otherwise out of place, so that
    backward finds what it saved.

    Args:
        x: ``(..., d)``.
        t: temperatures broadcastable to ``(..., 2d)`` (not wider), or None.
        swap: ``[relu(-x), relu(x)]`` instead.

    Returns:
        ``(..., 2d)``.
    """
    c = polar_halves(x, swap)
    records = records_grad(x, t)
    if t is not None:
        c = c * t if records else c.mul_(t)
    if records:
        return torch.exp(c) - 1
    return c.exp_().sub_(1)


def sum_to(t: Tensor, shape: Sequence[int]) -> Tensor:
    """``t`` summed over the dims where ``shape`` is 1 and ``t`` is not (a
    broadcast parameter's gradient), as ``shape``."""
    dims = [i for i, (a, b) in enumerate(zip(t.shape, shape))
            if b == 1 and a != 1]
    return (t.sum(dim=dims, keepdim=True) if dims else t).reshape(shape)
