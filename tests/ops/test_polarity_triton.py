"""The polarity attention's Triton kernels (:mod:`pola_mm.ops.polarity.triton`)
against the paper's formula (:func:`pola_mm.ops.polarity_attention_naive`):
forward and every gradient, in float32 and in half precision.

Without a GPU the kernels run under Triton's interpreter on CPU tensors
(``TRITON_INTERPRET=1``, set by ``tests/conftest.py`` before pola_mm is
imported); with one, on CUDA. Small blocks of 16 tokens make ``N`` and
``n`` not multiples of the block, and 3 chunks per image and head make the
split sums run."""
import pytest
import torch

from pola_mm.ops import dispatch, polarity_attention, polarity_attention_naive
from pola_mm.ops.polarity import triton as kernels
from pola_mm.ops.polarity.cpu import polarity_attention_cpu

pytestmark = [
    pytest.mark.kernels,
    pytest.mark.skipif(not kernels.HAVE_TRITON,
                       reason='Triton is not installed')]

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
ALPHA = 4.0


def test_kernels_are_interpreted_without_a_gpu():
    """The conftest's switch reached the kernels (else they would need a
    GPU and every test below would fail for that reason)."""
    if DEVICE == 'cpu':
        from triton.runtime.interpreter import InterpretedFunction
        assert isinstance(kernels._key_pass, InterpretedFunction)


def _inputs(B, h, N, n, d, bias, dtype=torch.float32, seed=0):
    """q, k, v as views of one packed projection (B, L, 3, h, d) permuted
    to heads, as the models give them; parameters with a wide spread."""
    g = torch.Generator().manual_seed(seed)
    L = max(N, n)
    packed = torch.randn(B, L, 3, h, d, generator=g).to(dtype)
    q = packed[:, :N, 0].transpose(1, 2)
    k = packed[:, :n, 1].transpose(1, 2)
    v = packed[:, :n, 2].transpose(1, 2)
    scale = torch.randn(1, h, 1, d, generator=g) * 0.5
    power = torch.randn(1, h, 1, d, generator=g)
    kb = torch.randn(1, h, n, d, generator=g) * 0.3 if bias else None
    return q, k, v, scale, power, kb


def _naive_grads(q, k, v, scale, power, kb, dx):
    """Output and gradients of the paper's formula in float64 (the key
    bias added to the keys)."""
    leaves = [t.detach().double().requires_grad_()
              for t in (q, k, v, scale, power)]
    bias = None if kb is None else kb.double().requires_grad_()
    kk = leaves[1] if bias is None else leaves[1] + bias
    out = polarity_attention_naive(leaves[0], kk, leaves[2], leaves[3],
                                   leaves[4], ALPHA)
    wrt = leaves + ([bias] if bias is not None else [])
    return out, torch.autograd.grad(out, wrt, dx.double())


def _kernel_grads(q, k, v, scale, power, kb, dx, **kw):
    """Output and gradients of the kernels' autograd function."""
    leaves = [t.detach().to(DEVICE).requires_grad_()
              for t in (q, k, v, scale, power)]
    bias = None if kb is None else kb.to(DEVICE).requires_grad_()
    with _blocks(**kw):
        out = kernels.polarity_attention_triton(*leaves, ALPHA, k_bias=bias)
    wrt = leaves + ([bias] if bias is not None else [])
    grads = torch.autograd.grad(out, wrt, dx.to(DEVICE, out.dtype))
    return out.cpu(), [g.cpu() for g in grads]


class _blocks:
    """Small tiles and a forced chunk count for the kernels in a block of
    code (the wrappers' defaults are sized for a GPU)."""

    def __init__(self, block_n=16, chunks=None):
        self.kw = dict(block_n=block_n, chunks=chunks)

    def __enter__(self):
        self.saved = kernels.polarity_forward, kernels.polarity_backward
        fwd, bwd = self.saved
        kernels.polarity_forward = lambda *a, **k: fwd(*a, **{**k, **self.kw})
        kernels.polarity_backward = lambda *a, **k: bwd(*a,
                                                        **{**k, **self.kw})

    def __exit__(self, *exc):
        kernels.polarity_forward, kernels.polarity_backward = self.saved


def _rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a.double() - b.double()).abs().max() /
                 b.double().abs().max())


@pytest.mark.parametrize('d', [16, 32, 64])
@pytest.mark.parametrize('B,h', [(1, 1), (2, 3)], ids=['bh1', 'bh6'])
@pytest.mark.parametrize('N,n,bias', [(37, 37, False), (37, 37, True),
                                      (40, 23, True), (23, 45, False)],
                         ids=['self', 'self-bias', 'reduced-bias', 'longer'])
def test_float32_equals_formula(d, B, h, N, n, bias):
    q, k, v, scale, power, kb = _inputs(B, h, N, n, d, bias)
    dx = torch.randn(B, h, N, d, generator=torch.Generator().manual_seed(9))
    want, grads = _naive_grads(q, k, v, scale, power, kb, dx)
    got, kgrads = _kernel_grads(q, k, v, scale, power, kb, dx, chunks=3)
    assert got.dtype == torch.float32
    assert _rel(got, want) < 1e-5
    names = ['q', 'k', 'v', 'scale', 'power', 'k_bias']
    for name, a, b in zip(names, kgrads, grads):
        assert a.shape == b.shape, name
        assert _rel(a, b) < 1e-5, (name, _rel(a, b))


def test_one_chunk_and_default_chunks_agree():
    """The split of the sums over tokens changes nothing but rounding."""
    q, k, v, scale, power, kb = _inputs(2, 2, 70, 70, 32, True)
    dx = torch.randn(2, 2, 70, 32)
    one, g1 = _kernel_grads(q, k, v, scale, power, kb, dx, chunks=1)
    many, g2 = _kernel_grads(q, k, v, scale, power, kb, dx, chunks=None)
    assert _rel(many, one) < 1e-6
    for a, b in zip(g2, g1):
        assert _rel(a, b) < 1e-5


def test_exact_zeros_have_finite_zero_gradients():
    """``t = 0`` (padding, ReLU'd inputs): both features are 0 and so are
    their gradients, as in the formula (no 0/0)."""
    q, k, v, scale, power, kb = _inputs(1, 2, 33, 33, 16, False)
    q = q.clone()
    k = k.clone()
    q[..., :5, :] = 0
    k[..., 3:9, 2:7] = 0
    dx = torch.randn(1, 2, 33, 16)
    want, grads = _naive_grads(q, k, v, scale, power, kb, dx)
    got, kgrads = _kernel_grads(q, k, v, scale, power, kb, dx)
    assert _rel(got, want) < 1e-5
    for a, b in zip(kgrads, grads):
        assert torch.isfinite(a).all()
        assert _rel(a, b) < 1e-5
    assert (kgrads[0][..., :5, :] == 0).all()


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision_no_further_than_todays_path(dtype):
    """fp16/bf16 inputs (autocast): the kernels compute in float32
    registers and store in the inputs' dtype; against the float64 formula
    they are as close as the CPU path, which computes on float32 copies and
    rounds the same results to the inputs' dtype. (Under the interpreter,
    Triton's bf16 cast does not round to nearest as a GPU's does: there it
    may add one unit of bf16's resolution.)"""
    q, k, v, scale, power, _ = _inputs(2, 3, 70, 70, 32, False, dtype=dtype)
    dx = torch.randn(2, 3, 70, 32).to(dtype)
    want, grads = _naive_grads(q, k, v, scale, power, None, dx)

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    today = polarity_attention_cpu(*leaves, scale, power, ALPHA).to(dtype)
    tgrads = torch.autograd.grad(today, leaves, dx)
    got, kgrads = _kernel_grads(q, k, v, scale, power, None, dx)
    assert got.dtype == dtype and all(g.dtype == dtype for g in kgrads[:3])

    slack = 0.0
    if DEVICE == 'cpu' and dtype == torch.bfloat16:
        slack = torch.finfo(dtype).eps
    for a, t, w in zip([got] + kgrads[:3], [today] + list(tgrads),
                       [want] + list(grads[:3])):
        assert _rel(a, w) <= 1.25 * _rel(t, w) + slack, (_rel(a, w),
                                                          _rel(t, w))


@pytest.mark.parametrize('d', [8, 12, 24, 48, 96, 128])
def test_kernels_refuse_widths_they_do_not_take(d):
    """Widths without a resource-checked launch configuration (d = 128
    included) take the torch path."""
    q = torch.empty(1, 1, 4, d)
    assert not kernels.fits(q, q, q)


def test_kernels_take_the_checked_widths():
    for d in (16, 32, 64):
        q = torch.empty(1, 1, 4, d)
        assert kernels.fits(q, q, q)
    assert not kernels.fits(*(torch.empty(1, 1, 4, 32,
                                          dtype=torch.float64), ) * 3)


class TestOneRule:
    """:func:`~pola_mm.ops.dispatch.implementation` picks the form of
    every attention op."""

    def test_cpu_tensors_take_the_cpu_path(self):
        assert dispatch.implementation(torch.empty(1), True) == 'cpu'

    def test_meta_and_fake_cuda_take_the_kernels(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        assert dispatch.implementation(torch.empty(1, device='meta'),
                                       True) == 'triton'
        with FakeTensorMode(allow_non_fake_inputs=True):
            x = torch.empty(1, device='cuda')
            assert dispatch.implementation(x, True) == 'triton'
        # ... not where the kernels do not take the shapes
        assert dispatch.implementation(torch.empty(1, device='meta'),
                                       False) == 'cpu'

    def test_switches(self):
        x = torch.empty(1, device='meta')
        dispatch.set_implementation('cpu')
        try:
            assert dispatch.implementation(x, True) == 'cpu'
        finally:
            dispatch.set_implementation('auto')
        with dispatch.use_implementation('graph'):
            assert dispatch.implementation(x, True) == 'graph'
        assert dispatch.implementation(torch.empty(1), True,
                                       cpu_fits=False) == 'graph'


def test_op_on_meta_runs_the_kernel_ops(monkeypatch):
    """On ``meta`` the op calls the kernels' custom ops (their fake
    implementations give the shapes) and gradients flow back."""
    seen = []
    real = kernels.polarity_attention_triton

    def spy(*a, **k):
        seen.append(1)
        return real(*a, **k)

    import pola_mm.ops.polarity.op as op_module
    monkeypatch.setattr(op_module.kernels, 'polarity_attention_triton', spy)
    q, k, v, scale, power, kb = (t.to('meta') for t in _inputs(
        2, 3, 50, 20, 32, True))
    q.requires_grad_()
    scale.requires_grad_()
    out = polarity_attention(q, k, v, scale, power, ALPHA, k_bias=kb)
    assert seen and out.shape == (2, 3, 50, 32) and out.device.type == 'meta'
    out.sum().backward()
    assert q.grad.shape == q.shape and scale.grad.shape == scale.shape
