"""2-D rotary position encoding of PolaFormer++ (the authors' ``RoPE``).

For features of width ``w`` on a map ``(H, W)``: ``w / 4`` frequencies
``angle = 1 / base ** linspace(0, 1, w / 4)``, each repeated twice in place
(``w / 2`` values); a token at ``(row, col)`` gets
``sin = [sin(row * angle), sin(col * angle)]`` and ``cos`` likewise
(``w`` values). :func:`theta_shift` rotates each pair of channels
``(x0, x1)`` by its angle. The tables depend only on the map, so the
encoding works at any input size with nothing learned.
"""
from typing import Tuple

import torch
from torch import Tensor

from ...typing import Size2


def rotary_tables(hw: Size2, width: int, base: float = 10000.,
                  device: torch.device = torch.device('cpu'),
                  dtype: torch.dtype = torch.float32) -> Tuple[Tensor, Tensor]:
    """``sin`` and ``cos`` tables of a map, row-major.

    Computed in float32 as the authors (then cast to ``dtype``).

    Args:
        hw: ``(H, W)``.
        width: feature width ``w``, a multiple of 4 (the authors' ``RoPE``
            uses ``w = d``, ``RoPE_linear`` ``w = 2d``).
        base: frequency base.

    Returns:
        ``sin``, ``cos``: ``(H * W, w)`` each.
    """
    if width % 4:
        raise ValueError(f'rotary encoding needs a feature width divisible '
                         f'by 4, got {width} (use a head width divisible by '
                         '4 for softmax blocks, by 2 for PaCS blocks)')
    H, W = int(hw[0]), int(hw[1])
    angle = 1.0 / (base**torch.linspace(0, 1, width // 4, device=device))
    angle = angle.unsqueeze(-1).repeat(1, 2).flatten()  # (w / 2)
    rows = torch.arange(H, device=device, dtype=angle.dtype)[:, None] * angle
    cols = torch.arange(W, device=device, dtype=angle.dtype)[:, None] * angle
    half = width // 2

    def table(fn) -> Tensor:
        return torch.cat([fn(rows)[:, None].expand(H, W, half),
                          fn(cols)[None].expand(H, W, half)],
                         dim=-1).reshape(H * W, width)

    return table(torch.sin).to(dtype), table(torch.cos).to(dtype)


def rotate_every_two(x: Tensor) -> Tensor:
    """``(..., w)``: each pair ``(x0, x1)`` -> ``(-x1, x0)``."""
    return torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)


def theta_shift(x: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
    """Rotary encoding ``x * cos + rotate_every_two(x) * sin``.

    Args:
        x: ``(..., N, w)``.
        sin, cos: ``(N, w)`` from :func:`rotary_tables`.
    """
    return x * cos + rotate_every_two(x) * sin
