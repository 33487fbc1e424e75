"""Checking an exported ONNX file against PyTorch.

:func:`verify_onnx` runs a file in ONNX Runtime (and OpenVINO, when the
``openvino`` package is installed: :func:`available_runtimes`) on the same
inputs as the PyTorch model and compares every output
(:class:`OutputCheck`: max abs difference within :data:`DEFAULT_RTOL` of
the output's scale). A file with a free height/width is checked at the
export size and at three other sizes (:func:`check_sizes`: none a multiple
of 32, two larger than the export size).
"""
from dataclasses import dataclass
from typing import Any, List, Sequence, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from ..type_aliases import Size2
from .onnx_errors import ExportError, first_line

__all__ = [
    'RUNTIMES', 'DEFAULT_RTOL', 'OutputCheck', 'available_runtimes',
    'check_sizes', 'verify_onnx'
]

#: The runtimes a file is checked in: ONNX Runtime always, OpenVINO when
#: the ``openvino`` package is installed.
RUNTIMES = ('onnxruntime', 'openvino')

#: Default tolerance: max abs difference per output, relative to the output
#: scale (its max abs value in PyTorch).
DEFAULT_RTOL = 1e-4


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
                              f'{first_line(exc)}') from exc
        import onnx
        names = [o.name for o in onnx.load(
            path, load_external_data=False).graph.output]
        for x, ref in zip(inputs, refs):
            try:
                got = run(x.numpy())
            except Exception as exc:
                raise ExportError(
                    f'{runtime} failed to run {path} on an input of shape '
                    f'{tuple(x.shape)}: {first_line(exc)}') from exc
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

