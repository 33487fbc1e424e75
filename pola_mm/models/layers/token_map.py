"""Tokens and maps: the two layouts of a stage's features.

Blocks compute on tokens ``(B, H * W, C)``, row-major on the stage map;
convolutions (positional convs, depth-wise convs in FFNs, stems and
downsampling) on maps ``(B, C, H, W)``.

Both are views in eager mode (the map of contiguous tokens is a
channels-last view). The order of the steps is for exported graphs: the
``Transpose`` is the 4-D NHWC <-> NCHW permutation, which ONNX Runtime
folds into the input and output reorders of its blocked convolutions (a
3-D transpose after the convolution stays a separate node;
docs/performance.md).
"""
from torch import Tensor

from ...type_aliases import Size2

__all__ = ['to_map', 'to_tokens']


def to_map(x: Tensor, hw: Size2) -> Tensor:
    """Tokens ``(B, H * W, C)`` -> map ``(B, C, H, W)``."""
    return x.reshape(x.shape[0], hw[0], hw[1], x.shape[2]).permute(0, 3, 1, 2)


def to_tokens(x: Tensor) -> Tensor:
    """Map ``(B, C, H, W)`` -> tokens ``(B, H * W, C)``."""
    return x.permute(0, 2, 3, 1).flatten(1, 2)
