"""Polarity-aware linear attention (PolaFormer, ICLR 2025).

One module serves both backbones: Pola-Swin (fused ``qkvg`` projection) and
Pola-PVT (``qg`` + ``kv`` projections); both attend to all tokens of a
stage map. Parameter names are the authors'.
"""
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ...ops.dispatch import PLAIN, Path
from ...ops.depthwise_conv import depthwise_conv2d
from ...ops.gate_linear import gate_linear
from ...ops.polarity_kernel import (polarity_attention_kernel,
                                    polarity_attention_pytorch,
                                    polarity_key_state, polarity_query_apply)
from ...ops.precision import no_autocast
from ...ops.token_runs import runs_pay, split_linear_in_runs
from ...type_aliases import Size2
from .embed import pad_for_stride
from .attention_args import polarity_head_dims
from .module import PolaModule
from .pacs_attention import add_pacs_temperatures, pacs_attend
from .position import check_resize_mode, resize_pos_table

FEATURE_MAPS = ('power', 'pacs')


class TokenLinear(nn.Linear):
    """``nn.Linear`` (same parameters and state dict) that also maps
    channel-major tokens: ``forward(x, channels_first=True)`` takes ``x``
    ``(B, C_in, N)`` to ``W x + b``, ``(B, C_out, N)``; the projections of
    :meth:`PolarityAttention.project_channels`, called as modules so that
    hooks (and the FLOP counter's attribution) see them."""

    def forward(self, x: Tensor, channels_first: bool = False) -> Tensor:
        if not channels_first:
            return F.linear(x, self.weight, self.bias)
        y = torch.matmul(self.weight, x)
        if self.bias is not None:
            y = y + self.bias.unsqueeze(-1)
        return y


class PolarityAttention(PolaModule):
    """Polarity-aware linear attention with gate and depth-wise conv on v.

    The forward has three steps: :meth:`project` (tokens -> q, k, v, g),
    :meth:`mix` (attention + dwc over the stage map, float32 under
    autocast) and :meth:`output` (gate and output projection).

    ``mix`` runs the published formula, written with standard operations
    (:func:`~pola_mm.ops.polarity_kernel.polarity_attention_pytorch`), or
    where the call's :class:`~pola_mm.ops.dispatch.Path` allows (chosen once
    per call in :meth:`forward` by :func:`pola_mm.ops.dispatch.select`) the
    fast kernel beside it
    (:func:`~pola_mm.ops.polarity_kernel.polarity_attention_kernel`: same
    outputs and gradients, without storing the ``(B, h, N, 2d)`` feature
    maps). With the fast paths off and while a graph is captured (export,
    ``torch.compile``, TorchScript) the plain formula runs, and
    :meth:`forward` keeps it channel-major from the projection to the gate
    (:meth:`project_channels`, :meth:`mix_channels`): an exported graph
    then has no transposes of token maps.

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
        alpha: exponent range of the learned power.
        kernel_size: depth-wise conv kernel on v.
        attn_drop: must be 0: the linear attention has no attention
            matrix to drop (a non-zero rate raises instead of being
            ignored).
        proj_drop: dropout after ``proj``.
        feature_map: ``'power'`` (PolaFormer, the default: ``relu(+-t)^p``
            with the learned ``power``) or ``'pacs'`` (PolaFormer++'s PaCS:
            the same-signed and opposite-signed query flows take
            ``exp(t_s x) - 1`` and ``exp(t_o x) - 1`` of ``[relu(q),
            relu(-q)]`` (halves swapped for the opposite flow) with
            per-channel temperatures ``t = sigmoid(s1)``, ``sigmoid(s2)``
            (parameters ``s1``, ``s2`` of shape ``(1, h, 1, 2d)``,
            zero-initialised as the authors'), the keys ``exp(.) - 1``
            without temperature; no ``power``, ``alpha`` unused). Scale,
            positional table, depth-wise conv, gate and projections are the
            same for both.
        sr_ratio: the authors' spatial reduction of keys and values in
            Pola-PVT (their ``la_sr_ratios``; 1 in every published model):
            with ``r > 1`` (only with ``fused_qkvg=False``), k and v come
            from ``kv(norm(sr(x)))``, ``sr`` a Conv2d with kernel = stride =
            ``r`` over the stage map and ``norm`` a LayerNorm;
            ``positional_encoding`` lies on the reduced grid; for the
            depth-wise conv, v is brought back to the ``N`` tokens by linear
            interpolation along the token sequence, as the authors do. This
            variant always runs the plain formula (no fast kernel).
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
            self.qkvg = TokenLinear(embed_dims, embed_dims * 4,
                                    bias=qkv_bias)
        else:
            self.qg = TokenLinear(embed_dims, embed_dims * 2, bias=qkv_bias)
            self.kv = TokenLinear(embed_dims, embed_dims * 2, bias=qkv_bias)
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

    def extra_repr(self) -> str:
        return (f'embed_dims={self.embed_dims}, num_heads={self.num_heads}, '
                f'ref_hw={self.ref_hw}, alpha={self.alpha}' +
                (f', feature_map={self.feature_map!r}'
                 if self.feature_map != 'power' else '') +
                (f', sr_ratio={self.sr_ratio}' if self.sr_ratio > 1 else ''))

    # -- step 1 ------------------------------------------------------------
    def project(self, x: Tensor, path: Path = PLAIN
                ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """Input projections.

        Args:
            x: ``(..., C)`` tokens.
            path: the call's fast paths (:meth:`forward`).

        Returns:
            ``q, k, v, g``, each ``(..., C)``: the authors' ``reshape(...,
            4, C)`` split of ``qkvg``, or of ``qg`` and ``kv`` for PVT. In
            CPU training on large token maps (``path.cpu_training`` and
            :func:`~pola_mm.ops.token_runs.runs_pay`) they are separate
            tensors made on runs of tokens (no 4C-wide output or stacked
            gradient is allocated); elsewhere
            views into the projection output, split by ``unbind`` so that
            backward assembles the projection's gradient in one pass.
        """
        width = (4 if self.fused_qkvg else 2) * self.embed_dims
        if path.cpu_training and runs_pay(x, width):
            return self._project_in_runs(x)
        if hasattr(self, 'qkvg'):
            q, k, v, g = self._split(self.qkvg(x), 4)
        else:
            q, g = self._split(self.qg(x), 2)
            k, v = self._split(self.kv(x), 2)
        return q, k, v, g

    def project_channels(self, x: Tensor
                         ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """:meth:`project` channel-major: tokens ``(B, N, C)`` ->
        ``q, k, v, g``, each ``(B, C, N)`` (``W x^T + b``, the same
        projection; views into its output)."""
        B, N, C = x.shape
        xt = x.transpose(1, 2)
        if hasattr(self, 'qkvg'):
            q, k, v, g = self.qkvg(xt, channels_first=True).reshape(
                B, 4, C, N).unbind(1)
        else:
            q, g = self.qg(xt, channels_first=True).reshape(B, 2, C,
                                                            N).unbind(1)
            k, v = self.kv(xt, channels_first=True).reshape(B, 2, C,
                                                            N).unbind(1)
        return q, k, v, g

    def _split(self, y: Tensor, parts: int) -> List[Tensor]:
        """A projection's output ``(..., parts * C)`` -> ``parts`` views
        ``(..., C)``."""
        shape = list(y.shape[:-1])
        return y.reshape(shape + [parts, self.embed_dims]).unbind(-2)

    @torch.jit.unused
    def _project_in_runs(self, x: Tensor
                         ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """:meth:`project` on runs of tokens (CPU training)."""
        if self.fused_qkvg:
            q, k, v, g = split_linear_in_runs(x, self.qkvg, 4)
        else:
            q, g = split_linear_in_runs(x, self.qg, 2)
            k, v = split_linear_in_runs(x, self.kv, 2)
        return q, k, v, g

    def split_heads(self, t: Tensor) -> Tensor:
        """Tokens ``(B', ..., C)`` (any token layout, e.g. ``(B', N, C)`` or
        a run of grid rows ``(B', r, W, C)``) -> ``(B', h, L, d)`` with the
        ``L`` tokens in row-major order (a view where the layout allows)."""
        return t.reshape(t.shape[0], -1, self.num_heads,
                         self.head_dims).transpose(1, 2)

    def positional_table(self, hw: Size2, cache: bool = False) -> Tensor:
        """``positional_encoding`` for a grid ``hw``: ``(1, H * W, C)``.

        Used unchanged at its reference grid; otherwise resized with
        ``interpolate_mode`` (``align_corners=False``) on its 2-D grid
        (``cache``: see :func:`~.position.resize_pos_table`).
        """
        return resize_pos_table(self.positional_encoding, self.ref_hw, hw,
                                self.interpolate_mode, cache=cache)

    # -- step 2 ------------------------------------------------------------
    def mix(self, q: Tensor, k: Tensor, v: Tensor, hw: Size2,
            path: Path = PLAIN) -> Tensor:
        """Attention and depth-wise conv on v over a whole grid of tokens.

        Under fp16/bf16 autocast the computation runs in float32; the result
        is returned in the inputs' dtype.

        Args:
            q, k, v: ``(B, N, C)`` from :meth:`project` (any strides),
                ``N = H * W`` tokens row-major on the stage map ``hw``;
                ``k`` without the positional table.
            hw: ``(H, W)``.
            path: the call's fast paths (:meth:`forward`): the kernel where
                ``path.kernels``, else the plain formula.

        Returns:
            ``(B', N, C)`` (before the gate).
        """
        if not torch.jit.is_scripting():  # (compiled code: no autocast)
            with no_autocast(q.device.type):
                return self._mix(q, k, v, hw, path)
        return self._mix(q, k, v, hw, path)

    def mix_channels(self, q: Tensor, k: Tensor, v: Tensor,
                     hw: Size2) -> Tensor:
        """:meth:`mix` with the plain formula on channel-major ``q``,
        ``k``, ``v`` ``(B, C, N)`` (from :meth:`project_channels`; ``k``
        without the positional table), in float32 at least under autocast;
        returns ``(B, C, N)`` in the inputs' dtype. The power feature map
        only."""
        if not torch.jit.is_scripting():  # (compiled code: no autocast)
            with no_autocast(q.device.type):
                return self._mix_channels(q, k, v, hw)
        return self._mix_channels(q, k, v, hw)

    def _mix_channels(self, q: Tensor, k: Tensor, v: Tensor,
                      hw: Size2) -> Tensor:
        """:meth:`mix_channels` with autocast off."""
        out_dtype = q.dtype
        dt = torch.promote_types(out_dtype, torch.float32)
        B, C, N = q.shape
        h, d = self.num_heads, self.head_dims
        pos = self.positional_table(hw).to(dt).transpose(1, 2)  # (1, C, N)
        v = v.to(dt)
        y = polarity_attention_pytorch(
            q.to(dt).reshape(B, h, d, N), k.to(dt).reshape(B, h, d, N),
            v.reshape(B, h, d, N), self.scale.to(dt).reshape(1, h, 1, d),
            self.power.to(dt), self.alpha, k_bias=pos.reshape(1, h, d, N),
            channels_first=True)
        weight, bias = self.dwc_params(dt)
        conv = F.conv2d(v.reshape(B, C, hw[0], hw[1]), weight, bias,
                        padding=self.dwc.padding, groups=C)
        return (y.reshape(B, C, N) + conv.reshape(B, C, N)).to(out_dtype)

    def _mix(self, q: Tensor, k: Tensor, v: Tensor, hw: Size2,
             path: Path) -> Tensor:
        """:meth:`mix` with autocast off."""
        if hasattr(self, 'power'):
            if torch.jit.is_scripting() or not path.kernels:
                # the plain formula (what TorchScript compiles)
                return self._mix_channels(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                    hw).transpose(1, 2)
        out_dtype = q.dtype
        # float32 at least (float64 stays float64, e.g. for gradcheck)
        dt = torch.promote_types(out_dtype, torch.float32)
        B, N, C = q.shape
        h, d = self.num_heads, self.head_dims
        pos = self.split_heads(
            self.positional_table(hw, cache=path.kernels).to(dt))
        scale = self.scale.to(dt).reshape(1, h, 1, d)
        if hasattr(self, 'power'):
            # the kernel and the conv upcast inside and keep q, k, v as
            # given (under autocast fp16/bf16 views of the projection, not
            # float32 copies)
            q, k, v = (self.split_heads(q), self.split_heads(k),
                       self.split_heads(v))
            x = self._kernel(q, k, v, scale, pos)
        else:
            q, k, v = (self.split_heads(q.to(dt)), self.split_heads(k.to(dt)),
                       self.split_heads(v.to(dt)))
            x = self._pacs(q, k + pos, v, scale, dt, path.kernels)
        # depth-wise conv on v: the per-head kernel repeated over the heads,
        # on the channels-last (B, C, H, W) map, so its output is
        # token-major like the attention's; v may be a view of the
        # projection's output (no copy kept for backward on GPUs)
        vmap = v.transpose(1, 2).reshape(B, hw[0], hw[1], C)
        weight, bias = self.dwc_params(dt)
        conv = depthwise_conv2d(vmap.permute(0, 3, 1, 2), weight, bias,
                                self.dwc.padding, lean=path.autograd)
        x = torch.add(x.transpose(1, 2).reshape(B, N, C),
                      conv.permute(0, 2, 3, 1).reshape(B, N, C))
        return x.to(out_dtype)

    @torch.jit.unused
    def _kernel(self, q: Tensor, k: Tensor, v: Tensor, scale: Tensor,
                pos: Tensor) -> Tensor:
        """The fast kernel of the power feature map on ``(B, h, N, d)``
        heads (``pos`` added to the keys)."""
        return polarity_attention_kernel(q, k, v, scale,
                                         self.power.to(scale.dtype),
                                         self.alpha, k_bias=pos)

    def _pacs(self, q: Tensor, k: Tensor, v: Tensor, scale: Tensor,
              dt: torch.dtype, fast: bool) -> Tensor:
        """``feature_map='pacs'``: PaCS attention of ``q / s``,
        ``k / s`` (``s = softplus(scale)``, ``k`` with the positional table)
        and ``v``, all ``(B, h, N, d)``; no rotary encoding."""
        s = F.softplus(scale)
        return pacs_attend(q / s, k / s, v, self.s1.to(dt), self.s2.to(dt),
                           fast=fast)

    def mix_flops(self, batch: int, tokens: int) -> Tuple[str, Dict[str, int]]:
        """FLOPs of :meth:`mix` on ``batch`` maps of ``tokens`` tokens, the
        published computation whatever implementation runs (1 multiply-add
        = 1 FLOP): ``('polarity_attention',``
        :func:`~pola_mm.analysis.flops.polarity_attention_flops` ``)``, or
        with the PaCS feature map ``('pacs_attention',``
        :func:`~pola_mm.analysis.flops.pacs_attention_flops` ``)`` with the
        positional table and scale (``scaled_inputs``)."""
        from ...analysis.flops import (pacs_attention_flops,
                                       polarity_attention_flops)
        args = (batch, tokens, self.embed_dims, self.num_heads,
                self.dwc.kernel_size[0])
        if self.feature_map == 'pacs':
            return 'pacs_attention', pacs_attention_flops(
                *args, scaled_inputs=True)
        return 'polarity_attention', polarity_attention_flops(*args)

    def dwc_params(self, dt: torch.dtype) -> Tuple[Tensor, Optional[Tensor]]:
        """The depth-wise conv's per-head kernel and bias repeated over the
        heads (one ``groups=C`` conv over all channels)."""
        h = self.num_heads
        weight = self.dwc.weight.to(dt).repeat(h, 1, 1, 1)
        bias = self.dwc.bias
        if bias is None:
            return weight, None
        return weight, bias.to(dt).repeat(h)

    # -- step 3 ------------------------------------------------------------
    def output(self, x: Tensor, g: Tensor, path: Path = PLAIN) -> Tensor:
        """Gate and output projection: ``proj(x * g)``; ``(..., C)``.

        Where ``path.autograd`` (the call's fast paths, :meth:`forward`),
        one function that keeps ``x`` and ``g`` but not ``x * g`` for
        backward (:func:`~pola_mm.ops.gate_linear.gate_linear`)."""
        if path.autograd and x.shape == g.shape:
            return self.proj_drop(gate_linear(x, g, self.proj.weight,
                                              self.proj.bias))
        return self.proj_drop(self.proj(x * g))

    def forward(self, x: Tensor, hw: Size2) -> Tensor:
        """Attention over all tokens of a grid (the published computation:
        :meth:`project`, :meth:`mix`, :meth:`output`).

        Args:
            x: ``(B, N, C)``, ``N = H * W`` row-major on the grid ``hw``.
            hw: ``(H, W)``.

        Returns:
            ``(B, N, C)``.
        """
        path = self.select_path(x)
        if hasattr(self, 'sr'):  # sr_ratio > 1
            return self.forward_reduced(x, hw, path)
        if hasattr(self, 'power'):
            if torch.jit.is_scripting() or not path.kernels:
                # the plain formula, channel-major up to the gate
                q, k, v, g = self.project_channels(x)
                y = self.mix_channels(q, k, v, hw) * g
                return self.proj_drop(self.proj(y.transpose(1, 2)))
        q, k, v, g = self.project(x, path)
        return self.output(self.mix(q, k, v, hw, path), g, path)

    def forward_reduced(self, x: Tensor, hw: Size2,
                        path: Path = PLAIN) -> Tensor:
        """``sr_ratio > 1``: keys and values from the reduced map, the
        authors' Pola-PVT with ``la_sr_ratios``; ``(B, N, C)`` ->
        ``(B, N, C)``. The attention is the plain formula on any path."""
        B, N, C = x.shape
        q, g = self.qg(x).reshape(B, N, 2, C).unbind(-2)
        # like the authors' conv; a side shorter than r is padded to r
        reduced = self.sr(pad_for_stride(
            x.transpose(1, 2).reshape(B, C, hw[0], hw[1]), self.sr_ratio,
            pad_input=False))
        kv_hw = (reduced.shape[2], reduced.shape[3])
        k, v = self.kv(self.norm(reduced.flatten(2).transpose(1, 2))
                       ).reshape(B, -1, 2, C).unbind(-2)
        if not torch.jit.is_scripting():  # (compiled code: no autocast)
            with no_autocast(x.device.type):
                y = self._mix_reduced(q, k, v, hw, kv_hw, path)
        else:
            y = self._mix_reduced(q, k, v, hw, kv_hw, path)
        return self.output(y, g, path)

    def _mix_reduced(self, q: Tensor, k: Tensor, v: Tensor, hw: Size2,
                     kv_hw: Size2, path: Path) -> Tensor:
        """Attention and depth-wise conv of :meth:`forward_reduced`, with
        autocast off: ``q`` ``(B, N, C)``, ``k``, ``v`` ``(B, n, C)`` on
        the reduced grid ``kv_hw``."""
        B, N, C = q.shape
        h, d = self.num_heads, self.head_dims
        n = k.shape[1]
        out_dtype = q.dtype
        dt = torch.promote_types(out_dtype, torch.float32)
        q, k, v = (self.split_heads(q.to(dt)), self.split_heads(k.to(dt)),
                   self.split_heads(v.to(dt)))
        k = k + self.split_heads(
            self.positional_table(kv_hw, cache=path.kernels).to(dt))
        scale = self.scale.to(dt).reshape(1, h, 1, d)
        if hasattr(self, 'power'):
            y = polarity_attention_pytorch(q, k, v, scale, self.power.to(dt),
                                           self.alpha)
        else:
            y = self._pacs(q, k, v, scale, dt, fast=False)
        # v back to N tokens (linear along the token sequence), then the
        # depth-wise conv on the stage map
        v = F.interpolate(v.transpose(-2, -1).reshape(B * h, d, n), size=N,
                          mode='linear')
        vmap = v.reshape(B, C, hw[0], hw[1])
        weight, bias = self.dwc_params(dt)
        conv = F.conv2d(vmap, weight, bias, padding=self.dwc.padding,
                        groups=C)
        y = y.transpose(1, 2).reshape(B, N, C) + conv.flatten(2).transpose(
            1, 2)
        return y.to(out_dtype)

    # -- CPU inference in runs (the same computation) ----------------------
    def project_parts(self, x: Tensor,
                      parts: Tuple[int, int]) -> Tuple[Tensor, Tensor]:
        """Two of :meth:`project`'s ``q, k, v, g`` (indices 0-3) without
        computing the others: ``(0, 3)`` gives ``q, g`` and ``(1, 2)`` gives
        ``k, v``, each ``(..., C)``."""
        C = self.embed_dims
        if not self.fused_qkvg:
            linear = self.qg if parts == (0, 3) else self.kv
            a, b = linear(x).reshape(*x.shape[:-1], 2, C).unbind(-2)
            return a, b
        w, bias = self.qkvg.weight, self.qkvg.bias
        out = []
        for i in parts:
            rows = slice(i * C, (i + 1) * C)
            out.append(F.linear(x, w[rows],
                                None if bias is None else bias[rows]))
        return out[0], out[1]

    def forward_in_runs(self, x: Tensor, hw: Size2, rows: int,
                        norm: Optional[nn.Module] = None,
                        residual: bool = False) -> Tensor:
        """:meth:`forward` on runs of ``rows`` grid rows, for CPU inference
        of large maps: the keys' state summed over all runs
        (:func:`~pola_mm.ops.polarity_kernel.polarity_key_state`), then each
        run's queries (:func:`~pola_mm.ops.polarity_kernel.
        polarity_query_apply`), the depth-wise conv on a halo of rows, gate
        and output projection. Nothing larger than a run is allocated
        besides one ``v`` map for the conv, which the results then
        overwrite. No autograd; float32 or float64; ``sr_ratio`` 1 and the
        power feature map.

        Args:
            x: ``(B, N, C)`` tokens of the grid ``hw``.
            hw: ``(H, W)``.
            rows: grid rows per run.
            norm: applied to each run of ``x`` first (a block's ``norm1``,
                so that the normalised map is never held whole).
            residual: return ``x + attention`` instead.

        Returns:
            ``(B, N, C)``.
        """
        B, N, C = x.shape
        H, W = hw
        h, d = self.num_heads, self.head_dims
        xmap = x.view(B, H, W, C)
        pos = self.positional_table(hw, cache=True).view(1, H, W, C).to(
            x.dtype)
        scale = self.scale.to(x.dtype).reshape(1, h, 1, d)
        power = self.power.to(x.dtype)
        runs = [(r, min(r + rows, H)) for r in range(0, H, rows)]

        def inputs(r0: int, r1: int) -> Tensor:
            run = xmap[:, r0:r1]
            return run if norm is None else norm(run)

        vmap = x.new_empty(B, H, W, C)
        state: Optional[Tensor] = None
        for r0, r1 in runs:
            k, v = self.project_parts(inputs(r0, r1), (1, 2))
            vmap[:, r0:r1] = v
            part = polarity_key_state(
                self.split_heads(k), self.split_heads(v), scale, power,
                self.alpha, self.split_heads(pos[:, r0:r1]))
            state = part if state is None else state.add_(part)
        assert state is not None
        weight, bias = self.dwc_params(x.dtype)
        ph, pw = self.dwc.padding
        vchw = vmap.permute(0, 3, 1, 2)  # channels-last (B, C, H, W)
        # The results overwrite the v map once no later run's conv halo
        # reads their rows (one full-size allocation fewer).
        pending: List[Tuple[int, int, Tensor]] = []
        for r0, r1 in runs:
            q, g = self.project_parts(inputs(r0, r1), (0, 3))
            y = polarity_query_apply(self.split_heads(q), state, float(N),
                                     scale, power, self.alpha)
            lo, hi = max(r0 - ph, 0), min(r1 + ph, H)
            halo = F.pad(vchw[:, :, lo:hi],
                         (0, 0, ph - (r0 - lo), ph - (hi - r1)))
            conv = depthwise_conv2d(halo, weight, bias, (0, pw))
            y = torch.add(y.transpose(1, 2).reshape(B, r1 - r0, W, C),
                          conv.permute(0, 2, 3, 1))
            y = self.output(y, g)
            if residual:
                y = y.add_(xmap[:, r0:r1])
            pending.append((r0, r1, y))
            while pending and pending[0][1] <= r1 - ph:
                a, b, done = pending.pop(0)
                vmap[:, a:b] = done
        for a, b, done in pending:
            vmap[:, a:b] = done
        return vmap.view(B, N, C)
