"""Resizing of learned position tables to other grids: the op.

:func:`resize_pos_table` resizes a table on every call where autograd needs
its gradient, with the fast paths off and while a graph is captured (a
traced graph would hold a cached table as a constant of one size); in
inference it keeps the resized table for the last grid and reuses it until
the table changes.

While a graph is captured the table is resized on every call, also at its
own size (an exact identity for both modes), to the grid it is given: in a
traced graph (the TorchScript ONNX exporter, MMDeploy) that grid comes
from the tensors' shapes, so the exported ``Resize`` takes its size from
the graph's input and a file with a dynamic height/width resizes to the
size it is run at.
"""
import torch
import torch.nn.functional as F
from torch import Tensor

from ..type_aliases import Size2
from .dispatch import capturing, records_grad, use_fast

__all__ = ['resize_pos_table', 'resize_pos_table_pytorch',
           'check_resize_mode', 'RESIZE_MODES']


#: Interpolation modes a table may be resized with.
RESIZE_MODES = ('bicubic', 'bilinear')


def check_resize_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`RESIZE_MODES`, else a clear error."""
    if mode not in RESIZE_MODES:
        raise ValueError(f'interpolate_mode must be one of {RESIZE_MODES} '
                         f'(how learned position tables are resized to '
                         f'other stage maps), got {mode!r}')
    return mode


def resize_pos_table(table: Tensor, ref_hw: Size2, hw: Size2,
                     mode: str = 'bicubic') -> Tensor:
    """Resize a learned ``(1, Hr * Wr, C)`` token table to ``(1, H * W, C)``.

    ``mode`` (``'bicubic'`` or ``'bilinear'``), ``align_corners=False``, on
    the 2-D grid; the table itself is returned at its reference size. Where
    no gradient is needed (inference, frozen tables) and no graph is
    captured, the resized table is cached on ``table`` for the last ``hw``
    and reused until the table changes (in place or by a move); the result
    must not be modified in place. While a graph is captured the table is
    always resized (no comparison of sizes, which a trace would fix), with
    the size taken as given: traced shapes keep it dynamic.
    """
    if capturing():
        return resize_pos_table_pytorch(table, ref_hw, hw, mode)
    if hw[0] == ref_hw[0] and hw[1] == ref_hw[1]:
        return table
    if use_fast(table) and not records_grad(table):
        return _cached_resize(table, ref_hw, hw, mode)
    return resize_pos_table_pytorch(table, ref_hw, hw, mode)


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


def _cached_resize(table: Tensor, ref_hw: Size2, hw: Size2,
                   mode: str) -> Tensor:
    """:func:`resize_pos_table_pytorch`, cached on ``table`` for the last
    ``hw``."""
    key = (tuple(int(i) for i in hw), tuple(ref_hw), mode, table._version,
           table.data_ptr(), table.dtype, table.device)
    hit = getattr(table, '_pola_resized', None)
    if hit is not None and hit[0] == key:
        return hit[1]
    # token-major in memory, as the keys it is added to (the resize gives
    # a channel-major view)
    out = resize_pos_table_pytorch(table, ref_hw, hw, mode).contiguous()
    table._pola_resized = (key, out)
    return out
