"""Depth-wise 2-D convolution: the op.

:func:`depthwise_conv2d` computes ``F.conv2d(x, w, b, padding=p,
groups=C)`` in the weight's dtype (float32 under autocast, as the
polarity attention around it): its plain reference
:func:`depthwise_conv2d_pytorch` with the fast paths off or a graph
captured (:func:`~.dispatch.use_fast`), else its one fast implementation,
the autograd function :class:`_DepthwiseConv2d`:

- it keeps ``x`` as given for backward (a view of the projection that
  autograd keeps anyway, fp16/bf16 under autocast) instead of a float32
  copy: the GPU training memory goal (docs/performance.md);
- it convolves a transient copy in the weight's dtype, on the CPU a dense
  one (channels-last for a strided ``x``: PyTorch's CPU conv is several
  times slower on strided inputs), made again in backward.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .dispatch import use_fast
from .precision import no_autocast

__all__ = ['depthwise_conv2d', 'depthwise_conv2d_pytorch']


def _dense(x: Tensor) -> Tensor:
    """``x`` ``(B, C, H, W)`` if it is contiguous or channels-last
    contiguous, else a channels-last contiguous copy."""
    if x.is_contiguous() or x.is_contiguous(
            memory_format=torch.channels_last):
        return x
    return x.contiguous(memory_format=torch.channels_last)


def _conv_input(x: Tensor, weight: Tensor) -> Tensor:
    """``x`` in the weight's dtype; on the CPU dense (:func:`_dense`)."""
    x = x.to(weight.dtype)
    return _dense(x) if x.device.type == 'cpu' else x


class _DepthwiseConv2d(torch.autograd.Function):
    """:func:`depthwise_conv2d_pytorch` saving ``x`` as given (any strides
    and dtype) and convolving a transient copy (:func:`_conv_input`), made
    again in backward; the input gradient is returned in ``x``'s dtype."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor],
                padding: Tuple[int, int]) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.padding = padding
        ctx.has_bias = bias is not None
        return F.conv2d(_conv_input(x, weight), weight, bias,
                        padding=padding, groups=x.shape[1])

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = dw = db = None
        if need_x or need_w:
            dx, dw, _ = torch.ops.aten.convolution_backward(
                grad, _conv_input(x, weight), weight, None, [1, 1],
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
            return _DepthwiseConv2d.apply(x, weight, bias, tuple(padding))
        return depthwise_conv2d_pytorch(x, weight, bias, padding)


def depthwise_conv2d_pytorch(x: Tensor, weight: Tensor,
                             bias: Optional[Tensor],
                             padding: Tuple[int, int]) -> Tensor:
    """The plain reference of :func:`depthwise_conv2d` (same arguments)."""
    return F.conv2d(x.to(weight.dtype), weight, bias, padding=padding,
                    groups=x.shape[1])
