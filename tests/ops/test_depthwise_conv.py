"""The depth-wise conv op (:func:`pola_mm.ops.depthwise_conv2d`) on a
strided view, what the polarity attention passes it (v, a channel slice of
the projection's output): in training under autocast (a fp16/bf16 view, a
float32 weight) its fast function keeps the view as given, never a float32
copy, on the GPU code path (meta tensors) and on the CPU, with the values
and gradients of its plain reference; in CPU inference it convolves a dense
copy, with the reference's values."""
import pytest
import torch
import torch.nn.functional as F
from helpers import count_calls, saved_storages

from pola_mm.ops import use_implementation
from pola_mm.ops.depthwise_conv import (_DepthwiseConv2d, depthwise_conv2d,
                                        depthwise_conv2d_pytorch)


def _strided_v(device: str, dtype=torch.float32):
    """v as the attention passes it: ``(B, C, H, W)`` view of the third
    quarter of a ``(B, H*W, 4C)`` projection output (not contiguous in
    either memory format)."""
    B, H, W, C = 2, 6, 7, 8
    proj = torch.randn(B, H * W, 4 * C, device=device).to(dtype)
    proj.requires_grad_()
    v = proj[..., 2 * C:3 * C].transpose(1, 2).reshape(B, C, H, W)
    return proj, v


def _params(device: str, dtype=torch.float32, k=3):
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(8, 1, k, k, generator=g).to(device, dtype)
    bias = torch.randn(8, generator=g).to(device, dtype)
    return weight.requires_grad_(), bias.requires_grad_()


@pytest.mark.parametrize('device', ['meta', 'cpu'])
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_low_precision_view_kept_as_given(device, dtype):
    """A bf16/fp16 view with a float32 weight (v under autocast): the fast
    function runs, the result is the float32 conv of its float32 copy, only
    the low-precision storage is kept, and the input gradient comes back
    in the input's dtype."""
    proj, v = _strided_v(device, dtype)
    weight, bias = _params(device)
    y, saved = saved_storages(depthwise_conv2d, v, weight, bias, (1, 1))
    assert y.grad_fn.name() == '_DepthwiseConv2dBackward'
    saved = {s for s, _ in saved}
    own = {t.untyped_storage()._cdata for t in (proj, weight, bias)}
    assert saved <= own and proj.untyped_storage()._cdata in saved
    assert y.dtype == torch.float32
    (dproj, ) = torch.autograd.grad(y.sum(), [proj])
    assert dproj.dtype == dtype


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('k,padding', [(3, (1, 1)), (5, (2, 2))])
def test_low_precision_fast_function_equals_reference(dtype, k, padding):
    """The fast function against the plain reference on the same
    low-precision view (fast paths off): identical outputs and input
    gradients, the weight's and bias's equal up to float32 rounding (the
    bias gradient is summed in another order)."""
    results = []
    for plain in (False, True):
        torch.manual_seed(0)
        proj, v = _strided_v('cpu', dtype)
        weight, bias = _params('cpu', k=k)
        with (use_implementation('graph') if plain else torch.enable_grad()):
            y = depthwise_conv2d(v, weight, bias, padding)
        assert (y.grad_fn.name() == '_DepthwiseConv2dBackward') != plain
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
        results.append([y] + list(torch.autograd.grad(y, [proj, weight,
                                                          bias], g)))
    for i, (a, b) in enumerate(zip(*results)):
        assert a.dtype == b.dtype
        tol = 0 if i < 2 else 1e-5 * float(b.abs().max())
        torch.testing.assert_close(a, b, rtol=0, atol=tol)


@pytest.mark.parametrize('with_bias', [True, False])
def test_function_gradcheck_float64(with_bias):
    """The fast function's backward (``convolution_backward``, bias as a
    sum) by float64 gradcheck on a strided view."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 6, 4, dtype=torch.float64).permute(0, 3, 1, 2)
    x.requires_grad_()
    w = torch.randn(4, 1, 3, 3, dtype=torch.float64, requires_grad=True)
    b = (torch.randn(4, dtype=torch.float64, requires_grad=True)
         if with_bias else None)
    assert torch.autograd.gradcheck(
        lambda x, w, b: _DepthwiseConv2d.apply(x, w, b, (1, 1)), (x, w, b),
        fast_mode=True)


def test_float32_training_keeps_the_view():
    """float32 training (no autocast) runs the one fast function too, which
    on the GPU code path keeps the strided view itself (no copy) for
    backward, as the plain conv does."""
    proj, v = _strided_v('meta')
    weight, bias = _params('meta')
    y, saved = saved_storages(depthwise_conv2d, v, weight, bias, (1, 1))
    assert y.grad_fn.name() == '_DepthwiseConv2dBackward'
    own = {t.untyped_storage()._cdata for t in (proj, weight, bias)}
    assert {s for s, _ in saved} <= own


def test_cpu_inference_convolves_a_dense_copy(monkeypatch):
    """In CPU inference a strided view is convolved as a channels-last copy
    (the reference's values); with the fast paths off, as it is."""
    import pola_mm.ops.depthwise_conv as module
    dense = count_calls(monkeypatch, module, '_dense')
    _, v = _strided_v('cpu')
    weight, bias = _params('cpu', k=5)
    with torch.no_grad():
        y = depthwise_conv2d(v, weight, bias, (2, 2))
        assert len(dense) == 1
        with use_implementation('graph'):
            ref = depthwise_conv2d(v, weight, bias, (2, 2))
        assert len(dense) == 1
        torch.testing.assert_close(
            ref, depthwise_conv2d_pytorch(v, weight, bias, (2, 2)),
            rtol=0, atol=0)
        torch.testing.assert_close(
            y, F.conv2d(v.contiguous(), weight, bias, padding=2, groups=8),
            rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-6)
