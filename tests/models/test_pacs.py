"""PaCS attention (PolaFormer++): the op's kernel against its plain
formula, the formula against a hand-written float64 one, mixed precision,
and ``PolarityAttention(feature_map=...)``."""
import importlib
from unittest import mock

import helpers
import pytest
import torch
import torch.nn.functional as F

from pola_mm.models.backbones import PolaPVT, PolaSwinTransformer
from pola_mm.models.layers import PaCSAttention, PolarityAttention
from pola_mm.ops import (pacs_attention, pacs_attention_pytorch, rotary_tables,
                         use_implementation)

D64 = torch.float64
#: the op's module (``pola_mm.ops.pacs_attention`` is also the op)
op_module = importlib.import_module('pola_mm.ops.pacs.op')
#: the torch implementations' module (the op calls them through it)
cpu_module = importlib.import_module('pola_mm.ops.pacs.cpu')


def fast(*args, **kwargs):
    """The PaCS op, which must run its fast kernel (fast paths on, as many keys
    as queries)."""
    with mock.patch.object(cpu_module, 'pacs_attention_cpu',
                           wraps=cpu_module.pacs_attention_cpu) as k:
        out = pacs_attention(*args, **kwargs)
    assert k.call_count == 1
    return out


def spelled_out(q, k, v, s1, s2, sin=None, cos=None, eps=1e-6):
    """PaCS attention token by token, as the reference README words it
    (loops over heads, explicit rotation of channel pairs)."""
    B, h, N, d = q.shape
    out = torch.empty_like(q)

    def rot(x):  # each pair (x0, x1) -> (x0 c - x1 s, x1 c + x0 s)
        if sin is None:
            return x
        y = x.clone()
        c, s = cos[:, 0::2], sin[:, 0::2]  # equal on both of a pair
        y[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
        y[..., 1::2] = x[..., 1::2] * c + x[..., 0::2] * s
        return y

    for b in range(B):
        for i in range(h):
            qi, ki, vi = q[b, i], k[b, i], v[b, i]
            t1 = torch.sigmoid(s1[0, i, 0])
            t2 = torch.sigmoid(s2[0, i, 0])
            pos, neg = qi.clamp(min=0), (-qi).clamp(min=0)
            q_sim = torch.exp(torch.cat([pos, neg], -1) * t1) - 1
            q_opp = torch.exp(torch.cat([neg, pos], -1) * t2) - 1
            kf = torch.exp(torch.cat([ki.clamp(min=0), (-ki).clamp(min=0)],
                                     -1)) - 1
            k_mean = kf.mean(0)
            kr = rot(kf)
            v1, v2 = vi[:, :d // 2], vi[:, d // 2:]
            x_sim = (rot(q_sim) @ (kr.T @ v1) / N) / (
                (q_sim @ k_mean)[:, None] + eps)
            x_opp = (rot(q_opp) @ (kr.T @ v2) / N) / (
                (q_opp @ k_mean)[:, None] + eps)
            out[b, i] = torch.cat([x_sim, x_opp], -1)
    return out


def inputs(B=2, h=2, N=12, d=4, dtype=D64, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return (torch.randn(*shape, generator=g, dtype=dtype) *
                scale).requires_grad_()

    q, k, v = r(B, h, N, d), r(B, h, N, d), r(B, h, N, d)
    s1, s2 = r(1, h, 1, 2 * d), r(1, h, 1, 2 * d)
    return q, k, v, s1, s2


@pytest.mark.parametrize('rope', [False, True])
def test_formula_matches_spelled_out_float64(rope):
    q, k, v, s1, s2 = inputs()
    sin, cos = rotary_tables((3, 4), 8, dtype=D64) if rope else (None, None)
    got = pacs_attention_pytorch(q, k, v, s1, s2, sin, cos)
    want = spelled_out(q, k, v, s1, s2, sin, cos)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('rope', [False, True, 'arbitrary'])
def test_kernel_matches_formula_values_and_gradients(rope):
    """The op without rotary and with the rotary map (the kernel's complex
    product per channel pair); the CPU kernel itself with tables whose
    pairs differ (its plain fallback)."""
    q, k, v, s1, s2 = inputs(N=20, d=6)
    sin, cos = rotary_tables((4, 5), 12, dtype=D64) if rope else (None, None)
    if rope == 'arbitrary':
        g = torch.Generator().manual_seed(7)
        sin, cos = (torch.randn(20, 12, generator=g, dtype=D64)
                    for _ in range(2))
    if rope:
        from pola_mm.ops.pacs.cpu import _phasor
        assert (_phasor(sin, cos) is None) == (rope == 'arbitrary')
    grad = torch.randn(2, 2, 20, 6, dtype=D64)
    leaves = (q, k, v, s1, s2)
    want = pacs_attention_pytorch(q, k, v, s1, s2, sin, cos)
    want_g = torch.autograd.grad(want, leaves, grad)

    def run(*args):
        if rope == 'arbitrary':
            return cpu_module.pacs_attention_cpu(*args, sin, cos)
        return fast(*args, hw=(4, 5) if rope else None)

    got = run(q, k, v, s1, s2)
    got_g = torch.autograd.grad(got, leaves, grad)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for a, b in zip(got_g, want_g):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    with torch.no_grad():  # the forward-only path
        torch.testing.assert_close(run(q, k, v, s1, s2), want)


def test_scale_and_key_bias_divide_queries_and_keys():
    """``scale`` and ``k_bias``: the formula on ``q / softplus(scale)`` and
    ``(k + k_bias) / softplus(scale)``, values and gradients of every
    input (the op's fast path and its formula path)."""
    q, k, v, s1, s2 = inputs(N=20, d=6)
    g = torch.Generator().manual_seed(5)
    scale = torch.randn(1, 2, 1, 6, generator=g, dtype=D64).requires_grad_()
    bias = torch.randn(1, 2, 20, 6, generator=g,
                       dtype=D64).requires_grad_()
    leaves = (q, k, v, s1, s2, scale, bias)
    grad = torch.randn(2, 2, 20, 6, generator=g, dtype=D64)
    s = F.softplus(scale)
    want = pacs_attention_pytorch(q / s, (k + bias) / s, v, s1, s2)
    want_g = torch.autograd.grad(want, leaves, grad)
    for run in (fast, pacs_attention):
        with use_implementation('cpu' if run is fast else 'graph'):
            got = run(q, k, v, s1, s2, scale=scale, k_bias=bias)
        got_g = torch.autograd.grad(got, leaves, grad)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        for a, b in zip(got_g, want_g):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_kernel_gradcheck():
    q, k, v, s1, s2 = inputs(B=1, h=1, N=6, d=4, seed=3)
    assert torch.autograd.gradcheck(
        lambda *a: fast(*a, hw=(2, 3)), (q, k, v, s1, s2))


def test_kernel_saves_no_feature_maps():
    """Only (N, d)-sized tensors and the small matrices are kept for
    backward, no (N, 2d) feature map."""
    q, k, v, s1, s2 = inputs(B=1, h=1, N=64, d=4)
    sin, cos = rotary_tables((8, 8), 8, dtype=D64)
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fast(q, k, v, s1, s2, hw=(8, 8))
    assert (1, 1, 64, 8) not in shapes, shapes
    shapes.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        pacs_attention_pytorch(q, k, v, s1, s2, sin, cos)
    assert (1, 1, 64, 8) in shapes  # the formula does keep them


def test_large_activations_under_bf16_autocast_stay_finite():
    """exp(t x) - 1 is computed in float32 under autocast: q and k of
    magnitude up to 30 (exp(30) = 1e13, far beyond fp16's 65504) give finite
    outputs equal to float32 ones computed from the same bf16 projections.
    (Beyond float32's range, |q| + |k| > 88, the published formula
    overflows in float32 too.)"""
    torch.manual_seed(0)
    attn = PaCSAttention(16, 2).eval()
    x = torch.randn(1, 36, 16)
    with torch.no_grad():
        peak = attn.qkvg(x)[..., :32].abs().max()
        attn.qkvg.weight.mul_(30 / peak)  # q, k of magnitude up to 30
        attn.qkvg.bias.mul_(30 / peak)
        qkvg = attn.qkvg(x.bfloat16().float())
        assert qkvg[..., :32].abs().max() > 25
        def heads(t):
            return t.unflatten(-1, (2, 8)).transpose(1, 2)

        with torch.autocast('cpu', dtype=torch.bfloat16):
            q, k, v, _ = attn.qkvg(x).unflatten(-1, (4, 16)).unbind(-2)
            assert q.dtype == torch.bfloat16
            got = pacs_attention(heads(q), heads(k), heads(v), attn.s1,
                                 attn.s2, hw=(6, 6))
            full = attn(x, (6, 6))
        want = pacs_attention(heads(q.float()), heads(k.float()),
                              heads(v.float()), attn.s1, attn.s2, hw=(6, 6))
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    assert torch.isfinite(full).all()
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    # the same in fp16 storage would overflow: exp(30) > 65504
    assert torch.isinf(torch.exp(torch.tensor(30., dtype=torch.float16)))


def test_pacs_attention_fast_and_reference_agree(monkeypatch):
    """The kernel (fast paths on) and the formula (fast paths off) give the
    same outputs and gradients; each side runs only its own."""
    torch.manual_seed(0)
    attn = PaCSAttention(16, 2)
    helpers.randomise(attn, std=0.3)
    ref = PaCSAttention(16, 2)
    ref.load_state_dict(attn.state_dict())
    kernel = helpers.count_calls(monkeypatch, cpu_module,
                                 'pacs_attention_cpu')
    formula = helpers.count_calls(monkeypatch, cpu_module,
                                  'pacs_attention_pytorch')
    x = torch.randn(2, 30, 16)
    a = attn(x, (5, 6))
    assert (len(kernel), len(formula)) == (1, 0)
    with use_implementation('graph'):
        b = ref(x, (5, 6))
    assert (len(kernel), len(formula)) == (1, 1)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    a.square().sum().backward()
    b.square().sum().backward()
    for (n, p), q in zip(attn.named_parameters(), ref.parameters()):
        # float32: equal up to rounding, relative to the gradient's size
        err = (p.grad - q.grad).abs().max() / q.grad.abs().max()
        assert err < 1e-5, (n, float(err))


def test_one_feature_map_and_one_temperature_init():
    """Both PaCS attentions share one feature map, formula and fast entry
    (the op :func:`pola_mm.ops.pacs_attention`), and their temperatures are
    created and reset by one function (zero, the authors' init)."""
    import pola_mm.models.layers.linear_attention as pa
    import pola_mm.ops.pacs.cpu as pk
    import pola_mm.ops.pacs.naive as naive
    assert naive.pacs_features is pk.pacs_features
    x = torch.randn(3, 5, 4, dtype=D64, requires_grad=True)
    t = torch.rand(8, dtype=D64, requires_grad=True)
    pos, neg = F.relu(x), F.relu(-x)
    for swap, halves in ((False, [pos, neg]), (True, [neg, pos])):
        want = torch.exp(torch.cat(halves, -1) * t) - 1  # the authors'
        got = pk.pacs_features(x, t, swap)  # autograd records: out of place
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert torch.autograd.gradcheck(
            lambda a, b, swap=swap: pk.pacs_features(a, b, swap), (x, t))
        with torch.no_grad():  # in place
            torch.testing.assert_close(pk.pacs_features(x, t, swap), want)
    torch.testing.assert_close(pk.pacs_features(x),
                               torch.exp(torch.cat([pos, neg], -1)) - 1)
    for m in (PaCSAttention(16, 2), build('pacs')):
        assert m.s1.shape == m.s2.shape == (1, 2, 1, 16)
        with torch.no_grad():
            m.s1.fill_(1.), m.s2.fill_(-1.)
        pa.reset_pacs_temperatures(m)
        assert (m.s1 == 0).all() and (m.s2 == 0).all()


# -- PolarityAttention(feature_map=...) -------------------------------------
def build(feature_map=None, seed=0, fused=True):
    torch.manual_seed(seed)
    kw = {} if feature_map is None else dict(feature_map=feature_map)
    m = PolarityAttention(16, 2, (4, 5), fused_qkvg=fused, **kw)
    helpers.randomise(m, seed=seed, std=0.3)
    return m


def test_power_is_the_default_and_unchanged():
    """'power' builds the same parameters (no s1/s2) and computes
    bit-identical outputs and gradients to the default (today's) module."""
    old, new = build(), build('power')
    assert old.feature_map == 'power'
    assert list(old.state_dict()) == list(new.state_dict())
    assert 'power' in dict(new.named_parameters())
    assert not hasattr(new, 's1')
    x = torch.randn(2, 20, 16)
    a, b = old(x, (4, 5)), new(x, (4, 5))
    assert torch.equal(a, b)
    a.sum().backward()
    b.sum().backward()
    for p, q in zip(old.parameters(), new.parameters()):
        assert torch.equal(p.grad, q.grad)
    with pytest.raises(ValueError, match="feature_map must be one of"):
        PolarityAttention(16, 2, (4, 5), feature_map='exp')


def pacs_polarity_by_hand(m, x, hw):
    """feature_map='pacs' written out in float64 from the module's
    parameters: PolaFormer's projections, scale and positional table, PaCS
    features (no rotary encoding), dwc, gate, proj."""
    B, N, C = x.shape
    h, d = m.num_heads, m.head_dims
    q, k, v, g = F.linear(x, m.qkvg.weight, m.qkvg.bias).unflatten(
        -1, (4, C)).unbind(-2)
    k = k + m.positional_encoding

    def heads(t):
        return t.unflatten(-1, (h, d)).transpose(1, 2)

    s = F.softplus(m.scale).reshape(1, h, 1, d)
    att = spelled_out(heads(q) / s, heads(k) / s, heads(v), m.s1, m.s2)
    vmap = v.transpose(1, 2).reshape(B, C, *hw)
    conv = F.conv2d(vmap, m.dwc.weight.repeat(h, 1, 1, 1),
                    m.dwc.bias.repeat(h), padding=m.dwc.padding, groups=C)
    y = att.transpose(1, 2).reshape(B, N, C) + conv.flatten(2).transpose(1, 2)
    return F.linear(y * g, m.proj.weight, m.proj.bias)


@pytest.mark.parametrize('fast', [True, False])
def test_pacs_feature_map_matches_float64_formula(fast):
    m = build('pacs', seed=1).double()
    assert {'s1', 's2'} <= set(dict(m.named_parameters()))
    assert not hasattr(m, 'power')
    x = torch.randn(2, 20, 16, dtype=D64)
    want = pacs_polarity_by_hand(m, x, (4, 5))
    want_g = torch.autograd.grad(want.sum(), list(m.parameters()))
    if fast:
        got = m(x, (4, 5))
    else:
        with use_implementation('graph'):
            got = m(x, (4, 5))
    got_g = torch.autograd.grad(got.sum(), list(m.parameters()))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for (n, _), a, b in zip(m.named_parameters(), got_g, want_g):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10, msg=n)


@pytest.mark.parametrize('cls,arch', [(PolaSwinTransformer,
                                       helpers.SWIN_TINY_DEPTH1),
                                      (PolaPVT, helpers.PVT_TINY)])
def test_backbones_pass_feature_map(cls, arch):
    m = cls(arch=arch, feature_map='pacs', out_indices=(0, 1))
    m.init_weights()
    attns = [a for a in m.modules() if isinstance(a, PolarityAttention)]
    assert attns and all(a.feature_map == 'pacs' for a in attns)
    assert all((a.s1 == 0).all() and (a.s2 == 0).all() for a in attns)
    outs = m(torch.randn(1, 3, 40, 56))
    sum(o.sum() for o in outs).backward()
    assert [n for n, p in m.named_parameters() if p.grad is None] == []
    # CPU inference on a map taller than one run of rows: the same result
    # as the plain model (pacs blocks skip PolaFormer's streamed attention)
    m.eval()
    x = torch.randn(1, 3, 256, 320)
    with torch.no_grad():
        fast = m(x)
        with use_implementation('graph'):
            plain = m(x)
    for a, b in zip(fast, plain):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
