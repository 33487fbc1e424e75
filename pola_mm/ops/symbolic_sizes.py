"""What ``torch.export`` needs when it captures symbolic sizes (a free
input height/width).

With symbolic sizes some ordinary operations ask questions that
``torch.export`` can only answer with a guard fixing the input size. The
helpers here compute the same values without asking, and only while such
a capture runs: eager mode, tracing and ``torch.compile`` (where a guard
is a recompilation, not a fixed size) keep the ordinary operations.
"""
import contextlib
from typing import Iterator, Optional

import torch
from torch import Tensor

from .dispatch import exporting

__all__ = ['dynamic_export', 'dynamic_export_supported', 'fx_config',
           'exporting_symbolic', 'contiguous']


def fx_config() -> Optional[object]:
    """torch's ``torch.fx.experimental._config`` where it has
    ``backed_size_oblivious`` (recent torch; 2.14 tested), else None."""
    try:
        from torch.fx.experimental import _config
    except ImportError:  # pragma: no cover (torch without the module)
        return None
    return _config if hasattr(_config, 'backed_size_oblivious') else None


def dynamic_export_supported() -> bool:
    """Whether this torch can ``torch.export`` shifted windows with a free
    height/width (:func:`dynamic_export`)."""
    return fx_config() is not None


@contextlib.contextmanager
def dynamic_export() -> Iterator[None]:
    """Run a ``torch.export`` (or ``torch.onnx.export(dynamo=True)``) with
    a free height/width of any pola_mm model, Pola-Swin included.

    Sets torch's ``backed_size_oblivious`` for the block: torch.export then
    reasons about the symbolic sizes as sizes (a window count or a map
    side of 1 is not special-cased), so the shifted windows' padding,
    partition and crop stay symbolic instead of becoming guards that fix
    the input size. The models avoid the questions that would still be
    guards (a copy in place of ``.contiguous()`` of a permuted view, a
    gather in place of the crop's slice: :mod:`pola_mm.models.layers.
    window`). Without the setting (an older torch) the block runs as it is,
    and :func:`~.softmax_attention.check_window_export` refuses shifted
    windows. The export tools use it; wrap a direct call the same way::

        with pola_mm.ops.dynamic_export():
            torch.onnx.export(model, (x, ), 'model.onnx', dynamo=True,
                              dynamic_shapes=...)
    """
    config = fx_config()
    if config is None:
        yield
        return
    with config.patch(backed_size_oblivious=True):
        yield


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
