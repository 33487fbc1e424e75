"""ONNX export of pola_mm backbones and whole models, verified by runtimes.

:func:`export_onnx` writes a model to an ONNX file with either of torch's
exporters (:data:`EXPORTERS`); :func:`export_and_verify` exports, checks
the file against PyTorch (:func:`~pola_mm.deployment.onnx_verify.
verify_onnx`) and only puts files at the target path when every output
agrees, so no exporter can hand out a silently different model.

While a graph is captured for export, every op runs its plain reference
(:func:`pola_mm.ops.dispatch.use_fast` is False while
:func:`~pola_mm.ops.dispatch.exporting`): no kernel, run of tokens or
custom autograd function, so the exported graph is the published
computation in standard operators.

Shapes: with ``dynamic_hw`` and ``dynamic_batch`` the height, width and
batch size of the input are free for both exporters; the graph takes every
size it needs (padding, windows, masks, table resizes) from the input's
shape. :func:`export_and_verify` then checks the file at the export size
and at three other sizes (:func:`~pola_mm.deployment.onnx_verify.
check_sizes`; batch 3 with a dynamic batch) in ONNX Runtime and, when it is
installed, OpenVINO, and writes nothing when any output differs. What
cannot be dynamic is refused at export with one
:class:`~pola_mm.deployment.onnx_refusal.DynamicExportRefused` (Pola-Swin
under the dynamo exporter; :mod:`pola_mm.deployment.onnx_refusal`).

The rest of the export, by job: the models and inputs
(:mod:`~pola_mm.deployment.onnx_build`), the opsets
(:mod:`~pola_mm.deployment.onnx_opsets`), the files and their external
weights (:mod:`~pola_mm.deployment.onnx_files`), the errors
(:mod:`~pola_mm.deployment.onnx_errors`).
"""
import contextlib
import inspect
import logging
import math
import os
import os.path as osp
import warnings
from typing import Iterator, List, Optional, Sequence

import torch
import torch.nn as nn
from torch import Tensor

from ..ops import dynamic_export
from ..type_aliases import Size2
from .onnx_build import TensorModeModel, example_inputs
from .onnx_errors import ExportError, first_line
from .onnx_files import gather_external_data, move_into_place, staging_folder
from .onnx_opsets import check_opset, unflatten_below_opset13
from .onnx_refusal import (capture_dynamic, clear_refusals, refusal_of,
                           refuse_if_not_dynamic)
from .onnx_verify import (DEFAULT_RTOL, OutputCheck, available_runtimes,
                          check_sizes, verify_onnx)

__all__ = ['EXPORTERS', 'export_onnx', 'export_and_verify']

#: The two exporters of ``torch.onnx.export``: ``'dynamo'``
#: (``torch.export``, torch's default) and ``'torchscript'``
#: (``torch.jit.trace``, ``dynamo=False``).
EXPORTERS = ('dynamo', 'torchscript')


def _output_names(model: nn.Module, x: Tensor) -> List[str]:
    """``out0``, ``out1``, ...: one per ``out_indices`` of a pola_mm
    backbone, else one per output of ``model(x)``."""
    out_indices = getattr(model, 'out_indices', None)
    if out_indices is not None:  # pola_mm backbones: one map per index
        return [f'out{i}' for i in range(len(out_indices))]
    with torch.no_grad():
        outs = model(x)
    if isinstance(outs, Tensor):
        return ['out0']
    return [f'out{i}' for i in range(len(outs))]


@contextlib.contextmanager
def _quiet_guard_errors() -> Iterator[None]:
    """Keep torch's guard-creation log (the dynamo exporter's fallback
    strategies print their size guards there) off the user's terminal: a
    failed export is reported once, by the ExportError."""
    logger = logging.getLogger('torch._guards')
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def export_onnx(model: nn.Module,
                shape: Size2,
                out: str,
                exporter: str = 'dynamo',
                opset: Optional[int] = None,
                dynamic_batch: bool = False,
                dynamic_hw: bool = False) -> str:
    """Export ``model`` (a backbone: images ``(B, C, H, W)`` to a tuple of
    maps) at the spatial size ``shape`` to ``out``.

    The input is named ``input``, the outputs ``out0``, ``out1``, ...
    (``out_indices`` order). The model is put in eval mode.

    Args:
        model: the backbone.
        shape: ``(H, W)`` of the input, fixed in the graph.
        out: the ``.onnx`` file to write.
        exporter: ``'dynamo'`` or ``'torchscript'`` (see :data:`EXPORTERS`).
        opset: ONNX opset (default: the exporter's).
        dynamic_batch: a free batch dimension.
        dynamic_hw: a free height and width (both exporters: the
            TorchScript one with ``dynamic_axes``, the dynamo one with
            ``dynamic_shapes``, inside :func:`~pola_mm.ops.dynamic_export`).
            With an older torch (:func:`~pola_mm.ops.
            dynamic_export_supported` false) Pola-Swin's shifted-window
            stages refuse the dynamo exporter with a dynamic height/width
            (:class:`~pola_mm.ops.DynamicShapeExportError`, quoted).

    Below opset 13 the TorchScript exporter gets an ``aten::unflatten``
    symbolic for the duration of the call where torch has none
    (:func:`~pola_mm.deployment.onnx_opsets.unflatten_below_opset13`).

    Returns:
        ``out``.

    Raises:
        ExportError: an unknown exporter, an opset outside
            :data:`~pola_mm.deployment.onnx_opsets.OPSETS`, or the
            exporter failed (its first line quoted).
        DynamicExportRefused: a part of the model refused a dynamic size
            (its message), or the exporter fixed the height/width; nothing
            is left at ``out``.
    """
    if exporter not in EXPORTERS:
        raise ExportError(f'unknown exporter {exporter!r}; use one of '
                          f'{list(EXPORTERS)}')
    check_opset(exporter, opset)
    model.eval()
    # batch 2 for a dynamic batch: torch.export specialises sizes 0 and 1
    x = example_inputs(model, shape, batch=2 if dynamic_batch else 1)
    try:
        names = _output_names(model, x)
    except Exception as exc:
        whole = isinstance(model, TensorModeModel)
        raise ExportError(
            f'{type(getattr(model, "model", model)).__name__} does not run '
            f'on an input of shape {tuple(x.shape)} '
            f'({type(exc).__name__}: {first_line(exc)})'
            + ('; the whole-model export takes models whose tensor-mode '
               'forward needs no image metadata (one-stage detectors, '
               'segmentors, classifiers); export a two-stage detector with '
               'tools/deployment/deploy.py (MMDeploy) or its backbone '
               'without --whole' if whole else '')) from exc
    kwargs = dict(input_names=['input'], output_names=names)
    if opset is not None:
        kwargs['opset_version'] = int(opset)
    if exporter == 'dynamo':
        kwargs.update(dynamo=True, verbose=False)
        dims = {}
        if dynamic_batch:
            dims[0] = torch.export.Dim('batch', min=1, max=1024)
        if dynamic_hw:
            dims[2] = torch.export.Dim('height', min=16, max=8192)
            dims[3] = torch.export.Dim('width', min=16, max=8192)
        if dims:
            kwargs['dynamic_shapes'] = (dims, )
    else:
        if 'dynamo' in inspect.signature(torch.onnx.export).parameters:
            kwargs['dynamo'] = False  # torch < 2.5 has only this exporter
        axes = {0: 'batch'} if dynamic_batch else {}
        if dynamic_hw:
            axes.update({2: 'height', 3: 'width'})
        if axes:
            kwargs['dynamic_axes'] = {'input': axes}
    d = osp.dirname(osp.abspath(out))
    os.makedirs(d, exist_ok=True)
    clear_refusals()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', torch.jit.TracerWarning)
            with torch.no_grad(), unflatten_below_opset13(exporter, opset), \
                    _quiet_guard_errors(), dynamic_export():
                torch.onnx.export(capture_dynamic(model, x, kwargs), (x, ),
                                  out, **kwargs)
    except Exception as exc:  # the exporters raise many kinds
        refused = refusal_of(exc, exporter, model)
        if refused is not None:
            raise refused from exc
        first = str(exc).strip().splitlines()
        other = 'torchscript' if exporter == 'dynamo' else 'dynamo'
        raise ExportError(
            f'the {exporter} exporter failed on {type(model).__name__} at '
            f'{shape[0]}x{shape[1]}: {type(exc).__name__}: '
            f'{first[0] if first else ""}; try --exporter {other}') from exc
    refuse_if_not_dynamic(out, exporter, model, shape, dynamic_hw)
    return out


def export_and_verify(model: nn.Module,
                      shape: Size2,
                      out: str,
                      exporter: str = 'dynamo',
                      opset: Optional[int] = None,
                      dynamic_batch: bool = False,
                      rtol: float = DEFAULT_RTOL,
                      dynamic_hw: bool = False,
                      runtimes: Optional[Sequence[str]] = None
                      ) -> List[OutputCheck]:
    """:func:`export_onnx` then :func:`~pola_mm.deployment.onnx_verify.
    verify_onnx`; files reach ``out`` only when every output agrees in every
    runtime.

    Writes ``out`` and, when the exporter stores the weights outside the
    graph (the dynamo exporter does), ``<out>.data`` next to it
    (:func:`~pola_mm.deployment.onnx_files.data_file_name`), to which
    ``out`` refers by that relative name: the two files can be moved or
    copied together to any folder. Both are exported under these final
    names into a private folder next to ``out``
    (:func:`~pola_mm.deployment.onnx_files.staging_folder`), checked there
    on a seeded input of batch 1 at ``shape`` (with ``dynamic_hw`` also at
    the three :func:`~pola_mm.deployment.onnx_verify.check_sizes`; with
    ``dynamic_batch`` one input more of batch 3, at the last other size
    with ``dynamic_hw``) in each of ``runtimes`` (default:
    :func:`~pola_mm.deployment.onnx_verify.available_runtimes`), then moved
    into place, the data file first and ``out`` last
    (:func:`~pola_mm.deployment.onnx_files.move_into_place`). A
    ``<out>.data`` of an earlier export is removed when the new file has no
    external weights.

    On any failure or interruption (``KeyboardInterrupt`` included) the
    private folder is removed: nothing new is left, and files already at
    ``out`` are untouched.

    Returns:
        The checks (all within tolerance).

    Raises:
        ExportInputError: ``out`` cannot be written (a folder, no
            permission).
        ExportError: the export failed, an output differs beyond the
            tolerance (the message lists every output), or every output is
            empty (nothing was compared).
    """
    with staging_folder(out) as folder:
        staged = osp.join(folder, osp.basename(osp.abspath(out)))
        export_onnx(model, shape, staged, exporter, opset, dynamic_batch,
                    dynamic_hw)
        data_files = gather_external_data(staged)
        sizes = [tuple(shape)]
        if dynamic_hw:
            sizes += check_sizes(shape)
        inputs = [example_inputs(model, hw, batch=1, seed=1 + i)
                  for i, hw in enumerate(sizes)]
        if dynamic_batch:
            inputs.append(example_inputs(model, sizes[-1], batch=3, seed=9))
        if runtimes is None:
            runtimes = available_runtimes()
        checks = verify_onnx(model, staged, inputs, rtol, runtimes)
        if not any(math.prod(c.shape) for c in checks):
            raise ExportError(
                f'nothing to compare: every output of the {exporter} export '
                'is empty in every runtime, so it was not verified and not '
                'written')
        bad = [c for c in checks if not c.ok]
        if bad:
            raise ExportError(
                f'the {exporter} export differs from PyTorch beyond the '
                f'tolerance ({rtol:g} of the output scale), so it was not '
                'written:\n  ' + '\n  '.join(str(c) for c in checks))
        move_into_place(staged, out, data_files)
    return checks
