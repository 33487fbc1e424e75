"""Tensor-level helpers of CPU inference in runs.

At detection sizes the large intermediates of the first stages are larger
than glibc's mmap ceiling, so each one is handed back to the OS when freed
and page-faulted afresh the next time. The models compute their blocks on
runs of tokens or grid rows in eval mode (``PreNormBlock.forward_in_runs``,
``PolarityAttention.forward_in_runs``, ``Mlp.forward_into``), from the
primitives of :mod:`pola_mm.ops` (``polarity_key_state``,
``polarity_query_apply``, ``depthwise_conv2d``, ``linear_out``) and
:func:`norm_in_place` here. They apply where the call's
:class:`~.dispatch.Path` says ``cpu_inference``.
"""
from typing import Callable

from torch import Tensor

from . import dispatch

__all__ = ['norm_in_place']


def norm_in_place(norm: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """``norm(x)`` for a contiguous ``x`` ``(..., C)`` and a per-token
    ``norm`` (a LayerNorm), written over ``x`` in runs of
    ``dispatch.NORM_RUN_ELEMENTS`` (no second full-size map); returns
    ``x``."""
    flat = x.view(-1, x.shape[-1])
    step = max(1, dispatch.NORM_RUN_ELEMENTS // flat.shape[1])
    for i in range(0, flat.shape[0], step):
        flat[i:i + step] = norm(flat[i:i + step])
    return x
