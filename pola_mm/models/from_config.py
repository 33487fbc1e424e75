"""The pola_mm backbone of a config, for the tools that need the backbone
alone (ONNX export, attention analysis)."""
import os.path as osp
from typing import Any, Optional, Sequence, Tuple

import torch.nn as nn

__all__ = ['backbone_from_config']


def backbone_from_config(config: Any,
                         checkpoint: Optional[str] = None,
                         cfg_options: Optional[dict] = None,
                         out_indices: Optional[Sequence[int]] = None
                         ) -> Tuple[nn.Module, Any]:
    """Build ``model.backbone`` of a classifier, detector or segmentor config.

    Args:
        config: a config file or an mmengine ``Config``.
        checkpoint: weights read through the backbone's strict pretrained
            loading (:func:`pola_mm.models.load_checkpoint_file`, which never
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

    import pola_mm  # noqa: F401  (registers the backbones, pola_mm::)
    from ..registry import MODELS
    if not isinstance(config, Config):
        if not osp.isfile(config):
            raise FileNotFoundError(f'config file not found: {config}')
        config = Config.fromfile(config)
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
    backbone = MODELS.build(bcfg)
    backbone.init_weights()
    return backbone.eval(), config
