"""Rotary encoding of channel pairs, the tensor-level primitive.

The one rotation helper of pola_mm: the plain formula
(:func:`~pola_mm.ops.pacs_attention.pacs_attention_pytorch`, the
softmax blocks of PolaPP) and the PaCS kernel
(:mod:`~pola_mm.ops.pacs_kernel`) both rotate through it. The tables
themselves (which angle each channel gets) are the model's:
:func:`~pola_mm.models.layers.rotary.rotary_tables`.
"""
import torch
from torch import Tensor

__all__ = ['rotate_every_two', 'theta_shift']


def rotate_every_two(x: Tensor) -> Tensor:
    """Each channel pair ``(x0, x1)`` -> ``(-x1, x0)``: ``(..., w)`` ->
    ``(..., w)``, ``w`` even (multiplication of the pair, read as
    ``x0 + i x1``, by ``i``)."""
    return torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)


def theta_shift(x: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
    """Rotary encoding ``x * cos + rotate_every_two(x) * sin``.

    Args:
        x: ``(..., N, w)``.
        sin, cos: ``(N, w)`` (for example from
            :func:`~pola_mm.models.layers.rotary.rotary_tables`).

    Returns:
        ``(..., N, w)``.
    """
    return x * cos + rotate_every_two(x) * sin
