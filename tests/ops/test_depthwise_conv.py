"""The depth-wise conv on a strided view (``ops/depthwise_conv.py``): what
the polarity attention passes it (v, a channel slice of the projection's
output) is kept for backward as it is, never as a copy, on the GPU code
path (meta tensors) and in the CPU training function, with the gradients
of the conv of a dense copy."""
import pytest
import torch
import torch.nn.functional as F

from pola_mm.ops.depthwise_conv import depthwise_conv2d

from helpers import saved_storages


def _strided_v(device: str, requires_grad: bool = True):
    """v as ``mix`` passes it: ``(B, C, H, W)`` channels-last view of the
    third quarter of a ``(B, H*W, 4C)`` projection output."""
    B, H, W, C = 2, 6, 7, 8
    proj = torch.randn(B, H * W, 4 * C, device=device,
                       requires_grad=requires_grad)
    v = proj[..., 2 * C:3 * C].reshape(B, H, W, C).permute(0, 3, 1, 2)
    assert not v.is_contiguous(memory_format=torch.channels_last)
    return proj, v


@pytest.mark.parametrize('device,fast', [('meta', True), ('cpu', True),
                                         ('cpu', False)])
def test_strided_input_saved_without_copy(device, fast):
    """With ``lean`` (a training call's ``Path.autograd``), only the
    projection output's storage and the parameters are kept; the CPU's
    plain conv keeps a dense copy."""
    proj, v = _strided_v(device)
    weight = torch.randn(8, 1, 3, 3, device=device, requires_grad=True)
    bias = torch.randn(8, device=device, requires_grad=True)
    _, saved = saved_storages(depthwise_conv2d, v, weight, bias, (1, 1),
                              fast)
    saved = {s for s, _ in saved}
    own = {t.untyped_storage()._cdata for t in (proj, weight, bias)}
    if fast:
        assert saved <= own and proj.untyped_storage()._cdata in saved
    else:
        assert saved - own  # the plain CPU conv keeps its dense copy


def test_strided_input_gradients_equal_dense_copy():
    """CPU training function on the strided view: outputs and gradients of
    ``F.conv2d`` on a dense copy (float64)."""
    torch.manual_seed(0)
    proj, v = _strided_v('cpu')
    proj = proj.detach().double().requires_grad_()
    v = proj[..., 16:24].reshape(2, 6, 7, 8).permute(0, 3, 1, 2)
    weight = torch.randn(8, 1, 5, 3, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(8, dtype=torch.float64, requires_grad=True)
    y = depthwise_conv2d(v, weight, bias, (2, 1), lean=True)
    assert y.grad_fn.name() == '_DepthwiseConv2dBackward'
    ref = F.conv2d(v.contiguous(), weight, bias, padding=(2, 1), groups=8)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn(y.shape, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(y, [proj, weight, bias], g),
                    torch.autograd.grad(ref, [proj, weight, bias], g)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('device', ['meta', 'cpu'])
def test_low_precision_input_kept_as_given(device):
    """A bf16 view with a float32 weight (v under autocast): the result is
    the float32 conv of its float32 copy, only the bf16 storage is kept,
    and the input gradient comes back in bf16."""
    proj, v = _strided_v(device)
    proj = proj.detach().to(torch.bfloat16).requires_grad_()
    v = proj[..., 16:24].reshape(2, 6, 7, 8).permute(0, 3, 1, 2)
    weight = torch.randn(8, 1, 3, 3, device=device, requires_grad=True)
    bias = torch.randn(8, device=device, requires_grad=True)
    y, saved = saved_storages(depthwise_conv2d, v, weight, bias, (1, 1),
                              True)
    saved = {s for s, _ in saved}
    own = {t.untyped_storage()._cdata for t in (proj, weight, bias)}
    assert saved <= own and proj.untyped_storage()._cdata in saved
    assert y.dtype == torch.float32
    (dproj, ) = torch.autograd.grad(y.sum(), [proj])
    assert dproj.dtype == torch.bfloat16
    if device == 'cpu':
        ref = F.conv2d(v.float(), weight, bias, padding=(1, 1), groups=8)
        torch.testing.assert_close(y, ref, rtol=0, atol=0)
