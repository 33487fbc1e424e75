"""The fused Triton kernels of the PaCS attention
(:mod:`pola_mm.ops.pacs.triton`) against the plain formula
(:func:`~pola_mm.ops.pacs_attention_pytorch`) in float64:
the output and every gradient (``q``, ``k``, ``v``, the raw temperatures
``s1``, ``s2``), through a small autograd function that wraps
``pacs_forward`` / ``pacs_backward``.

Without a GPU the kernels run in Triton's CPU interpreter
(``TRITON_INTERPRET=1``, set by ``tests/conftest.py`` before pola_mm and
triton are imported: triton reads it when a ``@triton.jit`` decorator
runs).
"""
import subprocess
import sys
import textwrap
from typing import Optional, Tuple

import pytest
import torch
from helpers import subprocess_env
from torch import Tensor

import pola_mm.ops.pacs.triton as pacs_triton
from pola_mm.ops import pacs_attention, pacs_attention_pytorch
from pola_mm.ops.rotary import rotary_tables

pytestmark = pytest.mark.kernels

DEVICE = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
needs_triton = pytest.mark.skipif(not pacs_triton.HAVE_TRITON,
                                  reason='triton is not installed')

#: float32 kernels vs float64: max error / max |reference|.
FP32_TOL = 1e-5


class KernelAttention(torch.autograd.Function):
    """``pacs_forward`` / ``pacs_backward`` as a function of the
    temperatures ``t1``, ``t2``, ``tk`` and the key bias (the raw
    parameters go through :func:`~pola_mm.ops.pacs.triton.temperatures`
    under autograd, outside)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, t1: Tensor,
                t2: Tensor, tk: Optional[Tensor], k_bias: Optional[Tensor],
                hw: Optional[Tuple[int, int]], block_n: Optional[int],
                chunks: Optional[int]) -> Tensor:
        x, M, k_mean, rz = pacs_triton.pacs_forward(
            q, k, v, t1, t2, hw, tk=tk, k_bias=k_bias, block_n=block_n,
            chunks=chunks)
        ctx.save_for_backward(q, k, v, t1, t2, tk, k_bias, x, M, k_mean, rz)
        ctx.options = dict(block_n=block_n, chunks=chunks)
        ctx.hw = hw
        return x

    @staticmethod
    def backward(ctx, dx: Tensor):
        q, k, v, t1, t2, tk, k_bias, x, M, k_mean, rz = ctx.saved_tensors
        dq, dk, dv, dt1, dt2, dtk = pacs_triton.pacs_backward(
            dx, q, k, v, t1, t2, ctx.hw, x, M, k_mean, rz, tk=tk,
            k_bias=k_bias, need_v=ctx.needs_input_grad[2], **ctx.options)
        h = dt1.shape[0]

        def to(g: Optional[Tensor], t: Optional[Tensor]):
            if t is None:
                return None
            return g.view(1, h, 1, -1).sum_to_size(t.shape)

        dbias = None if k_bias is None else dk.sum_to_size(k_bias.shape)
        return (dq, dk, dv, to(dt1, t1), to(dt2, t2), to(dtk, tk), dbias,
                None, None, None)


def _views(B: int, h: int, N: int, n: int, d: int, dtype: torch.dtype,
           g: torch.Generator) -> Tuple[Tensor, Tensor, Tensor]:
    """``q`` ``(B, h, N, d)``, ``k``, ``v`` ``(B, h, n, d)`` as
    non-contiguous views of packed projections ``(B, N, 3, h, d)`` (or
    ``(B, N, h, d)`` and ``(B, n, 2, h, d)`` when ``n != N``)."""
    def rand(*shape):
        return torch.randn(*shape, generator=g).to(DEVICE, dtype)

    if n == N:
        qkv = rand(B, N, 3, h, d)
        return tuple(qkv[:, :, i].permute(0, 2, 1, 3) for i in range(3))
    kv = rand(B, n, 2, h, d)
    return (rand(B, N, h, d).transpose(1, 2), kv[:, :, 0].transpose(1, 2),
            kv[:, :, 1].transpose(1, 2))


def _map(kind: str, N: int) -> Optional[Tuple[int, int]]:
    """The rotary map of a case: ``(N / 10, 10)`` or ``(N / 7, 7)`` when
    ``kind`` names ``rotary``, else None."""
    if 'rotary' not in kind:
        return None
    W = 10 if N % 10 == 0 else 7
    return N // W, W


def _temperature(shape: str, h: int, d: int, g: torch.Generator) -> Tensor:
    """Raw float32 temperatures of one of the shapes broadcastable to
    ``(1, h, 1, 2d)``."""
    size = {'full': (1, h, 1, 2 * d), 'heads': (h, 1, 2 * d),
            'channels': (2 * d, )}[shape]
    return torch.randn(*size, generator=g).to(DEVICE)


def _run(fn, inputs, hw, dx, **kw) -> Tuple[Tensor, ...]:
    """Output and gradients of every input (``q``, ``k``, ``v``, ``s1``,
    ``s2`` and, when scaled, ``scale``, ``k_bias``) of one attention
    ``fn(q, k, v, s1, s2, hw=, scale=, k_bias=)`` (leaves made from
    ``inputs``)."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    extra = dict(zip(('scale', 'k_bias'), leaves[5:]))
    out = fn(*leaves[:5], hw=hw, **extra, **kw)
    out.backward(dx)
    return (out.detach(), ) + tuple(t.grad for t in leaves)


def _formula(q, k, v, s1, s2, hw=None, scale=None, k_bias=None):
    """The plain formula on ``q / softplus(scale)``, ``(k + k_bias) /
    softplus(scale)`` with the rotary tables of ``hw``."""
    tables = (None, None)
    if hw is not None:
        tables = rotary_tables(hw, 2 * q.shape[-1], dtype=q.dtype)
    if k_bias is not None:
        k = k + k_bias
    if scale is not None:
        s = torch.nn.functional.softplus(scale)
        q, k = q / s, k / s
    return pacs_attention_pytorch(q, k, v, s1, s2, *tables)


def _reference(inputs, hw, dx) -> Tuple[Tensor, ...]:
    """The plain formula in float64 on the same values."""
    return _run(_formula, [t.double() for t in inputs], hw, dx.double())


def _kernels(inputs, hw, dx, block_n, chunks) -> Tuple[Tensor, ...]:
    def fn(q, k, v, s1, s2, hw=None, scale=None, k_bias=None):
        t1, t2, tk = pacs_triton.temperatures(s1, s2, scale, q.shape[1],
                                              q.shape[3])
        return KernelAttention.apply(q, k, v, t1, t2, tk, k_bias, hw,
                                     block_n, chunks)

    return _run(fn, inputs, hw, dx)


def _errors(got, ref) -> dict:
    """Max error / max |reference| per tensor."""
    names = ('x', 'dq', 'dk', 'dv', 'ds1', 'ds2', 'dscale', 'dk_bias')
    return {name: ((a.double() - b).abs().max() / b.abs().max()).item()
            for name, a, b in zip(names, got, ref)}


def _case(B, h, N, n, d, kind, temps, dtype, seed=0):
    """Inputs of one case: ``(q, k, v, s1, s2)`` (plus ``scale`` ``(1, h,
    1, d)`` and a key bias ``(1, h, n, d)``, as PolarityAttention's
    positional table, when ``kind`` names ``scaled``), the rotary map
    (:func:`_map`) and ``dx`` (a non-contiguous view)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = _views(B, h, N, n, d, dtype, g)
    s1, s2 = (_temperature(temps, h, d, g) for _ in range(2))
    inputs = (q, k, v, s1, s2)
    if 'scaled' in kind:
        # softplus(scale) in about (0.4, 1.2): q / s keeps exp() in float32
        scale = (0.3 * torch.randn(1, h, 1, d, generator=g)).to(DEVICE)
        bias = torch.randn(1, n, h, d, generator=g).to(DEVICE)
        inputs += (scale, bias.transpose(1, 2))
    dx = torch.randn(B, N, h, d, generator=g).to(DEVICE, dtype)
    return inputs, _map(kind, N), dx.transpose(1, 2)


# (B, h, N, n, d, kind, temperatures, block_n, chunks)
FP32_CASES = [
    pytest.param(1, 1, 37, 37, 16, 'none', 'full', 16, 1,
                 id='d16-bh1-N37-block16-chunks1'),
    pytest.param(2, 3, 70, 70, 16, 'rotary', 'full', 32, 3,
                 id='d16-bh6-N70-rotary-block32-chunks3'),
    pytest.param(1, 1, 37, 37, 16, 'scaled', 'channels', 32, 3,
                 id='d16-bh1-N37-scaled-block32-chunks3(2)'),
    pytest.param(2, 3, 40, 23, 16, 'none', 'heads', 16, 3,
                 id='d16-bh6-N40-n23-block16-chunks3'),
    pytest.param(2, 3, 40, 23, 32, 'scaled', 'full', 16, 3,
                 id='d32-bh6-N40-n23-scaled-block16-chunks3'),
    pytest.param(1, 1, 37, 37, 32, 'scaled', 'full', 16, 3,
                 id='d32-bh1-N37-scaled-block16-chunks3'),
    pytest.param(1, 2, 70, 70, 32, 'rotary', 'heads', None, None,
                 id='d32-bh2-N70-rotary-defaults'),
    pytest.param(1, 1, 70, 70, 64, 'rotary+scaled', 'full', 16, 1,
                 id='d64-bh1-N70-rotary-scaled-block16-chunks1'),
    pytest.param(2, 3, 40, 23, 64, 'none', 'full', 32, 1,
                 id='d64-bh6-N40-n23-block32-chunks1'),
    pytest.param(2, 3, 37, 37, 64, 'scaled', 'channels', 16, 3,
                 id='d64-bh6-N37-scaled-block16-chunks3'),
]


@needs_triton
@pytest.mark.parametrize('B,h,N,n,d,kind,temps,block_n,chunks',
                         FP32_CASES)
def test_float32_matches_float64_formula(B, h, N, n, d, kind, temps,
                                         block_n, chunks):
    inputs, hw, dx = _case(B, h, N, n, d, kind, temps, torch.float32)
    assert pacs_triton.fits(*inputs[:3], hw, *inputs[6:])
    got = _kernels(inputs, hw, dx, block_n, chunks)
    ref = _reference(inputs, hw, dx)
    for a, b in zip(got, ref):
        assert a.shape == b.shape
    assert got[0].dtype == torch.float32
    errors = _errors(got, ref)
    assert max(errors.values()) < FP32_TOL, errors


@needs_triton
@pytest.mark.parametrize('kind', ['none', 'rotary+scaled'])
def test_backward_without_dv(kind):
    """``need_v=False``: no ``dv``, the other gradients unchanged."""
    inputs, hw, dx = _case(1, 2, 40, 40, 32, kind, 'full', torch.float32,
                           seed=1)
    q, k, v, s1, s2 = inputs[:5]
    scale, k_bias = inputs[5:] or (None, None)
    t1, t2, tk = pacs_triton.temperatures(s1, s2, scale, 2, 32)
    kw = dict(tk=tk, k_bias=k_bias, block_n=16)
    fwd = pacs_triton.pacs_forward(q, k, v, t1, t2, hw, **kw)
    args = (dx, q, k, v, t1, t2, hw) + fwd
    full = pacs_triton.pacs_backward(*args, chunks=2, **kw)
    lean = pacs_triton.pacs_backward(*args, need_v=False, chunks=2, **kw)
    assert lean[2] is None and full[2] is not None
    assert (full[5] is None) == (kind == 'none')
    for a, b in zip(full[:2] + full[3:], lean[:2] + lean[3:]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@needs_triton
def test_forward_outputs():
    """``M``, ``k_mean``, ``1 / (z + eps)`` of the forward: shapes, float32,
    and ``M = R(k')^T v / N``, ``k_mean = mean(k')`` with ``n != N``."""
    inputs, _, _ = _case(2, 3, 40, 23, 16, 'none', 'full', torch.float32)
    q, k, v, s1, s2 = inputs
    x, M, k_mean, rz = pacs_triton.pacs_forward(
        q, k, v, torch.sigmoid(s1), torch.sigmoid(s2), block_n=16, chunks=3)
    kf = torch.cat([k.clamp(min=0), (-k).clamp(min=0)], -1).exp() - 1
    torch.testing.assert_close(M, kf.transpose(-2, -1) @ v / 40)
    torch.testing.assert_close(k_mean, kf.mean(-2))
    assert x.shape == (2, 3, 40, 16) and rz.shape == (2, 3, 40, 2)
    assert {t.dtype for t in (M, k_mean, rz)} == {torch.float32}


#: Half-precision cases: (B, h, N, n, d, kind).
HALF_CASES = [
    pytest.param(1, 2, 70, 70, 32, 'rotary', id='d32-bh2-N70-rotary'),
    pytest.param(2, 1, 40, 23, 16, 'scaled', id='d16-bh2-N40-n23-scaled'),
]


def half_errors(B, h, N, n, d, kind, dtype):
    """Errors (max error / max |reference|, per tensor) of the kernels and
    of today's path (:func:`pacs_attention`: float32 computation, output
    and input gradients rounded to ``dtype``) against the float64 formula,
    on ``q``, ``k``, ``v``, ``dx`` given in ``dtype``, the temperatures
    scale and key bias in float32."""
    inputs, hw, dx = _case(B, h, N, n, d, kind, 'full', dtype)
    ref = _reference(inputs, hw, dx)
    got = _kernels(inputs, hw, dx, 32, 3)
    assert [t.dtype for t in got[:4]] == [dtype] * 4
    today = _run(pacs_attention, inputs, hw, dx)
    return _errors(got, ref), _errors(today, ref)


@needs_triton
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16],
                         ids=['fp16', 'bf16'])
@pytest.mark.parametrize('B,h,N,n,d,kind', HALF_CASES)
def test_half_precision_as_close_as_todays_path(B, h, N, n, d, kind,
                                                dtype):
    """No further from the float64 formula than today's path: within twice
    its error plus a small slack (relative to the largest reference value):
    a quarter of the dtype's resolution on ``x``, ``dq``, ``dk``, ``dv``
    (in ``dtype``) and on the key bias's gradient (the sum of ``dk`` in
    ``dtype`` over the batch, so measured against today's ``dk``),
    a tenth of the float32 tolerance on ``ds1``, ``ds2``, ``dscale``
    (float32 in both: a rounded ``x`` in the backward would show here)."""
    kernel, today = half_errors(B, h, N, n, d, kind, dtype)
    for name in kernel:
        slack = (FP32_TOL / 10 if name.startswith('ds')
                 else torch.finfo(dtype).eps / 4)
        bar = today['dk' if name == 'dk_bias' else name]
        assert kernel[name] <= 2 * bar + slack, (name, kernel,
                                                         today)


@needs_triton
@pytest.mark.parametrize('d', [16, 32, 64])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16,
                                   torch.bfloat16])
def test_supported_widths(d, dtype):
    q = torch.zeros(1, 2, 6, d, dtype=dtype, device=DEVICE)
    assert pacs_triton.fits(q, q, q)
    assert pacs_triton.fits(q, q, q, (2, 3), q[:1])


@pytest.mark.parametrize('d', [8, 12, 24, 48, 96, 128, 256])
def test_unsupported_widths(d):
    q = torch.zeros(1, 2, 6, d, device=DEVICE)
    assert not pacs_triton.fits(q, q, q)


def test_unsupported_inputs():
    q = torch.zeros(1, 2, 6, 16, device=DEVICE)
    k = torch.zeros(1, 2, 5, 16, device=DEVICE)
    assert not pacs_triton.fits(q.double(), q.double(), q.double())
    assert not pacs_triton.fits(q[0], q[0], q[0])  # 3-D
    assert not pacs_triton.fits(q, k, k, (2, 3))  # rotary map, n != N
    assert not pacs_triton.fits(q, q, q, (2, 2))  # map of 4 tokens, N = 6
    assert not pacs_triton.fits(q, q, q, None, q[..., :8])  # bias vs k
    assert not pacs_triton.fits(q[:, :, :0], q, q)  # no queries
    assert not pacs_triton.fits(q, k[:, :1], k)  # k, v mismatch


@needs_triton
def test_wrappers_refuse_what_is_not_supported():
    q = torch.zeros(1, 1, 6, 24, device=DEVICE)
    t = torch.full((1, 1, 1, 48), 0.5, device=DEVICE)
    with pytest.raises(ValueError, match='not supported'):
        pacs_triton.pacs_forward(q, q, q, t, t)
    q = torch.zeros(1, 1, 6, 16, device=DEVICE)
    with pytest.raises(ValueError, match='block_n'):
        pacs_triton.pacs_forward(q, q, q, t[..., :32], t[..., :32],
                                 block_n=24)


def test_imports_and_runs_without_triton():
    """Where triton is missing pola_mm imports, the kernel modules say so
    (``HAVE_TRITON`` False) and the attention ops run their torch paths."""
    code = textwrap.dedent("""
        import sys
        sys.modules['triton'] = None  # import triton raises ImportError
        sys.modules['triton.language'] = None
        import torch
        from pola_mm.ops import pacs_attention, polarity_attention
        from pola_mm.ops.pacs import triton as pacs_kernels
        from pola_mm.ops.polarity import triton as polarity_kernels
        assert not pacs_kernels.HAVE_TRITON
        assert not polarity_kernels.HAVE_TRITON
        q = torch.randn(1, 2, 6, 16)
        t = torch.zeros(1, 2, 1, 32)
        p = torch.zeros(1, 2, 1, 16)
        assert pacs_attention(q, q, q, t, t).shape == q.shape
        assert polarity_attention(q, q, q, p, p, 3.0).shape == q.shape
        print('ok')
    """)
    out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, env=subprocess_env(), timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == 'ok', out.stderr


def test_rotary_factors_cached_for_real_maps():
    """The kernels' rotary factors are built once per map, width and
    device (every layer of a stage and its backward read them), equal to
    a fresh build; a tracing mode's tensors are not kept."""
    from pola_mm.ops.rotary import rotary_factors
    q = torch.zeros(1, 2, 70, 32, device=DEVICE)
    first, w = pacs_triton._rotary((7, 10), q)
    again, _ = pacs_triton._rotary((7, 10), q)
    assert w == 10 and first is again
    assert torch.equal(first, rotary_factors((7, 10), 64, device=DEVICE))
    meta, _ = pacs_triton._rotary((7, 10), q.to('meta'))
    assert meta.device.type == 'meta'
    assert pacs_triton._rotary((7, 10), q.to('meta'))[0] is not meta
