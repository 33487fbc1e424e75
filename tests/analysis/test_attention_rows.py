"""Attention rows of polarity and softmax blocks: they reproduce the modules'
own outputs; PSE on the counterexample to the published Theorem 1; rank."""
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import PVT_TINY, SWIN_TINY_DEPTH2, randomise_attention

from pola_mm.analysis.attention import (attention_rows, block_statistics,
                                        capture_blocks, dwc_rows,
                                        image_to_tensor, load_image,
                                        polarity_qk, polarity_scores,
                                        positive_sequence_entropy,
                                        query_tokens, softmax_rows)
from pola_mm.ops import polarity_attention_naive
from pola_mm.registry import MODELS


def _model(kind: str) -> torch.nn.Module:
    cfg = (dict(type='PolaSwinTransformer', arch=SWIN_TINY_DEPTH2)
           if kind == 'swin' else dict(type='PolaPVT', arch=PVT_TINY))
    torch.manual_seed(0)
    m = MODELS.build(cfg)
    m.init_weights()
    randomise_attention(m)
    return m.eval()


@pytest.fixture(scope='module')
def photo():
    """The astronaut photo at 64x96 (H x W), normalised."""
    return image_to_tensor(load_image('skimage:astronaut'), (64, 96))


@pytest.fixture(scope='module')
def swin_caps(photo):
    return capture_blocks(_model('swin'), photo[1])


@pytest.fixture(scope='module')
def swin_stage3():
    """Stage 3 of the coffee photo at 128x176: an 8x11 map."""
    _, x = image_to_tensor(load_image('skimage:coffee'), (128, 176))
    return capture_blocks(_model('swin'), x, [(3, 1), (3, 2)])


# -- PSE ---------------------------------------------------------------------
def test_pse_counterexample_to_theorem_1():
    """x = (1,1,1), k1 = (10,10,10), k2 = (15,1,1), g(t) = t^2: the power
    raises PSE (0.654 -> 0.683 nats), so the theorem fails in general."""
    x = torch.tensor([1., 1., 1.])
    k = torch.tensor([[10., 10., 10.], [15., 1., 1.]])
    scores = k @ x
    powered = (k ** 2) @ (x ** 2)
    assert scores.tolist() == [30., 17.]
    assert powered.tolist() == [300., 227.]
    before = float(positive_sequence_entropy(scores))
    after = float(positive_sequence_entropy(powered))
    assert before == pytest.approx(0.6545, abs=5e-4)
    assert after == pytest.approx(0.6835, abs=5e-4)
    assert after > before


@pytest.mark.parametrize('x, k', [
    ((1., 1.), ((2., 2.), (1., 1.))),          # scores (4, 2) -> (8, 2)
    ((1., 2., 0.5), ((3., 1., 1.), (1., 1., 1.), (0.5, 0.2, 2.))),
])
def test_pse_lowered_by_the_power(x, k):
    x, k = torch.tensor(x), torch.tensor(k)
    for p in (2., 3.):
        assert (positive_sequence_entropy((k ** p) @ (x ** p))
                < positive_sequence_entropy(k @ x))


def test_pse_is_entropy_of_the_normalised_sequence_and_checks_input():
    s = torch.tensor([[1., 1., 1., 1.], [5., 0., 0., 0.]])
    assert positive_sequence_entropy(s).tolist() == pytest.approx(
        [math.log(4), 0.0])
    assert float(positive_sequence_entropy(s[0] * 7)) == pytest.approx(
        math.log(4))
    with pytest.raises(ValueError, match='non-negative'):
        positive_sequence_entropy([1., -1.])
    with pytest.raises(ValueError, match='positive sum'):
        positive_sequence_entropy([0., 0.])


# -- polarity rows -----------------------------------------------------------
@pytest.mark.parametrize('kind', ['swin', 'pvt'])
def test_polarity_rows_reproduce_the_module_output(kind, photo, swin_caps):
    """Same-signed rows times v1, opposite-signed rows times v2 (with the
    module's 1e-6), plus the depth-wise conv's matrix times v, gated and
    projected, are the attention module's own output on the real pass."""
    caps = swin_caps if kind == 'swin' else capture_blocks(_model(kind),
                                                           photo[1])
    cap = caps[(1, 1)]
    attn = cap.attn
    N = cap.hw[0] * cap.hw[1]
    rows = torch.arange(N)
    qk = polarity_qk(attn, cap.x, cap.hw)
    sc = polarity_scores(qk, rows)
    d = attn.head_dims
    x_sim = sc['same'] / (sc['same'].sum(-1, keepdim=True) + N * 1e-6) \
        @ qk.v[..., :d // 2]
    x_opp = sc['opposite'] / (sc['opposite'].sum(-1, keepdim=True)
                              + N * 1e-6) @ qk.v[..., d // 2:]
    # the flows alone equal the plain formula on the same q, k, v
    # (q, k are already scaled: a raw scale with softplus(scale) = 1)
    unit = torch.full((1, ), math.log(math.e - 1), dtype=torch.float64)
    ref = polarity_attention_naive(qk.q, qk.k, qk.v, unit,
                                      attn.power.detach().double(),
                                      attn.alpha)
    assert torch.allclose(torch.cat([x_sim, x_opp], -1), ref, atol=1e-9)
    conv = torch.cat([dwc_rows(attn, cap.hw, rows, c) @ qk.v[..., c:c + 1]
                      for c in range(d)], -1)  # (B, h, N, d)
    conv = conv + attn.dwc.bias.double()
    mixed = (torch.cat([x_sim, x_opp], -1) + conv).transpose(1, 2)
    mixed = mixed.reshape(1, N, attn.embed_dims)
    g = qk.g.transpose(1, 2).reshape(1, N, attn.embed_dims)
    out = F.linear(mixed * g, attn.proj.weight.double(),
                   attn.proj.bias.double())
    assert cap.out is not None
    assert torch.allclose(out.float(), cap.out, atol=2e-5, rtol=1e-4)


def test_polarity_rows_sum_to_one_and_differ(swin_caps):
    cap = swin_caps[(1, 2)]
    rows = query_tokens([(48, 32), (5, 60)], (64, 96), cap.hw)
    maps = attention_rows(cap, rows)
    assert set(maps) == {'same', 'opposite', 'combined', 'relu'}
    for name, m in maps.items():
        assert m.shape == (1, cap.num_heads, 2, cap.hw[0] * cap.hw[1])
        assert (m >= 0).all()
        assert torch.allclose(m.sum(-1), torch.ones(()).double()), name
    assert not torch.allclose(maps['same'], maps['opposite'])
    # combined is a convex mixture: between the two flows everywhere
    lo = torch.minimum(maps['same'], maps['opposite'])
    hi = torch.maximum(maps['same'], maps['opposite'])
    assert ((maps['combined'] >= lo - 1e-12)
            & (maps['combined'] <= hi + 1e-12)).all()


# -- softmax rows ------------------------------------------------------------
@pytest.mark.parametrize('block', [1, 2])  # unshifted and shifted
def test_softmax_rows_reproduce_the_window_attention(swin_stage3, block):
    """At 128x176 stage 3 is 8x11: windows of 7 with padding, and block 2
    is shifted (region mask)."""
    cap = swin_stage3[(3, block)]
    attn = cap.attn
    assert cap.hw == (8, 11)
    assert attn.shift_size == ((3, 3) if block == 2 else (0, 0))
    N = cap.hw[0] * cap.hw[1]
    rows = torch.arange(N)
    a = softmax_rows(cap, rows)  # (1, h, N, N)
    # 8x11 is padded to 14x14: mmdet's Swin attends to the zero padding, so
    # rows of windows with padding keep part of their mass there
    mass = a.sum(-1)
    assert (mass <= 1 + 1e-9).all() and (mass < 1 - 1e-3).any()
    win = attn.window_size
    assert ((a[0, 0] > 0).sum(-1) <= win[0] * win[1]).all()
    h = attn.num_heads
    v = attn.qkv(cap.x).double().reshape(1, N, 3, h, -1)[:, :, 2]
    # a padded token's value is the qkv bias of v
    v_pad = attn.qkv(cap.x.new_zeros(1, cap.x.shape[-1])).double().reshape(
        3, h, -1)[2]
    y = a @ v.transpose(1, 2) + (1 - mass)[..., None] * v_pad[None, :, None]
    y = y.transpose(1, 2).reshape(1, N, -1)
    out = F.linear(y, attn.proj.weight.double(), attn.proj.bias.double())
    with torch.no_grad():
        expected = attn(cap.x, cap.hw)
    assert torch.allclose(out.float(), expected, atol=1e-5)


# -- statistics --------------------------------------------------------------
def test_block_statistics_ranges_and_rank_bounds(swin_caps):
    stats = block_statistics(swin_caps[(1, 1)], num_rows=96)
    soft = block_statistics(swin_caps[(3, 2)], num_rows=96)
    d = stats[0]['head_dims']
    for r in stats + soft:
        assert 0 < r['rows'] <= 96
        for name, e in r['entropy'].items():
            assert 0 <= e <= r['max_entropy'] + 1e-9, name
        for name, k in r['rank'].items():
            assert 1 <= k <= r['rows'], name
    s = stats[0]
    # a flow's rows factor through 2d features, ReLU's through d
    assert s['rank']['same'] <= 2 * d and s['rank']['relu'] <= d
    assert s['rank']['same'] > s['rank']['relu']
    # the conv adds a local full-rank part
    assert s['rank_dwc']['same'] > s['rank']['same']
    # PSE of the score rows is the entropy of the normalised rows
    assert s['pse']['same'] == pytest.approx(s['entropy']['same'],
                                             abs=1e-6)
    assert s['pse']['relu'] == pytest.approx(s['entropy']['relu'], abs=1e-9)
    assert soft[0]['kind'] == 'softmax' and soft[0]['pse'] == {}


def test_query_outside_the_image_is_refused():
    with pytest.raises(ValueError, match='outside'):
        query_tokens([(100, 10)], (64, 96), (16, 24))


def test_pacs_rows_reproduce_the_module_output(photo):
    """``feature_map='pacs'`` (PolaFormer++'s exp(t x) - 1 features): the
    flows' rows times v1 / v2 equal the PaCS formula on the same q, k, v,
    and rows, conv, gate and projection give the module's own output."""
    from pola_mm.analysis.attention import (format_statistics,
                                            summarise_statistics)
    from pola_mm.ops import pacs_attention_pytorch
    torch.manual_seed(0)
    m = MODELS.build(dict(type='PolaSwinTransformer', arch=SWIN_TINY_DEPTH2,
                          feature_map='pacs'))
    m.init_weights()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # non-zero temperatures, tables, scales, convs
        for name, p in m.named_parameters():
            if name.endswith(('attn.s1', 'attn.s2', 'positional_encoding',
                              'attn.scale', 'dwc.weight')):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    cap = capture_blocks(m.eval(), photo[1], [(1, 1)])[(1, 1)]
    attn = cap.attn
    N, d = cap.hw[0] * cap.hw[1], attn.head_dims
    rows = torch.arange(N)
    qk = polarity_qk(attn, cap.x, cap.hw)
    assert qk.p is None and qk.t_same.shape == (1, attn.num_heads, 1, 2 * d)
    sc = polarity_scores(qk, rows)
    assert all((s >= 0).all() for s in sc.values())
    assert not torch.allclose(sc['same'], sc['opposite'])
    x = torch.cat([
        sc[f] / (sc[f].sum(-1, keepdim=True) + N * 1e-6) @ v
        for f, v in (('same', qk.v[..., :d // 2]),
                     ('opposite', qk.v[..., d // 2:]))], -1)
    ref = pacs_attention_pytorch(qk.q, qk.k, qk.v,
                                 attn.s1.detach().double(),
                                 attn.s2.detach().double())
    assert torch.allclose(x, ref, atol=1e-9)
    conv = torch.cat([dwc_rows(attn, cap.hw, rows, c) @ qk.v[..., c:c + 1]
                      for c in range(d)], -1) + attn.dwc.bias.double()
    mixed = (x + conv).transpose(1, 2).reshape(1, N, attn.embed_dims)
    gate = qk.g.transpose(1, 2).reshape(1, N, attn.embed_dims)
    out = F.linear(mixed * gate, attn.proj.weight.double(),
                   attn.proj.bias.double())
    assert torch.allclose(out.float(), cap.out, atol=2e-5, rtol=1e-4)
    stats = block_statistics(cap, num_rows=16)
    assert 'power_mean' not in stats[0]
    assert all(0 <= s['entropy']['same'] <= s['max_entropy'] for s in stats)
    assert '| PaCS |' in format_statistics(summarise_statistics(stats))


@pytest.mark.parametrize('feature_map', ['power', 'pacs'])
def test_polarity_qk_observes_the_module_forward(feature_map, monkeypatch):
    """polarity_qk runs the module's own forward and takes what its op
    receives: a forward that hands the op doubled queries is reflected,
    and the values equal the op's inputs (not a copy of the forward)."""
    import pola_mm.models.layers.linear_attention as layer
    import pola_mm.ops as ops
    from pola_mm.models.layers import PolarityAttention
    torch.manual_seed(0)
    attn = PolarityAttention(16, 2, (5, 7), feature_map=feature_map)
    randomise_attention(attn)
    x = torch.randn(2, 35, 16)
    before = polarity_qk(attn, x, (5, 7))
    name = 'polarity_attention' if feature_map == 'power' else \
        'pacs_attention'
    received = []

    def doubled(q, k, v, *args, **kwargs):
        received.append((2 * q, k, v))
        # the op looked up at call time: what polarity_qk observes
        return getattr(ops, name)(2 * q, k, v, *args, **kwargs)

    monkeypatch.setattr(layer, name, doubled)
    after = polarity_qk(attn, x, (5, 7))
    assert len(received) == 1
    q, k, v = (t.double() for t in received[0])
    assert torch.allclose(after.q, 2 * before.q, rtol=1e-6, atol=1e-12)
    assert torch.equal(after.k, before.k)
    assert torch.equal(after.v, v) and torch.equal(after.g, before.g)
    # q / softplus(scale), the op's first step (both ops), on what it
    # received
    s = F.softplus(attn.scale.detach().double()).view(1, 2, 1, 8)
    assert torch.equal(after.q, q / s)
    # a forward that bypasses the op cannot be observed: an error, not rows
    monkeypatch.setattr(layer, name, lambda q, *a, **k: q)
    with pytest.raises(RuntimeError, match=f'did not call.*{name}'):
        polarity_qk(attn, x, (5, 7))
