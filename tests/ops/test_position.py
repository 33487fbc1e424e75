"""The positional tables' resize (:mod:`pola_mm.ops.position`): the
separable matrices give ``F.interpolate``'s values and gradients (no
``upsample_bicubic2d_backward``), and inference keeps a resized table per
grid until the table changes."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from pola_mm.ops import position, resize_pos_table


def _interpolate(table, ref_hw, hw, mode):
    """``F.interpolate`` on the grid, the arbiter (float64)."""
    grid = table.reshape(1, *ref_hw, -1).permute(0, 3, 1, 2)
    out = F.interpolate(grid, size=hw, mode=mode, align_corners=False)
    return out.flatten(2).transpose(1, 2)


SIZES = [((7, 7), (9, 11)), ((56, 56), (200, 336)), ((14, 14), (5, 3)),
         ((4, 5), (1, 1)), ((1, 3), (4, 7)), ((12, 12), (12, 13))]


@pytest.mark.parametrize('mode', ['bicubic', 'bilinear'])
@pytest.mark.parametrize('ref_hw,hw', SIZES)
def test_matrices_equal_interpolate(mode, ref_hw, hw):
    """Up- and down-sampling, odd and single-pixel grids: float64 equal to
    F.interpolate's at rounding; float32 within 1e-6 of its exact values."""
    g = torch.Generator().manual_seed(0)
    table = torch.randn(1, ref_hw[0] * ref_hw[1], 8, generator=g,
                        dtype=torch.float64)
    want = _interpolate(table, ref_hw, hw, mode)
    got64 = position._separable_resize(table, ref_hw, hw, mode)
    torch.testing.assert_close(got64, want, rtol=0, atol=1e-12)
    # float32: within 1e-6 of F.interpolate's exact values, and no farther
    # from them than F.interpolate's own float32 (whose source coordinates
    # in float32 are off by up to 2e-5 at 56 -> 336)
    got32 = position._separable_resize(table.float(), ref_hw, hw, mode)
    own32 = _interpolate(table.float(), ref_hw, hw, mode)
    err = (got32.double() - want).abs().max()
    assert err <= 1e-6
    assert err <= max((own32.double() - want).abs().max(), 5e-7)
    assert got32.is_contiguous()


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize('mode', ['bicubic', 'bilinear'])
def test_training_gradient_equals_interpolate_without_atomic_backward(mode):
    table = torch.randn(1, 56 * 56, 16, dtype=torch.float64,
                        requires_grad=True)
    dy = torch.randn(1, 60 * 84, 16, dtype=torch.float64)
    with _Ops() as ops:
        out = resize_pos_table(table, (56, 56), (60, 84), mode)
        (got, ) = torch.autograd.grad(out, table, dy)
    assert not any(n.startswith('upsample') for n in ops.names), ops.names
    (want, ) = torch.autograd.grad(
        _interpolate(table, (56, 56), (60, 84), mode), table, dy)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-11)


def test_inference_cache_per_grid_invalidated_by_a_change():
    t = torch.nn.Parameter(torch.randn(1, 49, 8))
    with torch.no_grad():
        a = resize_pos_table(t, (7, 7), (9, 11))
        b = resize_pos_table(t, (7, 7), (10, 12))
        assert resize_pos_table(t, (7, 7), (9, 11)) is a  # both kept
        assert resize_pos_table(t, (7, 7), (10, 12)) is b
        t.mul_(2)
        c = resize_pos_table(t, (7, 7), (9, 11))
        assert c is not a
        torch.testing.assert_close(c, 2 * a)
        for i in range(position.CACHED_GRIDS + 3):  # bounded
            resize_pos_table(t, (7, 7), (20 + i, 20))
        assert len(t._pola_resized[1]) == position.CACHED_GRIDS


def test_matrices_cached_per_device_and_dtype():
    a = position.resize_matrix(7, 9, 'bicubic', torch.device('cpu'),
                               torch.float32)
    assert position.resize_matrix(7, 9, 'bicubic', torch.device('cpu'),
                                  torch.float32) is a
    b = position.resize_matrix(7, 9, 'bicubic', torch.device('cpu'),
                               torch.float64)
    assert b.dtype == torch.float64 and b is not a
    # rows are partitions of unity (each output a weighted mean)
    torch.testing.assert_close(b.sum(1), torch.ones(9, dtype=torch.float64))
