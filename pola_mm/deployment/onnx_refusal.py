"""Refusing a dynamic export that cannot be one.

With a free height/width (``dynamic_hw``) both exporters take every size
the graph needs from the input's shape, except where a part of the model
cannot: Pola-Swin's shifted windows under the dynamo exporter of a torch
without torch.fx's ``backed_size_oblivious``. Such a
part raises :class:`~pola_mm.ops.DynamicShapeExportError` while the graph
is captured (and records it, since an exporter may swallow it and fall
back to another capture strategy), or torch.export turns its
size-dependent parts into guards and fixes the size. Either way the
export is refused with one :class:`DynamicExportRefused` and nothing is
written:

- :func:`clear_refusals` forgets what an earlier export recorded;
- :func:`capture_dynamic` captures a dynamic dynamo export itself, so that
  a refusal ends it at once;
- :func:`refusal_of` finds a refusal behind an exporter's exception;
- :func:`refuse_if_not_dynamic` checks a written file (a refusal the
  exporter swallowed, a height/width it fixed) and removes it if refused.
"""
from typing import Any, Optional

import torch
import torch.nn as nn

from ..ops import DynamicShapeExportError
from ..type_aliases import Size2
from .onnx_errors import ExportError
from .onnx_files import remove_export

__all__ = [
    'DynamicExportRefused', 'clear_refusals', 'capture_dynamic',
    'refusal_of', 'refuse_if_not_dynamic'
]


class DynamicExportRefused(ExportError):
    """The exporter cannot export the model with a free height/width (a
    part refused, or the exporter fixed the size); nothing was written. The
    TorchScript exporter exports every model dynamically: the export tool
    switches to it where the user did not choose an exporter."""


def _refused(exporter: str, model: nn.Module,
             refusal: str) -> DynamicExportRefused:
    """The error for a part of ``model`` that refused a dynamic size with
    the message ``refusal``."""
    return DynamicExportRefused(
        f'the {exporter} exporter cannot export {type(model).__name__} '
        f'with a dynamic height/width: {refusal}')


def clear_refusals() -> None:
    """Forget the refusal an earlier export recorded
    (:attr:`DynamicShapeExportError.last`); an export calls this first."""
    DynamicShapeExportError.last = None


def capture_dynamic(model: nn.Module, x: torch.Tensor, kwargs: dict) -> Any:
    """What ``torch.onnx.export`` is given: for a dynamic dynamo export
    (``dynamic_shapes`` in ``kwargs``), the program of torch.onnx's first
    capture strategy (``torch.export``, non-strict), captured here so that
    a part's refusal ends the export at once (torch.onnx would try its
    strict strategy next, about 30 s of a tiny Pola-Swin, and fail the same
    way); ``kwargs`` then lose the dynamic shapes the program carries. Any
    other failure of that capture leaves the model to torch.onnx's
    strategies, as without this step; otherwise the model itself."""
    if 'dynamic_shapes' not in kwargs:
        return model
    try:
        program = torch.export.export(
            model, (x, ), dynamic_shapes=kwargs['dynamic_shapes'],
            strict=False)
    except Exception:
        if DynamicShapeExportError.last is not None:
            raise
        return model
    del kwargs['dynamic_shapes']
    return program


def _refusal_in_chain(exc: Optional[BaseException]) -> Optional[str]:
    """The message of a :class:`~pola_mm.ops.DynamicShapeExportError`
    in the chain of ``exc`` (the exporters wrap what the model raises);
    None when there is none."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DynamicShapeExportError):
            return str(exc)
        exc = exc.__cause__ or exc.__context__
    return None


def refusal_of(exc: BaseException, exporter: str,
               model: nn.Module) -> Optional[DynamicExportRefused]:
    """The :class:`DynamicExportRefused` behind the exception ``exc`` of
    ``exporter`` on ``model``: a part's refusal in the chain of ``exc``, or
    one raised and swallowed by a capture strategy the exporter fell back
    from; None when no part refused (another failure)."""
    refusal = _refusal_in_chain(exc) or DynamicShapeExportError.last
    return None if refusal is None else _refused(exporter, model, refusal)


def _input_hw_is_dynamic(path: str) -> bool:
    """Whether the first input of the ONNX file ``path`` has a symbolic
    height and width (dims 2 and 3)."""
    import onnx
    dims = onnx.load(path, load_external_data=False).graph.input[0].type
    dims = dims.tensor_type.shape.dim
    return len(dims) == 4 and all(
        not dims[i].HasField('dim_value') for i in (2, 3))


def refuse_if_not_dynamic(out: str, exporter: str, model: nn.Module,
                          shape: Size2, dynamic_hw: bool) -> None:
    """Check the file ``out`` that ``exporter`` wrote for ``model`` at
    ``shape``: a part refused and the exporter fell back to a strategy
    that captured it anyway (at one size), or, with ``dynamic_hw``, the
    exporter fixed the height/width (torch.onnx's dynamo path refines
    unsatisfiable dynamic shapes to the example's size).

    Raises:
        DynamicExportRefused: either happened; ``out`` and its weights are
            removed first (no file of one size passes as a dynamic one).
    """
    if DynamicShapeExportError.last is not None:
        remove_export(out)
        raise _refused(exporter, model, DynamicShapeExportError.last)
    if dynamic_hw and not _input_hw_is_dynamic(out):
        remove_export(out)
        raise DynamicExportRefused(
            f'the {exporter} exporter fixed the height/width of '
            f'{type(model).__name__} at {shape[0]}x{shape[1]} (torch.export '
            'turned its size-dependent parts into guards on the size, as '
            'Pola-Swin\'s shifted windows do with an older torch), so no '
            'file was written; '
            'export with --exporter torchscript (torch.onnx.export(..., '
            'dynamo=False, dynamic_axes=...)) for a dynamic height/width, '
            'or without --dynamic')
