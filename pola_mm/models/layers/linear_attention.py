"""The linear attention modules: PolaFormer's polarity-aware attention
(ICLR 2025) and PolaFormer++'s PaCS attention.

- :class:`PolarityAttention` serves both PolaFormer backbones: Pola-Swin
  (fused ``qkvg`` projection) and Pola-PVT (``qg`` + ``kv`` projections);
  both attend to all tokens of a stage map. Its feature map is the learned
  power (PolaFormer) or PaCS (``feature_map='pacs'``).
- :class:`PaCSAttention` is PolaPP's block part (the authors'
  ``AddLinearAttention``).

PaCS, the polarity-aware feature map with channel-wise spikiness, replaces
PolaFormer's learned power by ``phi(x; t) = exp(t * x) - 1`` with learned
per-channel temperatures ``t = sigmoid(s)``, one for the same-signed and one
for the opposite-signed flow; the keys take ``exp(x) - 1``. In PolaPP the
products (not the normalisers) carry a 2-D rotary encoding. Both modules
share the op :func:`~pola_mm.ops.pacs_attention` and the temperatures
``s1``, ``s2`` (:func:`add_pacs_temperatures`,
:func:`reset_pacs_temperatures`).

The arithmetic lives in the ops (:func:`~pola_mm.ops.polarity_attention`,
:func:`~pola_mm.ops.pacs_attention`); parameter names are the authors'.
"""
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule
from torch import Tensor

from ...ops import (depthwise_conv2d, gate_linear, pacs_attention,
                    polarity_attention)
from ...ops.checks import check_token_grid
from ...ops.position import check_resize_mode, resize_pos_table
from ...type_aliases import Size2
from .attention_args import polarity_head_dims
from .bricks import linear_chunks
from .embed import pad_for_stride
from .token_map import to_map, to_tokens

__all__ = ['PolarityAttention', 'PaCSAttention', 'FEATURE_MAPS',
           'add_pacs_temperatures', 'reset_pacs_temperatures']

#: The feature maps of :class:`PolarityAttention`.
FEATURE_MAPS = ('power', 'pacs')


def add_pacs_temperatures(module: nn.Module, num_heads: int,
                          head_dims: int) -> None:
    """Register the raw temperatures ``s1``, ``s2`` ``(1, h, 1, 2d)`` on
    ``module`` (the authors' names), initialised by
    :func:`reset_pacs_temperatures`."""
    for name in ('s1', 's2'):
        module.register_parameter(
            name, nn.Parameter(torch.empty(1, num_heads, 1, 2 * head_dims)))
    reset_pacs_temperatures(module)


def reset_pacs_temperatures(module: nn.Module) -> None:
    """The authors' init of ``module.s1``, ``module.s2``: zero (so both
    flows start at ``t = sigmoid(0) = 1/2``). The one place that
    initialises them, at construction and in the backbones'
    ``init_weights``."""
    with torch.no_grad():
        module.s1.zero_()
        module.s2.zero_()


class PolarityAttention(BaseModule):
    """Polarity-aware linear attention with gate and depth-wise conv on v.

    ``forward`` reads as the paper: project ``q, k, v, g``; polarity
    attention of the heads (feature maps with the learned power, the
    same-signed and opposite-signed flows, their concatenation: the op
    :func:`~pola_mm.ops.polarity_attention`), the keys carrying the learned
    ``positional_encoding``; plus a depth-wise conv of ``v`` over the stage
    map; times the gate ``g``; output projection.

    Args:
        embed_dims: channels ``C``.
        num_heads: heads ``h``; ``d = C / h`` must be even.
        ref_hw: the grid of ``positional_encoding`` (Swin: the authors'
            polarity window at the pre-training size, the whole stage map;
            PVT: the stage at 224, divided by ``sr_ratio``). Resized with
            ``interpolate_mode`` to other maps.
        fused_qkvg: True for Swin's ``qkvg`` Linear(C, 4C); False for PVT's
            ``qg`` and ``kv`` Linear(C, 2C) each.
        qkv_bias: bias of the input projections.
        alpha: exponent range of the learned power,
            ``p = 1 + alpha * sigmoid(power)``.
        kernel_size: depth-wise conv kernel on v.
        attn_drop: must be 0: the linear attention has no attention
            matrix to drop (a non-zero rate raises instead of being
            ignored).
        proj_drop: dropout after ``proj``.
        feature_map: ``'power'`` (PolaFormer, the default: ``relu(+-t)^p``
            with the learned ``power``) or ``'pacs'`` (PolaFormer++'s PaCS:
            channel-wise ``exp(t x) - 1`` with one learned temperature per
            flow, parameters ``s1``, ``s2`` of shape ``(1, h, 1, 2d)``
            instead of ``power``; :func:`~pola_mm.ops.pacs_attention`).
            Scale, positional table, depth-wise conv, gate and projections
            are the same for both.
        sr_ratio: the authors' spatial reduction of keys and values in
            Pola-PVT (their ``la_sr_ratios``; 1 in every published model):
            with ``r > 1`` (only with ``fused_qkvg=False``), k and v come
            from ``kv(norm(sr(x)))``, ``sr`` a Conv2d with kernel = stride =
            ``r`` over the stage map and ``norm`` a LayerNorm;
            ``positional_encoding`` lies on the reduced grid; for the
            depth-wise conv, v is brought back to the ``N`` tokens by linear
            interpolation along the token sequence, as the authors do.
        interpolate_mode: how ``positional_encoding`` is resized to other
            maps: ``'bicubic'`` (Pola-Swin, the authors' 384 fine-tune) or
            ``'bilinear'`` (Pola-PVT, the authors' PVT and its downstream
            lineage).
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 ref_hw: Size2,
                 fused_qkvg: bool = True,
                 qkv_bias: bool = True,
                 alpha: float = 4,
                 kernel_size: int = 5,
                 attn_drop: float = 0.,
                 proj_drop: float = 0.,
                 feature_map: str = 'power',
                 sr_ratio: int = 1,
                 interpolate_mode: str = 'bicubic',
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if sr_ratio < 1 or (sr_ratio > 1 and fused_qkvg):
            raise ValueError(
                f'sr_ratio={sr_ratio}: the spatial reduction of keys and '
                'values needs sr_ratio >= 1 and the separate qg / kv '
                'projections of Pola-PVT (fused_qkvg=False)')
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f'feature_map must be one of {FEATURE_MAPS} '
                             f"('power': PolaFormer, 'pacs': PolaFormer++), "
                             f'got {feature_map!r}')
        if attn_drop:
            raise ValueError(
                f'attn_drop={attn_drop}: polarity attention has no attention '
                'matrix to drop; use attn_drop=0 (attn_drop_rate=0 in the '
                'backbone) and drop_rate / drop_path_rate instead')
        head_dims = polarity_head_dims(embed_dims, num_heads)
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = head_dims
        self.ref_hw = (int(ref_hw[0]), int(ref_hw[1]))
        self.sr_ratio = int(sr_ratio)
        self.interpolate_mode = check_resize_mode(interpolate_mode)
        self.fused_qkvg = fused_qkvg
        self.alpha = float(alpha)
        self.feature_map = feature_map
        if fused_qkvg:
            self.qkvg = nn.Linear(embed_dims, embed_dims * 4, bias=qkv_bias)
        else:
            self.qg = nn.Linear(embed_dims, embed_dims * 2, bias=qkv_bias)
            self.kv = nn.Linear(embed_dims, embed_dims * 2, bias=qkv_bias)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)
        if self.sr_ratio > 1:  # the authors' names and order
            self.sr = nn.Conv2d(embed_dims, embed_dims, self.sr_ratio,
                                stride=self.sr_ratio)
            self.norm = nn.LayerNorm(embed_dims)
        self.dwc = nn.Conv2d(head_dims, head_dims, kernel_size,
                             padding=kernel_size // 2, groups=head_dims)
        if feature_map == 'power':
            self.power = nn.Parameter(
                torch.zeros(1, num_heads, 1, head_dims))
        else:
            add_pacs_temperatures(self, num_heads, head_dims)
        self.scale = nn.Parameter(torch.zeros(1, 1, embed_dims))
        self.positional_encoding = nn.Parameter(
            torch.zeros(1, self.ref_hw[0] * self.ref_hw[1], embed_dims))

    def reset_own_parameters(self) -> None:
        """The authors' init of this module's own parameters (the
        backbones' ``init_weights`` calls it): the power (or the PaCS
        temperatures), ``scale`` and ``positional_encoding`` zero."""
        if self.feature_map == 'power':
            nn.init.zeros_(self.power)
        else:
            reset_pacs_temperatures(self)
        nn.init.zeros_(self.scale)
        nn.init.zeros_(self.positional_encoding)

    def extra_repr(self) -> str:
        return (f'embed_dims={self.embed_dims}, num_heads={self.num_heads}, '
                f'ref_hw={self.ref_hw}, alpha={self.alpha}' +
                (f', feature_map={self.feature_map!r}'
                 if self.feature_map != 'power' else '') +
                (f', sr_ratio={self.sr_ratio}' if self.sr_ratio > 1 else ''))

    def forward(self, x: Tensor, hw: Size2) -> Tensor:
        """Attention over all tokens of a stage map.

        Args:
            x: ``(B, N, C)``, ``N = H * W`` row-major on the grid ``hw``.
            hw: ``(H, W)``.

        Returns:
            ``(B, N, C)``.

        Raises:
            ValueError: when ``x`` is not ``(B, H*W, embed_dims)`` for
                ``hw`` (the message names the expected and received
                shapes).
        """
        check_token_grid('PolarityAttention', x, hw, self.embed_dims)
        B, N, C = x.shape
        h, d = self.num_heads, self.head_dims

        # 1. project: q, k, v, g (k, v from the reduced map with sr_ratio > 1)
        kv_hw = hw
        if self.fused_qkvg:
            q, k, v, g = linear_chunks(self.qkvg, x, 4)
        else:
            q, g = linear_chunks(self.qg, x, 2)
            kv_x = x
            if self.sr_ratio > 1:  # like the authors' conv; a side shorter
                # than r is padded to r
                m = self.sr(pad_for_stride(to_map(x, hw), self.sr_ratio,
                                           pad_input=False))
                kv_hw = (m.shape[2], m.shape[3])
                kv_x = self.norm(to_tokens(m))
            k, v = linear_chunks(self.kv, kv_x, 2)

        # 2. polarity attention of the heads; the keys carry the positional
        # table (resized to the map)
        def heads(t: Tensor) -> Tensor:  # (B', L, C) -> (B', h, L, d)
            if h == 1:  # a view without a Transpose in exported graphs
                return t.unsqueeze(1)
            return t.reshape(t.shape[0], -1, h, d).transpose(1, 2)

        pos = heads(resize_pos_table(self.positional_encoding, self.ref_hw,
                                     kv_hw, self.interpolate_mode))
        scale = self.scale.view(1, h, 1, d)
        if self.feature_map == 'power':
            y = polarity_attention(heads(q), heads(k), heads(v), scale,
                                   self.power, self.alpha, k_bias=pos)
        else:  # PaCS on q / s and (k + pos) / s, s = softplus(scale)
            y = pacs_attention(heads(q), heads(k), heads(v), self.s1,
                               self.s2, scale=scale, k_bias=pos)
        y = y.squeeze(1) if h == 1 else y.transpose(1, 2).reshape(B, N, C)

        # 3. depth-wise conv of v over the stage map: the authors' per-head
        # conv, its kernel repeated over the heads (one conv of C channels);
        # a reduced v first goes back to the N tokens, linear along the
        # token sequence as the authors
        if self.sr_ratio > 1:
            v_map = F.interpolate(v.transpose(1, 2), size=N,
                                  mode='linear').reshape(B, C, hw[0], hw[1])
        else:
            v_map = to_map(v, hw)
        y = y + to_tokens(depthwise_conv2d(
            v_map, self.dwc.weight.repeat(h, 1, 1, 1),
            None if self.dwc.bias is None else self.dwc.bias.repeat(h),
            self.dwc.padding))

        # 4. gate and output projection: proj(y * g)
        return self.proj_drop(gate_linear(y, g, self.proj))


class PaCSAttention(BaseModule):
    """PolaFormer++'s linear attention block part (the authors'
    ``AddLinearAttention``), on tokens of a stage map.

    ``qkvg`` Linear(C, 4C) -> q, k, v, g; PaCS attention
    (:func:`~pola_mm.ops.pacs_attention`) with the rotary encoding of width
    ``2d`` over the whole map; plus ``lepe``, a depth-wise 5x5 conv of v
    over all C channels; then ``proj(x * g)``. Under fp16/bf16 autocast the
    attention and ``lepe`` compute in float32 (``exp`` of fp16 overflows
    above 11).

    Args:
        embed_dims: channels ``C``.
        num_heads: heads ``h``; ``d = C / h`` must be even.
        kernel_size: kernel of ``lepe``.
    """

    def __init__(self, embed_dims: int, num_heads: int,
                 kernel_size: int = 5,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        head_dims = polarity_head_dims(embed_dims, num_heads)
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = head_dims
        self.qkvg = nn.Linear(embed_dims, embed_dims * 4)
        self.lepe = nn.Conv2d(embed_dims, embed_dims, kernel_size,
                              padding=kernel_size // 2, groups=embed_dims)
        self.proj = nn.Linear(embed_dims, embed_dims)
        add_pacs_temperatures(self, num_heads, head_dims)

    def reset_own_parameters(self) -> None:
        """The authors' init of the temperatures (the backbones'
        ``init_weights`` calls it)."""
        reset_pacs_temperatures(self)

    def extra_repr(self) -> str:
        return f'embed_dims={self.embed_dims}, num_heads={self.num_heads}'

    def forward(self, x: Tensor, hw: Size2) -> Tensor:
        """``(B, N, C)`` tokens on the grid ``hw`` -> ``(B, N, C)``."""
        B, N, C = x.shape
        h, d = self.num_heads, self.head_dims
        # 1. project: q, k, v, g
        q, k, v, g = linear_chunks(self.qkvg, x, 4)

        # 2. PaCS attention of the heads, rotary encoding over the whole map
        def heads(t: Tensor) -> Tensor:  # (B, N, C) -> (B, h, N, d)
            return t.reshape(B, -1, h, d).transpose(1, 2)

        y = pacs_attention(heads(q), heads(k), heads(v), self.s1, self.s2,
                           hw=hw).transpose(1, 2).reshape(B, N, C)

        # 3. lepe: a depth-wise conv of v over the stage map
        y = y + to_tokens(depthwise_conv2d(to_map(v, hw), self.lepe.weight,
                                           self.lepe.bias, self.lepe.padding))

        # 4. gate and output projection: proj(y * g)
        return gate_linear(y, g, self.proj)
