"""Deployment: ONNX export of the backbones, verified by onnxruntime
(:mod:`pola_mm.deployment.onnx`, used by
``tools/deployment/pytorch2onnx.py``), and whole models through MMDeploy,
verified against PyTorch (:mod:`pola_mm.deployment.mmdeploy_verify`, used
by ``tools/deployment/deploy.py``: the export in
:mod:`~pola_mm.deployment.mmdeploy_export`, the comparisons in
:mod:`~pola_mm.deployment.mmdeploy_compare`, drawing in
:mod:`~pola_mm.deployment.mmdeploy_draw`), with the narrow fixes that let
MMDeploy export on the modern torch
(:mod:`pola_mm.deployment.mmdeploy_fixes`, applied once MMDeploy is
imported, where ``import pola_mm`` finds it installed) and its rewriters
for the ONNX Runtime backend
(:mod:`pola_mm.deployment.mmdeploy_rewriters`).

Nothing here imports the package root back (``import pola_mm`` runs before
any of these modules)."""
from .mmdeploy_verify import DeployError, DeployReport, deploy_and_verify
from .onnx import (EXPORTERS, ExportError, OutputCheck, build_backbone,
                   example_inputs, export_and_verify, export_onnx, verify_onnx)

__all__ = [
    'EXPORTERS', 'ExportError', 'OutputCheck', 'build_backbone',
    'example_inputs', 'export_onnx', 'verify_onnx', 'export_and_verify',
    'DeployError', 'DeployReport', 'deploy_and_verify'
]
