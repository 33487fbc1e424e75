"""``linear(gelu(h))`` that keeps only ``h`` for backward.

The second half of a transformer MLP, ``fc2(gelu(h))`` with ``h =
fc1(x)``, makes autograd save two hidden-layer tensors: ``h`` for GELU's
gradient and ``gelu(h)`` for ``fc2``'s weight gradient. They are the
largest activations of a block (MLP ratio 4 or 8: each is 4-8 times a
token-by-channel tensor). :func:`gelu_linear` computes the same values and
saves only ``h`` (and the weight, a parameter); backward recomputes
``gelu(h)`` (one elementwise pass) for the weight gradient.

Mixed precision: under autocast the forward runs exactly as the plain
layers do (GELU and the Linear under the ambient autocast); backward
repeats the casts autocast made explicitly (GELU in the dtype it ran in,
the Linear's operands in its output dtype, gradients cast back to each
input's dtype), so the fp16/bf16 copies of the weight and of ``gelu(h)``
are not kept either.

:func:`gelu_linear` uses the function where autograd records, else its
plain reference :func:`gelu_linear_pytorch`.

:func:`gelu_mlp` is the op the MLP calls, the whole ``fc2(gelu(fc1(x)))``,
with its plain reference :func:`gelu_mlp_pytorch` and one fast
implementation, :func:`gelu_mlp_fast`: in training ``fc1`` then
:class:`GeluLinearFunction` (only ``fc1(x)`` kept); in CPU inference on
many tokens, runs of tokens through one reused hidden buffer of about
``MLP_RUN_ELEMENTS`` (4 MB): the hidden layer, 4-8 times the input, then
never leaves the cache (about 2x faster at stage 1 of Pola-Swin-T on the
CPU: docs/performance.md).
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from .dispatch import records_grad, use_fast
from .precision import autocast_enabled, no_autocast
from .runs import token_runs

__all__ = [
    'GeluLinearFunction', 'gelu_linear', 'gelu_linear_pytorch', 'gelu_mlp',
    'gelu_mlp_pytorch', 'gelu_mlp_fast'
]

#: CPU inference: hidden-layer elements of one run of tokens of
#: :func:`gelu_mlp` ...
MLP_RUN_ELEMENTS = 1 << 20
#: ... and the fewest tokens of a run (wide hidden layers).
MLP_MIN_TOKENS = 512


def gelu_linear_pytorch(h: Tensor, weight: Tensor, bias: Optional[Tensor],
                        approximate: str = 'none') -> Tensor:
    """Plain reference: ``F.linear(F.gelu(h, approximate), weight, bias)``.

    Args:
        h: ``(..., K)`` hidden pre-activation (``fc1``'s output).
        weight: ``(C, K)``.
        bias: ``(C,)`` or None.
        approximate: GELU's ``approximate`` (``'none'`` or ``'tanh'``).

    Returns:
        ``(..., C)``.
    """
    return F.linear(F.gelu(h, approximate=approximate), weight, bias)


class GeluLinearFunction(torch.autograd.Function):
    """:func:`gelu_linear_pytorch` saving ``h`` and ``weight`` only."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, bias: Optional[Tensor],
                approximate: str) -> Tensor:
        # the same calls as the plain reference, under the ambient autocast
        a = F.gelu(h, approximate=approximate)
        y = F.linear(a, weight, bias)
        ctx.save_for_backward(h, weight)
        ctx.approximate = approximate
        ctx.act_dtype = a.dtype  # the dtype GELU ran in
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        h, weight = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        cdt = grad.dtype  # the Linear's compute dtype (its output's)
        dh = dw = db = None
        with no_autocast(h.device.type):
            g = grad.reshape(-1, grad.shape[-1])
            ha = h.to(ctx.act_dtype)
            if need_w:  # GELU recomputed, as it ran in the forward
                a = F.gelu(ha, approximate=ctx.approximate)
                dw = torch.mm(g.t(), a.reshape(-1, a.shape[-1]).to(cdt))
                dw = dw.to(weight.dtype)
            if need_b and ctx.bias_dtype is not None:
                db = g.sum(0).to(ctx.bias_dtype)
            if need_h:
                da = torch.mm(g, weight.to(cdt)).to(ctx.act_dtype)
                dh = torch.ops.aten.gelu_backward(
                    da.view(ha.shape), ha, approximate=ctx.approximate)
                dh = dh.to(h.dtype)
        return dh, dw, db, None


def gelu_linear(h: Tensor, linear: nn.Linear,
                approximate: str = 'none') -> Tensor:
    """``linear(gelu(h))``, the second half of an MLP (the op).

    Where autograd records the call (and the fast paths are on, no graph
    captured), through :class:`GeluLinearFunction`, which saves only ``h``
    (and the weight) for backward; otherwise the plain reference
    :func:`gelu_linear_pytorch`. Same values; gradients up to float
    rounding.

    Args:
        h: ``(..., K)`` (``fc1``'s output).
        linear: the ``nn.Linear(K, C)`` (``fc2``).
        approximate: GELU's ``approximate`` (``'none'`` or ``'tanh'``).

    Returns:
        ``(..., C)``.
    """
    if use_fast(h) and records_grad(h, linear.weight, linear.bias):
        return GeluLinearFunction.apply(h, linear.weight, linear.bias,
                                        approximate)
    return gelu_linear_pytorch(h, linear.weight, linear.bias, approximate)


def gelu_mlp_pytorch(x: Tensor, w1: Tensor, b1: Optional[Tensor],
                     w2: Tensor, b2: Optional[Tensor],
                     approximate: str = 'none') -> Tensor:
    """Plain reference of :func:`gelu_mlp`: ``F.linear(F.gelu(F.linear(x,
    w1, b1), approximate), w2, b2)``.

    Args:
        x: ``(..., C)``.
        w1: ``(K, C)``; b1: ``(K,)`` or None (``fc1``).
        w2: ``(C', K)``; b2: ``(C',)`` or None (``fc2``).
        approximate: GELU's ``approximate`` (``'none'`` or ``'tanh'``).

    Returns:
        ``(..., C')``.
    """
    return gelu_linear_pytorch(F.linear(x, w1, b1), w2, b2, approximate)


def gelu_mlp(x: Tensor, fc1: nn.Linear, fc2: nn.Linear,
             approximate: str = 'none') -> Tensor:
    """``fc2(gelu(fc1(x)))``, a transformer MLP (the op).

    :func:`gelu_mlp_fast` with the fast paths on and no graph captured,
    else the plain reference :func:`gelu_mlp_pytorch`. Same values;
    gradients up to float rounding.

    Args:
        x: ``(..., C)``.
        fc1: ``nn.Linear(C, K)``.
        fc2: ``nn.Linear(K, C')``.
        approximate: GELU's ``approximate`` (``'none'`` or ``'tanh'``).

    Returns:
        ``(..., C')``.
    """
    if use_fast(x):
        return gelu_mlp_fast(x, fc1, fc2, approximate)
    return gelu_mlp_pytorch(x, fc1.weight, fc1.bias, fc2.weight, fc2.bias,
                            approximate)


def gelu_mlp_fast(x: Tensor, fc1: nn.Linear, fc2: nn.Linear,
                  approximate: str = 'none') -> Tensor:
    """:func:`gelu_mlp_pytorch`, lean: where autograd records, ``fc1``
    then :class:`GeluLinearFunction` (only ``fc1(x)`` kept for backward);
    in CPU inference (float32 or float64 without autocast, biases, more
    tokens than one run) on runs of tokens through one reused hidden
    buffer; otherwise the reference. Same arguments as :func:`gelu_mlp`.
    """
    w1, b1, w2, b2 = fc1.weight, fc1.bias, fc2.weight, fc2.bias
    if records_grad(x, w1, b1, w2, b2):
        return GeluLinearFunction.apply(F.linear(x, w1, b1), w2, b2,
                                        approximate)
    step = max(MLP_RUN_ELEMENTS // fc1.out_features, MLP_MIN_TOKENS)
    if (x.device.type == 'cpu' and not autocast_enabled('cpu')
            and x.dtype == w1.dtype == w2.dtype and b1 is not None
            and b2 is not None and x.numel() > step * x.shape[-1]):
        return _gelu_mlp_runs(x, fc1, fc2, approximate, step)
    return gelu_mlp_pytorch(x, w1, b1, w2, b2, approximate)


def _gelu_mlp_runs(x: Tensor, fc1: nn.Linear, fc2: nn.Linear,
                   approximate: str, step: int) -> Tensor:
    """:func:`gelu_mlp` on runs of ``step`` tokens, one hidden buffer."""
    flat = x.reshape(-1, x.shape[-1])
    out = flat.new_empty(flat.shape[0], fc2.out_features)
    hidden = flat.new_empty(step, fc1.out_features)
    w1, w2 = fc1.weight.t(), fc2.weight.t()
    for c in token_runs(flat.shape[0], step):
        run = flat[c]
        h = torch.addmm(fc1.bias, run, w1, out=hidden[:run.shape[0]])
        torch.ops.aten.gelu_(h, approximate=approximate)
        torch.addmm(fc2.bias, h, w2, out=out[c])
    return out.view(x.shape[:-1] + (fc2.out_features, ))
