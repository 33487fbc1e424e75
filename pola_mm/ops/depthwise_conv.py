"""Depth-wise 2-D convolution with a fast backward on CPU.

Same results as ``F.conv2d(x, w, b, padding=p, groups=C)``; see
:func:`depthwise_conv2d`.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .cpu_ext import cpu_ext


def _dense(x: Tensor) -> Tensor:
    """``x`` ``(B, C, H, W)`` if it is contiguous or channels-last
    contiguous, else a channels-last contiguous copy (PyTorch's CPU conv
    is several times slower on strided inputs)."""
    if x.is_contiguous() or x.is_contiguous(
            memory_format=torch.channels_last):
        return x
    return x.contiguous(memory_format=torch.channels_last)


def _conv_input(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` in the weight's ``dtype``, dense on the CPU."""
    x = x.to(dtype)
    return _dense(x) if x.device.type == 'cpu' else x


class _DepthwiseConv2d(torch.autograd.Function):
    """``F.conv2d(..., groups=C)`` with its bias gradient taken as a plain
    sum: PyTorch's CPU convolution backward computes the bias gradient of a
    channels-last depth-wise conv about as slowly as the weight gradient.
    For channels-last float32 maps with the fused CPU loops built, the
    weight gradient is their ``dwconv_weight_grad`` and the input gradient
    the conv with the flipped kernel; otherwise both are PyTorch's. Saves
    ``x`` as given (any strides and, under autocast, fp16/bf16: a view of a
    tensor kept anyway costs nothing) and convolves a copy in the weight's
    dtype (dense on the CPU), made again in backward; the input gradient
    is returned in ``x``'s dtype."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor],
                padding: Tuple[int, int]) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.padding = padding
        ctx.has_bias = bias is not None
        return F.conv2d(_conv_input(x, weight.dtype), weight, bias,
                        padding=padding, groups=x.shape[1])

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = dw = db = None
        C, _, kh, kw = weight.shape
        ph, pw = ctx.padding
        ext = None
        x_dtype = x.dtype
        x = _conv_input(x, weight.dtype)
        if (x.dtype == torch.float32 and grad.dtype == torch.float32
                and x.stride(1) == 1 and grad.stride(1) == 1
                and ph < kh and pw < kw and grad.shape == x.shape):
            ext = cpu_ext()
        if ext is not None:
            # channels-last float32: the input gradient is the conv of the
            # gradient with the flipped kernel, the weight gradient one
            # fused pass (see dwconv_weight_grad in polarity_cpu.cpp)
            if need_x:
                dx = F.conv2d(grad, weight.flip(-2, -1),
                              padding=(kh - 1 - ph, kw - 1 - pw), groups=C)
            if need_w:
                dw = weight.new_empty(C, kh, kw)
                ext.dwconv_weight_grad(x, grad, kh, kw, ph, pw, dw)
                dw = dw.view(C, 1, kh, kw)
        elif need_x or need_w:
            dx, dw, _ = torch.ops.aten.convolution_backward(
                grad, x, weight, None, [1, 1], list(ctx.padding), [1, 1],
                False, [0, 0], x.shape[1], [need_x, need_w, False])
        if ctx.has_bias and need_b:
            db = grad.sum(dim=(0, 2, 3))
        if dx is not None:
            dx = dx.to(x_dtype)
        return dx, dw, db, None


def depthwise_conv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor],
                     padding: Tuple[int, int], lean: bool = False) -> Tensor:
    """Depth-wise 2-D conv (stride 1, ``groups = channels``) of ``x``
    ``(B, C, H, W)`` with ``weight`` ``(C, 1, kh, kw)``, computed in the
    weight's dtype; with ``lean`` (the caller's ``Path.autograd``) and
    autograd recording, through :class:`_DepthwiseConv2d` on the CPU and,
    off the CPU, where ``x`` is in another dtype than the weight.

    ``x`` may have any strides (e.g. a strided view of a projection's
    output that autograd keeps anyway) and a lower precision than the
    weight (fp16/bf16 under autocast, float32 weight). Off the CPU, a
    float32 ``x`` goes to the conv as it is, so that autograd keeps ``x``
    itself rather than a copy (the dense copy cuDNN makes of a strided
    input is freed within the call); the function keeps ``x`` as given and
    convolves a transient copy in the weight's dtype (dense on the CPU);
    without it ``x`` is cast (and on the CPU made dense) first.

    Returns:
        ``(B, C, H, W)`` in the weight's dtype.
    """
    if lean and _lean_applies(x, weight, bias):
        return _lean_conv(x, weight, bias, padding)
    x = _conv_input(x, weight.dtype)
    return F.conv2d(x, weight, bias, padding=padding, groups=x.shape[1])


@torch.jit.unused  # compiled code runs the plain conv
def _lean_applies(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> bool:
    """Whether :class:`_DepthwiseConv2d` serves the call (autograd records
    it, on the CPU or with ``x`` in another dtype than the weight)."""
    return (torch.is_grad_enabled()
            and (x.device.type == 'cpu' or x.dtype != weight.dtype)
            and any(t is not None and t.requires_grad
                    for t in (x, weight, bias)))


@torch.jit.unused
def _lean_conv(x: Tensor, weight: Tensor, bias: Optional[Tensor],
               padding: Tuple[int, int]) -> Tensor:
    return _DepthwiseConv2d.apply(x, weight, bias, tuple(padding))
