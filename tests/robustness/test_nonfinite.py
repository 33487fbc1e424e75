"""Non-finite inputs: the fused CPU loop (pola_mm/ops/csrc) called
directly with NaN, Inf, subnormals and zeros, the polarity attention op
with and without it, and whole backbones fed an image with a NaN or Inf
pixel: non-finite values come out where they went in, never a
finite-looking result, a hang or a crash."""
import pytest
import torch
from helpers import PVT_TINY, SWIN_TINY_DEPTH2, randomise_attention

from pola_mm.models.backbones.pola_pvt import PolaPVT
from pola_mm.models.backbones.pola_swin import PolaSwinTransformer
from pola_mm.ops import dispatch
from pola_mm.ops import polarity_attention
from pola_mm.ops.cpu_ext import CPU_EXT_ENV, cpu_ext

NAN, INF = float('nan'), float('inf')
#: one row of special values (d = 8): NaN, +-Inf, +-subnormal, +-0, 1
SPECIAL = torch.tensor([NAN, INF, -INF, 1e-40, -1e-40, 0.0, -0.0, 1.0])


@pytest.fixture(scope='module')
def ext():
    mod = cpu_ext()
    assert mod is not None, 'the fused CPU loops must build here'
    return mod


def _features_direct(ext, x, p):
    """``ext.features`` on ``x`` ``(1, 1, n, d)`` with unit scale."""
    d = x.shape[-1]
    f = torch.empty(1, 1, x.shape[2], 2 * d)
    none = torch.empty(0)
    ext.features(x, torch.ones(1, d), p, none, f, none)
    return f


def test_fused_features_of_special_values(ext):
    """NaN gives NaN features, +-Inf infinite ones (never the clamped
    finite 2^127 of the polynomial exp2), subnormals and zeros give 0 in
    both halves, 1 gives 1 in the positive half."""
    d = SPECIAL.numel()
    x = SPECIAL.reshape(1, 1, 1, d).repeat(1, 1, 3, 1).contiguous()
    f = _features_direct(ext, x, torch.full((1, d), 2.5))[0, 0, 0]
    pos, neg = f[:d], f[d:]
    assert torch.isnan(neg[0])
    assert pos[1] == INF and neg[1] == 0
    assert pos[2] == 0 and neg[2] == INF
    assert (f[[3, 4, 5, 6, 3 + d, 4 + d, 5 + d, 6 + d]] == 0).all()
    assert pos[7] == 1 and neg[7] == 0


def _kernel(q, k, v, scale, power, fused, monkeypatch):
    monkeypatch.setenv(CPU_EXT_ENV, '1' if fused else '0')
    return polarity_attention(q, k, v, scale, power, 4.0)


@pytest.mark.parametrize('value', [NAN, INF, -INF], ids=['nan', 'inf',
                                                         '-inf'])
@pytest.mark.parametrize('where', ['q', 'k'])
def test_kernel_keeps_non_finite_where_the_torch_kernel_does(
        ext, monkeypatch, value, where):
    """One bad entry in a query spoils that token's output only; in a key
    it spoils every output (all queries read the key sum). The kernel with
    the fused loop and without it agree on where, and on every finite
    value."""
    g = torch.Generator().manual_seed(0)
    B, h, N, d = 1, 2, 100, 16
    q, k, v = (torch.randn(B, N, h, d, generator=g).transpose(1, 2)
               for _ in range(3))
    scale = torch.randn(1, h, 1, d, generator=g) * 0.3
    power = torch.randn(1, h, 1, d, generator=g)
    (q if where == 'q' else k)[0, 0, 3, 5] = value
    fused = _kernel(q, k, v, scale, power, True, monkeypatch)
    plain = _kernel(q, k, v, scale, power, False, monkeypatch)
    bad = ~torch.isfinite(fused)
    assert torch.equal(bad, ~torch.isfinite(plain))
    if where == 'q':
        assert bad[0, 0, 3].all() and bad.sum() == d
    else:
        assert bad[0, 0].all() and not bad[0, 1].any()
    torch.testing.assert_close(fused[~bad], plain[~bad], rtol=2e-5,
                               atol=2e-5)


@pytest.mark.parametrize('cls,arch', [(PolaSwinTransformer, SWIN_TINY_DEPTH2),
                                      (PolaPVT, PVT_TINY)],
                         ids=['swin', 'pvt'])
@pytest.mark.parametrize('value', [NAN, INF], ids=['nan', 'inf'])
def test_backbone_with_a_bad_pixel_gives_nan_maps(cls, arch, value):
    """One NaN or Inf pixel: every output map is NaN (the attention is
    global over each stage), on the CPU fast path, the plain model and in
    training with gradients: a clear sign, no exception, no hang."""
    model = cls(arch=arch)
    model.init_weights()
    randomise_attention(model)
    x = torch.randn(1, 3, 33, 47, generator=torch.Generator().manual_seed(0))
    x[0, 1, 5, 5] = value
    model.eval()
    with torch.no_grad():
        fast = model(x)
        with dispatch.plain_paths():
            plain = model(x)
    model.train()
    xt = x.clone().requires_grad_()
    trained = model(xt)
    sum(o.sum() for o in trained).backward()
    for outs in (fast, plain, trained):
        assert all(torch.isnan(o).all() for o in outs)
    assert torch.isnan(xt.grad).any()
