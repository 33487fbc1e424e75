"""CPU training of the per-token layers in runs of tokens.

On CPU, every tensor larger than glibc's mmap ceiling (32 MB) is handed back
to the OS when freed and page-faulted afresh, zero-filled, the next time one
is allocated. In a Pola-Swin-T training step at 224 (batch 8) the first
stage's 4C-wide tensors are 38.5 MB: the MLP's hidden layer before and after
GELU, their gradients, the fused ``qkvg`` projection and the gradient that
autograd stacks for it (measurements: docs/performance.md).

The two autograd functions here compute exactly what ``fc2(gelu(fc1(x)))``
and ``linear(x).chunk(parts, -1)`` compute, walking runs of tokens (about
``dispatch.TRAIN_RUN_ELEMENTS`` elements of the widest tensor each) with
reused run-sized buffers, so that nothing 4C-wide is allocated whole:

- :func:`mlp_in_runs` keeps ``fc1(x)`` as one tensor per run and recomputes
  GELU per run in backward (the GELU output is neither stored nor allocated
  whole); its backward writes the input gradient run by run and accumulates
  the weight gradients.
- :func:`split_linear_in_runs` writes the parts of a fused projection as
  separate tensors and assembles their gradients per run instead of in one
  stacked tensor.

The layers call them where their :class:`~.dispatch.Path` says
``cpu_training`` (CPU training in float32/float64) and :func:`runs_pay`
holds (large maps); elsewhere (GPUs with their
caching allocator, autocast, ``torch.compile``, tracing, inference, small
maps, fast paths off) the layers run as plain PyTorch.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import dispatch


@torch.jit.unused  # compiled code never trains in runs
def runs_pay(x: Tensor, width: int) -> bool:
    """Whether a layer mapping ``x`` ``(..., C)`` to ``width`` channels is
    large enough to train in runs: its widest tensor spans at least
    ``TRAIN_MIN_RUNS`` runs (smaller maps keep the plain layers)."""
    tokens = x.numel() // max(x.shape[-1], 1)
    return (tokens * width
            >= dispatch.TRAIN_MIN_RUNS * dispatch.TRAIN_RUN_ELEMENTS)


def _run_tokens(width: int) -> int:
    return max(dispatch.TRAIN_RUN_ELEMENTS // width,
               dispatch.TRAIN_MIN_TOKENS)


def _runs(n: int, width: int) -> List[slice]:
    step = _run_tokens(width)
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def _run_buffer(ref: Tensor, runs: List[slice], width: int) -> Tensor:
    """One buffer for the longest run (runs are ``_runs``: the first)."""
    return ref.new_empty(runs[0].stop - runs[0].start if runs else 0, width)


def linear_out(x: Tensor, weight_t: Tensor, bias: Optional[Tensor],
               out: Tensor) -> None:
    """``x @ weight_t (+ bias)`` written into ``out`` (no autograd)."""
    if bias is None:
        torch.mm(x, weight_t, out=out)
    else:
        torch.addmm(bias, x, weight_t, out=out)


class _MlpRuns(torch.autograd.Function):
    """``fc2(gelu(fc1(x)))`` on runs of tokens; saves ``x`` and ``fc1(x)``
    (one tensor per run)."""

    @staticmethod
    def forward(ctx, x: Tensor, w1: Tensor, b1: Optional[Tensor], w2: Tensor,
                b2: Optional[Tensor], approximate: str) -> Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        T, hidden = x2.shape[0], w1.shape[0]
        y = x2.new_empty(T, w2.shape[0])
        runs = _runs(T, hidden)
        # fc1(x), kept for backward one tensor per run: run-sized
        # allocations stay below the mmap ceiling (reused heap memory)
        pre = [x2.new_empty(r.stop - r.start, hidden) for r in runs]
        act = _run_buffer(x2, runs, hidden)
        w1t, w2t = w1.t(), w2.t()
        for r, h in zip(runs, pre):
            a = act[:r.stop - r.start]
            linear_out(x2[r], w1t, b1, h)
            torch.ops.aten.gelu.out(h, approximate=approximate, out=a)
            linear_out(a, w2t, b2, y[r])
        ctx.save_for_backward(x2, w1, w2, *pre)
        ctx.runs = runs
        ctx.approximate = approximate
        ctx.x_shape = x.shape
        ctx.has_bias = (b1 is not None, b2 is not None)
        return y.view(*x.shape[:-1], w2.shape[0])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        x2, w1, w2, *pre = ctx.saved_tensors
        need_x, need_w1, need_b1, need_w2, need_b2 = ctx.needs_input_grad[:5]
        gy = grad.reshape(-1, grad.shape[-1])
        hidden = w1.shape[0]
        dx = x2.new_empty(x2.shape) if need_x else None
        dw1 = torch.zeros_like(w1) if need_w1 else None
        dw2 = torch.zeros_like(w2) if need_w2 else None
        db1 = w1.new_zeros(hidden) if need_b1 and ctx.has_bias[0] else None
        db2 = w2.new_zeros(w2.shape[0]) \
            if need_b2 and ctx.has_bias[1] else None
        runs = ctx.runs
        act = _run_buffer(x2, runs, hidden) if dw2 is not None else None
        dh = _run_buffer(x2, runs, hidden)
        for r, h in zip(runs, pre):
            g = gy[r]
            if dw2 is not None:  # GELU recomputed, never stored whole
                a = act[:r.stop - r.start]
                torch.ops.aten.gelu.out(h, approximate=ctx.approximate,
                                        out=a)
                dw2.addmm_(g.t(), a)
            if db2 is not None:
                db2.add_(g.sum(0))
            d = dh[:r.stop - r.start]
            torch.mm(g, w2, out=d)
            torch.ops.aten.gelu_backward.grad_input(
                d, h, approximate=ctx.approximate, grad_input=d)
            if dw1 is not None:
                dw1.addmm_(d.t(), x2[r])
            if db1 is not None:
                db1.add_(d.sum(0))
            if dx is not None:
                torch.mm(d, w1, out=dx[r])
        if dx is not None:
            dx = dx.view(ctx.x_shape)
        return dx, dw1, db1, dw2, db2, None


def mlp_in_runs(x: Tensor, fc1: nn.Linear, fc2: nn.Linear,
                approximate: str = 'none') -> Tensor:
    """``fc2(gelu(fc1(x), approximate))`` with gradients, computed on runs
    of tokens (see the module docstring). Same results as the plain layers
    up to float rounding of the accumulations.

    Args:
        x: ``(..., C)``.
        fc1, fc2: the MLP's linear layers.
        approximate: GELU's ``approximate`` (``'none'`` or ``'tanh'``).

    Returns:
        ``(..., fc2.out_features)``.
    """
    return _MlpRuns.apply(x, fc1.weight, fc1.bias, fc2.weight, fc2.bias,
                          approximate)


class _SplitLinearRuns(torch.autograd.Function):
    """``linear(x).chunk(parts, -1)`` as separate contiguous tensors."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor],
                parts: int) -> Tuple[Tensor, ...]:
        x2 = x.reshape(-1, x.shape[-1])
        T, width = x2.shape[0], weight.shape[0]
        C = width // parts
        outs = [x2.new_empty(T, C) for _ in range(parts)]
        runs = _runs(T, width)
        buf = _run_buffer(x2, runs, width)
        wt = weight.t()
        for r in runs:
            b = buf[:r.stop - r.start]
            linear_out(x2[r], wt, bias, b)
            for i, o in enumerate(outs):
                o[r].copy_(b[:, i * C:(i + 1) * C])
        ctx.save_for_backward(x2, weight)
        ctx.set_materialize_grads(False)
        ctx.x_shape = x.shape
        ctx.has_bias = bias is not None
        return tuple(o.view(*x.shape[:-1], C) for o in outs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads: Optional[Tensor]):
        x2, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        T, width = x2.shape[0], weight.shape[0]
        parts = len(grads)
        C = width // parts
        if all(g is None for g in grads):
            return None, None, None, None
        gs = [None if g is None else g.reshape(T, C) for g in grads]
        dx = x2.new_empty(x2.shape) if need_x else None
        dw = torch.zeros_like(weight) if need_w else None
        db = weight.new_zeros(width) if need_b and ctx.has_bias else None
        runs = _runs(T, width)
        buf = _run_buffer(x2, runs, width)
        for r in runs:
            b = buf[:r.stop - r.start]
            for i, g in enumerate(gs):
                if g is None:
                    b[:, i * C:(i + 1) * C].zero_()
                else:
                    b[:, i * C:(i + 1) * C].copy_(g[r])
            if dx is not None:
                torch.mm(b, weight, out=dx[r])
            if dw is not None:
                dw.addmm_(b.t(), x2[r])
            if db is not None:
                db.add_(b.sum(0))
        if dx is not None:
            dx = dx.view(ctx.x_shape)
        return dx, dw, db, None


def split_linear_in_runs(x: Tensor, linear: nn.Linear,
                         parts: int) -> Sequence[Tensor]:
    """``linear(x)`` split into ``parts`` equal slices of its channels, each
    a separate contiguous tensor, with gradients; computed on runs of
    tokens (see the module docstring).

    Args:
        x: ``(..., C_in)``.
        linear: ``nn.Linear`` with ``out_features`` divisible by ``parts``.
        parts: number of slices.

    Returns:
        ``parts`` tensors ``(..., out_features // parts)``.
    """
    if linear.out_features % parts:
        raise ValueError(f'out_features {linear.out_features} is not '
                         f'divisible into {parts} parts')
    return _SplitLinearRuns.apply(x, linear.weight, linear.bias, parts)
