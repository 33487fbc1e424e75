"""The authors' weights in pola_mm's layout, and pretrained loading into a
backbone (``init_cfg=dict(type='Pretrained', ...)``).

The authors' classifiers (``{'model': state_dict}``) use the same module
names as pola_mm's backbones, so conversion is a prefix rename:

- every backbone key gets ``backbone.``; ``head.*`` becomes ``head.fc.*``
  (mmpretrain ``LinearClsHead``);
- Pola-Swin's final ``norm.*`` becomes ``backbone.norm3.*`` (the output norm
  of the last stage);
- Pola-PVT's final ``norm.*`` is dropped: the published classifier never
  applies it;
- the recomputed buffers ``relative_position_index`` and ``attn_mask`` are
  dropped;
- PolaPP (PolaFormer++) keeps every name; its recomputed rotary buffers
  ``layers.i.RoPE.angle`` / ``RoPE_linear.angle`` are dropped. The authors'
  ImageNet classifier (``POLA_b*``) ends in ``proj`` (1x1 conv), ``norm``
  (BatchNorm) and a 1x1-conv ``head``: ``proj.*`` / ``norm.*`` become
  ``neck.proj.*`` / ``neck.norm.*`` (pola_mm's ``PolaPPClsNeck``) and the
  head's ``(classes, P, 1, 1)`` weight becomes
  ``head.fc.weight`` ``(classes, P)``. A backbone loading such a file keeps
  only ``backbone.*`` (the classifier's ``extra_norms`` do not exist and
  start fresh, as in the authors' downstream code).

Reading the file is not this module's job: every file pola_mm reads for
weights goes through :func:`pola_mm.fileio.load_checkpoint_file`
(``torch.load(weights_only=True)`` first, pola_mm's restricted unpickler for
the files torch refuses, so no code from the file ever runs).
"""
import os
import os.path as osp
import re
from collections import OrderedDict
from itertools import zip_longest
from typing import Callable, Dict, List, Mapping, Optional

import torch
from mmengine.logging import print_log
from torch import Tensor

from ..fileio import load_checkpoint_file
from ..fileio.safe_load import summarise_keys, weights_key

__all__ = [
    'official_family', 'is_polapp_classifier', 'convert_official_checkpoint',
    'backbone_state_dict', 'extract_state_dict', 'load_pretrained',
    'where_to_get_weights', 'POLAFORMER_WEIGHTS', 'POLAPP_WEIGHTS',
    'adapt_pos_tables', 'PretrainedNotFoundError'
]

class PretrainedNotFoundError(FileNotFoundError):
    """A backbone's ``init_cfg`` names a local pretrained checkpoint that
    does not exist; the message says where to get the weights and how to
    point the config at them (an uncaught one is printed as one line:
    :func:`pola_mm.config_errors.excepthook`)."""


SWIN_SENTINEL = 'patch_embed.proj.weight'
PVT_SENTINEL = 'patch_embed1.proj.weight'
POLAPP_SENTINEL = 'patch_embed.proj.0.weight'  # PolaPP's conv stem
_POLAPP_ROPE = re.compile(r'^layers\.\d+\.(RoPE|RoPE_linear)\.angle$')
_DROPPED_BUFFERS = ('relative_position_index', 'attn_mask')
_POLA_ONLY = re.compile(r'^norm[0-3]\.')


def official_family(state_dict: Mapping[str, Tensor]) -> Optional[str]:
    """``'swin'`` / ``'pvt'`` / ``'polapp'`` for a state dict in the
    authors' layout, else ``None``.

    The authors' layout is recognised by its sentinel key
    (``patch_embed.proj.weight`` for Swin, ``patch_embed1.proj.weight`` for
    PVT, ``patch_embed.proj.0.weight`` for PolaPP), no ``backbone.`` prefix
    and none of pola_mm's output norms ``norm0..3``.
    """
    keys = list(state_dict.keys())
    if any(k.startswith('backbone.') for k in keys):
        return None
    if any(_POLA_ONLY.match(k) for k in keys):
        return None
    if SWIN_SENTINEL in state_dict:
        return 'swin'
    if PVT_SENTINEL in state_dict:
        return 'pvt'
    if POLAPP_SENTINEL in state_dict:
        return 'polapp'
    return None


def is_polapp_classifier(state_dict: Mapping[str, Tensor]) -> bool:
    """Whether ``state_dict`` is the authors' PolaPP ImageNet classifier
    (``POLA_b*``: the PolaPP layout with its ``proj`` 1x1 conv and ``head``)
    rather than their detection / segmentation backbone."""
    return official_family(state_dict) == 'polapp' and \
        'proj.weight' in state_dict and 'head.weight' in state_dict


def convert_official_checkpoint(
        state_dict: Mapping[str, Tensor]) -> 'OrderedDict[str, Tensor]':
    """Convert the authors' state dict to mmpretrain's classifier layout.

    Safe to run twice: a dict that is not in the authors' layout (e.g.
    already converted) is returned unchanged (as a new OrderedDict).

    Args:
        state_dict: the authors' ``checkpoint['model']``.

    Returns:
        ``backbone.*`` + ``head.fc.*`` keys (PolaPP classifiers also
        ``neck.*``), tensors unchanged but for the PolaPP 1x1-conv head
        weight, flattened to ``(classes, P)``.
    """
    family = official_family(state_dict)
    if family is None:
        return OrderedDict(state_dict)
    out: 'OrderedDict[str, Tensor]' = OrderedDict()
    for key, value in state_dict.items():
        if key.rsplit('.', 1)[-1] in _DROPPED_BUFFERS or (
                family == 'polapp' and _POLAPP_ROPE.match(key)):
            continue
        if key.startswith('head.'):
            if family == 'polapp' and value.dim() == 4:  # 1x1 conv head
                value = value.flatten(1)
            out['head.fc.' + key[len('head.'):]] = value
        elif family == 'polapp' and key.startswith(('proj.', 'norm.')):
            out['neck.' + key] = value  # the classifier's PolaPPClsNeck
        elif key.startswith('norm.'):
            if family == 'swin':
                out['backbone.norm3.' + key[len('norm.'):]] = value
            # PVT: the published forward does not apply the final norm.
        else:
            out['backbone.' + key] = value
    return out


def backbone_state_dict(
        state_dict: Mapping[str, Tensor]) -> 'OrderedDict[str, Tensor]':
    """Backbone-only keys of a state dict, without the ``backbone.`` prefix.

    Accepts the authors' layout (converted first), a classifier / detector
    checkpoint (``backbone.*`` kept, everything else dropped) or a plain
    backbone state dict (returned as is).
    """
    sd = convert_official_checkpoint(state_dict)
    if any(k.startswith('backbone.') for k in sd):
        return OrderedDict((k[len('backbone.'):], v) for k, v in sd.items()
                           if k.startswith('backbone.'))
    return OrderedDict(sd)


def extract_state_dict(checkpoint: Mapping) -> Mapping[str, Tensor]:
    """The state dict inside a loaded checkpoint file (its
    :func:`~pola_mm.fileio.safe_load.weights_key` entry: ``state_dict``,
    ``model`` or ``module``, else the mapping itself)."""
    if not isinstance(checkpoint, Mapping):
        return checkpoint
    key = weights_key(checkpoint)
    return checkpoint if key is None else checkpoint[key]


#: where the authors publish their PolaFormer ImageNet-1k classifiers
POLAFORMER_WEIGHTS = 'https://huggingface.co/ZachMeng/PolaFormer/tree/main'
#: where they publish the PolaFormer++ (PolaPP) ones (extraction code atba)
POLAPP_WEIGHTS = 'https://pan.baidu.com/s/1tjG-Qq2zFwN_HZswAzxarQ?pwd=atba'


def where_to_get_weights(key: str = 'model.backbone.init_cfg') -> str:
    """The text a missing ImageNet checkpoint's error ends with: where the
    authors publish their files and every way to point a config at one.

    Args:
        key: the config key of the ``Pretrained`` init_cfg, for the
            ``--cfg-options`` examples.
    """
    return ('ImageNet weights are the authors\' released classifiers '
            f'(PolaFormer: {POLAFORMER_WEIGHTS}; PolaFormer++: '
            f'{POLAPP_WEIGHTS}, extraction code atba); they load as '
            'downloaded (or convert with '
            'tools/model_converters/pola_official_to_mm.py). Save the file '
            'under that name, set $POLA_PRETRAINED to the folder holding '
            'it (the configs read $POLA_PRETRAINED/<name>), pass '
            f'--cfg-options {key}.checkpoint=PATH, or train from scratch '
            f'with --cfg-options {key}=None')


def load_pretrained(module: torch.nn.Module,
                    checkpoint: str,
                    expected_missing: Callable[[str], bool],
                    expected_unexpected: Callable[[str], bool],
                    expected_checkpoint: str,
                    prefix: Optional[str] = None) -> None:
    """Load a pretrained checkpoint into a backbone, strictly.

    The file may be an authors' checkpoint, a converted mmpretrain
    classifier, a detector/segmentor checkpoint or a plain backbone state
    dict. Everything is validated before any weight is copied, so a
    checkpoint that does not fit leaves the module untouched.

    Args:
        module: the backbone.
        checkpoint: path or URL (read with :func:`load_checkpoint_file`).
        expected_missing: predicate for module keys that may be absent
            (e.g. new output norms).
        expected_unexpected: predicate for checkpoint keys that are fine to
            ignore (stages not built, the authors' unused norm).
        expected_checkpoint: text naming what the module expects, for the
            error message.
        prefix: optional prefix (e.g. ``'backbone.'``) to select and strip.

    Raises:
        PretrainedNotFoundError: a local ``checkpoint`` that does not exist.
        ValueError: missing, unexpected or shape-mismatched keys.
    """
    is_remote = '://' in str(checkpoint)
    if not is_remote and not osp.isfile(checkpoint):
        raise PretrainedNotFoundError(
            f'Pretrained checkpoint {checkpoint!r} not found (relative to '
            f'{os.getcwd()!r}). {where_to_get_weights()}')
    ckpt = load_checkpoint_file(checkpoint, map_location='cpu')
    sd = extract_state_dict(ckpt)
    if prefix:
        if not prefix.endswith('.'):
            prefix += '.'
        sd = OrderedDict((k[len(prefix):], v) for k, v in sd.items()
                         if k.startswith(prefix))
    family = official_family(sd)
    classifier = is_polapp_classifier(sd)
    converted = convert_official_checkpoint(sd)
    others = ([k for k in converted if not k.startswith('backbone.')]
              if any(k.startswith('backbone.') for k in converted) else [])
    sd = backbone_state_dict(converted)
    if not sd:
        raise ValueError(
            f'{type(module).__name__}: checkpoint {checkpoint!r} holds no '
            f'backbone weights. Expected {expected_checkpoint}.')
    own = module.state_dict()
    resized = adapt_pos_tables(sd, module)
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    mismatched = [
        f'{k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}'
        for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)
    ]
    bad_missing = [k for k in missing if not expected_missing(k)]
    bad_unexpected = [k for k in unexpected if not expected_unexpected(k)]
    if bad_missing or bad_unexpected or mismatched:
        matched = len(own) - len(missing) - len(mismatched)
        # a few of each kind, interleaved
        kinds = [[f'missing {k}' for k in bad_missing],
                 [f'unexpected {k}' for k in bad_unexpected], mismatched]
        problems = [p for group in zip_longest(*kinds) for p in group
                    if p is not None]
        raise ValueError(
            f'{type(module).__name__}: checkpoint {checkpoint!r} does not fit '
            f'this backbone: {matched} of {len(own)} keys matched; '
            f'{len(bad_missing)} missing, {len(bad_unexpected)} unexpected, '
            f'{len(mismatched)} with another shape, e.g. '
            f'{"; ".join(problems[:5])}. Expected {expected_checkpoint}.')
    module.load_state_dict(
        OrderedDict((k, v) for k, v in sd.items() if k in own), strict=False)
    notes: List[str] = []
    if missing:
        notes.append(f'not in checkpoint (kept initialised): '
                     f'{summarise_keys(missing)}')
    if unexpected:
        notes.append(f'ignored: {summarise_keys(unexpected)}')
    if resized:
        notes.append(f'position tables resized: {summarise_keys(resized)}')
    if others:
        notes.append(f'non-backbone keys ignored: {summarise_keys(others)}')
    if family == 'pvt':
        notes.append("the authors' final PVT norm is unused by the published "
                     'forward and was dropped')
    if classifier:
        new = [k for k in missing if k.startswith('extra_norms.')]
        notes.append(
            "the authors' PolaPP ImageNet classifier: its classification-only "
            'proj / norm / head were dropped' +
            (' and the output norms extra_norms.* start fresh'
             if new else '') + " (as the authors' downstream code loads it)")
    if isinstance(ckpt, Mapping) and 'state_dict_ema' in ckpt and \
            weights_key(ckpt) == 'model':
        notes.append("weights from 'model' (the raw weights, as the authors' "
                     "downstream code), not 'state_dict_ema'")
    print_log(
        f'{type(module).__name__}: loaded {len(own) - len(missing)}/{len(own)}'
        f' tensors from {checkpoint}' +
        ('; ' + '; '.join(notes) if notes else ''),
        logger='current')


def adapt_pos_tables(state_dict: Dict[str, Tensor],
                     module: torch.nn.Module) -> List[str]:
    """Resize learned token tables of another pre-training size, in place.

    ``positional_encoding`` (of a :class:`PolarityAttention`, grid
    ``ref_hw``) and PVT's ``pos_embed{i}`` (grid ``module.ref_grids[i-1]``)
    whose checkpoint version has the same channels but another (square) token
    count are resized by bicubic interpolation to the module's grid, e.g. to
    fine-tune a 224 checkpoint at 384; Swin's ``relative_position_bias_table``
    of another window is cropped to the offsets of a smaller window or
    bicubic-resized for a larger one. Anything else is left for the shape
    check.

    Returns:
        The keys that were resized.
    """
    from ..ops.position import resize_pos_table
    own = module.state_dict()
    done = []
    for key, value in list(state_dict.items()):
        if key not in own or own[key].shape == value.shape:
            continue
        name = key.rsplit('.', 1)[-1]
        if name == 'relative_position_bias_table':
            table = _adapt_bias_table(value, own[key].shape)
            if table is not None:
                state_dict[key] = table
                done.append(key)
            continue
        if value.dim() != 3 or own[key].dim() != 3 or \
                value.shape[-1] != own[key].shape[-1]:
            continue
        grid = None
        if name == 'positional_encoding':
            grid = getattr(module.get_submodule(key.rsplit('.', 1)[0]),
                           'ref_hw', None)
        elif re.fullmatch(r'pos_embed\d+', name) and \
                hasattr(module, 'ref_grids'):
            grid = module.ref_grids[int(name[len('pos_embed'):]) - 1]
        side = int(round(value.shape[1]**0.5))
        if grid is None or side * side != value.shape[1]:
            continue
        state_dict[key] = resize_pos_table(value, (side, side), grid)
        done.append(key)
    return done


def _adapt_bias_table(table: Tensor, shape: torch.Size) -> Optional[Tensor]:
    """``((2w-1)^2, h)`` table -> ``((2w'-1)^2, h)``: the centre (the exact
    offsets of the smaller window) when shrinking, bicubic when growing."""
    if table.dim() != 2 or len(shape) != 2 or table.shape[1] != shape[1]:
        return None
    s1 = int(round(table.shape[0]**0.5))
    s2 = int(round(shape[0]**0.5))
    if s1 * s1 != table.shape[0] or s2 * s2 != shape[0]:
        return None
    grid = table.t().reshape(1, -1, s1, s1)
    if s2 <= s1:
        c = (s1 - s2) // 2
        grid = grid[:, :, c:c + s2, c:c + s2]
    else:
        grid = torch.nn.functional.interpolate(
            grid.float(), size=(s2, s2), mode='bicubic',
            align_corners=False).to(table.dtype)
    return grid.reshape(-1, s2 * s2).t().contiguous()
