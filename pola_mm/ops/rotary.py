"""2-D rotary position encoding of PolaFormer++ (the authors' ``RoPE``).

For features of width ``w`` on a map ``(H, W)``: ``w / 4`` frequencies
``angle = 1 / base ** linspace(0, 1, w / 4)``, each repeated twice in place
(``w / 2`` values); a token at ``(row, col)`` gets
``sin = [sin(row * angle), sin(col * angle)]`` and ``cos`` likewise
(``w`` values): :func:`rotary_tables`. :func:`theta_shift` rotates each
pair of channels ``(x0, x1)`` by its angle. The tables depend only on the
map, so the encoding works at any input size with nothing learned. They
are separable: :func:`rotary_factors` holds the ``H + W`` distinct rows
(what the fused PaCS kernels read), :func:`expand_factors` makes the
``(H W, w)`` tables of them.

The one rotation of pola_mm: the plain PaCS formula
(:func:`~pola_mm.ops.pacs_attention.pacs_attention_pytorch`), PolaPP's
softmax blocks and the fast PaCS implementation
(:mod:`~pola_mm.ops.pacs.cpu`, which multiplies channel pairs as complex
numbers, the same rotation) all use these tables and this rotation.
"""
import functools
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..type_aliases import Size2

__all__ = ['expand_factors', 'rotary_factors', 'rotary_tables',
           'rotate_every_two', 'theta_shift']


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
            :func:`rotary_tables`).

    Returns:
        ``(..., N, w)``.
    """
    return x * cos + rotate_every_two(x) * sin


def rotary_factors(hw: Size2, width: int, base: float = 10000.,
                   device: Optional[torch.device] = None,
                   cache: bool = False) -> Tensor:
    """The separable factors of :func:`rotary_tables`, float32.

    Args:
        hw: ``(H, W)``.
        width: feature width ``w``, a multiple of 4.
        base: frequency base.
        device: where to make them (default: the CPU).
        cache: keep them per map, width, base and device (``hw`` plain
            ints, and not for the meta and fake tensors of a tracing mode):
            every layer of a stage and its backward read the same ones.

    Returns:
        ``(2, H + W, w / 2)``: ``[0]`` the sines, ``[1]`` the cosines; rows
        ``0..H-1`` of the map's rows, ``H..H+W-1`` of its columns. A token
        at ``(row, col)`` takes its channels ``0..w/2-1`` from row ``row``,
        the others from row ``H + col``.
    """
    if width % 4 != 0:
        raise ValueError(f'rotary encoding needs a feature width divisible '
                         f'by 4, got {width} (use a head width divisible by '
                         '4 for softmax blocks, by 2 for PaCS blocks)')
    build = _factors if not cache else _cached_factors
    return build(hw[0], hw[1], width, base, device)


def _factors(H, W, width: int, base: float,
             device: Optional[torch.device]) -> Tensor:
    """:func:`rotary_factors` of an ``H x W`` map (ints, or a traced
    graph's sizes: int() would fix them)."""
    angle = 1.0 / (base**torch.linspace(0, 1, width // 4, device=device))
    angle = angle.unsqueeze(-1).repeat(1, 2).flatten()  # (w / 2)
    at = torch.cat([torch.arange(H, device=device, dtype=angle.dtype),
                    torch.arange(W, device=device, dtype=angle.dtype)])
    at = at[:, None] * angle  # (H + W, w / 2)
    return torch.stack([torch.sin(at), torch.cos(at)])


_cached_factors = functools.lru_cache(maxsize=64)(_factors)


def expand_factors(factors: Tensor, hw: Size2) -> Tuple[Tensor, Tensor]:
    """``sin``, ``cos`` ``(H * W, w)`` tables, row-major, of
    :func:`rotary_factors`' ``(2, H + W, w / 2)`` (any values)."""
    H, W = hw
    half = factors.shape[-1]
    rows, cols = factors[:, :H], factors[:, H:]
    tables = torch.cat([rows[:, :, None].expand(2, H, W, half),
                        cols[:, None].expand(2, H, W, half)], dim=-1)
    tables = tables.reshape(2, H * W, 2 * half)
    return tables[0], tables[1]


def rotary_tables(hw: Size2, width: int, base: float = 10000.,
                  device: Optional[torch.device] = None,
                  dtype: torch.dtype = torch.float32) -> Tuple[Tensor, Tensor]:
    """``sin`` and ``cos`` tables of a map, row-major.

    Computed in float32 as the authors (then cast to ``dtype``).

    Args:
        hw: ``(H, W)``.
        width: feature width ``w``, a multiple of 4 (the authors' ``RoPE``
            uses ``w = d``, ``RoPE_linear`` ``w = 2d``).
        base: frequency base.
        device: where to make them (default: the CPU).

    Returns:
        ``sin``, ``cos``: ``(H * W, w)`` each.
    """
    sin, cos = expand_factors(rotary_factors(hw, width, base, device), hw)
    return sin.to(dtype), cos.to(dtype)
