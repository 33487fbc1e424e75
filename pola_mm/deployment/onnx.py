"""ONNX export of pola_mm backbones, verified by onnxruntime.

:func:`export_onnx` writes a backbone to an ONNX file with either of
torch's exporters; :func:`verify_onnx` runs the file in onnxruntime on the
same inputs as the PyTorch model and compares every output;
:func:`export_and_verify` does both and only leaves a file at the target
path when every output agrees, so no exporter can hand out a silently
different model. :func:`build_backbone` builds the backbone of any pola_mm
config (classifier, detector or segmentor), optionally with a checkpoint.

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
import os
import os.path as osp
import warnings
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from ..type_aliases import Size2

__all__ = [
    'EXPORTERS', 'ExportError', 'OutputCheck', 'build_backbone',
    'export_onnx', 'verify_onnx', 'export_and_verify', 'example_inputs'
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


def build_backbone(config: Any,
                   checkpoint: Optional[str] = None,
                   cfg_options: Optional[dict] = None) -> nn.Module:
    """The backbone of a pola_mm config, in eval mode.

    Args:
        config: a config file (classifier, detector or segmentor: anything
            with ``model.backbone``) or an mmengine ``Config``.
        checkpoint: optional weights, read through the backbone's strict
            pretrained loading (:func:`pola_mm.models.load_checkpoint_file`,
            which never runs code from the file): the authors' file, a
            converted classifier, a detector / segmentor checkpoint or a
            backbone state dict. The config's own ``init_cfg`` is ignored
            (without ``checkpoint`` the backbone keeps its initialisation).
        cfg_options: overrides merged into the config first (e.g. a smaller
            ``model.backbone.arch``).

    Raises:
        ExportError: no ``model.backbone``, or not a pola_mm backbone.
    """
    from ..models.from_config import backbone_from_config
    try:
        model, _ = backbone_from_config(config, checkpoint, cfg_options)
    except ValueError as err:
        raise ExportError(f'{err}; this tool exports pola_mm backbones '
                          'only') from err
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
                dynamic_batch: bool = False) -> str:
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

    Returns:
        ``out``.

    Raises:
        ExportError: an unknown exporter, ``dynamic_batch`` with
            ``'torchscript'``, or the exporter failed (its first line
            quoted).
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
        if dynamic_batch:
            kwargs['dynamic_shapes'] = (
                {0: torch.export.Dim('batch', min=1, max=1024)}, )
    else:
        kwargs['dynamo'] = False
    d = osp.dirname(osp.abspath(out))
    os.makedirs(d, exist_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', torch.jit.TracerWarning)
            with torch.no_grad():
                torch.onnx.export(model, (x, ), out, **kwargs)
    except Exception as exc:  # the exporters raise many kinds
        first = str(exc).strip().splitlines()
        other = 'torchscript' if exporter == 'dynamo' else 'dynamo'
        raise ExportError(
            f'the {exporter} exporter failed on {type(model).__name__} at '
            f'{shape[0]}x{shape[1]}: {type(exc).__name__}: '
            f'{first[0] if first else ""}; try --exporter {other}') from exc
    return out


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


def export_and_verify(model: nn.Module,
                      shape: Size2,
                      out: str,
                      exporter: str = 'dynamo',
                      opset: Optional[int] = None,
                      dynamic_batch: bool = False,
                      rtol: float = DEFAULT_RTOL) -> List[OutputCheck]:
    """:func:`export_onnx` then :func:`verify_onnx`; the file reaches
    ``out`` only when every output agrees.

    The file is written next to ``out`` first and checked on a seeded input
    of batch 1 at ``shape`` (with ``dynamic_batch`` also at batch 3).

    Returns:
        The checks (all within tolerance).

    Raises:
        ExportError: the export failed, or an output differs beyond the
            tolerance (the message lists every output; no file is left at
            ``out``).
    """
    tmp = out + '.unverified'
    try:
        export_onnx(model, shape, tmp, exporter, opset, dynamic_batch)
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
    except BaseException:
        if osp.exists(tmp):
            os.remove(tmp)
        raise
    os.replace(tmp, out)
    return checks
