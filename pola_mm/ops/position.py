"""Resizing of learned position tables to other grids: the op.

:func:`resize_pos_table` resizes a ``(1, Hr * Wr, C)`` table to an
``H x W`` grid with the weights of ``F.interpolate(mode=...,
align_corners=False)``. Its fast path writes the resize as two small
products with separable interpolation matrices (:func:`resize_matrix`,
cached per size, device and dtype): the same weights and border handling
as ``F.interpolate``, but forward and backward are products, without the
atomic additions of ``upsample_bicubic2d_backward``. Where no gradient is
needed it keeps the resized table per grid and reuses it until the table
changes.

With the fast paths off and while a graph is captured the table goes
through ``F.interpolate`` (:func:`resize_pos_table_pytorch`), on every call
and also at its own size (an exact identity for both modes), to the grid
it is given: in a traced graph (the TorchScript ONNX exporter, MMDeploy)
that grid comes from the tensors' shapes, so the exported ``Resize`` takes
its size from the graph's input and a file with a dynamic height/width
resizes to the size it is run at.
"""
import functools

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..type_aliases import Size2
from . import observers
from .dispatch import capturing, records_grad, use_fast

__all__ = ['resize_pos_table', 'resize_pos_table_pytorch', 'resize_matrix',
           'resize_weights', 'check_resize_mode', 'RESIZE_MODES']


#: Interpolation modes a table may be resized with.
RESIZE_MODES = ('bicubic', 'bilinear')


def check_resize_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`RESIZE_MODES`, else a clear error."""
    if mode not in RESIZE_MODES:
        raise ValueError(f'interpolate_mode must be one of {RESIZE_MODES} '
                         f'(how learned position tables are resized to '
                         f'other stage maps), got {mode!r}')
    return mode


@observers.reports_calls
def resize_pos_table(table: Tensor, ref_hw: Size2, hw: Size2,
                     mode: str = 'bicubic') -> Tensor:
    """Resize a learned ``(1, Hr * Wr, C)`` token table to ``(1, H * W, C)``.

    ``mode`` (``'bicubic'`` or ``'bilinear'``), ``align_corners=False``, on
    the 2-D grid; the table itself is returned at its reference size. The
    fast path computes it as two products with :func:`resize_matrix`; where
    no gradient is needed (inference, frozen tables) the resized table is
    cached on ``table`` per ``hw`` until the table changes (in place or by
    a move), and must not be modified in place. While a graph is captured
    the table is always resized by ``F.interpolate`` (no comparison of
    sizes, which a trace would fix), with the size taken as given: traced
    shapes keep it dynamic.
    """
    if capturing():
        return resize_pos_table_pytorch(table, ref_hw, hw, mode)
    if hw[0] == ref_hw[0] and hw[1] == ref_hw[1]:
        return table
    if not use_fast(table):
        return resize_pos_table_pytorch(table, ref_hw, hw, mode)
    if records_grad(table):
        return _separable_resize(table, ref_hw, hw, mode)
    return _cached_resize(table, ref_hw, hw, mode)


def _cubic_weights(t: np.ndarray, a: float = -0.75) -> np.ndarray:
    """The four weights of taps ``-1, 0, 1, 2`` at the fractions ``t``
    (Keys' cubic convolution with ``a = -0.75``, PyTorch's)."""
    def near(x: np.ndarray) -> np.ndarray:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: np.ndarray) -> np.ndarray:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], -1)


def resize_matrix(size_in: int, size_out: int, mode: str,
                  device: torch.device, dtype: torch.dtype,
                  cache: bool = True) -> Tensor:
    """:func:`resize_weights` as a tensor on ``device`` in ``dtype``, cached
    per size, mode, device and dtype (``cache=False`` for tensors without
    storage: the meta and fake tensors of one tracing mode are not kept)."""
    build = _cached_matrix if cache else _cached_matrix.__wrapped__
    return build(size_in, size_out, mode, device, dtype)


@functools.lru_cache(maxsize=64)
def _cached_matrix(size_in: int, size_out: int, mode: str,
                   device: torch.device, dtype: torch.dtype) -> Tensor:
    return torch.tensor(resize_weights(size_in, size_out, mode),
                        dtype=dtype, device=device)


@functools.lru_cache(maxsize=64)
def resize_weights(size_in: int, size_out: int, mode: str) -> np.ndarray:
    """The ``(size_out, size_in)`` matrix of a 1-D resize along one axis
    with ``F.interpolate(mode=mode, align_corners=False)``'s weights.

    Output ``i`` samples the input at ``x = (i + 0.5) size_in / size_out -
    0.5``. ``'bicubic'``: taps ``floor(x) - 1 ... floor(x) + 2`` with Keys'
    cubic weights, indices clamped to the border (a clamped tap adds its
    weight to the edge sample). ``'bilinear'``: ``x`` clamped to ``>= 0``,
    taps ``floor(x)`` and the next one (the last sample at the border).
    Bicubic and bilinear resizes of a grid are separable, so a 2-D resize
    is ``Wh @ grid @ Ww^T``. A float64 numpy array (no tensor: it is
    computed alike under any tracing or fake-tensor mode), cached; not to
    be modified.
    """
    check_resize_mode(mode)
    x = (np.arange(size_out) + 0.5) * (size_in / size_out) - 0.5
    if mode == 'bilinear':
        x = np.maximum(x, 0)
    base = np.floor(x)
    t = x - base
    if mode == 'bicubic':
        taps = base.astype(np.int64)[:, None] + np.arange(-1, 3)
        weights = _cubic_weights(t)
    else:
        taps = base.astype(np.int64)[:, None] + np.arange(0, 2)
        weights = np.stack([1 - t, t], -1)
    m = np.zeros((size_out, size_in))
    rows = np.broadcast_to(np.arange(size_out)[:, None], taps.shape)
    np.add.at(m, (rows, np.clip(taps, 0, size_in - 1)), weights)
    m.flags.writeable = False
    return m


def _separable_resize(table: Tensor, ref_hw: Size2, hw: Size2,
                      mode: str) -> Tensor:
    """:func:`resize_pos_table_pytorch` as ``Wh @ grid @ Ww^T``: two
    products forward and backward (same weights, float32 at least)."""
    (Hr, Wr), (H, W) = (int(ref_hw[0]), int(ref_hw[1])), (int(hw[0]),
                                                           int(hw[1]))
    C = table.shape[-1]
    dt = torch.promote_types(table.dtype, torch.float32)
    real = has_storage(table)
    wh = resize_matrix(Hr, H, mode, table.device, dt, cache=real)
    ww = resize_matrix(Wr, W, mode, table.device, dt, cache=real)
    rows = wh @ table.to(dt).reshape(Hr, Wr * C)  # (H, Wr * C)
    grid = ww @ rows.view(H, Wr, C)  # (H, W, C), token-major
    return grid.reshape(1, H * W, C).to(table.dtype)


def resize_pos_table_pytorch(table: Tensor, ref_hw: Size2, hw: Size2,
                             mode: str = 'bicubic') -> Tensor:
    """The plain reference of :func:`resize_pos_table` (same arguments):
    the table resized on every call, at its own size too."""
    C = table.shape[-1]
    grid = table.reshape(1, ref_hw[0], ref_hw[1], C).permute(0, 3, 1, 2)
    dt = torch.promote_types(table.dtype, torch.float32)
    # hw as given: Python ints, or a traced graph's shape values (an int()
    # here would fix the exported Resize to one size)
    grid = F.interpolate(grid.to(dt), size=(hw[0], hw[1]), mode=mode,
                         align_corners=False)
    return grid.flatten(2).transpose(1, 2).to(table.dtype)


def has_storage(t: Tensor) -> bool:
    """False for meta and fake tensors (their data pointer is 0)."""
    try:
        return t.data_ptr() != 0
    except RuntimeError:
        return False


#: Grids kept per table in inference (several test scales, the sizes of a
#: batch's padded images).
CACHED_GRIDS = 8


def _cached_resize(table: Tensor, ref_hw: Size2, hw: Size2,
                   mode: str) -> Tensor:
    """:func:`_separable_resize`, cached on ``table`` per ``hw`` (up to
    :data:`CACHED_GRIDS`); the cache is dropped when the table changes."""
    owner = (table._version, table.data_ptr(), table.dtype, table.device,
             tuple(ref_hw), mode)
    cache = getattr(table, '_pola_resized', None)
    if cache is None or cache[0] != owner:
        cache = (owner, {})
        table._pola_resized = cache
    grids = cache[1]
    key = (int(hw[0]), int(hw[1]))
    out = grids.get(key)
    if out is None:
        if len(grids) >= CACHED_GRIDS:
            grids.pop(next(iter(grids)))
        out = grids[key] = _separable_resize(table, ref_hw, hw, mode)
    return out
