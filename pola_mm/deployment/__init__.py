"""Deployment: ONNX export of the backbones and whole models, verified by
ONNX Runtime and OpenVINO (the tool ``python -m
pola_mm.deployment.pytorch2onnx``, :mod:`~pola_mm.deployment.pytorch2onnx`),
and whole models through MMDeploy, verified against PyTorch (``python -m
pola_mm.deployment.deploy``, :mod:`~pola_mm.deployment.deploy`). In a
checkout ``tools/deployment/`` runs the two tools too.

torch's own exporters, one module per job:

- :mod:`~pola_mm.deployment.onnx_export`: the exporter choice, the
  TorchScript and dynamo calls, and the verified export
  (:func:`export_onnx`, :func:`export_and_verify`);
- :mod:`~pola_mm.deployment.onnx_build`: what is exported, from a config
  (:func:`build_backbone`, :func:`build_model`, seeded without a
  checkpoint; :func:`save_state_dict`), and its inputs;
- :mod:`~pola_mm.deployment.onnx_defaults`: the tool's defaults, the
  config's test size (:func:`config_test_size`) and a file under
  ``work_dirs/`` (:func:`default_onnx_path`);
- :mod:`~pola_mm.deployment.onnx_verify`: the file checked in the runtimes
  against PyTorch, at the export size and others (:func:`verify_onnx`);
- :mod:`~pola_mm.deployment.onnx_refusal`: a dynamic export that cannot
  be one, refused (:class:`DynamicExportRefused`);
- :mod:`~pola_mm.deployment.onnx_opsets`: the opsets each exporter takes
  and the opset-11/12 shim;
- :mod:`~pola_mm.deployment.onnx_files`: the ``.onnx`` file and its
  external weights, written privately and moved into place;
- :mod:`~pola_mm.deployment.onnx_errors`: :class:`ExportError` and
  :class:`ExportInputError`.

MMDeploy: :mod:`~pola_mm.deployment.mmdeploy_verify` (the verification,
:func:`deploy_and_verify`), the export in
:mod:`~pola_mm.deployment.mmdeploy_export` (with pola_mm's own deploy
configs, the stock ones at opset 16 for two-stage detectors), the
comparisons in :mod:`~pola_mm.deployment.mmdeploy_compare` (detections:
at least the top 20 of each side), drawing in
:mod:`~pola_mm.deployment.mmdeploy_draw`, with the narrow fixes that let
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
    'EXPORTERS': 'onnx_export', 'export_onnx': 'onnx_export',
    'export_and_verify': 'onnx_export',
    'TensorModeModel': 'onnx_build', 'build_backbone': 'onnx_build',
    'build_model': 'onnx_build', 'example_inputs': 'onnx_build',
    'RUNTIMES': 'onnx_verify', 'OutputCheck': 'onnx_verify',
    'available_runtimes': 'onnx_verify', 'check_sizes': 'onnx_verify',
    'verify_onnx': 'onnx_verify',
    'DynamicExportRefused': 'onnx_refusal', 'OPSETS': 'onnx_opsets',
    'data_file_name': 'onnx_files', 'external_data_files': 'onnx_files',
    'ExportError': 'onnx_errors', 'ExportInputError': 'onnx_errors',
    'DeployError': 'mmdeploy_verify', 'DeployReport': 'mmdeploy_verify',
    'deploy_and_verify': 'mmdeploy_verify',
    'NothingComparedError': 'mmdeploy_verify',
    'seeded': 'onnx_build', 'save_state_dict': 'onnx_build',
    'weights_line': 'onnx_build',
    'config_test_size': 'onnx_defaults', 'default_onnx_path': 'onnx_defaults',
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    value = getattr(importlib.import_module(f'.{module}', __name__), name)
    globals()[name] = value
    return value
