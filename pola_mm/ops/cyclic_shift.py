"""Swin's cyclic shift of a channel-last map: the op.

:func:`cyclic_shift` rolls the spatial dims by ``-shift`` (``+shift`` with
``reverse``). In eager mode with shifts that are Python ints it is one
``torch.roll`` (one kernel forward and one backward); while a graph is
captured, with the fast paths off, or for a traced shift, it runs its
reference :func:`cyclic_shift_pytorch`, a gather along each dim whose
indices follow the traced size (a roll's shifts would be constants of an
exported graph).
"""
import torch
from torch import Tensor

from ..type_aliases import Size2
from .dispatch import use_fast
from .symbolic_sizes import exporting_symbolic

__all__ = ['cyclic_shift', 'cyclic_shift_pytorch']


def cyclic_shift(x: Tensor, shift: Size2, reverse: bool = False) -> Tensor:
    """Swin's cyclic shift of a channel-last map (``roll`` by ``-shift``).

    Args:
        x: any tensor whose dims 1, 2 are the spatial ones (``(B, H, W,
            C)``, label maps ``(1, H, W, 1)``).
        shift: ``(sh, sw)`` (0 shifts nothing; an int 0 is skipped).
        reverse: roll back by ``+shift``.

    Returns:
        ``x``'s shape: ``out[:, i, j] = x[:, (i + sh) % H, (j + sw) % W]``
        (``-`` with ``reverse``).
    """
    if use_fast(x) and all(type(s) is int for s in shift):
        dims = [d for d, s in ((1, shift[0]), (2, shift[1])) if s != 0]
        if not dims:
            return x
        shifts = [shift[d - 1] if reverse else -shift[d - 1] for d in dims]
        return torch.roll(x, shifts=shifts, dims=dims)
    return cyclic_shift_pytorch(x, shift, reverse)


def cyclic_shift_pytorch(x: Tensor, shift: Size2,
                         reverse: bool = False) -> Tensor:
    """:func:`cyclic_shift` as a gather along each spatial dim
    (``out[i] = x[(i + s) % n]``, the values of ``torch.roll``), so that the
    shift may be a traced size."""
    for dim, s in ((1, shift[0]), (2, shift[1])):
        if isinstance(s, int) and s == 0:
            continue
        n = x.shape[dim]
        i = torch.arange(n, device=x.device)
        if exporting_symbolic(n):  # ONNX's Mod takes no symbolic int
            n = torch.full((), n, device=x.device)
        x = x.index_select(dim, (i - s if reverse else i + s) % n)
    return x
