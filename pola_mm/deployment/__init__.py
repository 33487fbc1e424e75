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
import importlib
from typing import Any

#: public name -> the module of this package that defines it; loaded on
#: first use, so that ``import pola_mm`` (which loads only
#: :mod:`~pola_mm.deployment.mmdeploy_fixes`, and only where MMDeploy is
#: installed) does not load the export and verification code
_LAZY = {
    'EXPORTERS': 'onnx', 'ExportError': 'onnx', 'OutputCheck': 'onnx',
    'build_backbone': 'onnx', 'example_inputs': 'onnx',
    'export_and_verify': 'onnx', 'export_onnx': 'onnx',
    'verify_onnx': 'onnx', 'DeployError': 'mmdeploy_verify',
    'DeployReport': 'mmdeploy_verify', 'deploy_and_verify': 'mmdeploy_verify',
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    value = getattr(importlib.import_module(f'.{module}', __name__), name)
    globals()[name] = value
    return value
