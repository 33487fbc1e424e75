"""The models of the analysis tools, by name, and the one builder behind the
benchmark, the memory tool and the FLOPs counter.

Names are read from the backbones' own ``arch_zoo`` (each arch is defined
there once; nothing here repeats a width, depth or head count):

- ``pola_swin_t|s|b``, ``pola_pvt_t|s|m|l``, ``polapp_b0`` ... ``polapp_b5``:
  ``<family>_<key>`` for the first key of every arch of
  :class:`~pola_mm.models.PolaSwinTransformer`, :class:`~pola_mm.models.
  PolaPVT` and :class:`~pola_mm.models.PolaPP`, with the backbone's own
  defaults (drop path: the arch's, from its ``arch_zoo``);
- their softmax counterparts in mmdet (:func:`counterpart`):
  ``swin_<key>`` (``SwinTransformer``, window 7), ``pvt_<key>``
  (``PyramidVisionTransformer``) and ``pvt_v2_<key>``
  (``PyramidVisionTransformerV2``), at the same widths, depths, heads and
  drop path;
- ``<pola name>_plain``: the same Pola model run with every fast path off
  (``pola_mm.ops.use_implementation('graph')``);
- ``<pola name>_torch``: the same Pola model with the fast paths on but
  without the attention's Triton kernels (the torch path they replace on a
  GPU; ``POLA_MM_OPS=cpu``);
- ``<name>_compile`` for every Pola name and its softmax counterpart: the
  model's forward under ``torch.compile`` (the attention ops then run
  their graph form).

What :func:`build` takes (a *spec*): a name; a backbone config dict
(``_scope_='mmdet'`` builds it with mmdet's registry, pola_mm's otherwise;
``_fast_paths_=False`` runs it with every fast path off, as a ``_plain``
name; ``_kernels_=False`` without the Triton kernels, as a ``_torch``
name; ``_compile_=True`` compiles the forward (``torch.compile``), as a
``_compile`` name; a ``type`` of the form ``'package.module:Name'`` calls
that class or function with the other keys); an OpenMMLab config file
(``.py``: its whole model, measured through ``extract_feat``, or its bare
backbone); or
``{'_config_': FILE, 'backbone': DICT}``, a config file with its backbone
replaced (what :func:`counterpart` returns for a file). Everything is built
by pola_mm's one builder, :mod:`pola_mm.models.from_config` (MMEngine's
registries, in the model's scope).
"""
import contextlib
import copy
import importlib
import inspect
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import (Any, Callable, ContextManager, Dict, List, Optional,
                    Sequence, Tuple, Union)

import torch.nn as nn

from .. import models  # noqa: F401  (registers the backbones)
from ..models.backbones.base import arch_drop_path
from ..models.from_config import (build_config_model, build_in_scope,
                                  load_config)
from ..registry import MODELS

__all__ = [
    'FAMILIES', 'Spec', 'Built', 'zoo', 'zoo_names', 'backbone_config',
    'counterpart', 'stage_of', 'build'
]

#: A model the builder takes (see the module docstring).
Spec = Union[str, Dict[str, Any]]

#: Name prefix of a Pola family -> (its registry type, the name prefix of
#: its softmax counterpart in mmdet).
FAMILIES: Dict[str, tuple] = {
    'pola_swin': ('PolaSwinTransformer', 'swin'),
    'pola_pvt': ('PolaPVT', 'pvt'),
    'polapp': ('PolaPP', 'pvt_v2'),
}

_PLAIN = '_plain'
_TORCH = '_torch'
_COMPILE = '_compile'


def _backbone_class(kind: str) -> type:
    return MODELS.get(kind)


def _arch_names(cls: type) -> List[str]:
    """The first key of every distinct arch of ``cls.arch_zoo`` (aliases
    made with ``dict.fromkeys`` share one dict)."""
    seen: List[dict] = []
    names = []
    for key, arch in cls.arch_zoo.items():
        if any(arch is s or arch == s for s in seen):
            continue
        seen.append(arch)
        names.append(key)
    return names


@lru_cache(maxsize=None)
def zoo() -> Dict[str, Dict[str, Any]]:
    """Every name -> its backbone config (with ``_scope_``; ``_plain``
    names with ``_fast_paths_=False``). Built once from the backbones'
    ``arch_zoo``; the dict is the table itself (a test may add to it)."""
    table: Dict[str, Dict[str, Any]] = {}
    for prefix, (kind, soft_prefix) in FAMILIES.items():
        for arch in _arch_names(_backbone_class(kind)):
            name = f'{prefix}_{arch}'
            cfg = dict(_scope_='pola_mm', type=kind, arch=arch)
            table[name] = cfg
            table[name + _PLAIN] = dict(cfg, _fast_paths_=False)
            table[name + _TORCH] = dict(cfg, _kernels_=False)
            table[name + _COMPILE] = dict(cfg, _compile_=True)
            soft = _softmax_backbone(cfg)
            if soft is not None:
                table[f'{soft_prefix}_{arch}'] = soft
                table[f'{soft_prefix}_{arch}{_COMPILE}'] = dict(
                    soft, _compile_=True)
    return table


def zoo_names() -> List[str]:
    """The names of :func:`zoo`, in table order."""
    return list(zoo())


def backbone_config(spec: Spec) -> Dict[str, Any]:
    """The backbone config of a name or a config dict: a copy, with
    ``_scope_`` (default ``'pola_mm'``).

    Raises:
        KeyError: an unknown name.
    """
    if isinstance(spec, str):
        table = zoo()
        if spec not in table:
            raise KeyError(f'unknown model {spec!r}: use a config file (.py) '
                           f'or one of {", ".join(table)}')
        cfg = copy.deepcopy(table[spec])
    elif isinstance(spec, dict) and 'type' in spec:
        cfg = copy.deepcopy(dict(spec))
    else:
        raise TypeError(f'a model is a name, a config file or a dict with '
                        f'"type", got {spec!r}')
    cfg.setdefault('_scope_', 'pola_mm')
    return cfg


# -- softmax counterparts ----------------------------------------------------
def _short_type(t: Any) -> str:
    return t.__name__ if isinstance(t, type) else str(t).split('.')[-1]


def _pola_arch(kind: str, bb: Dict[str, Any]) -> Dict[str, Any]:
    arch = bb.get('arch', inspect.signature(
        _backbone_class(kind)).parameters['arch'].default)
    if isinstance(arch, dict):
        return dict(arch)
    return dict(_backbone_class(kind).arch_zoo[str(arch).lower()])


def _softmax_backbone(bb: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """mmdet's softmax backbone of the same shape as the Pola backbone
    config ``bb``, or None (not a Pola model, or no such shape)."""
    kind = _short_type(bb.get('type'))
    if kind not in {k for k, _ in FAMILIES.values()}:
        return None
    a = _pola_arch(kind, bb)
    common = dict(_scope_='mmdet',
                  out_indices=tuple(bb.get('out_indices', (0, 1, 2, 3))),
                  drop_path_rate=arch_drop_path(a, bb.get('drop_path_rate')))
    dims = a['embed_dims']
    if kind == 'PolaSwinTransformer':
        return dict(common, type='SwinTransformer', embed_dims=int(dims),
                    depths=tuple(a['depths']),
                    num_heads=tuple(a['num_heads']), window_size=7,
                    mlp_ratio=bb.get('mlp_ratio', 4))
    dims = tuple(int(c) for c in dims)
    if kind == 'PolaPVT':  # PVTv1: one width per head in every stage
        heads = tuple(int(h) for h in a['num_heads'])
        base = dims[0] // heads[0]
        if any(c != base * h for c, h in zip(dims, heads)):
            return None
        return dict(common, type='PyramidVisionTransformer',
                    embed_dims=base, num_layers=tuple(a['depths']),
                    num_heads=heads,
                    mlp_ratios=tuple(a.get('mlp_ratios', (8, 8, 4, 4))))
    # PolaPP: PVTv2, the softmax pyramid with the same ingredients
    # (overlapping conv patch embedding, conv FFN), MLP ratio 4
    base = dims[0]
    if any(c % base for c in dims):
        return None
    return dict(common, type='PyramidVisionTransformerV2', embed_dims=base,
                num_layers=tuple(a['depths']),
                num_heads=tuple(c // base for c in dims),
                mlp_ratios=(4, 4, 4, 4))


def _is_config_file(spec: Spec) -> bool:
    return isinstance(spec, str) and spec.endswith('.py')


def counterpart(spec: Spec) -> Optional[Spec]:
    """The softmax model a Pola model is compared with: mmdet's
    ``SwinTransformer`` for Pola-Swin (window 7), ``PyramidVisionTransformer``
    for Pola-PVT and ``PyramidVisionTransformerV2`` for PolaPP, at the same
    widths, depths, heads and drop path (a backbone config dict). A config
    file gets ``{'_config_': FILE, 'backbone': DICT}``: the same config
    with its backbone replaced. None where there is none."""
    if _is_config_file(spec):
        cfg = load_config(spec)
        model = cfg.get('model') or {}
        whole = 'backbone' in model
        bb = model['backbone'] if whole else model
        soft = _softmax_backbone(
            bb.to_dict() if hasattr(bb, 'to_dict') else dict(bb))
        if soft is None or not whole:
            return soft
        return {'_config_': spec, 'backbone': soft}
    cfg = backbone_config(spec)
    if cfg.get('_scope_') != 'pola_mm':
        return None
    return _softmax_backbone(cfg)


# -- stages of the zoo's models ---------------------------------------------
_STAGE_RULES: Sequence[Tuple[str, int]] = (
    # Pola-Swin, PolaPP, mmdet Swin/PVT: layers.i / stages.i (0-based),
    # output norms norm{i} / extra_norms.i
    (r'(?:layers|stages|extra_norms)\.(\d+)(?:\.|$)', 0),
    (r'norm(\d+)(?:\.|$)', 0),
    # Pola-PVT: the authors' 1-based patch_embed{i}, pos_embed{i}, block{i}
    (r'(?:patch_embed|pos_drop|block)(\d+)(?:\.|$)', 1),
)


def stage_of(module: str) -> str:
    """The stage a module belongs to: ``'stage1'``..``'stage4'`` (1-based,
    the patch embedding and downsampling of a stage included; the stem
    ``patch_embed`` counts to stage 1), else its first path component
    (``'neck'``, ...) or ``'(top)'``.

    Args:
        module: dotted module path, optionally under ``backbone.``.
    """
    path = module[len('backbone.'):] if module.startswith(
        'backbone.') else module
    for pattern, base in _STAGE_RULES:
        m = re.match(pattern, path)
        if m:
            return f'stage{int(m.group(1)) - base + 1}'
    if path == 'patch_embed' or path.startswith('patch_embed.'):
        return 'stage1'
    if not module:
        return '(top)'
    if module.startswith('backbone.'):
        return 'backbone'
    return module.split('.')[0]


# -- building ----------------------------------------------------------------
@dataclass
class Built:
    """A model built by :func:`build`.

    Attributes:
        model: the module (in training mode, as built).
        forward: what a measurement calls with the images: the model itself
            (a backbone) or its ``extract_feat`` (backbone and neck of a
            whole model).
        kind: ``'backbone'`` or ``'extract_feat'``.
        fast_paths: False for a ``_plain`` name: run it under
            :meth:`paths`.
        kernels: False for a ``_torch`` name: run it under :meth:`paths`.
    """
    model: nn.Module
    forward: Callable[..., Any]
    kind: str = 'backbone'
    fast_paths: bool = True
    kernels: bool = True

    def paths(self) -> ContextManager[None]:
        """The context the model runs in: every fast path off for a
        ``_plain`` model, the kernels off for a ``_torch`` one, nothing
        otherwise."""
        from ..ops import use_implementation
        if not self.fast_paths:
            return use_implementation('graph')
        if not self.kernels:
            return use_implementation('cpu')
        return contextlib.nullcontext()


def build(spec: Spec) -> Built:
    """Build a model of the zoo, a backbone config, or the model of a config
    file (see the module docstring), on the CPU.

    Raises:
        KeyError: an unknown name.
        FileNotFoundError: a missing config file.
        ValueError: a whole model without ``extract_feat``.
    """
    if _is_config_file(spec) or (isinstance(spec, dict)
                                 and '_config_' in spec):
        path = spec if isinstance(spec, str) else spec['_config_']
        cfg = load_config(path)
        if isinstance(spec, dict):
            soft = dict(spec['backbone'])
            soft['type'] = f"{soft.pop('_scope_', 'mmdet')}.{soft['type']}"
            cfg.model.backbone = soft
        model = build_config_model(cfg)
        if 'backbone' not in cfg.model:
            return Built(model, model)
        if not hasattr(model, 'extract_feat'):
            raise ValueError(f'{path}: the model ({type(model).__name__}) '
                             'has no extract_feat to measure')
        return Built(model, model.extract_feat, 'extract_feat')
    cfg = backbone_config(spec)
    fast_paths = bool(cfg.pop('_fast_paths_', True))
    kernels = bool(cfg.pop('_kernels_', True))
    compiled = bool(cfg.pop('_compile_', False))
    scope = cfg.pop('_scope_')
    kind = cfg.get('type')
    if isinstance(kind, str) and ':' in kind:
        module, attr = cfg.pop('type').split(':', 1)
        model = getattr(importlib.import_module(module), attr)(**cfg)
    else:
        model = build_in_scope(cfg, scope)
    if compiled:
        import torch
        return Built(model, torch.compile(model), 'backbone', fast_paths,
                     kernels)
    return Built(model, model, 'backbone', fast_paths, kernels)
