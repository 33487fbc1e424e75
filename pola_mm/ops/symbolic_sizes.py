"""What ``torch.export`` needs when it captures symbolic sizes (a free
input height/width, :func:`~pola_mm.ops.dynamic_export`).

With symbolic sizes some ordinary operations ask questions that
``torch.export`` can only answer with a guard fixing the input size. The
helpers here compute the same values without asking, and only while such
a capture runs: eager mode, tracing and ``torch.compile`` (where a guard
is a recompilation, not a fixed size) keep the ordinary operations.
"""
import torch
from torch import Tensor

from .dispatch import exporting

__all__ = ['exporting_symbolic', 'contiguous']


def exporting_symbolic(*sizes) -> bool:
    """Whether ``torch.export`` captures the graph with any of ``sizes``
    symbolic."""
    return any(isinstance(s, torch.SymInt) for s in sizes) and exporting()


def contiguous(x: Tensor) -> Tensor:
    """``x.contiguous()``; while ``torch.export`` captures symbolic sizes,
    a copy into a new tensor.

    ``.contiguous()`` (and ``reshape``) first ask whether ``x`` is
    contiguous already. For a permuted view that holds exactly when a
    window count or a map side is 1, and under ``torch.export`` the answer
    is a guard that fixes the input size; a copy asks nothing.
    """
    if not exporting_symbolic(*x.shape):
        return x.contiguous()
    out = x.new_empty(x.shape)
    out.copy_(x)
    return out
