"""Depth-wise 2-D convolution: the op.

:func:`depthwise_conv2d` computes ``F.conv2d(x, w, b, padding=p,
groups=C)`` in the weight's dtype (float32 under autocast, as the
polarity attention around it). It decides itself
(:func:`~.dispatch.use_fast`):

- in training under autocast (``x`` in fp16/bf16, the weight in float32) a
  custom autograd function keeps ``x`` as given (a view of the projection
  that autograd keeps anyway) instead of a float32 copy: the GPU training
  memory goal (docs/performance.md);
- in CPU inference a strided ``x`` is convolved as a dense channels-last
  copy (PyTorch's CPU conv is several times slower on strided inputs);
- otherwise, and with the fast paths off or a graph captured, the plain
  reference :func:`depthwise_conv2d_pytorch`.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .dispatch import records_grad, use_fast
from .precision import no_autocast

__all__ = ['depthwise_conv2d', 'depthwise_conv2d_pytorch']


def _dense(x: Tensor) -> Tensor:
    """``x`` ``(B, C, H, W)`` if it is contiguous or channels-last
    contiguous, else a channels-last contiguous copy."""
    if x.is_contiguous() or x.is_contiguous(
            memory_format=torch.channels_last):
        return x
    return x.contiguous(memory_format=torch.channels_last)


class _DepthwiseConv2d(torch.autograd.Function):
    """:func:`depthwise_conv2d_pytorch` saving ``x`` as given (any strides
    and dtype) and convolving a transient copy in the weight's dtype, made
    again in backward; the input gradient is returned in ``x``'s dtype."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor],
                padding: Tuple[int, int]) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.padding = padding
        ctx.has_bias = bias is not None
        return F.conv2d(x.to(weight.dtype), weight, bias, padding=padding,
                        groups=x.shape[1])

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = dw = db = None
        if need_x or need_w:
            dx, dw, _ = torch.ops.aten.convolution_backward(
                grad, x.to(weight.dtype), weight, None, [1, 1],
                list(ctx.padding), [1, 1], False, [0, 0], x.shape[1],
                [need_x, need_w, False])
        if ctx.has_bias and need_b:
            db = grad.sum(dim=(0, 2, 3))
        if dx is not None:
            dx = dx.to(x.dtype)
        return dx, dw, db, None


def depthwise_conv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor],
                     padding: Tuple[int, int]) -> Tensor:
    """Depth-wise 2-D conv (stride 1, ``groups = C``).

    Args:
        x: ``(B, C, H, W)``, any strides, possibly in a lower precision
            than the weight (fp16/bf16 under autocast).
        weight: ``(C, 1, kh, kw)``.
        bias: ``(C,)`` or None.
        padding: ``(ph, pw)``.

    Returns:
        ``(B, C, H, W)`` in the weight's dtype.
    """
    with no_autocast(x.device.type):
        if use_fast(x):
            if records_grad(x, weight, bias) and x.dtype != weight.dtype:
                return _DepthwiseConv2d.apply(x, weight, bias,
                                              tuple(padding))
            if x.device.type == 'cpu':
                x = _dense(x.to(weight.dtype))
        return depthwise_conv2d_pytorch(x, weight, bias, padding)


def depthwise_conv2d_pytorch(x: Tensor, weight: Tensor,
                             bias: Optional[Tensor],
                             padding: Tuple[int, int]) -> Tensor:
    """The plain reference of :func:`depthwise_conv2d` (same arguments)."""
    return F.conv2d(x.to(weight.dtype), weight, bias, padding=padding,
                    groups=x.shape[1])
