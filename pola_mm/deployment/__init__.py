"""Deployment: ONNX export of the backbones, verified by onnxruntime
(:mod:`pola_mm.deployment.onnx`, used by
``tools/deployment/pytorch2onnx.py``)."""
from .onnx import (EXPORTERS, ExportError, OutputCheck, build_backbone,
                   example_inputs, export_and_verify, export_onnx,
                   verify_onnx)

__all__ = [
    'EXPORTERS', 'ExportError', 'OutputCheck', 'build_backbone',
    'example_inputs', 'export_onnx', 'verify_onnx', 'export_and_verify'
]
