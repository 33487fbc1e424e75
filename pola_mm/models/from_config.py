"""Models built from configs: the one builder of the tools.

Everything is built through MMEngine's registries in the model's scope
(:func:`build_in_scope`): a backbone config (pola_mm's, or another
codebase's such as mmdet's softmax baselines, whose registry MMEngine
imports by scope: nothing here imports mmdet), the ``model`` of a config
file (:func:`build_config_model`), or the pola_mm backbone of a config with
its weights (:func:`backbone_from_config`, for the ONNX export and the
attention analysis). :mod:`pola_mm.analysis.zoo` names the models of the
benchmark, the memory tool and the FLOPs counter and builds them here.
"""
import copy
import importlib
import os.path as osp
from typing import Any, Dict, Optional, Sequence, Tuple

import torch.nn as nn

__all__ = ['ConfigFileError', 'load_config', 'build_in_scope',
           'build_config_model', 'backbone_from_config']


class ConfigFileError(ValueError):
    """A config file that mmengine cannot read (a syntax error, a missing
    ``_base_`` file, ...); the message names the file and the error."""


def load_config(path: str, cfg_options: Optional[dict] = None) -> Any:
    """The mmengine ``Config`` of a file, with ``cfg_options`` (the tools'
    ``--cfg-options``) merged into it: pola_mm's one config reader (the
    train / test tools, the analysis tools, the ONNX export).

    Raises:
        FileNotFoundError: no such file (``config file not found: PATH``).
        ConfigFileError: mmengine cannot read it (``cannot read config
            PATH: ...``), or ``cfg_options`` cannot be merged into it.
    """
    if not osp.isfile(path):
        raise FileNotFoundError(f'config file not found: {path}')
    from mmengine.config import Config
    try:
        cfg = Config.fromfile(path)
    except Exception as exc:  # syntax errors, missing _base_ files, ...
        raise ConfigFileError(f'cannot read config {path}: '
                              f'{type(exc).__name__}: {exc}') from exc
    if cfg_options:
        try:
            cfg.merge_from_dict(cfg_options)
        except (TypeError, KeyError) as exc:  # a dict over a str, ...
            raise ConfigFileError(f'--cfg-options do not fit config {path}: '
                                  f'{exc}') from exc
    return cfg


def build_in_scope(cfg: Dict[str, Any], scope: str = 'pola_mm') -> nn.Module:
    """Build ``cfg`` with the ``MODELS`` registry of ``scope``
    (``'pola_mm'``, ``'mmdet'``, ...), that scope being the default while it
    builds (MMEngine imports the scope's models; pola_mm's are registered
    first)."""
    from mmengine.registry import MODELS
    importlib.import_module('pola_mm.models')  # registers the backbones
    with MODELS.switch_scope_and_registry(scope) as registry:
        return registry.build(cfg)


def build_config_model(cfg: Any) -> nn.Module:
    """The ``model`` of an mmengine ``Config`` (a detector, segmentor,
    classifier or bare backbone), built in the config's ``default_scope``.

    Raises:
        ValueError: the config has no ``model``.
    """
    model_cfg = cfg.get('model')
    if model_cfg is None:
        raise ValueError('the config has no "model"')
    return build_in_scope(copy.deepcopy(model_cfg),
                          cfg.get('default_scope') or 'mmengine')


def backbone_from_config(config: Any,
                         checkpoint: Optional[str] = None,
                         cfg_options: Optional[dict] = None,
                         out_indices: Optional[Sequence[int]] = None
                         ) -> Tuple[nn.Module, Any]:
    """Build ``model.backbone`` of a classifier, detector or segmentor config.

    Args:
        config: a config file or an mmengine ``Config``.
        checkpoint: weights read through the backbone's strict pretrained
            loading (:func:`pola_mm.fileio.load_checkpoint_file`, which never
            runs code from the file): the authors' file, a converted
            classifier, a detector / segmentor checkpoint or a backbone state
            dict. The config's own ``init_cfg`` is ignored; without
            ``checkpoint`` the backbone keeps pola_mm's initialisation.
        cfg_options: overrides merged into the config first (e.g. a smaller
            ``model.backbone.arch``).
        out_indices: override of the backbone's ``out_indices``.

    Returns:
        the backbone in eval mode, and the (merged) config.

    Raises:
        FileNotFoundError: the config or the checkpoint file is missing.
        ValueError: no ``model.backbone``, or not a pola_mm backbone.
    """
    from mmengine.config import Config

    from ..registry import MODELS
    if not isinstance(config, Config):
        config = load_config(config)
    if cfg_options:
        config.merge_from_dict(cfg_options)
    model_cfg = config.get('model')
    bcfg = model_cfg.get('backbone') if model_cfg is not None else None
    if bcfg is None:
        raise ValueError('the config has no model.backbone; pass a '
                         'classifier, detector or segmentor config of pola_mm '
                         '(configs/*.py)')
    bcfg = dict(bcfg)
    bcfg.pop('_delete_', None)
    btype = bcfg.get('type')
    name = (btype if isinstance(btype, str) else
            getattr(btype, '__name__', str(btype)))
    name = name[len('pola_mm.'):] if name.startswith('pola_mm.') else name
    if name not in MODELS.module_dict:
        raise ValueError(f'model.backbone type {btype!r} is not a pola_mm '
                         f'backbone (one of {sorted(MODELS.module_dict)})')
    if checkpoint and '://' not in checkpoint and not osp.isfile(checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {checkpoint}')
    bcfg['type'] = name
    bcfg['init_cfg'] = (dict(type='Pretrained', checkpoint=checkpoint)
                        if checkpoint else None)
    if out_indices is not None:
        bcfg['out_indices'] = tuple(out_indices)
    backbone = build_in_scope(bcfg)
    backbone.init_weights()
    backbone.eval()
    return backbone, config
