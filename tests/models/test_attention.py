"""Window helpers, polarity attention, global polarity blocks, shifted and
padded softmax windows."""
import itertools

import pytest
import torch
import torch.nn.functional as F
from helpers import count_calls, randomise

from pola_mm.models.backbones.pola_swin import PolaSwinBlock
from pola_mm.models.layers import (PolarityAttention, WindowMSA,
                                   relative_position_index)
from pola_mm.models.layers.window import (crop_map, cyclic_shift, grid_padding,
                                          key_valid_mask, pad_map,
                                          shift_region_mask, valid_token_map,
                                          window_partition, window_reverse)
from pola_mm.ops import (polarity_attention_naive, resize_pos_table,
                         use_implementation)


# -- window helpers ---------------------------------------------------------
@pytest.mark.parametrize('hw,window', [((6, 8), (3, 4)), ((4, 4), (4, 4)),
                                       ((10, 6), (5, 2))])
def test_partition_roundtrip(hw, window):
    x = torch.randn(2, *hw, 3)
    w = window_partition(x, window)
    nw = (hw[0] // window[0]) * (hw[1] // window[1])
    assert w.shape == (2 * nw, window[0] * window[1], 3)
    # first window = top-left block, row-major
    assert torch.equal(w[0].view(*window, 3), x[0, :window[0], :window[1]])
    assert torch.equal(window_reverse(w, window, hw), x)


def window_attention_reference(msa, windows, window, mask=None):
    """Softmax attention in each of ``windows`` ``(B * nW, n, C)`` written
    out: ``qkv``, ``softmax(scale q k^T + relative bias + mask) v``,
    ``proj``; ``mask`` ``(nW, n, n)`` additive logits per window."""
    Bw, n, C = windows.shape
    h = msa.num_heads
    q, k, v = msa.qkv(windows).reshape(Bw, n, 3, h, C // h).permute(
        2, 0, 3, 1, 4).unbind(0)
    logits = (q * msa.scale) @ k.transpose(-2, -1) + \
        msa.relative_bias(window).unsqueeze(0)
    if mask is not None:
        nw = mask.shape[0]
        logits = (logits.view(Bw // nw, nw, h, n, n) +
                  mask.unsqueeze(1).unsqueeze(0)).view(Bw, h, n, n)
    y = logits.softmax(-1) @ v
    return msa.proj(y.transpose(1, 2).reshape(Bw, n, C))


@pytest.mark.parametrize('mask_kind', ['none', 'shift', 'padding'])
def test_window_msa_fused_inference_equals_explicit(monkeypatch, mask_kind):
    """Inference runs scaled_dot_product_attention (not with the fast paths
    off); it equals the explicit product-softmax-product that CPU training
    runs, with the shift mask and with masked padded keys (a map smaller
    than the window is that window: its padded keys are masked)."""
    import torch.nn.functional as tnf
    torch.manual_seed(0)
    attn = WindowMSA(16, 4, (7, 7), shift=mask_kind == 'shift').double()
    randomise(attn)
    hw = (5, 6) if mask_kind == 'padding' else (14, 21)
    x = torch.randn(2, hw[0] * hw[1], 16, dtype=torch.float64)
    sdpa = count_calls(monkeypatch, tnf, 'scaled_dot_product_attention')
    explicit = attn(x.clone().requires_grad_(), hw)
    assert not sdpa
    with torch.no_grad():
        with use_implementation('graph'):  # the switch turns SDPA off too
            plain = attn(x, hw)
        assert not sdpa
        fused = attn(x, hw)
        # the relative bias alone or one window's key mask: one call;
        # per-window masks: one call per image, the masks broadcast over
        # the batch, never tiled
        assert len(sdpa) == (2 if mask_kind == 'shift' else 1)
    torch.testing.assert_close(fused, explicit.detach(), rtol=1e-12,
                               atol=1e-12)
    torch.testing.assert_close(plain, explicit.detach(), rtol=0, atol=0)


def test_grid_padding():
    assert grid_padding((10, 13), (4, 4)) == (0, 2, 0, 3)
    assert grid_padding((8, 12), (4, 4)) == (0, 0, 0, 0)
    x = torch.randn(1, 5, 7, 2)
    pad = (1, 2, 3, 0)
    assert torch.equal(crop_map(pad_map(x, pad), pad), x)
    vm = valid_token_map((5, 7), pad)
    assert vm.shape == (1, 8, 10, 1) and int(vm.sum()) == 35
    assert not vm[0, 0].any() and vm[0, 1, 3:, 0].all()


def test_shift_region_mask_matches_swin():
    """Region labels = Swin's original h/w slices on the rolled map."""
    Hp, Wp, w, s = 8, 12, 4, 2
    mask = shift_region_mask((Hp, Wp), (w, w), (s, s))
    img = torch.zeros(1, Hp, Wp, 1)
    cnt = 0
    for hs in (slice(0, -w), slice(-w, -s), slice(-s, None)):
        for ws in (slice(0, -w), slice(-w, -s), slice(-s, None)):
            img[:, hs, ws, :] = cnt
            cnt += 1
    lw = window_partition(img, (w, w)).squeeze(-1)
    ref = (lw.unsqueeze(1) - lw.unsqueeze(2)) != 0
    assert torch.equal(mask != 0, ref)
    assert set(mask.unique().tolist()) == {0.0, -100.0}


def test_relative_index_subtable():
    full = relative_position_index((7, 7), (7, 7))
    sub = relative_position_index((3, 5), (7, 7))
    coords = [(i, j) for i in range(7) for j in range(7)]
    keep = [coords.index((i, j)) for i in range(3) for j in range(5)]
    # the sub-window's offsets index the same table entries as in the full one
    assert torch.equal(sub, full[keep][:, keep])
    assert full.max() == 13 * 13 - 1 and full.min() == 0


# -- polarity attention -----------------------------------------------------
def test_polarity_gradcheck_float64():
    torch.manual_seed(0)
    attn = PolarityAttention(4, 2, (2, 3), alpha=4, kernel_size=3).double()
    randomise(attn)
    x = torch.randn(2, 6, 4, dtype=torch.float64, requires_grad=True)
    params = [attn.power, attn.scale, attn.positional_encoding]

    def f(x, *ps):
        return attn(x, (2, 3))

    # full (not fast-mode) check of x and the polarity parameters
    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-5)
    # resized positional table (grid differs from the reference)
    x2 = torch.randn(1, 9, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *ps: attn(x, (3, 3)),
                                    (x2, *params), eps=1e-6, atol=1e-5,
                                    fast_mode=True)


def test_positional_table_resize():
    t = torch.randn(1, 16, 3)
    assert resize_pos_table(t, (4, 4), (4, 4)) is t
    r = resize_pos_table(t, (4, 4), (3, 5))
    ref = F.interpolate(t.view(1, 4, 4, 3).permute(0, 3, 1, 2), size=(3, 5),
                        mode='bicubic', align_corners=False)
    torch.testing.assert_close(r, ref.flatten(2).transpose(1, 2))


@pytest.mark.parametrize('fused', [True, False])
def test_bf16_autocast(fused):
    torch.manual_seed(0)
    attn = PolarityAttention(16, 2, (4, 4), fused_qkvg=fused)
    randomise(attn)
    x = (torch.randn(2, 16, 16) * 30).requires_grad_()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y = attn(x, (4, 4))
    assert y.dtype == torch.bfloat16
    assert torch.isfinite(y.float()).all()
    y.float().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters())


# -- global polarity blocks -------------------------------------------------
def _global_polarity_reference(attn, x, hw):
    """The published computation written out over the whole map: ``qkvg``
    split, the positional table bicubic-resized to the map and added to k,
    the paper's formula (``pola_mm.ops.polarity_attention_naive``), the
    per-head depth-wise
    conv of v, gate and output projection."""
    B, L, C = x.shape
    h, d = attn.num_heads, attn.head_dims
    q, k, v, g = attn.qkvg(x).view(B, L, 4, C).unbind(2)
    grid = attn.positional_encoding.reshape(1, *attn.ref_hw, C)
    pos = F.interpolate(grid.permute(0, 3, 1, 2), size=hw, mode='bicubic',
                        align_corners=False).flatten(2).transpose(1, 2)
    k = k + pos

    def heads(t):
        return t.view(B, L, h, d).transpose(1, 2)

    y = polarity_attention_naive(heads(q), heads(k), heads(v),
                                    attn.scale.view(1, h, 1, d), attn.power,
                                    attn.alpha)
    vmap = heads(v).reshape(B * h, L, d).transpose(1, 2).reshape(
        B * h, d, *hw)
    conv = attn.dwc(vmap).view(B, h, d, L).permute(0, 1, 3, 2)
    y = (y + conv).transpose(1, 2).reshape(B, L, C)
    return attn.proj(y * g)


@pytest.mark.parametrize('hw', [(7, 7), (9, 13), (20, 6), (3, 4)])
@pytest.mark.parametrize('shift', [False, True])
def test_polarity_block_attends_to_the_whole_map(hw, shift):
    """A polarity block at any map size, shifted or not, is the global
    computation with the table resized to the map (no windows, no shift,
    no padding); at the table's own grid the table is used as it is."""
    torch.manual_seed(0)
    blk = PolaSwinBlock(8, 2, (7, 7), shift=shift, attn_type='L').double()
    randomise(blk.attn)
    x = torch.randn(2, hw[0] * hw[1], 8, dtype=torch.float64)
    with torch.no_grad():
        got = blk.attn(x, hw)
        ref = _global_polarity_reference(blk.attn, x, hw)
    torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)
    # the whole block is the same with and without shift
    other = PolaSwinBlock(8, 2, (7, 7), shift=not shift,
                          attn_type='L').double()
    other.load_state_dict(blk.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(blk(x, hw), other(x, hw), rtol=0, atol=0)


def test_polarity_block_receptive_field_is_the_whole_map():
    """A token at the far corner of a map eight times larger than the table
    grid changes the output at the first token (a window of the table's size
    would not reach it)."""
    torch.manual_seed(0)
    blk = PolaSwinBlock(8, 2, (4, 4), attn_type='L').eval()
    randomise(blk)
    hw = (32, 32)
    x = torch.randn(1, hw[0] * hw[1], 8)
    y = x.clone()
    y[:, -1] += 3.0 * torch.randn(8)  # not a constant (LayerNorm)
    with torch.no_grad():
        a, b = blk(x, hw), blk(y, hw)
    assert (a[:, 0] - b[:, 0]).abs().max() > 1e-6


def test_softmax_shift_matches_swin_reference():
    """The 'S' block reproduces Swin's masked cyclic shift at a multiple of
    the window (the 224 case of stage 3)."""
    torch.manual_seed(0)
    blk = PolaSwinBlock(8, 2, (4, 4), shift=True, attn_type='S')
    randomise(blk.attn)
    x = torch.randn(1, 8 * 8, 8)
    with torch.no_grad():
        got = blk.attn(x, (8, 8))
        xm = cyclic_shift(x.view(1, 8, 8, 8), (2, 2))
        mask = shift_region_mask((8, 8), (4, 4), (2, 2))
        y = window_attention_reference(blk.attn, window_partition(xm, (4, 4)),
                                       (4, 4), mask)
        y = cyclic_shift(window_reverse(y, (4, 4), (8, 8)), (2, 2), True)
    torch.testing.assert_close(got, y.reshape(1, 64, 8))
    assert key_valid_mask(valid_token_map((8, 8), (0, 0, 0, 0)),
                          (4, 4)).all()


@pytest.mark.parametrize('hw', list(itertools.product([3, 9], [5, 12])))
@pytest.mark.parametrize('attn_type', ['L', 'S'])
def test_block_any_size(hw, attn_type):
    blk = PolaSwinBlock(8, 2, (4, 4), shift=True, attn_type=attn_type)
    x = torch.randn(2, hw[0] * hw[1], 8, requires_grad=True)
    y = blk(x, hw)
    assert y.shape == x.shape
    y.sum().backward()
    assert all(p.grad is not None for p in blk.parameters())


# -- shape errors: the expected shape and what was received ------------------
def _raises(message, fn, *args, error=ValueError, **kwargs):
    """``fn(*args, **kwargs)`` raises ``error`` with exactly ``message``."""
    with pytest.raises(error) as info:
        fn(*args, **kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize('feature_map', ['power', 'pacs'])
def test_polarity_module_shape_errors(feature_map):
    attn = PolarityAttention(64, 2, (14, 14), feature_map=feature_map)
    want = 'PolarityAttention: x must be (B, H*W, C) = (B, 600, 64) for ' \
        'hw=(20, 30); got '
    # one token short (N != H*W): before, "unflatten"/"view" errors of torch
    _raises(want + '(2, 599, 64)', attn, torch.randn(2, 599, 64), (20, 30))
    # channels other than embed_dims
    _raises(want + '(2, 600, 32)', attn, torch.randn(2, 600, 32), (20, 30))
    # a map instead of tokens, and tokens without a batch
    _raises(want + '(2, 20, 30, 64)', attn, torch.randn(2, 20, 30, 64),
            (20, 30))
    _raises(want + '(600, 64)', attn, torch.randn(600, 64), (20, 30))
    _raises('PolarityAttention: hw must be (H, W), the grid of the tokens; '
            'got 600', attn, torch.randn(2, 600, 64), 600)
    _raises('PolarityAttention: x must be a tensor (B, H*W, C); got list',
            attn, [[0.]], (1, 1), error=TypeError)
    # the same module takes any grid and a 1-D sequence (1, N)
    assert attn(torch.randn(2, 600, 64), (20, 30)).shape == (2, 600, 64)
    assert attn(torch.randn(1, 50, 64), (1, 50)).shape == (1, 50, 64)


def _heads(B=2, h=3, N=11, d=6, n=None):
    n = N if n is None else n
    return (torch.randn(B, h, N, d), torch.randn(B, h, n, d),
            torch.randn(B, h, n, d))


def test_polarity_op_shape_errors():
    from pola_mm.ops import polarity_attention
    q, k, v = _heads()
    par = torch.zeros(1, 3, 1, 6)
    op = 'polarity_attention: '
    kv = op + 'k and v must be (B, h, n, d) = (2, 3, n, 6) for q ' \
        '(2, 3, 11, 6); got '
    _raises(kv + 'k (2, 3, 11, 6), v (2, 3, 7, 6)', polarity_attention, q,
            k, v[:, :, :7], par, par, 4.)
    _raises(kv + 'k (2, 2, 11, 6), v (2, 2, 11, 6)', polarity_attention, q,
            k[:, :2], v[:, :2], par, par, 4.)
    _raises(kv + 'k (2, 3, 11, 4), v (2, 3, 11, 6)', polarity_attention, q,
            k[..., :4], v, par, par, 4.)
    _raises(kv + 'k (1, 3, 11, 6), v (1, 3, 11, 6)', polarity_attention, q,
            k[:1], v[:1], par, par, 4.)
    _raises(op + 'q must be 4-D (B, h, N, d) (heads split off the channels); '
            'got (2, 11, 18)', polarity_attention, torch.randn(2, 11, 18), k,
            v, par, par, 4.)
    _raises(op + 'k must be 4-D (B, h, n, d) (heads split off the channels); '
            'got (3, 11, 6)', polarity_attention, q, k[0], v, par, par, 4.)
    _raises(op + 'the head width d must be even (v is split into two halves '
            'per head); got q (2, 3, 11, 5), d = 5', polarity_attention,
            q[..., :5], k[..., :5], v[..., :5], par[..., :5], par[..., :5],
            4.)
    _raises(op + 'scale must be broadcastable to (1, h, 1, d) = (1, 3, 1, 6); '
            'got (1, 3, 1, 5)', polarity_attention, q, k, v, par[..., :5],
            par, 4.)
    _raises(op + 'power must be (1, h, 1, d) = (1, 3, 1, 6); got (1, 1, 1, 6)',
            polarity_attention, q, k, v, par, par[:, :1], 4.)
    _raises(op + 'k_bias must be broadcastable to k (B, h, n, d) = '
            '(2, 3, 11, 6); got (1, 3, 12, 6)', polarity_attention, q, k, v,
            par, par, 4., k_bias=torch.zeros(1, 3, 12, 6))
    _raises(op + 'q must be a tensor (B, h, N, d); got list',
            polarity_attention, [0.], k, v, par, par, 4., error=TypeError)
    # what the op accepts: fewer keys than queries, a scale shared by the
    # heads, a positional table broadcast over the batch
    out = polarity_attention(q, k[:, :, :4], v[:, :, :4], par[:, :1], par,
                             4., k_bias=torch.zeros(1, 3, 4, 6))
    assert out.shape == (2, 3, 11, 6)


def test_pacs_op_shape_errors():
    from pola_mm.ops import pacs_attention
    q, k, v = _heads(N=12)  # N = 3 x 4
    s = torch.zeros(1, 3, 1, 12)
    op = 'pacs_attention: '
    _raises(op + 's1 must be broadcastable to (1, h, 1, 2d) = (1, 3, 1, 12); '
            'got (1, 3, 1, 6)', pacs_attention, q, k, v, s[..., :6], s)
    _raises(op + 's2 must be broadcastable to (1, h, 1, 2d) = (1, 3, 1, 12); '
            'got (1, 4, 1, 12)', pacs_attention, q, k, v, s,
            torch.zeros(1, 4, 1, 12))
    _raises(op + 'k and v must be (B, h, n, d) = (2, 3, n, 6) for q '
            '(2, 3, 12, 6); got k (2, 3, 12, 6), v (2, 3, 5, 6)',
            pacs_attention, q, k, v[:, :, :5], s, s)
    _raises(op + 'the head width d must be even (v is split into two halves '
            'per head); got q (2, 3, 12, 3), d = 3', pacs_attention,
            q[..., :3], k[..., :3], v[..., :3], s[..., :6], s[..., :6])
    _raises(op + 'k and v must be (B, h, N, d) = (2, 3, 12, 6) for q '
            '(2, 3, 12, 6) (as many keys as queries with the rotary map hw); '
            'got k (2, 3, 4, 6), v (2, 3, 4, 6)', pacs_attention, q,
            k[:, :, :4], v[:, :, :4], s, s, hw=(3, 4))
    _raises(op + 'hw=(4, 4) has 16 tokens, but q has 12 (N = H * W, '
            'row-major)', pacs_attention, q, k, v, s, s, hw=(4, 4))
    _raises(op + 'hw is the (H, W) map of the rotary encoding, got Tensor; '
            'the op builds the rotary tables itself (pass hw=(H, W) instead '
            'of sin and cos)', pacs_attention, q, k, v, s, s,
            hw=torch.zeros(12, 12))
    _raises(op + 'scale must be broadcastable to (1, h, 1, d) = (1, 3, 1, 6); '
            'got (1, 3, 1, 12)', pacs_attention, q, k, v, s, s, scale=s)
    _raises(op + 'k_bias must be broadcastable to k (B, h, n, d) = '
            '(2, 3, 12, 6); got (1, 3, 5, 6)', pacs_attention, q, k, v, s, s,
            k_bias=torch.zeros(1, 3, 5, 6))
    # accepted: fewer keys without rotary encoding, the full rotary call
    assert pacs_attention(q, k[:, :, :4], v[:, :, :4], s, s).shape == q.shape
    assert pacs_attention(q, k, v, s, s, hw=(3, 4)).shape == q.shape


class _MapAttention(torch.nn.Module):
    """PolarityAttention on a ``(B, C, H, W)`` map (the sizes come from the
    input, symbolic under a dynamic export)."""

    def __init__(self, feature_map: str) -> None:
        super().__init__()
        self.attn = PolarityAttention(16, 2, (4, 6), feature_map=feature_map)

    def forward(self, x):
        hw = (x.shape[2], x.shape[3])
        return self.attn(x.flatten(2).transpose(1, 2), hw)


@pytest.mark.parametrize('feature_map', ['power', 'pacs'])
def test_shape_checks_export_with_dynamic_sizes(feature_map):
    """The checks compare only plain ints: a ``torch.export`` with a
    dynamic batch and map size captures no guard from them, and the program
    runs at other sizes equal to eager."""
    torch.manual_seed(0)
    model = _MapAttention(feature_map).eval()
    randomise(model, std=0.3)
    dims = {0: torch.export.Dim('B', min=1, max=8),
            2: torch.export.Dim('H', min=2, max=32),
            3: torch.export.Dim('W', min=2, max=32)}
    program = torch.export.export(model, (torch.randn(2, 16, 4, 6), ),
                                  dynamic_shapes={'x': dims})
    x = torch.randn(3, 16, 5, 9)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), model(x), rtol=1e-4,
                                   atol=1e-5)
