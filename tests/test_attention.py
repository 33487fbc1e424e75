"""Window helpers, polarity attention, shifted and padded windows."""
import itertools

import pytest
import torch
import torch.nn.functional as F

from pola_mm.models.backbones.pola_swin import PolaSwinBlock
from pola_mm.models.layers import (PolarityAttention, WindowMSA,
                                   relative_position_index, resize_pos_table)
from pola_mm.models.layers.polarity_attention import depthwise_conv2d
from pola_mm.models.layers.window import (crop_map, cyclic_shift,
                                          effective_window, grid_padding,
                                          key_padding_logits, key_valid_mask,
                                          merge_crop, pad_map, pad_partition,
                                          shift_region_mask, valid_token_map,
                                          window_partition, window_reverse)


def _randomise(module: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)


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


@pytest.mark.parametrize('hw,window,offset', [
    ((9, 11), (4, 5), (0, 0)), ((9, 11), (4, 5), (2, 3)),
    ((8, 10), (4, 5), (2, 0)), ((3, 2), (4, 5), (1, 4)),
    ((13, 5), (3, 5), (1, 2))])
def test_pad_partition_equals_pad_then_partition(hw, window, offset):
    """The one-copy pad + partition (and its inverse) equal the two-step
    helpers, for strided inputs, any fill value, and in backward."""
    pad = grid_padding(hw, window, offset)
    base = torch.randn(2, *hw, 12, dtype=torch.float64)
    x = base[..., ::3]  # strided, like an unbind view
    ref = window_partition(pad_map(x, pad), window)
    assert torch.equal(pad_partition(x, pad, window), ref)
    filled = pad_partition(x, pad, window, 1.0)
    valid = key_valid_mask(valid_token_map(hw, pad), window).repeat(2, 1)
    assert torch.equal(filled[valid], ref[valid])
    assert bool((filled[~valid] == 1).all())
    padded_hw = (hw[0] + pad[0] + pad[1], hw[1] + pad[2] + pad[3])
    assert torch.equal(merge_crop(ref, pad, window, hw), x)
    assert torch.equal(
        merge_crop(ref, pad, window, hw),
        crop_map(window_reverse(ref, window, padded_hw), pad))
    xg = x.clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: pad_partition(t, pad, window, 1.0), (xg, ))
    w = ref.clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: merge_crop(t, pad, window, hw), (w, ))


@pytest.mark.parametrize('mask_kind', ['none', 'shift', 'padding'])
def test_window_msa_fused_inference_equals_explicit(mask_kind):
    """Inference runs scaled_dot_product_attention; it equals the explicit
    product-softmax-product that CPU training runs."""
    torch.manual_seed(0)
    attn = WindowMSA(16, 4, (7, 7)).double()
    _randomise(attn)
    x = torch.randn(2 * 6, 49, 16, dtype=torch.float64)
    mask = {'none': None,
            'shift': shift_region_mask((14, 21), (7, 7), (3, 3)),
            'padding': key_padding_logits(torch.rand(6, 49) > 0.3)}[mask_kind]
    xg = x.clone().requires_grad_()
    assert not attn.use_fused(xg)
    explicit = attn(xg, (7, 7), mask)
    with torch.no_grad():
        assert attn.use_fused(x)
        fused = attn(x, (7, 7), mask)
    torch.testing.assert_close(fused, explicit.detach(), rtol=1e-12,
                               atol=1e-12)


def test_effective_window_and_padding():
    assert effective_window((56, 56), (56, 56), (28, 28)) == ((56, 56), (0, 0))
    assert effective_window((9, 120), (56, 56), (28, 28)) == ((9, 56), (0, 28))
    assert grid_padding((10, 13), (4, 4)) == (0, 2, 0, 3)
    assert grid_padding((10, 13), (4, 4), (2, 1)) == (2, 0, 1, 2)
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
    _randomise(attn)
    x = torch.randn(2, 6, 4, dtype=torch.float64, requires_grad=True)
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[1, 4:] = False
    params = [attn.power, attn.scale, attn.positional_encoding]

    def f(x, *ps):
        return attn(x, (2, 3), valid)

    # full (not fast-mode) check of x and the polarity parameters
    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-5)
    # resized positional table (grid differs from the reference)
    x2 = torch.randn(1, 9, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *ps: attn(x, (3, 3)),
                                    (x2, *params), eps=1e-6, atol=1e-5,
                                    fast_mode=True)


@pytest.mark.parametrize('fused', [True, False])
@pytest.mark.parametrize('offset', [(0, 0), (2, 1)])
def test_masked_padding_equals_dense(fused, offset):
    """A window holding a padded map equals the dense computation on the
    map alone (keys masked, v zero at padding like the conv's zero padding,
    n = number of real keys), whatever the padded tokens contain."""
    torch.manual_seed(0)
    ref_hw, sub_hw = (6, 6), (4, 5)
    a = PolarityAttention(8, 2, ref_hw, fused_qkvg=fused)
    _randomise(a)
    b = PolarityAttention(8, 2, sub_hw, fused_qkvg=fused)
    b.load_state_dict({k: v for k, v in a.state_dict().items()
                       if k != 'positional_encoding'}, strict=False)
    top, left = offset
    pe = a.positional_encoding.detach().view(1, *ref_hw, 8)
    b.positional_encoding.data.copy_(
        pe[:, top:top + sub_hw[0], left:left + sub_hw[1]].reshape(1, -1, 8))
    x_sub = torch.randn(2, *sub_hw, 8)
    x_pad = torch.randn(2, *ref_hw, 8) * 10  # garbage at padded positions
    x_pad[:, top:top + sub_hw[0], left:left + sub_hw[1]] = x_sub
    valid = torch.zeros(2, *ref_hw, dtype=torch.bool)
    valid[:, top:top + sub_hw[0], left:left + sub_hw[1]] = True
    out_pad = a(x_pad.flatten(1, 2), ref_hw, valid.flatten(1)).view(
        2, *ref_hw, 8)[:, top:top + sub_hw[0], left:left + sub_hw[1]]
    out_sub = b(x_sub.flatten(1, 2), sub_hw).view(2, *sub_hw, 8)
    torch.testing.assert_close(out_pad, out_sub, rtol=1e-5, atol=1e-5)


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
    _randomise(attn)
    x = (torch.randn(2, 16, 16) * 30).requires_grad_()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y = attn(x, (4, 4))
    assert y.dtype == torch.bfloat16
    assert torch.isfinite(y.float()).all()
    y.float().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters())


# -- shifted polarity windows -----------------------------------------------
def _regions_swin(hw, w, s):
    """Region id per token from Swin's cyclic shift + region labels."""
    H, W = hw
    lab = torch.zeros(1, H, W, 1)
    cnt = 0
    for hs in (slice(0, -w), slice(-w, -s), slice(-s, None)):
        for ws in (slice(0, -w), slice(-w, -s), slice(-s, None)):
            lab[:, hs, ws, :] = cnt
            cnt += 1
    win = torch.arange(H * W, dtype=torch.float).view(1, H, W, 1)
    win = window_partition(win, (w, w)).squeeze(-1)  # token ids per window
    ids = torch.zeros(H * W, dtype=torch.long)
    labw = window_partition(lab, (w, w)).squeeze(-1)
    for i in range(win.shape[0]):
        for j in range(win.shape[1]):
            ids[int(win[i, j])] = i * 100 + int(labw[i, j])
    # ids are in rolled coordinates; map back to the original positions
    rolled = ids.view(H, W)
    return torch.roll(rolled, shifts=(s, s), dims=(0, 1))


def _regions_offset(hw, w, s):
    """Region id per token of the offset grid (boundaries at s + k * w)."""
    H, W = hw
    r = (torch.arange(H) + w - s) // w
    c = (torch.arange(W) + w - s) // w
    return r[:, None] * 1000 + c[None, :]


def _brute_force_polarity(attn, x, hw, w, s, regions):
    """Quadratic-form polarity attention per region (independent of the
    module's linear implementation): for a query i in region R,
    x_sim_i = sum_j (q_sim_i . k'_j) v1_j / n / (mean_j q_sim_i . k'_j + 1e-6),
    positional encoding indexed by the position in the shifted window, and
    the depth-wise conv on v with zeros outside R."""
    H, W = hw
    B, L, C = x.shape
    h, d = attn.num_heads, attn.head_dims
    q, k, v, g = attn.qkvg(x).view(B, L, 4, C).unbind(2)
    pe = attn.positional_encoding.view(w, w, C)
    rows = (torch.arange(H) - s) % w
    cols = (torch.arange(W) - s) % w
    k = k + pe[rows][:, cols].reshape(1, L, C)
    sc = F.softplus(attn.scale)
    q, k = (q / sc).view(B, L, h, d), (k / sc).view(B, L, h, d)
    p = (1 + attn.alpha * torch.sigmoid(attn.power)).view(1, h, d)
    fp = lambda t: F.relu(t) ** p  # noqa: E731
    fn = lambda t: F.relu(-t) ** p  # noqa: E731
    vh = v.view(B, L, h, d)
    out = torch.zeros(B, L, h, d)
    conv = torch.zeros(B, L, h, d)
    reg = regions.flatten()
    for r in reg.unique():
        idx = (reg == r).nonzero().flatten()
        qs = torch.cat([fp(q[:, idx]), fn(q[:, idx])], -1)
        qo = torch.cat([fn(q[:, idx]), fp(q[:, idx])], -1)
        kk = torch.cat([fp(k[:, idx]), fn(k[:, idx])], -1)
        v1, v2 = vh[:, idx].chunk(2, -1)
        a_sim = torch.einsum('bihc,bjhc->bhij', qs, kk)
        a_opp = torch.einsum('bihc,bjhc->bhij', qo, kk)
        n = len(idx)
        x_sim = torch.einsum('bhij,bjhc->bihc', a_sim, v1) / n / (
            a_sim.mean(-1).permute(0, 2, 1)[..., None] + 1e-6)
        x_opp = torch.einsum('bhij,bjhc->bihc', a_opp, v2) / n / (
            a_opp.mean(-1).permute(0, 2, 1)[..., None] + 1e-6)
        out[:, idx] = torch.cat([x_sim, x_opp], -1)
        m = (reg == r).float().view(1, H, W, 1, 1)
        vm = (vh.view(B, H, W, h, d) * m).permute(0, 3, 4, 1, 2)
        cv = attn.dwc(vm.reshape(B * h, d, H, W)).view(B, h, d, H, W)
        conv[:, idx] = cv.permute(0, 3, 4, 1, 2).reshape(B, L, h, d)[:, idx]
    y = (out + conv).reshape(B, L, C)
    return attn.proj(y * g)


@pytest.mark.parametrize('hw,regions_of', [((8, 12), _regions_swin),
                                           ((10, 13), _regions_offset)])
def test_shifted_polarity_windows_brute_force(hw, regions_of):
    """Shifted polarity windows = attention restricted to Swin's shifted
    regions (cyclic shift + mask) for maps that are multiples of the window;
    the same offset-grid regions with padding otherwise."""
    torch.manual_seed(0)
    w, s = 4, 2
    blk = PolaSwinBlock(8, 2, (w, w), shift=True, attn_type='L')
    _randomise(blk.attn)
    x = torch.randn(2, hw[0] * hw[1], 8)
    with torch.no_grad():
        got = blk._polarity(x, hw)
        ref = _brute_force_polarity(blk.attn, x, hw, w, s,
                                    regions_of(hw, w, s))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_offset_grid_equals_swin_regions():
    a = _regions_swin((8, 12), 4, 2).flatten()
    b = _regions_offset((8, 12), 4, 2).flatten()
    # the same partition of the tokens (labels may be numbered differently)
    assert torch.equal(a[:, None] == a[None], b[:, None] == b[None])


def test_shifted_polarity_translation_consistent():
    """Translating the content by a whole window translates the output of a
    shifted block (regions are aligned to the image, not wrapped around),
    and content at the bottom/right border never reaches the top/left."""
    torch.manual_seed(0)
    w, s, H, W = 4, 2, 10, 13
    blk = PolaSwinBlock(8, 2, (w, w), shift=True, attn_type='L').eval()
    _randomise(blk)
    y = torch.randn(1, H + w, W + w, 8)
    with torch.no_grad():
        big = blk(y.flatten(1, 2), (H + w, W + w)).view(1, H + w, W + w, 8)
        small = blk(y[:, w:, w:].flatten(1, 2), (H, W)).view(1, H, W, 8)
        torch.testing.assert_close(big[:, w + s:, w + s:], small[:, s:, s:],
                                   rtol=1e-5, atol=1e-5)
        y2 = y.clone()
        y2[:, -3:, :] += 5
        y2[:, :, -3:] += 5
        big2 = blk(y2.flatten(1, 2), (H + w, W + w)).view(1, H + w, W + w, 8)
    # (a cyclic roll without mask would put these tokens in one window)
    assert torch.equal(big2[:, :s, :s], big[:, :s, :s])


def test_shift_is_zero_when_window_covers_map():
    """At 224 the authors' polarity stages never shift: same output for the
    shifted and the unshifted block."""
    torch.manual_seed(0)
    a = PolaSwinBlock(8, 2, (7, 7), shift=False, attn_type='L')
    b = PolaSwinBlock(8, 2, (7, 7), shift=True, attn_type='L')
    _randomise(a)
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 49, 8)
    torch.testing.assert_close(a(x, (7, 7)), b(x, (7, 7)))


def test_softmax_window_padding_masks_keys():
    """Softmax windows: padded keys are masked, so a window with padding
    equals the attention on its real tokens only (sub-table of offsets)."""
    torch.manual_seed(0)
    msa = WindowMSA(8, 2, (4, 4))
    _randomise(msa)
    x = torch.randn(1, 3, 4, 8)
    blk = PolaSwinBlock(8, 2, (4, 4), shift=False, attn_type='S')
    blk.attn.load_state_dict(msa.state_dict())
    big = torch.randn(1, 6, 4, 8)  # 6 rows: second window has 2 real rows
    big[:, 4:] = x[:, :2]
    with torch.no_grad():
        got = blk._softmax(big.flatten(1, 2), (6, 4)).view(1, 6, 4, 8)[:, 4:]
        ref = msa(x[:, :2].reshape(1, 8, 8), (2, 4)).view(1, 2, 4, 8)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_softmax_shift_matches_swin_reference():
    """The 'S' block reproduces Swin's masked cyclic shift at a multiple of
    the window (the 224 case of stage 3)."""
    torch.manual_seed(0)
    blk = PolaSwinBlock(8, 2, (4, 4), shift=True, attn_type='S')
    _randomise(blk.attn)
    x = torch.randn(1, 8 * 8, 8)
    with torch.no_grad():
        got = blk._softmax(x, (8, 8))
        xm = cyclic_shift(x.view(1, 8, 8, 8), (2, 2))
        mask = shift_region_mask((8, 8), (4, 4), (2, 2))
        y = blk.attn(window_partition(xm, (4, 4)), (4, 4), mask)
        y = cyclic_shift(window_reverse(y, (4, 4), (8, 8)), (2, 2), True)
    torch.testing.assert_close(got, y.reshape(1, 64, 8))
    assert key_valid_mask(valid_token_map((8, 8), (0, 0, 0, 0)),
                          (4, 4)).all()


@pytest.mark.parametrize('hw', list(itertools.product([3, 9], [5, 12])))
def test_polarity_block_any_size(hw):
    blk = PolaSwinBlock(8, 2, (4, 4), shift=True, attn_type='L')
    x = torch.randn(2, hw[0] * hw[1], 8)
    assert blk(x, hw).shape == x.shape


@pytest.mark.parametrize('with_bias', [True, False])
def test_depthwise_conv_gradients(with_bias):
    """The depth-wise conv's own backward (bias gradient as a sum) gives
    F.conv2d's gradients, float64 gradcheck included, on a channels-last
    map as PolarityAttention feeds it."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 6, 4, dtype=torch.float64).permute(0, 3, 1, 2)
    x.requires_grad_()
    w = torch.randn(4, 1, 3, 3, dtype=torch.float64, requires_grad=True)
    b = (torch.randn(4, dtype=torch.float64, requires_grad=True)
         if with_bias else None)
    args = (x, w, b) if with_bias else (x, w)

    def ours(*a):
        return depthwise_conv2d(a[0], a[1], a[2] if with_bias else None,
                                (1, 1))

    def ref(*a):
        return F.conv2d(a[0], a[1], a[2] if with_bias else None,
                        padding=1, groups=4)

    grad = torch.randn(2, 4, 5, 6, dtype=torch.float64)
    got = torch.autograd.grad(ours(*args), args, grad)
    want = torch.autograd.grad(ref(*args), args, grad)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r)
    assert torch.autograd.gradcheck(ours, args)
