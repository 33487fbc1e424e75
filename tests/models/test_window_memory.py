"""Shifted-window attention in eager mode keeps its masks broadcast over the
batch and skips a pad of zeros; a captured graph keeps both, branch-free,
and computes the same at every size."""
import importlib
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as tnf
from helpers import count_calls, randomise

import pola_mm.models.layers.window as window_mod
import pola_mm.models.layers.window_attention as window_attention_mod
from pola_mm.models.layers import WindowMSA
from pola_mm.ops import softmax_attention, use_implementation
from pola_mm.ops.softmax_attention import softmax_attention_pytorch


def _msa(shift=True):
    torch.manual_seed(0)
    msa = WindowMSA(16, 4, (7, 7), shift=shift).double().eval()
    randomise(msa)
    return msa


def _spy_op(monkeypatch):
    """Record the shapes of ``q`` and of the bias the layer hands the op."""
    seen = []
    original = window_attention_mod.softmax_attention

    def spy(q, k, v, scale, bias=None, dropout_p=0.):
        seen.append((tuple(q.shape), tuple(bias.shape)))
        return original(q, k, v, scale, bias, dropout_p)

    monkeypatch.setattr(window_attention_mod, 'softmax_attention', spy)
    return seen


@pytest.mark.parametrize('shift', [False, True])
@pytest.mark.parametrize('fast', [True, False])
def test_eager_masks_are_broadcast_not_tiled(monkeypatch, shift, fast):
    """Three images: the op gets ``(B, nW, ...)`` queries and one bias for
    all images (``nW`` windows, or 1 where nothing is masked), and each
    image's output equals that image run alone."""
    msa = _msa(shift)
    hw, B = (13, 19), 3  # padded to 14 x 21: 2 x 3 windows
    x = torch.randn(B, hw[0] * hw[1], 16, dtype=torch.float64)
    seen = _spy_op(monkeypatch)
    sdpa_masks = []
    original_sdpa = tnf.scaled_dot_product_attention

    def sdpa(*args, attn_mask=None, **kwargs):
        sdpa_masks.append(tuple(attn_mask.shape))
        return original_sdpa(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(tnf, 'scaled_dot_product_attention', sdpa)
    with torch.no_grad():
        if fast:
            y = msa(x, hw)
            alone = torch.cat([msa(x[i:i + 1], hw) for i in range(B)])
        else:
            with use_implementation('graph'):
                y = msa(x, hw)
                alone = torch.cat([msa(x[i:i + 1], hw) for i in range(B)])
    q_shape, bias_shape = seen[0]
    assert q_shape == (B, 6, 4, 49, 4)
    # shifted: Swin's region mask per window; unshifted with padded keys
    # attended (mmdet's rule): no mask at all, the relative bias alone
    assert bias_shape == ((6, 4, 49, 49) if shift else (1, 4, 49, 49))
    if fast and shift:  # one fused call per image, the windows' masks
        assert sdpa_masks[:B] == [bias_shape] * B
    elif fast:  # one call for all images, the relative bias alone, 4-D
        # (PyTorch's fused CPU kernel takes no 3-D mask)
        assert sdpa_masks[0] == (1, *bias_shape[1:])
        # the next call: one image
        assert sdpa_masks[1] == (1, *bias_shape[1:])
    else:
        assert not sdpa_masks
    torch.testing.assert_close(y, alone, rtol=1e-12, atol=1e-12)


def test_eager_masks_padded_keys_of_one_window_only(monkeypatch):
    """A map smaller than the window (one window) masks its padded keys;
    a larger map that is not a multiple of the window attends to its zero
    padding as mmdet's Swin (no key mask), and a multiple of the window,
    not shifted, has no mask either."""
    msa = _msa(shift=False)
    masked = []
    original = window_attention_mod.softmax_attention

    def spy(q, k, v, scale, bias=None, dropout_p=0.):
        masked.append((tuple(bias.shape), bool((bias <= -100).any())))
        return original(q, k, v, scale, bias, dropout_p)

    monkeypatch.setattr(window_attention_mod, 'softmax_attention', spy)
    with torch.no_grad():
        msa(torch.randn(2, 5 * 6, 16, dtype=torch.float64), (5, 6))
        msa(torch.randn(2, 13 * 19, 16, dtype=torch.float64), (13, 19))
        msa(torch.randn(2, 14 * 21, 16, dtype=torch.float64), (14, 21))
    assert masked == [((1, 4, 49, 49), True), ((1, 4, 49, 49), False),
                      ((1, 4, 49, 49), False)]


@pytest.mark.parametrize('hw,pads', [((14, 21), 0), ((13, 19), 1),
                                     ((14, 19), 1)])
def test_eager_skips_a_pad_of_zeros(monkeypatch, hw, pads):
    """``F.pad`` runs only where the map is not a multiple of the window,
    and the unpadded map gives what padding by zeros gives."""
    msa = _msa(shift=True)
    x = torch.randn(2, hw[0] * hw[1], 16, dtype=torch.float64)
    calls = count_calls(monkeypatch, window_mod.F, 'pad')
    with torch.no_grad():
        y = msa(x, hw)
    assert len(calls) == pads
    assert window_mod.pad_map(torch.ones(1, 2, 2, 1), (0, 0, 0, 0)).shape \
        == (1, 2, 2, 1)
    assert window_mod.pad_map(torch.ones(1, 2, 2, 1), (0, 1, 0, 2)).shape \
        == (1, 3, 4, 1)
    # a traced size of 0 still pads (a graph keeps its pad)
    zero = torch.tensor(0)
    assert not window_mod.known_zeros((0, zero, 0, 0))
    assert window_mod.known_zeros((0, 0))
    assert y.shape == x.shape


class _OnImage(nn.Module):
    """``(B, C, H, W)`` image in, the block's tokens out: sizes from the
    input's shape, as a backbone gives them (traced sizes when traced)."""

    def __init__(self, msa: WindowMSA) -> None:
        super().__init__()
        self.msa = msa

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        B, C, H, W = img.shape
        return self.msa(img.flatten(2).transpose(1, 2), (H, W))


def test_traced_at_a_multiple_of_the_window_pads_at_other_sizes():
    """Traced where nothing is padded, unshifted or masked in eager mode
    (14 x 21, window 7), the graph keeps the pad, shift and masks
    branch-free and equals eager mode at sizes that need them, and at a
    batch the trace did not see."""
    msa = _msa(shift=True)
    wrapped = _OnImage(msa)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        traced = torch.jit.trace(
            wrapped, torch.randn(2, 16, 14, 21, dtype=torch.float64),
            check_trace=False)
    for shape in [(2, 16, 14, 21), (2, 16, 13, 19), (3, 16, 17, 12),
                  (1, 16, 5, 6)]:
        img = torch.randn(*shape, dtype=torch.float64)
        with torch.no_grad():
            torch.testing.assert_close(traced(img), wrapped(img),
                                       rtol=1e-10, atol=1e-10)
    graph = str(traced.inlined_graph)
    assert 'aten::pad' in graph or 'aten::constant_pad_nd' in graph
    assert 'aten::expand' in graph  # the bias expanded to the batch


@pytest.mark.parametrize('fast', [True, False])
def test_op_broadcasts_a_shared_bias(monkeypatch, fast):
    """The op on ``(B, nW, h, N, d)`` with an ``(nW, h, N, M)`` bias equals
    the 4-D product with the bias tiled over the batch, eager (fused or
    reference) and traced (traced at one batch, run at another)."""
    torch.manual_seed(0)
    B, nW, h, N, d = 3, 4, 2, 9, 5
    q, k, v = (torch.randn(B, nW, h, N, d, dtype=torch.float64)
               for _ in range(3))
    bias = torch.randn(nW, h, N, N, dtype=torch.float64)
    tiled = softmax_attention_pytorch(
        q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), 0.4,
        bias.repeat(B, 1, 1, 1)).view(B, nW, h, N, d)
    if fast:
        y = softmax_attention(q, k, v, 0.4, bias)
    else:
        with use_implementation('graph'):
            y = softmax_attention(q, k, v, 0.4, bias)
    torch.testing.assert_close(y, tiled, rtol=1e-12, atol=1e-12)

    def op(q, k, v):
        return softmax_attention(q, k, v, 0.4, bias)

    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        traced = torch.jit.trace(op, (q[:2], k[:2], v[:2]),
                                 check_trace=False)
    torch.testing.assert_close(traced(q, k, v), tiled, rtol=1e-12,
                               atol=1e-12)


def test_fused_training_expands_the_bias_once(monkeypatch):
    """Where autograd records (the GPU's training path) several images run
    in one fused call with the bias expanded to the batch, not one call per
    image whose outputs would all be kept; values and gradients equal the
    reference's."""
    # the module (the package's attribute of that name is the op)
    op_mod = importlib.import_module('pola_mm.ops.softmax_attention')
    torch.manual_seed(0)
    B, nW, h, N, d = 2, 3, 2, 6, 4
    qkv = torch.randn(3, B, nW, h, N, d, dtype=torch.float64,
                      requires_grad=True)
    bias = torch.randn(nW, h, N, N, dtype=torch.float64)
    masks = []
    original = tnf.scaled_dot_product_attention

    def sdpa(*args, attn_mask=None, **kwargs):
        masks.append(tuple(attn_mask.shape))
        return original(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(tnf, 'scaled_dot_product_attention', sdpa)
    fused = op_mod._sdpa(*qkv, 0.3, bias, 0.)
    assert masks == [(B * nW, h, N, N)]
    ref = softmax_attention_pytorch(*qkv, 0.3, bias)
    torch.testing.assert_close(fused, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(ref)
    (gf,) = torch.autograd.grad(fused, qkv, g)
    (gr,) = torch.autograd.grad(ref, qkv, g)
    torch.testing.assert_close(gf, gr, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('hw,pads', [((16, 24), 0), ((15, 24), 1)])
def test_patch_embedding_and_merging_skip_a_pad_of_zeros(monkeypatch, hw,
                                                         pads):
    """Patch embedding (stride 4) and patch merging pad only a map that
    needs it in eager mode, and equal padding by zeros either way; traced
    at a size that needs no pad, the graph still pads at one that does."""
    from pola_mm.models.layers import embed as embed_mod
    x = torch.randn(2, 3, *hw, dtype=torch.float64)
    want = tnf.pad(x, (0, (-hw[1]) % 4, 0, (-hw[0]) % 4))
    tokens = x.flatten(2).transpose(1, 2).contiguous()
    merge = embed_mod.PatchMerging(3).double()
    # embed.F and window.F are torch.nn.functional: one counter for both
    calls = count_calls(monkeypatch, embed_mod.F, 'pad')
    y = embed_mod.pad_for_stride(x, 4, True)
    assert len(calls) == pads
    if not pads:
        assert y is x  # no copy
    out, out_hw = merge(tokens, hw)
    assert len(calls) == 2 * pads
    assert torch.equal(y, want)
    assert out_hw == (-(-hw[0] // 2), -(-hw[1] // 2))

    def pad_then_embed(img):
        return embed_mod.pad_for_stride(img, 4, True)

    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        traced = torch.jit.trace(pad_then_embed,
                                 torch.randn(1, 3, 16, 24,
                                             dtype=torch.float64))
    odd = torch.randn(1, 3, 15, 21, dtype=torch.float64)
    assert torch.equal(traced(odd), tnf.pad(odd, (0, 3, 0, 1)))
