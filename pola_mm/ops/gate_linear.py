"""``linear(x * g)`` that keeps only ``x`` and ``g`` for backward.

The polarity attention's output step, ``proj(x * g)`` (the attention
output gated by ``g``), makes autograd save ``x`` and ``g`` for the
product's gradient and ``x * g`` for ``proj``'s weight gradient. ``g`` is a
view of the projection output, which is kept anyway; ``x * g`` is one more
token-by-channel tensor per block. :func:`gate_linear` computes the same
values and saves ``x``, ``g`` and the weight (a parameter); backward
recomputes ``x * g`` (one elementwise product).

Mixed precision: the forward runs the plain calls under the ambient
autocast; backward repeats autocast's casts explicitly (the product in the
dtype it ran in, the Linear's operands in its output dtype, gradients cast
back to each input's dtype), so neither ``x * g`` nor autocast's fp16 copy
of the weight is kept.

:func:`gate_linear` is the op the attention calls: it uses the function
where autograd records, else its plain reference
:func:`gate_linear_pytorch`.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from . import observers
from .dispatch import records_grad, use_fast
from .precision import no_autocast

__all__ = ['GateLinearFunction', 'gate_linear', 'gate_linear_pytorch']


def gate_linear_pytorch(x: Tensor, g: Tensor, weight: Tensor,
                        bias: Optional[Tensor]) -> Tensor:
    """Plain reference: ``F.linear(x * g, weight, bias)``.

    Args:
        x, g: ``(..., K)``, the same shape.
        weight: ``(C, K)``.
        bias: ``(C,)`` or None.

    Returns:
        ``(..., C)``.
    """
    return F.linear(x * g, weight, bias)


class GateLinearFunction(torch.autograd.Function):
    """:func:`gate_linear_pytorch` saving ``x``, ``g`` and ``weight``."""

    @staticmethod
    def forward(ctx, x: Tensor, g: Tensor, weight: Tensor,
                bias: Optional[Tensor]) -> Tensor:
        # the same calls as the plain reference, under the ambient autocast
        p = x * g
        y = F.linear(p, weight, bias)
        ctx.save_for_backward(x, g, weight)
        ctx.mul_dtype = p.dtype  # the dtype the product ran in
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        x, g, weight = ctx.saved_tensors
        need_x, need_g, need_w, need_b = ctx.needs_input_grad[:4]
        cdt = grad.dtype  # the Linear's compute dtype (its output's)
        md = ctx.mul_dtype
        dx = dg = dw = db = None
        with no_autocast(x.device.type):
            gy = grad.reshape(-1, grad.shape[-1])
            xm, gm = x.to(md), g.to(md)
            if need_w:  # the product recomputed
                p = (xm * gm).to(cdt)
                dw = torch.mm(gy.t(), p.reshape(-1, p.shape[-1]))
                dw = dw.to(weight.dtype)
            if need_b and ctx.bias_dtype is not None:
                db = gy.sum(0).to(ctx.bias_dtype)
            if need_x or need_g:
                dp = torch.mm(gy, weight.to(cdt)).to(md)
                dp = dp.view(*grad.shape[:-1], dp.shape[-1])
                if need_x:
                    dx = (dp * gm).to(x.dtype)
                if need_g:
                    dg = (dp * xm).to(g.dtype)
        return dx, dg, dw, db


@observers.reports_calls
def gate_linear(x: Tensor, g: Tensor, linear: nn.Linear) -> Tensor:
    """``linear(x * g)``, the gated output projection (the op).

    Where autograd records the call (and the fast paths are on, no graph
    captured), through :class:`GateLinearFunction`, which saves only ``x``,
    ``g`` (and the weight) for backward; otherwise the plain reference
    :func:`gate_linear_pytorch`. Same values; gradients up to float
    rounding.

    Args:
        x, g: ``(..., K)``, the same shape.
        linear: the ``nn.Linear(K, C)`` (``proj``).

    Returns:
        ``(..., C)``.
    """
    if (use_fast(x) and x.shape == g.shape
            and records_grad(x, g, linear.weight, linear.bias)):
        return GateLinearFunction.apply(x, g, linear.weight, linear.bias)
    return gate_linear_pytorch(x, g, linear.weight, linear.bias)
