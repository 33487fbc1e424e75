"""Tokens and maps: the two layouts of a stage's features.

Blocks compute on tokens ``(B, H * W, C)``, row-major on the stage map;
convolutions (positional convs, depth-wise convs in FFNs, stems and
downsampling) on maps ``(B, C, H, W)``.
"""
from torch import Tensor

from ...type_aliases import Size2

__all__ = ['to_map', 'to_tokens']


def to_map(x: Tensor, hw: Size2) -> Tensor:
    """Tokens ``(B, H * W, C)`` -> map ``(B, C, H, W)``."""
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], hw[0], hw[1])


def to_tokens(x: Tensor) -> Tensor:
    """Map ``(B, C, H, W)`` -> tokens ``(B, H * W, C)``."""
    return x.flatten(2).transpose(1, 2)
