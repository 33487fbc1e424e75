"""MMDeploy's side of the verification: the deploy configs and the export.

:func:`export_with_mmdeploy` runs MMDeploy's own ``torch2onnx`` with a
deploy config (MMDeploy's stock ONNX Runtime configs work unchanged once
:mod:`pola_mm` is imported, see :mod:`pola_mm.deployment.mmdeploy_fixes`);
:func:`load_deploy_configs` reads and checks the deploy and model configs.

A deploy config given as ``mmdeploy::<path>`` (``<path>`` relative to
MMDeploy's ``configs/`` folder, e.g.
``mmdeploy::mmdet/detection/detection_onnxruntime_dynamic.py``) is
MMDeploy's stock file from the copy that ships with pola_mm
(:func:`resolve_deploy_config`; the ``mmdeploy`` wheel ships none). One
given as ``pola_mm_deploy::<path>`` is one of pola_mm's own deploy configs
(:func:`pola_mm_deploy_configs`), which inherit the stock ones: the
detection and instance-segmentation configs at opset 16, where MMDeploy's
RoIAlign computes mmdet's for every RoI (:func:`roi_align_advice`).

Used by :mod:`pola_mm.deployment.mmdeploy_verify` and
:mod:`pola_mm.deployment.mmdeploy_draw`.
"""
import copy
import os
import os.path as osp
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
from mmengine.config import Config

__all__ = [
    'TASKS', 'ImageLike', 'DeployError', 'DeployInputError',
    'MMDEPLOY_SCOPE', 'POLA_MM_DEPLOY_SCOPE', 'ROI_ALIGN_OPSET',
    'stock_configs_dir', 'stock_deploy_configs', 'pola_mm_configs_dir',
    'pola_mm_deploy_configs', 'shipped_deploy_config_names',
    'suggested_deploy_config', 'roi_align_advice', 'resolve_deploy_config',
    'load_deploy_configs', 'is_dynamic_hw', 'deploy_task',
    'require_mmdeploy', 'export_with_mmdeploy'
]

#: MMDeploy tasks this module can verify.
TASKS = ('ObjectDetection', 'InstanceSegmentation', 'Segmentation',
         'Classification')

ImageLike = Union[str, np.ndarray]


class DeployError(RuntimeError):
    """A deployment that failed or whose backend disagrees with PyTorch; the
    message says what went wrong."""


class DeployInputError(DeployError):
    """Bad input: a missing file, an unreadable config or override, a
    deploy config this module does not verify."""


#: How a deploy config names one of MMDeploy's stock files shipped with
#: pola_mm: ``mmdeploy::<path relative to MMDeploy's configs/>``.
MMDEPLOY_SCOPE = 'mmdeploy::'


def stock_configs_dir() -> str:
    """The ``configs/`` folder of MMDeploy's stock deploy configs that ship
    with pola_mm (``pola_mm/.mim/mmdeploy_configs``: MMDeploy v1.3.1's files
    byte for byte in MMDeploy's layout, with its LICENSE, README.md for the
    provenance and BLOBS.txt for their git blob ids)."""
    return osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), '.mim',
                    'mmdeploy_configs', 'configs')


#: How a deploy config names one of pola_mm's own deploy configs:
#: ``pola_mm_deploy::<path relative to pola_mm's deploy_configs/>``.
POLA_MM_DEPLOY_SCOPE = 'pola_mm_deploy::'

#: The least opset at which MMDeploy 1.3.1's RoIAlign symbolic computes
#: mmdet's ``aligned=True`` RoIAlign for every RoI (ONNX RoiAlign with
#: ``coordinate_transformation_mode='half_pixel'``); below it, it shifts
#: the RoIs and writes the old RoiAlign, which clamps each RoI side to at
#: least one feature cell.
ROI_ALIGN_OPSET = 16


def pola_mm_configs_dir() -> str:
    """The folder of pola_mm's own deploy configs
    (``pola_mm/.mim/deploy_configs``, next to MMDeploy's stock copies,
    which they inherit by relative ``_base_``)."""
    return osp.join(osp.dirname(osp.dirname(stock_configs_dir())),
                    'deploy_configs')


def _configs_under(root: str) -> List[str]:
    """The ONNX Runtime deploy configs under ``root``, as ``/``-separated
    paths relative to it (sorted; ``_base_`` folders left out)."""
    names = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != '_base_']
        names += [
            osp.relpath(osp.join(folder, f), root).replace(os.sep, '/')
            for f in files if f.endswith('.py') and 'onnxruntime' in f
        ]
    return sorted(names)


def stock_deploy_configs() -> List[str]:
    """The shipped ONNX Runtime deploy configs, as the paths after
    ``mmdeploy::`` (sorted; the ``_base_`` files and backend-less bases are
    left out)."""
    return _configs_under(stock_configs_dir())


def pola_mm_deploy_configs() -> List[str]:
    """pola_mm's own deploy configs, as the paths after
    ``pola_mm_deploy::`` (sorted): MMDeploy's stock detection and
    instance-segmentation configs at opset :data:`ROI_ALIGN_OPSET`, named
    as the stock file with ``-opset16`` added."""
    return _configs_under(pola_mm_configs_dir())


def suggested_deploy_config(task: str, dynamic: bool = True) -> str:
    """The deploy config the docs and tools suggest for a detector
    (``task`` ``'detection'``) or an instance segmenter
    (``'instance-seg'``): pola_mm's opset-16 one, by name."""
    kind = 'dynamic' if dynamic else 'static'
    return (f'{POLA_MM_DEPLOY_SCOPE}mmdet/{task}/{task}_onnxruntime_'
            f'{kind}-opset{ROI_ALIGN_OPSET}.py')


def roi_align_advice(deploy_cfg: Config, model_cfg: Config) -> Optional[str]:
    """One line for a model with a RoIAlign (a two-stage detector) exported
    below opset :data:`ROI_ALIGN_OPSET`, naming the deploy config to use
    instead; None where there is nothing to say.

    Below opset 16 MMDeploy 1.3.1's RoIAlign symbolic emulates mmdet's
    ``aligned=True`` by shifting the RoIs half a cell and writing ONNX
    RoiAlign, which ONNX Runtime computes like mmcv's ``aligned=False``:
    each RoI side clamped to at least one feature cell. RoIs thinner than a
    cell (untrained models propose many) then pool other features.
    """
    model = model_cfg.get('model') or {}
    if not (hasattr(model, 'get') and model.get('roi_head')):
        return None
    opset = int(deploy_cfg.onnx_config.get('opset_version', 11))
    if opset >= ROI_ALIGN_OPSET:
        return None
    task = ('instance-seg' if 'masks' in (
        deploy_cfg.onnx_config.get('output_names') or []) else 'detection')
    name = suggested_deploy_config(task, is_dynamic_hw(deploy_cfg))
    return (f'opset {opset} < {ROI_ALIGN_OPSET}: MMDeploy\'s RoIAlign then '
            'clamps RoIs thinner than one feature cell, which mmdet does '
            f'not (scores and masks of such boxes differ); use {name} '
            '(the same deploy config at opset 16, docs/deployment.md)')


def shipped_deploy_config_names() -> List[str]:
    """Every deploy config name that :func:`resolve_deploy_config` knows:
    MMDeploy's stock ones (``mmdeploy::``), then pola_mm's own
    (``pola_mm_deploy::``)."""
    return ([MMDEPLOY_SCOPE + n for n in stock_deploy_configs()] +
            [POLA_MM_DEPLOY_SCOPE + n for n in pola_mm_deploy_configs()])


def resolve_deploy_config(deploy_cfg: str) -> str:
    """The file of a deploy config: ``mmdeploy::<path>`` is the shipped
    stock file ``<path>`` (:func:`stock_configs_dir`),
    ``pola_mm_deploy::<path>`` pola_mm's own (:func:`pola_mm_configs_dir`),
    any other string a path, returned as given.

    Raises:
        DeployInputError: a scoped name with no shipped file (the message
            lists :func:`shipped_deploy_config_names`).
    """
    deploy_cfg = str(deploy_cfg)
    scopes = ((MMDEPLOY_SCOPE, stock_configs_dir(), 'MMDeploy'),
              (POLA_MM_DEPLOY_SCOPE, pola_mm_configs_dir(), 'pola_mm'))
    for scope, root, what in scopes:
        if not deploy_cfg.startswith(scope):
            continue
        path = osp.normpath(osp.join(root, deploy_cfg[len(scope):]))
        if path.startswith(root + os.sep) and osp.isfile(path):
            return path
        names = ', '.join(shipped_deploy_config_names())
        raise DeployInputError(f'unknown {what} deploy config {deploy_cfg} '
                               f'(shipped with pola_mm: {names})')
    return deploy_cfg


def load_deploy_configs(deploy_cfg: Union[str, Config],
                        model_cfg: Union[str, Config],
                        cfg_options: Optional[Dict[str, Any]] = None
                        ) -> Tuple[Config, Config]:
    """The deploy and model configs as ``Config`` objects (copies).

    Args:
        deploy_cfg: an MMDeploy deploy config file, ``mmdeploy::<path>``
            (:func:`resolve_deploy_config`) or ``Config``.
        model_cfg: a model config file (mmdet / mmseg / mmpretrain) or
            ``Config``.
        cfg_options: overrides merged into the model config.

    Raises:
        DeployError: a config file does not exist, or the deploy config has
            no ``codebase_config`` / ``onnx_config``.
    """
    cfgs = []
    if not isinstance(deploy_cfg, Config):
        deploy_cfg = resolve_deploy_config(deploy_cfg)
    for what, cfg in (('deploy config', deploy_cfg), ('model config',
                                                      model_cfg)):
        if isinstance(cfg, Config):
            cfgs.append(copy.deepcopy(cfg))
            continue
        if not osp.isfile(str(cfg)):
            raise DeployInputError(f'{what} not found: {cfg}')
        try:
            cfgs.append(Config.fromfile(str(cfg)))
        except Exception as exc:  # syntax errors, missing bases, ...
            raise DeployInputError(f'cannot read {what} {cfg}: '
                                   f'{type(exc).__name__}: {exc}') from exc
    deploy, model = cfgs
    if cfg_options:
        try:
            model.merge_from_dict(cfg_options)
        except Exception as exc:  # e.g. a dict over a string
            raise DeployInputError(f'--cfg-options: {exc}') from exc
    for key in ('codebase_config', 'onnx_config', 'backend_config'):
        if key not in deploy:
            raise DeployInputError(
                f'the deploy config has no {key}: is it an MMDeploy deploy '
                'config (e.g. configs/mmdet/detection/'
                'detection_onnxruntime_static.py)?')
    if deploy.backend_config.get('type') != 'onnxruntime':
        raise DeployInputError(
            'only the ONNX Runtime backend is verified here; the deploy '
            f"config's backend is {deploy.backend_config.get('type')!r}")
    return deploy, model


def is_dynamic_hw(deploy_cfg: Config) -> bool:
    """Whether the deploy config leaves the input's height or width free."""
    axes = deploy_cfg.onnx_config.get('dynamic_axes') or {}
    names = deploy_cfg.onnx_config.get('input_names') or ['input']
    for name in names:
        spec = axes.get(name)
        if spec is None:
            continue
        dims = spec.keys() if isinstance(spec, dict) else spec
        if 2 in dims or 3 in dims:
            return True
    return False


def deploy_task(deploy_cfg: Config) -> str:
    """The task the deploy config exports (one of :data:`TASKS`; an
    ``ObjectDetection`` config with ``masks`` among its outputs is
    ``InstanceSegmentation``).

    Raises:
        DeployError: a task this package does not verify.
    """
    task = deploy_cfg.codebase_config.get('task')
    if task == 'ObjectDetection' and 'masks' in (
            deploy_cfg.onnx_config.get('output_names') or []):
        return 'InstanceSegmentation'
    if task not in TASKS:
        raise DeployError(f'MMDeploy task {task!r} is not verified here; '
                          f'supported: {list(TASKS)}')
    return task


def require_mmdeploy() -> None:
    """Import MMDeploy, or say how to install it: what every user of
    MMDeploy in pola_mm (the export here, the verification, the drawing,
    the whole-model benchmark) calls before its ``from mmdeploy... import``.
    ``import pola_mm``, which every module of the package runs first, has
    registered the models and the MMDeploy fixes, which run as
    ``mmdeploy.core`` is imported.

    Raises:
        DeployError: MMDeploy is not installed (the message says how to
            install it).
    """
    try:
        import mmdeploy  # noqa: F401
    except ImportError as exc:
        raise DeployError(
            'MMDeploy is not installed: pip install -r '
            'requirements/mmdeploy_deps.txt && pip install --no-deps -r '
            'requirements/mmdeploy.txt (see docs/deployment.md)') from exc


def export_with_mmdeploy(deploy_cfg: Config, model_cfg: Config,
                         checkpoint: Optional[str], img: ImageLike,
                         work_dir: str, device: str = 'cpu') -> str:
    """MMDeploy's ``torch2onnx`` of the model on ``img``.

    Returns:
        The path of the written ``.onnx`` file (in ``work_dir``).

    Raises:
        DeployError: the export failed (its exception quoted).
    """
    require_mmdeploy()
    from mmdeploy.apis import torch2onnx
    save_file = deploy_cfg.onnx_config.get('save_file', 'end2end.onnx')
    os.makedirs(work_dir, exist_ok=True)
    try:
        torch2onnx(img, work_dir, save_file, deploy_cfg, model_cfg,
                   checkpoint, device)
    except Exception as exc:  # the exporter and rewriters raise many kinds
        lines = str(exc).strip().splitlines()
        raise DeployError(f'MMDeploy torch2onnx failed: {type(exc).__name__}: '
                          f'{lines[0] if lines else ""}') from exc
    path = osp.join(work_dir, save_file)
    if not osp.isfile(path):
        raise DeployError(f'MMDeploy torch2onnx wrote no {path}')
    return path
