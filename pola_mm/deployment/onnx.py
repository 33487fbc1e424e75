"""ONNX export of pola_mm backbones, verified by onnxruntime.

:func:`export_onnx` writes a backbone to an ONNX file with either of
torch's exporters; :func:`verify_onnx` runs the file in onnxruntime on the
same inputs as the PyTorch model and compares every output;
:func:`export_and_verify` does both and only puts files at the target path
when every output agrees, so no exporter can hand out a silently different
model. :func:`build_backbone` builds the backbone of any pola_mm config
(classifier, detector or segmentor), optionally with a checkpoint.

Files: the verified ``FILE.onnx`` and, when the weights are stored outside
the graph (the dynamo exporter does this; the TorchScript one above 2 GB),
one ``FILE.onnx.data`` next to it, to which the ``.onnx`` refers by that
relative name (:func:`external_data_files`). Both are written under their
final names in a private temporary folder next to the destination,
verified there and then moved into place (data first, ``.onnx`` last); any
failure or interruption removes the folder and leaves nothing behind.

While a graph is captured for export, every op runs its plain reference
(:func:`pola_mm.ops.dispatch.use_fast` is False while
:func:`~pola_mm.ops.dispatch.exporting`): no kernel, run of tokens or
custom autograd function, so the exported graph is the published
computation in standard operators.

Shapes: the spatial size is fixed at export (the graph depends on it:
position tables resized to the stage maps, padding, Swin's windows and
masks); ``dynamic_batch`` (``torch.export`` exporter only) leaves the batch
size free.
"""
import inspect
import os
import os.path as osp
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from typing import (Any, Iterator, List, Mapping, Optional, Sequence,
                    Tuple)

import torch
import torch.nn as nn
from mmengine.logging import print_log
from torch import Tensor

from ..type_aliases import Size2

__all__ = [
    'EXPORTERS', 'ExportError', 'ExportInputError', 'OutputCheck',
    'build_backbone', 'export_onnx', 'verify_onnx', 'export_and_verify',
    'example_inputs', 'external_data_files', 'data_file_name'
]

#: The two exporters of ``torch.onnx.export``: ``'dynamo'``
#: (``torch.export``, torch's default) and ``'torchscript'``
#: (``torch.jit.trace``, ``dynamo=False``).
EXPORTERS = ('dynamo', 'torchscript')

#: Default tolerance: max abs difference per output, relative to the output
#: scale (its max abs value in PyTorch).
DEFAULT_RTOL = 1e-4


class ExportError(RuntimeError):
    """An export that failed or whose file disagrees with PyTorch; the
    message says what went wrong and what to try."""


class ExportInputError(ExportError):
    """What the export was given cannot be used: a missing, unreadable or
    corrupt config or checkpoint, a config without a pola_mm backbone, a
    checkpoint of another arch, or a destination that cannot be written.
    The message is one line naming the problem and the fix
    (``tools/deployment/pytorch2onnx.py`` exits with 2 on it, with 1 on
    other :class:`ExportError`)."""


@dataclass
class OutputCheck:
    """The comparison of one output of the exported file with PyTorch."""
    name: str
    batch: int
    shape: Tuple[int, ...]
    max_abs_diff: float
    scale: float
    tolerance: float

    @property
    def ok(self) -> bool:
        """Within the tolerance (and a finite difference)."""
        return self.max_abs_diff <= self.tolerance

    def __str__(self) -> str:
        return (f'{self.name} {tuple(self.shape)} (batch {self.batch}): max '
                f'abs diff {self.max_abs_diff:.3g} (output scale '
                f'{self.scale:.3g}, tolerance {self.tolerance:.3g}) '
                f'{"ok" if self.ok else "TOO LARGE"}')


def _first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type if empty)."""
    text = (str(err.args[0]) if isinstance(err, KeyError) and err.args else
            str(err))  # str() of a KeyError quotes its message
    lines = text.strip().splitlines()
    return lines[0] if lines else type(err).__name__


def _checked_config(config: Any, cfg_options: Optional[dict]) -> Any:
    """The mmengine ``Config`` of ``config`` with ``cfg_options`` merged,
    checked to have a pola_mm ``model.backbone``.

    Raises:
        ExportInputError: a missing or unreadable config file, no
            ``model.backbone``, or a backbone type pola_mm does not have.
    """
    from mmengine.config import Config

    # importing pola_mm.models (for the base class) registers the backbones
    from ..models.backbones.base import PolaBackbone
    from ..models.from_config import load_config
    from ..registry import MODELS
    name = config if isinstance(config, str) else 'the config'
    if not isinstance(config, Config):
        try:
            config = load_config(config)
        except FileNotFoundError as err:
            raise ExportInputError(f'{err}; check the path') from err
        except Exception as err:  # mmengine raises many kinds
            raise ExportInputError(
                f'config {name} cannot be read ({type(err).__name__}: '
                f'{_first_line(err)}); fix the file or pass a config of '
                'pola_mm (configs/*.py)') from err
    if cfg_options:
        try:
            config.merge_from_dict(cfg_options)
        except (TypeError, KeyError, ValueError) as err:
            raise ExportInputError(
                f'--cfg-options cannot be merged into {name}: '
                f'{_first_line(err)}') from err
    model_cfg = config.get('model')
    bcfg = (model_cfg.get('backbone') if isinstance(model_cfg, Mapping) else
            None)
    if not isinstance(bcfg, Mapping):
        raise ExportInputError(
            f'{name} has no model.backbone; pass a classifier, detector or '
            'segmentor config of pola_mm (configs/*.py)')
    btype = bcfg.get('type')
    btype = (btype if isinstance(btype, str) else
             getattr(btype, '__name__', str(btype)))
    short = btype[len('pola_mm.'):] if btype.startswith('pola_mm.') else btype
    backbones = sorted(k for k, cls in MODELS.module_dict.items()
                       if isinstance(cls, type)
                       and issubclass(cls, PolaBackbone))
    if short not in backbones:
        raise ExportInputError(
            f'model.backbone of {name} is {btype!r}, not a pola_mm backbone; '
            'this tool exports pola_mm backbones only: pass a config of '
            'pola_mm (configs/*.py) or set model.backbone.type to one of '
            f'{backbones}')
    return config


def build_backbone(config: Any,
                   checkpoint: Optional[str] = None,
                   cfg_options: Optional[dict] = None) -> nn.Module:
    """The backbone of a pola_mm config, in eval mode.

    Args:
        config: a config file (classifier, detector or segmentor: anything
            with ``model.backbone``) or an mmengine ``Config`` (changed in
            place by ``cfg_options``).
        checkpoint: optional weights, read through the backbone's strict
            pretrained loading (:func:`pola_mm.models.load_checkpoint_file`,
            which never runs code from the file): the authors' file, a
            converted classifier, a detector / segmentor checkpoint or a
            backbone state dict. The config's own ``init_cfg`` is ignored
            (without ``checkpoint`` the backbone keeps its initialisation).
        cfg_options: overrides merged into the config first (e.g. a smaller
            ``model.backbone.arch``).

    Raises:
        ExportInputError: the config or checkpoint is missing, unreadable,
            truncated or corrupt; no ``model.backbone`` or not a pola_mm
            backbone; the backbone cannot be built from its settings; the
            checkpoint does not fit the backbone. One line naming the
            problem and the fix.
    """
    from ..fileio import CheckpointFileError
    from ..models.from_config import backbone_from_config
    cfg = _checked_config(config, cfg_options)
    name = config if isinstance(config, str) else 'the config'
    try:
        model, _ = backbone_from_config(cfg, checkpoint)
    except CheckpointFileError as err:
        raise ExportInputError(
            f'{_first_line(err)}; pass an intact checkpoint (download or '
            'save it again), or no CKPT to export the initialised '
            'backbone') from err
    except FileNotFoundError as err:
        raise ExportInputError(f'{_first_line(err)}; check the path') from err
    except (ValueError, TypeError, KeyError, AssertionError) as err:
        what = f' with checkpoint {checkpoint}' if checkpoint else ''
        fix = ('check model.backbone in the config and --cfg-options, and '
               'that the checkpoint is of the same arch' if checkpoint else
               'check model.backbone in the config and --cfg-options')
        raise ExportInputError(
            f'cannot build model.backbone of {name}{what}: '
            f'{_first_line(err).rstrip(".")}; {fix}') from err
    return model


def example_inputs(model: nn.Module, shape: Size2, batch: int = 1,
                   seed: int = 0) -> Tensor:
    """A seeded ``(batch, in_channels, H, W)`` input like a normalised
    image."""
    g = torch.Generator().manual_seed(seed)
    c = int(getattr(model, 'in_channels', 3))
    return torch.randn(batch, c, int(shape[0]), int(shape[1]), generator=g)


def _output_names(model: nn.Module, x: Tensor) -> List[str]:
    out_indices = getattr(model, 'out_indices', None)
    if out_indices is not None:  # pola_mm backbones: one map per index
        return [f'out{i}' for i in range(len(out_indices))]
    with torch.no_grad():
        outs = model(x)
    if isinstance(outs, Tensor):
        return ['out0']
    return [f'out{i}' for i in range(len(outs))]


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
        dynamic_batch: a free batch dimension (``'dynamo'`` only).
        dynamic_hw: a free height and width (both exporters: the
            TorchScript one with ``dynamic_axes``, the dynamo one with
            ``dynamic_shapes``). Pola-Swin's shifted-window stages refuse
            the dynamo exporter with a dynamic height/width
            (:class:`~pola_mm.ops.DynamicShapeExportError`, quoted).

    Returns:
        ``out``.

    Raises:
        ExportError: an unknown exporter, ``dynamic_batch`` with
            ``'torchscript'``, or the exporter failed (its first line
            quoted; a refusal of a dynamic size by the model: its
            message).
    """
    if exporter not in EXPORTERS:
        raise ExportError(f'unknown exporter {exporter!r}; use one of '
                          f'{list(EXPORTERS)}')
    if dynamic_batch and exporter != 'dynamo':
        raise ExportError(
            'a dynamic batch needs the dynamo exporter (the TorchScript '
            'tracer fixes the batch size in reshapes); use exporter dynamo, '
            'or export without a dynamic batch')
    model.eval()
    # batch 2 for a dynamic batch: torch.export specialises sizes 0 and 1
    x = example_inputs(model, shape, batch=2 if dynamic_batch else 1)
    names = _output_names(model, x)
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
        if dynamic_hw:
            kwargs['dynamic_axes'] = {'input': {2: 'height', 3: 'width'}}
    d = osp.dirname(osp.abspath(out))
    os.makedirs(d, exist_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', torch.jit.TracerWarning)
            with torch.no_grad():
                torch.onnx.export(model, (x, ), out, **kwargs)
    except Exception as exc:  # the exporters raise many kinds
        refusal = _dynamic_shape_refusal(exc)
        if refusal is not None:
            raise ExportError(
                f'the {exporter} exporter cannot export '
                f'{type(model).__name__} with a dynamic height/width: '
                f'{refusal}') from exc
        first = str(exc).strip().splitlines()
        other = 'torchscript' if exporter == 'dynamo' else 'dynamo'
        raise ExportError(
            f'the {exporter} exporter failed on {type(model).__name__} at '
            f'{shape[0]}x{shape[1]}: {type(exc).__name__}: '
            f'{first[0] if first else ""}; try --exporter {other}') from exc
    if dynamic_hw and not _input_hw_is_dynamic(out):
        # torch.onnx's dynamo path refines unsatisfiable dynamic shapes to
        # the example's size: a file of one size is no dynamic export
        for path in (out, osp.join(d, data_file_name(out))):
            if osp.isfile(path):
                os.remove(path)
        raise ExportError(
            f'the {exporter} exporter fixed the height/width of '
            f'{type(model).__name__} at {shape[0]}x{shape[1]} (torch.export '
            'turned its size-dependent parts into guards on the size; '
            'Pola-Swin\'s shifted windows do), so no file was written; '
            'export with --exporter torchscript (torch.onnx.export(..., '
            'dynamo=False, dynamic_axes=...)) for a dynamic height/width, '
            'or without --dynamic')
    return out


def _input_hw_is_dynamic(path: str) -> bool:
    """Whether the first input of the ONNX file ``path`` has a symbolic
    height and width (dims 2 and 3)."""
    import onnx
    dims = onnx.load(path, load_external_data=False).graph.input[0].type
    dims = dims.tensor_type.shape.dim
    return len(dims) == 4 and all(
        not dims[i].HasField('dim_value') for i in (2, 3))


def _dynamic_shape_refusal(exc: BaseException) -> Optional[str]:
    """The message of a :class:`~pola_mm.ops.DynamicShapeExportError`
    in the chain of ``exc`` (the exporters wrap what the model raises);
    None when there is none."""
    from ..ops import DynamicShapeExportError
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DynamicShapeExportError):
            return str(exc)
        exc = exc.__cause__ or exc.__context__
    return None


def verify_onnx(model: nn.Module, path: str, inputs: Sequence[Tensor],
                rtol: float = DEFAULT_RTOL) -> List[OutputCheck]:
    """Run ``path`` in onnxruntime (CPU) and ``model`` in PyTorch (eval,
    no grad, fast paths as configured) on each of ``inputs``.

    An output agrees when its max abs difference is at most
    ``rtol * max(|PyTorch output|)`` (``rtol`` itself for an all-zero
    output). A shape mismatch counts as an infinite difference.

    Returns:
        One :class:`OutputCheck` per output and input.

    Raises:
        ExportError: onnxruntime cannot load or run the file (e.g. an input
            of another size than the export's).
    """
    import numpy as np
    import onnxruntime as ort
    try:
        sess = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    except Exception as exc:
        raise ExportError(f'onnxruntime cannot load {path}: {exc}') from exc
    names = [o.name for o in sess.get_outputs()]
    input_name = sess.get_inputs()[0].name
    model.eval()
    checks: List[OutputCheck] = []
    for x in inputs:
        with torch.no_grad():
            ref = model(x)
        ref = (ref, ) if isinstance(ref, Tensor) else tuple(ref)
        try:
            got = sess.run(None, {input_name: x.numpy()})
        except Exception as exc:
            raise ExportError(
                f'onnxruntime failed to run {path} on an input of shape '
                f'{tuple(x.shape)}: {str(exc).splitlines()[0]}') from exc
        if len(got) != len(ref):
            raise ExportError(f'{path} has {len(got)} outputs, PyTorch '
                              f'{len(ref)}')
        for name, r, o in zip(names, ref, got):
            r = r.detach().float().numpy()
            scale = float(np.abs(r).max()) if r.size else 0.0
            if o.shape != r.shape:
                diff = float('inf')
            else:
                diff = float(np.abs(r - o).max()) if r.size else 0.0
                if not np.isfinite(diff):
                    diff = float('inf')
            checks.append(OutputCheck(name, int(x.shape[0]),
                                      tuple(o.shape), diff, scale,
                                      rtol * scale if scale > 0 else rtol))
    return checks


def data_file_name(out: str) -> str:
    """The name of the external weights of the ONNX file ``out``:
    ``<basename of out>.data``, next to it (``swin_t.onnx`` ->
    ``swin_t.onnx.data``)."""
    return osp.basename(out) + '.data'


def _graph_tensors(graph: Any) -> Iterator[Any]:
    """Every ``TensorProto`` of an ONNX graph: initialisers and tensor
    attributes of its nodes (``Constant`` values), subgraphs included."""
    import onnx
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.TENSORS:
                yield from attr.tensors
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from _graph_tensors(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _graph_tensors(g)


def external_data_files(path: str) -> List[str]:
    """The external-data locations that the ONNX file ``path`` refers to,
    as written in the file (paths relative to its folder), in order of first
    use; empty when every weight is inside the file."""
    import onnx
    from onnx.external_data_helper import uses_external_data
    model = onnx.load(path, load_external_data=False)
    locations: List[str] = []
    for tensor in _graph_tensors(model.graph):
        if uses_external_data(tensor):
            for entry in tensor.external_data:
                if entry.key == 'location' and \
                        entry.value not in locations:
                    locations.append(entry.value)
    return locations


def _one_data_file(path: str) -> List[str]:
    """Make the ONNX file ``path`` keep its external weights (if any) in
    the one file :func:`data_file_name` next to it, referred to by that
    relative name; returns the data files it refers to afterwards (none or
    that one).

    The exporters name the data file after the file they write (the dynamo
    exporter: ``<file>.data``; the TorchScript one, above 2 GB: one file
    per tensor); anything else is rewritten here and the old data files are
    removed.
    """
    locations = external_data_files(path)
    wanted = data_file_name(path)
    if not locations or locations == [wanted]:
        return locations
    import onnx
    folder = osp.dirname(osp.abspath(path))
    model = onnx.load(path, load_external_data=True)
    for loc in locations:  # the exporter's files, in the folder of path
        old = osp.abspath(osp.join(folder, loc))
        if osp.dirname(old) == folder and osp.isfile(old):
            os.remove(old)
    onnx.save_model(model, path, save_as_external_data=True,
                    all_tensors_to_one_file=True, location=wanted,
                    size_threshold=1024)
    return external_data_files(path)


def _remove_stale_data_file(out: str) -> None:
    """Remove ``<out>.data`` left by an earlier export to ``out`` once the
    new ``out`` (which has no external weights) has replaced that file."""
    stale = osp.join(osp.dirname(osp.abspath(out)), data_file_name(out))
    if osp.isfile(stale):
        os.remove(stale)
        print_log(f'removed {stale}, the weights of the earlier {out}: the '
                  'new file holds its weights itself', logger='current')


def _private_dir(out: str) -> str:
    """A new private folder next to ``out`` (same file system, so files
    move into place atomically); the destination folder is created.

    Raises:
        ExportInputError: ``out`` is a folder, or its folder cannot be
            created or written.
    """
    dest = osp.abspath(out)
    if osp.isdir(dest):
        raise ExportInputError(f'--out {out} is a folder; pass the path of '
                               'the .onnx file to write')
    try:
        os.makedirs(osp.dirname(dest), exist_ok=True)
        return tempfile.mkdtemp(prefix=f'.{osp.basename(dest)}.',
                                suffix='.tmp', dir=osp.dirname(dest))
    except OSError as err:
        raise ExportInputError(
            f'cannot write next to {out} ({type(err).__name__}: '
            f'{err.strerror or _first_line(err)}); choose a writable '
            'folder for --out') from err


def export_and_verify(model: nn.Module,
                      shape: Size2,
                      out: str,
                      exporter: str = 'dynamo',
                      opset: Optional[int] = None,
                      dynamic_batch: bool = False,
                      rtol: float = DEFAULT_RTOL) -> List[OutputCheck]:
    """:func:`export_onnx` then :func:`verify_onnx`; files reach ``out``
    only when every output agrees.

    Writes ``out`` and, when the exporter stores the weights outside the
    graph (the dynamo exporter does), ``<out>.data`` next to it
    (:func:`data_file_name`), to which ``out`` refers by that relative name:
    the two files can be moved or copied together to any folder. Both are
    exported under these final names into a private folder next to ``out``,
    checked there on a seeded input of batch 1 at ``shape`` (with
    ``dynamic_batch`` also at batch 3), then moved into place, the data file
    first and ``out`` last. A ``<out>.data`` of an earlier export is removed
    when the new file has no external weights.

    On any failure or interruption (``KeyboardInterrupt`` included) the
    private folder is removed: nothing new is left, and files already at
    ``out`` are untouched.

    Returns:
        The checks (all within tolerance).

    Raises:
        ExportInputError: ``out`` cannot be written (a folder, no
            permission).
        ExportError: the export failed, or an output differs beyond the
            tolerance (the message lists every output).
    """
    tmp_dir = _private_dir(out)
    try:
        tmp = osp.join(tmp_dir, osp.basename(osp.abspath(out)))
        export_onnx(model, shape, tmp, exporter, opset, dynamic_batch)
        data_files = _one_data_file(tmp)
        inputs = [example_inputs(model, shape, batch=1, seed=1)]
        if dynamic_batch:
            inputs.append(example_inputs(model, shape, batch=3, seed=2))
        checks = verify_onnx(model, tmp, inputs, rtol)
        bad = [c for c in checks if not c.ok]
        if bad:
            raise ExportError(
                f'the {exporter} export differs from PyTorch beyond the '
                f'tolerance ({rtol:g} of the output scale), so it was not '
                'written:\n  ' + '\n  '.join(str(c) for c in checks))
        folder = osp.dirname(osp.abspath(out))
        moved: List[str] = []
        try:
            for name in data_files:  # the weights first, the graph last
                os.replace(osp.join(tmp_dir, name), osp.join(folder, name))
                moved.append(osp.join(folder, name))
            os.replace(tmp, osp.abspath(out))
        except BaseException:
            for path in moved:  # no weights without their graph
                os.remove(path)
            raise
        if not data_files:
            _remove_stale_data_file(out)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return checks
