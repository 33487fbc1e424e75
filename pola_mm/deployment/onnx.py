"""ONNX export of pola_mm backbones and whole models, verified by runtimes.

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

Shapes: with ``dynamic_hw`` and ``dynamic_batch`` the height, width and
batch size of the input are free for both exporters; the graph takes every
size it needs (padding, windows, masks, table resizes) from the input's
shape. :func:`export_and_verify` then checks the file at the export size
and at three other sizes (:func:`check_sizes`: none a multiple of 32, two
larger than the export size; batch 3 with a dynamic batch) in ONNX Runtime
and, when it is installed, OpenVINO, and writes nothing when any output
differs. What cannot be dynamic is refused at export with one
:class:`ExportError` (Pola-Swin under the dynamo exporter).

Whole models: :func:`build_model` wraps a classifier, detector or
segmentor of a config as :class:`TensorModeModel`, its ``mode='tensor'``
forward on normalised images (no data preprocessor, no post-processing:
class scores, box regressions or segmentation logits as a flat tuple).

Opsets: the TorchScript exporter is supported at opsets 11 to 21 (below
13, ``aten::unflatten``, which torch serves from opset 13 only, gets a
symbolic registered for the duration of the export); the dynamo exporter
at 18 to 21 (:data:`OPSETS`).
"""
import contextlib
import inspect
import logging
import os
import os.path as osp
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.logging import print_log
from torch import Tensor

from ..type_aliases import Size2

__all__ = [
    'EXPORTERS', 'OPSETS', 'RUNTIMES', 'ExportError', 'ExportInputError',
    'DynamicExportRefused',
    'OutputCheck', 'TensorModeModel', 'build_backbone', 'build_model',
    'available_runtimes', 'check_sizes', 'export_onnx', 'verify_onnx',
    'export_and_verify',
    'example_inputs', 'external_data_files', 'data_file_name'
]

#: The two exporters of ``torch.onnx.export``: ``'dynamo'``
#: (``torch.export``, torch's default) and ``'torchscript'``
#: (``torch.jit.trace``, ``dynamo=False``).
EXPORTERS = ('dynamo', 'torchscript')

#: The opsets each exporter is supported at (inclusive; tested at both
#: ends on torch 2.14; an older torch's own maximum applies, 17 on torch
#: 2.1). The dynamo exporter writes opset 18 and converts others with
#: ONNX's version converter, which cannot take its graphs below 18 (it
#: then silently keeps 18, so lower opsets are refused here).
OPSETS = {'torchscript': (11, 21), 'dynamo': (18, 21)}

#: The runtimes a file is checked in: ONNX Runtime always, OpenVINO when
#: the ``openvino`` package is installed.
RUNTIMES = ('onnxruntime', 'openvino')

#: Default tolerance: max abs difference per output, relative to the output
#: scale (its max abs value in PyTorch).
DEFAULT_RTOL = 1e-4


class ExportError(RuntimeError):
    """An export that failed or whose file disagrees with PyTorch; the
    message says what went wrong and what to try."""


class DynamicExportRefused(ExportError):
    """The exporter cannot export the model with a free height/width (a
    part refused, or the exporter fixed the size); nothing was written. The
    TorchScript exporter exports every model dynamically: the export tool
    switches to it where the user did not choose an exporter."""


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
    runtime: str = 'onnxruntime'

    @property
    def ok(self) -> bool:
        """Within the tolerance (and a finite difference)."""
        return self.max_abs_diff <= self.tolerance

    def __str__(self) -> str:
        return (f'{self.runtime} {self.name} {tuple(self.shape)} (batch '
                f'{self.batch}): max '
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


def _flat_tensors(outs: Any) -> List[Tensor]:
    """The tensors of a nested output (tensors, lists, tuples, dicts in
    key order), depth first."""
    if isinstance(outs, Tensor):
        return [outs]
    if isinstance(outs, Mapping):
        outs = [outs[k] for k in outs]
    if isinstance(outs, (list, tuple)):
        return [t for o in outs for t in _flat_tensors(o)]
    raise TypeError(f'cannot export an output of type {type(outs).__name__}')


class TensorModeModel(nn.Module):
    """A whole classifier, detector or segmentor as an exportable module:
    its ``mode='tensor'`` forward.

    Input: normalised images ``(B, C, H, W)`` (what the model's data
    preprocessor hands on: mean, std and padding are not in the graph).
    Output: the tensors of ``model(x, mode='tensor')``, flattened depth
    first into one tuple (a detector: every level's class scores, then every
    level's box regressions, ...; a segmentor: logits ``(B, K, H/4, W/4)``;
    a classifier: logits ``(B, K)``). No post-processing (NMS, resizing to
    the image) is exported.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    @property
    def in_channels(self) -> int:
        """Input channels, the backbone's."""
        return int(getattr(getattr(self.model, 'backbone', None),
                           'in_channels', 3))

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        return tuple(_flat_tensors(self.model(x, mode='tensor')))


def build_model(config: Any,
                checkpoint: Optional[str] = None,
                cfg_options: Optional[dict] = None) -> TensorModeModel:
    """The whole ``model`` of a pola_mm config (classifier, detector or
    segmentor, built in the config's ``default_scope``) as a
    :class:`TensorModeModel`, in eval mode.

    Args:
        config: a config file or an mmengine ``Config``.
        checkpoint: optional weights of the whole model (a Runner
            checkpoint or its state dict), read without running code from
            the file (:func:`pola_mm.fileio.load_checkpoint_file`) and
            loaded strictly. Without it the model keeps its initialisation
            (the config's ``init_cfg`` is ignored, nothing is downloaded).
        cfg_options: overrides merged into the config first.

    Raises:
        ExportInputError: as :func:`build_backbone`; also a config whose
            codebase (mmdet, mmseg, mmpretrain) is not installed, and a
            checkpoint whose keys or shapes do not fit the model.
    """
    from ..fileio import CheckpointFileError, load_checkpoint_file
    from ..models.checkpoint import extract_state_dict
    from ..models.from_config import build_config_model
    cfg = _checked_config(config, cfg_options)
    name = config if isinstance(config, str) else 'the config'
    try:
        model = build_config_model(cfg)
    except Exception as err:  # registries raise many kinds
        raise ExportInputError(
            f'cannot build the model of {name} ({type(err).__name__}: '
            f'{_first_line(err).rstrip(".")}); check that its codebase '
            '(mmdet, mmseg or mmpretrain) is installed, the config and '
            '--cfg-options') from err
    if checkpoint:
        try:
            state = extract_state_dict(load_checkpoint_file(checkpoint))
            model.load_state_dict(dict(state), strict=True)
        except CheckpointFileError as err:
            raise ExportInputError(
                f'{_first_line(err)}; pass an intact checkpoint') from err
        except FileNotFoundError as err:
            raise ExportInputError(
                f'{_first_line(err)}; check the path') from err
        except (RuntimeError, KeyError, ValueError) as err:
            raise ExportInputError(
                f'checkpoint {checkpoint} does not fit the model of {name} '
                f'({_first_line(err).rstrip(".")}); pass a checkpoint of '
                'this config, or leave out CKPT') from err
    return TensorModeModel(model).eval()


def check_sizes(shape: Size2) -> List[Tuple[int, int]]:
    """Three ``(H, W)`` sizes other than ``shape`` to check a file with a
    dynamic height/width at: none a multiple of 32 in either side, the
    first smaller than ``shape``, the other two larger (one taller than
    wide relative to it, one wider)."""
    h, w = int(shape[0]), int(shape[1])
    raw = [(h * 4 // 5, w * 3 // 4), (h * 5 // 4 + 6, w * 3 // 2 + 6),
           (h * 3 // 2 + 10, w * 5 // 4 + 10)]
    sizes = []
    for a, b in raw:
        a, b = max(a, 17), max(b, 17)
        sizes.append((a + (a % 32 == 0), b + (b % 32 == 0)))
    return sizes


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
        dynamic_batch: a free batch dimension.
        dynamic_hw: a free height and width (both exporters: the
            TorchScript one with ``dynamic_axes``, the dynamo one with
            ``dynamic_shapes``). Pola-Swin's shifted-window stages refuse
            the dynamo exporter with a dynamic height/width
            (:class:`~pola_mm.ops.DynamicShapeExportError`, quoted).

    Below opset 13 the TorchScript exporter gets an ``aten::unflatten``
    symbolic for the duration of the call where torch has none
    (:func:`_unflatten_below_opset13`).

    Returns:
        ``out``.

    Raises:
        ExportError: an unknown exporter, an opset outside
            :data:`OPSETS`, or the exporter failed (its first line
            quoted; a refusal of a dynamic size by the model: its
            message).
    """
    if exporter not in EXPORTERS:
        raise ExportError(f'unknown exporter {exporter!r}; use one of '
                          f'{list(EXPORTERS)}')
    if opset is not None and not (
            OPSETS[exporter][0] <= int(opset) <= OPSETS[exporter][1]):
        lo, hi = OPSETS[exporter]
        raise ExportError(
            f'the {exporter} exporter is supported at opsets {lo} to {hi}, '
            f'not {opset}; pass --opset in that range'
            + (' or --exporter torchscript (opsets 11 to 21)'
               if exporter == 'dynamo' and int(opset) < lo else ''))
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
            f'({type(exc).__name__}: {_first_line(exc)})'
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
    from ..ops import DynamicShapeExportError
    DynamicShapeExportError.last = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', torch.jit.TracerWarning)
            with torch.no_grad(), _unflatten_below_opset13(exporter, opset), \
                    _quiet_guard_errors():
                torch.onnx.export(_captured(model, x, kwargs), (x, ), out,
                                  **kwargs)
    except Exception as exc:  # the exporters raise many kinds
        # in the chain, or raised and swallowed by a capture strategy the
        # exporter fell back from
        refusal = _dynamic_shape_refusal(exc) or DynamicShapeExportError.last
        if refusal is not None:
            raise DynamicExportRefused(_refusal_message(
                exporter, model, refusal)) from exc
        first = str(exc).strip().splitlines()
        other = 'torchscript' if exporter == 'dynamo' else 'dynamo'
        raise ExportError(
            f'the {exporter} exporter failed on {type(model).__name__} at '
            f'{shape[0]}x{shape[1]}: {type(exc).__name__}: '
            f'{first[0] if first else ""}; try --exporter {other}') from exc
    if DynamicShapeExportError.last is not None:
        # a part refused and the exporter fell back to a strategy that
        # captured it anyway (at one size): no such file is written
        _discard(out)
        raise DynamicExportRefused(_refusal_message(
            exporter, model, DynamicShapeExportError.last))
    if dynamic_hw and not _input_hw_is_dynamic(out):
        # torch.onnx's dynamo path refines unsatisfiable dynamic shapes to
        # the example's size: a file of one size is no dynamic export
        _discard(out)
        raise DynamicExportRefused(
            f'the {exporter} exporter fixed the height/width of '
            f'{type(model).__name__} at {shape[0]}x{shape[1]} (torch.export '
            'turned its size-dependent parts into guards on the size; '
            'Pola-Swin\'s shifted windows do), so no file was written; '
            'export with --exporter torchscript (torch.onnx.export(..., '
            'dynamo=False, dynamic_axes=...)) for a dynamic height/width, '
            'or without --dynamic')
    return out


def _captured(model: nn.Module, x: torch.Tensor, kwargs: dict) -> Any:
    """What ``torch.onnx.export`` is given: for a dynamic dynamo export,
    the program of torch.onnx's first capture strategy (``torch.export``,
    non-strict), captured here so that a part's refusal ends the export at
    once (torch.onnx would try its strict strategy next, about 30 s of a
    tiny Pola-Swin, and fail the same way); ``kwargs`` then lose the
    dynamic shapes the program carries. Any other failure of that capture
    leaves the model to torch.onnx's strategies, as without this step."""
    if 'dynamic_shapes' not in kwargs:
        return model
    from ..ops import DynamicShapeExportError
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


def _refusal_message(exporter: str, model: nn.Module, refusal: str) -> str:
    """The export tool's message for a part that refused a dynamic size."""
    return (f'the {exporter} exporter cannot export '
            f'{type(model).__name__} with a dynamic height/width: {refusal}')


def _discard(out: str) -> None:
    """Remove the ONNX file ``out`` and its external weights, if written."""
    for path in (out, osp.join(osp.dirname(out), data_file_name(out))):
        if osp.isfile(path):
            os.remove(path)


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


@contextlib.contextmanager
def _unflatten_below_opset13(exporter: str,
                             opset: Optional[int]) -> Iterator[None]:
    """While open, the TorchScript exporter has an ``aten::unflatten``
    symbolic at ``opset`` (11 or 12) where torch has none (torch serves it
    from opset 13; ``nn.MultiheadAttention`` and user code call
    ``unflatten``): a ``Reshape`` to the input's shape with the dim
    replaced, the same symbolic MMDeploy's fix registers
    (:mod:`pola_mm.deployment.mmdeploy_fixes`). Registered for the call
    only and removed after it, so nothing changes outside pola_mm's export;
    a no-op for the dynamo exporter, opsets >= 13 and a torch (or an open
    MMDeploy fix) that already has one."""
    if exporter != 'torchscript' or opset is None or int(opset) >= 13:
        yield
        return
    from torch.onnx import (register_custom_op_symbolic,
                            unregister_custom_op_symbolic)

    from .mmdeploy_fixes import _unflatten_symbolic, unflatten_symbolic_missing
    added = []
    try:
        for version in range(int(opset), 13):
            if unflatten_symbolic_missing(version):
                register_custom_op_symbolic('aten::unflatten',
                                            _unflatten_symbolic, version)
                added.append(version)
        yield
    finally:
        for version in added:
            unregister_custom_op_symbolic('aten::unflatten', version)


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


def available_runtimes() -> Tuple[str, ...]:
    """The :data:`RUNTIMES` installed here (ONNX Runtime, and OpenVINO when
    the ``openvino`` package imports)."""
    import importlib.util
    return tuple(r for r in RUNTIMES if importlib.util.find_spec(r))


def _runner(runtime: str, path: str) -> Any:
    """A function running the file ``path`` in ``runtime`` on one input
    array, returning its outputs as arrays in the graph's order.

    OpenVINO computes in float32 (its CPU default may be bf16)."""
    import numpy as np
    if runtime == 'onnxruntime':
        import onnxruntime as ort
        sess = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
        name = sess.get_inputs()[0].name
        return lambda x: sess.run(None, {name: x})
    if runtime == 'openvino':
        import openvino as ov
        compiled = ov.Core().compile_model(
            path, 'CPU', {'INFERENCE_PRECISION_HINT': 'f32'})
        return lambda x: [np.asarray(o) for o in compiled([x]).values()]
    raise ExportError(f'unknown runtime {runtime!r}; use one of '
                      f'{list(RUNTIMES)}')


def verify_onnx(model: nn.Module, path: str, inputs: Sequence[Tensor],
                rtol: float = DEFAULT_RTOL,
                runtimes: Sequence[str] = ('onnxruntime', )
                ) -> List[OutputCheck]:
    """Run ``path`` in each of ``runtimes`` (CPU; ONNX Runtime by default,
    :func:`available_runtimes` for all installed) and ``model`` in PyTorch
    (eval, no grad, fast paths as configured) on each of ``inputs``.

    An output agrees when its max abs difference is at most
    ``rtol * max(|PyTorch output|)`` (``rtol`` itself for an all-zero
    output). A shape mismatch counts as an infinite difference.

    Returns:
        One :class:`OutputCheck` per runtime, input and output.

    Raises:
        ExportError: a runtime cannot load or run the file (e.g. an input
            of another size than the export's), or gives another number of
            outputs.
    """
    import numpy as np
    model.eval()
    refs = []
    for x in inputs:
        with torch.no_grad():
            ref = model(x)
        ref = (ref, ) if isinstance(ref, Tensor) else tuple(ref)
        refs.append([r.detach().float().numpy() for r in ref])
    checks: List[OutputCheck] = []
    for runtime in runtimes:
        try:
            run = _runner(runtime, path)
        except ExportError:
            raise
        except Exception as exc:
            raise ExportError(f'{runtime} cannot load {path}: '
                              f'{_first_line(exc)}') from exc
        import onnx
        names = [o.name for o in onnx.load(
            path, load_external_data=False).graph.output]
        for x, ref in zip(inputs, refs):
            try:
                got = run(x.numpy())
            except Exception as exc:
                raise ExportError(
                    f'{runtime} failed to run {path} on an input of shape '
                    f'{tuple(x.shape)}: {_first_line(exc)}') from exc
            if len(got) != len(ref):
                raise ExportError(f'{path} has {len(got)} outputs in '
                                  f'{runtime}, PyTorch {len(ref)}')
            for name, r, o in zip(names, ref, got):
                scale = float(np.abs(r).max()) if r.size else 0.0
                if o.shape != r.shape:
                    diff = float('inf')
                else:
                    diff = float(np.abs(r - o).max()) if r.size else 0.0
                    if not np.isfinite(diff):
                        diff = float('inf')
                checks.append(OutputCheck(
                    name, int(x.shape[0]), tuple(o.shape), diff, scale,
                    rtol * scale if scale > 0 else rtol, runtime))
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
                      rtol: float = DEFAULT_RTOL,
                      dynamic_hw: bool = False,
                      runtimes: Optional[Sequence[str]] = None
                      ) -> List[OutputCheck]:
    """:func:`export_onnx` then :func:`verify_onnx`; files reach ``out``
    only when every output agrees in every runtime.

    Writes ``out`` and, when the exporter stores the weights outside the
    graph (the dynamo exporter does), ``<out>.data`` next to it
    (:func:`data_file_name`), to which ``out`` refers by that relative name:
    the two files can be moved or copied together to any folder. Both are
    exported under these final names into a private folder next to ``out``,
    checked there on a seeded input of batch 1 at ``shape`` (with
    ``dynamic_hw`` also at the three :func:`check_sizes`; with
    ``dynamic_batch`` one input more of batch 3, at the last other size
    with ``dynamic_hw``) in each of ``runtimes`` (default:
    :func:`available_runtimes`), then moved into place, the data file
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
        export_onnx(model, shape, tmp, exporter, opset, dynamic_batch,
                    dynamic_hw)
        data_files = _one_data_file(tmp)
        sizes = [tuple(shape)]
        if dynamic_hw:
            sizes += check_sizes(shape)
        inputs = [example_inputs(model, hw, batch=1, seed=1 + i)
                  for i, hw in enumerate(sizes)]
        if dynamic_batch:
            inputs.append(example_inputs(model, sizes[-1], batch=3, seed=9))
        if runtimes is None:
            runtimes = available_runtimes()
        checks = verify_onnx(model, tmp, inputs, rtol, runtimes)
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
