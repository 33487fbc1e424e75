"""The ONNX opsets each exporter is supported at, and the shim that lets
the TorchScript exporter write opsets 11 and 12.

:data:`OPSETS`: the TorchScript exporter is supported at opsets 11 to 21,
the dynamo exporter at 18 to 21; :func:`check_opset` refuses any other
with one :class:`~pola_mm.deployment.onnx_errors.ExportError`. Below 13,
``aten::unflatten``, which torch serves from opset 13 only, gets a
symbolic registered for the duration of the export
(:func:`unflatten_below_opset13`; the symbolic is the one MMDeploy's fix
registers, :func:`pola_mm.deployment.mmdeploy_fixes.unflatten_symbolic`).
"""
import contextlib
from typing import Iterator, Optional

from .mmdeploy_fixes import unflatten_symbolic, unflatten_symbolic_missing
from .onnx_errors import ExportError

__all__ = ['OPSETS', 'check_opset', 'unflatten_below_opset13']

#: The opsets each exporter is supported at (inclusive; tested at both
#: ends on torch 2.14; an older torch's own maximum applies, 17 on torch
#: 2.1). The dynamo exporter writes opset 18 and converts others with
#: ONNX's version converter, which cannot take its graphs below 18 (it
#: then silently keeps 18, so lower opsets are refused here).
OPSETS = {'torchscript': (11, 21), 'dynamo': (18, 21)}


def check_opset(exporter: str, opset: Optional[int]) -> None:
    """Refuse an ``opset`` outside ``exporter``'s :data:`OPSETS` (None, the
    exporter's default, is always accepted).

    Raises:
        ExportError: the opset is outside the range; the message names the
            range (and, below the dynamo exporter's, the TorchScript
            exporter).
    """
    if opset is None:
        return
    lo, hi = OPSETS[exporter]
    if not lo <= int(opset) <= hi:
        raise ExportError(
            f'the {exporter} exporter is supported at opsets {lo} to {hi}, '
            f'not {opset}; pass --opset in that range'
            + (' or --exporter torchscript (opsets 11 to 21)'
               if exporter == 'dynamo' and int(opset) < lo else ''))


@contextlib.contextmanager
def unflatten_below_opset13(exporter: str,
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
    added = []
    try:
        for version in range(int(opset), 13):
            if unflatten_symbolic_missing(version):
                register_custom_op_symbolic('aten::unflatten',
                                            unflatten_symbolic, version)
                added.append(version)
        yield
    finally:
        for version in added:
            unregister_custom_op_symbolic('aten::unflatten', version)
