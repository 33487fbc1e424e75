"""Non-finite inputs: the polarity attention op (its kernel and its plain
reference) given NaN or Inf, and whole backbones fed an image with a NaN or
Inf pixel: non-finite values come out where they went in, never a
finite-looking result, a hang or a crash."""
import pytest
import torch
from helpers import PVT_TINY, SWIN_TINY_DEPTH2, randomise_attention

from pola_mm.models.backbones.pola_pvt import PolaPVT
from pola_mm.models.backbones.pola_swin import PolaSwinTransformer
from pola_mm.ops import dispatch, polarity_attention

pytestmark = pytest.mark.slow

NAN, INF = float('nan'), float('inf')


def _op(q, k, v, scale, power, fast):
    if fast:
        return polarity_attention(q, k, v, scale, power, 4.0)
    with dispatch.use_implementation('graph'):
        return polarity_attention(q, k, v, scale, power, 4.0)


@pytest.mark.parametrize('value', [NAN, INF, -INF], ids=['nan', 'inf',
                                                         '-inf'])
@pytest.mark.parametrize('where', ['q', 'k'])
def test_kernel_keeps_non_finite_where_the_reference_does(value, where):
    """One bad entry in a query spoils that token's output only; in a key
    it spoils every output (all queries read the key sum). The kernel and
    the plain reference agree on where, and on every finite value."""
    g = torch.Generator().manual_seed(0)
    B, h, N, d = 1, 2, 100, 16
    q, k, v = (torch.randn(B, N, h, d, generator=g).transpose(1, 2)
               for _ in range(3))
    scale = torch.randn(1, h, 1, d, generator=g) * 0.3
    power = torch.randn(1, h, 1, d, generator=g)
    (q if where == 'q' else k)[0, 0, 3, 5] = value
    fused = _op(q, k, v, scale, power, True)
    plain = _op(q, k, v, scale, power, False)
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
        with dispatch.use_implementation('graph'):
            plain = model(x)
    model.train()
    xt = x.clone().requires_grad_()
    trained = model(xt)
    sum(o.sum() for o in trained).backward()
    for outs in (fast, plain, trained):
        assert all(torch.isnan(o).all() for o in outs)
    assert torch.isnan(xt.grad).any()
