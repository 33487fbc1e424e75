"""The polarity attention op on fp16/bf16 q, k, v with float32 parameters
(what ``PolarityAttention`` passes it under autocast): its fast kernel
computes in float32 exactly what it computes on float32 copies, and keeps
the low-precision inputs for backward instead of float32 copies."""
import importlib
from unittest import mock

import pytest
import torch

import pola_mm.ops as ops
from pola_mm.models.layers import PolarityAttention
from pola_mm.ops import polarity_attention

#: the op's module
op_module = importlib.import_module('pola_mm.ops.polarity.op')

from helpers import randomise  # noqa: E402


def _inputs(dtype, seed=0, B=2, h=2, N=13, d=8):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, N, d, generator=g).to(dtype)
               for _ in range(3))
    scale, power = (torch.randn(1, h, 1, d, generator=g) for _ in range(2))
    bias = torch.randn(1, h, N, d, generator=g)
    return q, k, v, scale, power, bias


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_low_precision_inputs_equal_float32_copies(dtype):
    """The output (computed in float32, returned in the inputs' dtype) and
    every gradient equal those of the op on the float32 upcasts (cast to
    the inputs' dtype); the kernel ran, and the saved tensors hold the
    inputs' own storages and no float32 copy of them."""
    q, k, v, scale, power, bias = _inputs(dtype)
    lows = [t.clone().requires_grad_() for t in (q, k, v)]
    ups = [t.float().requires_grad_() for t in (q, k, v)]
    params = [[t.clone().requires_grad_() for t in (scale, power, bias)]
              for _ in range(2)]
    saved = []

    def pack(t):
        saved.append((t.untyped_storage()._cdata, t.dtype, t.shape))
        return t

    with mock.patch.object(op_module, 'polarity_attention_cpu',
                           wraps=op_module.polarity_attention_cpu) as k:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = polarity_attention(*lows, *params[0][:2], 4.0,
                                     k_bias=params[0][2])
        ref = polarity_attention(*ups, *params[1][:2], 4.0,
                                 k_bias=params[1][2])
    assert k.call_count == 2
    assert out.dtype == dtype and ref.dtype == torch.float32
    torch.testing.assert_close(out, ref.to(dtype), rtol=0, atol=0)
    keys = {s for s, _, _ in saved}
    assert {t.untyped_storage()._cdata for t in lows} <= keys
    # float32 tensors of q's shape: only the output
    assert sum(1 for _, dt, shape in saved
               if dt == torch.float32 and shape == q.shape) == 1
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    g = g.to(dtype).float()  # (the same cotangent for both)
    got = torch.autograd.grad(out, lows + params[0], g.to(dtype))
    want = torch.autograd.grad(ref, ups + params[1], g)
    for a, b, t in zip(got, want, lows + params[0]):
        assert a.dtype == t.dtype
        torch.testing.assert_close(a, b.to(t.dtype), rtol=0, atol=0)


def test_attention_under_autocast_fast_equals_plain():
    """PolarityAttention under CPU bf16 autocast: the kernel path (bf16 q,
    k, v into the kernel and the conv) and the plain path (float32 copies
    into the reference formula and the conv) give the same outputs and
    gradients up to bf16 rounding: each within 2% of the float32 result's
    scale, and of each other (the plain path projects channel-major,
    ``W x^T``, so its bf16 projections round differently; v's gradient is
    the sum of the kernel's and the conv's bf16 parts there, one rounding
    of their float32 sum here)."""
    torch.manual_seed(0)
    a = PolarityAttention(16, 2, (5, 6))
    randomise(a, std=0.3)
    x = torch.randn(2, 7 * 9, 16)
    results = []
    for mode in ('kernel', 'plain', 'float32'):
        a.zero_grad()
        xi = x.clone().requires_grad_()
        with torch.autocast('cpu', dtype=torch.bfloat16,
                            enabled=mode != 'float32'):
            if mode == 'plain':
                with ops.use_implementation('graph'):
                    y = a(xi, (7, 9))
            else:
                y = a(xi, (7, 9))
        assert y.dtype == (torch.float32 if mode == 'float32' else
                           torch.bfloat16)
        y.float().square().sum().backward()
        results.append([y.detach().float(), xi.grad] +
                       [p.grad.clone() for p in a.parameters()])
    kernel, plain, full = results
    assert full[0].abs().max() > 0
    for u, w, f in zip(kernel, plain, full):  # 2% of each tensor's scale
        assert (u - f).abs().max() <= 2e-2 * f.abs().max()
        assert (w - f).abs().max() <= 2e-2 * f.abs().max()
        assert (u - w).abs().max() <= 2e-2 * w.abs().max()
