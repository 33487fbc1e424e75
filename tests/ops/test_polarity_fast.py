"""The polarity attention op (:func:`pola_mm.ops.polarity_attention`): its
fast kernel and its plain PyTorch reference against the published formula
as the paper writes it."""
import importlib
from unittest import mock

import pytest
import torch

from pola_mm.ops import polarity_attention
from pola_mm.ops import polarity_attention_naive as reference
from pola_mm.ops import polarity_attention_pytorch
from pola_mm.ops.polarity import cpu as polarity_fast
from pola_mm.ops.polarity.cpu import PolarityAttentionFunction

#: the op's module
op_module = importlib.import_module('pola_mm.ops.polarity.op')

# slab sizes (elements) that make the CPU path work on: everything at once;
# a few whole sequences at a time; runs of tokens of one sequence
CHUNKS = {'whole': 1 << 30, 'sequences': 200, 'tokens': 24}


@pytest.fixture(params=sorted(CHUNKS))
def chunking(request, monkeypatch):
    monkeypatch.setattr(polarity_fast, 'RUN_ELEMENTS',
                        CHUNKS[request.param])
    return request.param


def fast(*args, **kwargs):
    """The op, which must run its fast kernel (fast paths on, no graph
    captured)."""
    with mock.patch.object(op_module, 'polarity_attention_cpu',
                           wraps=op_module.polarity_attention_cpu) as k:
        out = polarity_attention(*args, **kwargs)
    assert k.call_count == 1
    return out


def _inputs(B=2, h=3, N=11, d=6, dtype=torch.float64, seed=0,
            scale_heads=True):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, N, d, generator=g, dtype=dtype)
               for _ in range(3))
    scale = torch.randn(1, h if scale_heads else 1, 1, d, generator=g,
                        dtype=dtype)
    power = torch.randn(1, h, 1, d, generator=g, dtype=dtype)
    return q, k, v, scale, power


@pytest.mark.parametrize('shape', [(2, 3, 11, 6), (1, 1, 5, 2),
                                   (2, 2, 64, 32)])
def test_forward_matches_reference_float64(shape, chunking):
    B, h, N, d = shape
    q, k, v, scale, power = _inputs(B, h, N, d)
    out = fast(q, k, v, scale, power, 4.0)
    ref = reference(q, k, v, scale, power, 4.0)
    assert out.shape == (B, h, N, d) and out.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('n', [11, 4])  # n < N: spatially reduced keys
def test_pytorch_reference_is_the_textbook_formula(n):
    """polarity_attention_pytorch (one |t|^p, no concatenated features, the
    flows sharing the key products) equals the paper's form: values and
    every gradient, float64, with a key bias and fewer keys than queries."""
    q, k, v, scale, power = _inputs(2, 3, 11, 6)
    k, v = k[:, :, :n], v[:, :, :n]
    bias = torch.randn(1, 3, n, 6, dtype=torch.float64)
    k[0, 1, :2] = 0  # exact zeros, where |t|^p has its kink
    args = [t.requires_grad_(True) for t in (q, k, v, scale, power, bias)]
    out = polarity_attention_pytorch(*args[:5], 2.5, k_bias=args[5])
    ref = reference(q, k + bias, v, scale, power, 2.5)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, args, g),
                    torch.autograd.grad(ref, args, g)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_pytorch_reference_at_exact_zeros(dtype):
    """Exact zeros in q and k (where |t|^p, computed as exp(p log|t|), has
    its kink and log|t| its pole): values and every gradient finite and
    equal to the paper's form."""
    q, k, v, scale, power = (t.to(dtype) for t in _inputs(2, 3, 11, 6))
    q[0, 0, :3] = 0
    q[1, 2, :, 1] = 0
    k[0, 1, :2] = 0
    k[1, 0, 4:7, 3] = 0
    args = [t.requires_grad_(True) for t in (q, k, v, scale, power)]
    out = polarity_attention_pytorch(*args, 2.5)
    ref = reference(*args, 2.5)
    rtol = 1e-10 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(out, ref, rtol=rtol,
                               atol=rtol * float(ref.abs().max()))
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1),
                    dtype=dtype)
    for a, b in zip(torch.autograd.grad(out, args, g),
                    torch.autograd.grad(ref, args, g)):
        assert torch.isfinite(a).all()
        # (float32: relative to the gradient's scale, two formulas' rounding)
        torch.testing.assert_close(a, b, rtol=rtol,
                                   atol=rtol * float(b.abs().max()))


def test_forward_float32_close_to_float64_reference():
    q, k, v, scale, power = _inputs(2, 4, 300, 32)
    ref = reference(q, k, v, scale, power, 4.0)
    out = fast(q.float(), k.float(), v.float(),
                                    scale.float(), power.float(), 4.0)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)


def test_exact_zeros_and_shared_scale():
    """Exact zeros in q/k (where |t|^p has a kink) and a scale shared by
    all heads, as a (1, 1, 1, d) tensor."""
    q, k, v, scale, power = _inputs(2, 2, 9, 4, scale_heads=False)
    q[0, 0, :3] = 0
    k[1, 1, 2:5, 1] = 0
    out = fast(q, k, v, scale, power, 4.0)
    torch.testing.assert_close(out, reference(q, k, v, scale, power, 4.0))


@pytest.mark.parametrize('scale_heads', [True, False])
def test_gradcheck_float64(scale_heads, chunking):
    q, k, v, scale, power = _inputs(2, 2, 7, 4, scale_heads=scale_heads)
    for t in (q, k, v, scale, power):
        t.requires_grad_(True)

    def fn(q, k, v, scale, power):
        return fast(q, k, v, scale, power, 4.0)

    assert torch.autograd.gradcheck(fn, (q, k, v, scale, power))


def test_gradients_match_reference_autograd(chunking):
    q, k, v, scale, power = _inputs(2, 3, 40, 8)
    args = [t.requires_grad_(True) for t in (q, k, v, scale, power)]
    g = torch.randn(2, 3, 40, 8, dtype=torch.float64)
    out = fast(*args, 2.5)
    grads = torch.autograd.grad(out, args, g)
    ref_out = reference(*args, 2.5)
    ref_grads = torch.autograd.grad(ref_out, args, g)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_key_bias_equals_adding_it_to_the_keys(chunking):
    """k_bias (a positional table shared by the batch) is added inside the
    kernel: same values and gradients as adding it to k beforehand, and its
    gradient is the batch sum of the keys' gradient."""
    q, k, v, scale, power = _inputs(3, 2, 13, 6)
    bias = torch.randn(1, 2, 13, 6, dtype=torch.float64)
    args = [t.requires_grad_(True) for t in (q, k, v, scale, power, bias)]
    g = torch.randn(3, 2, 13, 6, dtype=torch.float64)
    out = fast(*args[:5], 4.0, k_bias=args[5])
    ref = reference(q, k + bias, v, scale, power, 4.0)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    grads = torch.autograd.grad(out, args, g)
    ref_grads = torch.autograd.grad(ref, args, g)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    with torch.no_grad():
        torch.testing.assert_close(
            fast(q, k, v, scale, power, 4.0,
                                      k_bias=bias), ref)

    q, k, v, scale, power = _inputs(2, 2, 5, 4)
    bias = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)

    def fn(k, scale, bias):
        return fast(q, k, v, scale, power, 4.0,
                                         k_bias=bias)

    assert torch.autograd.gradcheck(
        fn, (k.requires_grad_(True), scale.requires_grad_(True), bias))


def test_partial_requires_grad_and_no_grad_path():
    q, k, v, scale, power = _inputs(1, 2, 6, 4)
    v.requires_grad_(True)
    out = fast(q, k, v, scale, power, 4.0)
    (gv, ) = torch.autograd.grad(out.sum(), [v])
    ref = reference(q, k, v, scale, power, 4.0)
    (rv, ) = torch.autograd.grad(ref.sum(), [v])
    torch.testing.assert_close(gv, rv)
    with torch.no_grad():
        out = fast(q, k, v, scale, power, 4.0)
    assert out.grad_fn is None


def test_function_saves_only_inputs():
    """The autograd graph keeps q, k, v and the parameters, not the
    (B, h, N, 2d) feature maps."""
    q, k, v, scale, power = _inputs(1, 1, 50, 8)
    args = [t.requires_grad_(True) for t in (q, k, v, scale, power)]
    out = fast(*args, 4.0)
    assert isinstance(out.grad_fn.__self__ if hasattr(
        out.grad_fn, '__self__') else out.grad_fn, object)
    saved = out.grad_fn.saved_tensors
    assert all(t.numel() <= q.numel() for t in saved if t is not None)
    assert PolarityAttentionFunction.__name__ in type(out.grad_fn).__name__


def test_compiled_module_runs_the_reference_without_graph_breaks(
        monkeypatch):
    """Under torch.compile the attention traces its plain reference (the
    kernel, with its compiled CPU loops, is never entered), in one graph."""
    explain = pytest.importorskip('torch._dynamo').explain
    from pola_mm.models.layers import PolarityAttention
    attn = PolarityAttention(16, 2, (4, 5))
    x = torch.randn(2, 20, 16)

    def kernel(*args, **kwargs):
        raise AssertionError('the kernel ran while a graph was captured')

    monkeypatch.setattr(op_module, 'polarity_attention_cpu', kernel)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            result = explain(attn)(x, (4, 5))
        assert result.graph_break_count == 0, result.break_reasons


def test_resized_position_table_is_cached_only_without_grad():
    import copy

    from pola_mm.ops import resize_pos_table, use_implementation

    def resized(table, hw):
        return resize_pos_table(table, (7, 7), hw)

    t = torch.nn.Parameter(torch.randn(1, 49, 8))
    with torch.no_grad():
        a = resized(t, (9, 11))
        assert resized(t, (9, 11)) is a
        with use_implementation('graph'):
            assert resized(t, (9, 11)) is not a  # plain path
        t.add_(1)  # an in-place change (optimiser step, load) invalidates
        b = resized(t, (9, 11))
        assert b is not a
        assert resized(t, (10, 11)).shape == (1, 110, 8)
        # a copy (another device, a deepcopy) never sees the cache
        assert resized(copy.deepcopy(t), (9, 11)) is not b
    c = resized(t, (9, 11))
    assert c.requires_grad  # with grad: computed, differentiable
    torch.testing.assert_close(c, b)
    assert resized(t, (7, 7)) is t


def test_slab_plan(monkeypatch):
    monkeypatch.setattr(polarity_fast, 'RUN_ELEMENTS', 1000)
    plan = polarity_fast._plan
    slabs, step = plan(torch.empty(10, 2, 5, 4))  # 40 per sequence
    assert step == 5 and len(slabs) == 1 and slabs[0] == slice(0, 10)
    slabs, step = plan(torch.empty(100, 2, 5, 4))
    assert step == 5 and [s.stop - s.start for s in slabs] == [25] * 4
    slabs, step = plan(torch.empty(2, 2, 500, 4))  # 4000 per sequence
    assert len(slabs) == 2 and step == 125
