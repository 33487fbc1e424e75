"""Polarity-aware linear attention (PolaFormer, ICLR 2025).

One module serves both backbones: Pola-Swin (fused ``qkvg`` projection) and
Pola-PVT (``qg`` + ``kv`` projections); both attend to all tokens of a
stage map. Parameter names are the authors'.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule
from torch import Tensor

from .cpu_ext import cpu_ext
from .polarity_kernel import (is_compiling, polarity_attention_kernel,
                              polarity_key_state, polarity_query_apply)
from .token_runs import split_linear_in_runs, train_in_runs

Size2 = Tuple[int, int]


def polarity_linear_attention(q: Tensor, k: Tensor, v: Tensor, scale: Tensor,
                              power: Tensor, alpha: float,
                              valid: Optional[Tensor] = None) -> Tensor:
    """The polarity-aware linear attention of the published models.

    All tensors are expected in float32 (or float64). With ``h`` heads of
    width ``d``:

    - ``s = softplus(scale)``; ``q, k <- q / s, k / s``;
    - ``p = 1 + alpha * sigmoid(power)``; ``f+(t) = relu(t)^p``,
      ``f-(t) = relu(-t)^p``;
    - ``q_sim = [f+(q), f-(q)]``, ``q_opp = [f-(q), f+(q)]``,
      ``k' = [f+(k), f-(k)]``; ``v = [v1, v2]`` split per head;
    - ``x_sim = q_sim (k'^T v1 / n) / (q_sim . mean(k') + 1e-6)``, ``x_opp``
      the same with ``q_opp`` and ``v2``; output per head ``[x_sim, x_opp]``.

    Like the authors, ``k'`` and ``v`` are each scaled by ``n^-1/2`` before
    their product. With ``valid``, padded keys contribute nothing (``k'`` and
    ``v`` are zeroed there) and ``n`` is the number of valid keys of each
    sequence; without it ``n = N``.

    Args:
        q: ``(B, h, N, d)``.
        k: ``(B, h, N, d)``, positional encoding already added.
        v: ``(B, h, N, d)``, ``d`` even.
        scale: ``(1, 1, 1, d)`` or broadcastable raw ``scale`` per head.
        power: ``(1, h, 1, d)`` raw ``power``.
        alpha: exponent range, ``p`` lies in ``(1, 1 + alpha)``.
        valid: optional ``(B, N)`` bool, True for real keys.

    Returns:
        ``(B, h, N, d)``.
    """
    N = q.shape[-2]
    s = F.softplus(scale)
    q = q / s
    k = k / s
    p = 1 + alpha * torch.sigmoid(power)
    q_pos = F.relu(q) ** p
    q_neg = F.relu(-q) ** p
    k_pos = F.relu(k) ** p
    k_neg = F.relu(-k) ** p
    if valid is None:
        n_inv_sqrt = N ** -0.5
        n = float(N)
    else:
        m = valid[:, None, :, None].to(q.dtype)  # (B, 1, N, 1)
        k_pos = k_pos * m
        k_neg = k_neg * m
        v = v * m
        n = m.sum(dim=-2, keepdim=True).clamp(min=1.0)  # (B, 1, 1, 1)
        n_inv_sqrt = n.rsqrt()

    q_sim = torch.cat([q_pos, q_neg], dim=-1)
    q_opp = torch.cat([q_neg, q_pos], dim=-1)
    kk = torch.cat([k_pos, k_neg], dim=-1)  # (B, h, N, 2d)
    v1, v2 = torch.chunk(v, 2, dim=-1)
    k_mean = kk.sum(dim=-2, keepdim=True) / n  # (B, h, 1, 2d)
    kt = kk.transpose(-2, -1) * n_inv_sqrt  # (B, h, 2d, N)

    z_sim = 1 / (q_sim @ k_mean.transpose(-2, -1) + 1e-6)
    x_sim = q_sim @ (kt @ (v1 * n_inv_sqrt)) * z_sim
    z_opp = 1 / (q_opp @ k_mean.transpose(-2, -1) + 1e-6)
    x_opp = q_opp @ (kt @ (v2 * n_inv_sqrt)) * z_opp
    return torch.cat([x_sim, x_opp], dim=-1)


class PolarityAttention(BaseModule):
    """Polarity-aware linear attention with gate and depth-wise conv on v.

    The forward has three steps: :meth:`project` (tokens -> q, k, v, g),
    :meth:`mix` (attention + dwc over the stage map, float32 under
    autocast) and :meth:`output` (gate and output projection).
    :meth:`forward` chains them; :meth:`forward_in_runs` computes the same
    at CPU inference without holding full-size intermediates.

    Args:
        embed_dims: channels ``C``.
        num_heads: heads ``h``; ``d = C / h`` must be even.
        ref_hw: the grid of ``positional_encoding`` (Swin: the authors'
            polarity window at the pre-training size, the whole stage map;
            PVT: the stage at 224). Resized bicubically to other maps.
        fused_qkvg: True for Swin's ``qkvg`` Linear(C, 4C); False for PVT's
            ``qg`` and ``kv`` Linear(C, 2C) each.
        qkv_bias: bias of the input projections.
        alpha: exponent range of the learned power.
        kernel_size: depth-wise conv kernel on v.
        attn_drop: kept for interface parity (the linear attention has no
            attention matrix to drop).
        proj_drop: dropout after ``proj``.
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
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims {embed_dims} is not divisible by '
                             f'num_heads {num_heads}')
        head_dims = embed_dims // num_heads
        if head_dims % 2:
            raise ValueError(f'head width {head_dims} must be even (v is '
                             'split into two halves per head)')
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = head_dims
        self.ref_hw = (int(ref_hw[0]), int(ref_hw[1]))
        self.fused_qkvg = fused_qkvg
        self.alpha = alpha
        if fused_qkvg:
            self.qkvg = nn.Linear(embed_dims, embed_dims * 4, bias=qkv_bias)
        else:
            self.qg = nn.Linear(embed_dims, embed_dims * 2, bias=qkv_bias)
            self.kv = nn.Linear(embed_dims, embed_dims * 2, bias=qkv_bias)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)
        self.dwc = nn.Conv2d(head_dims, head_dims, kernel_size,
                             padding=kernel_size // 2, groups=head_dims)
        self.power = nn.Parameter(torch.zeros(1, num_heads, 1, head_dims))
        self.scale = nn.Parameter(torch.zeros(1, 1, embed_dims))
        self.positional_encoding = nn.Parameter(
            torch.zeros(1, self.ref_hw[0] * self.ref_hw[1], embed_dims))

    def extra_repr(self) -> str:
        return (f'embed_dims={self.embed_dims}, num_heads={self.num_heads}, '
                f'ref_hw={self.ref_hw}, alpha={self.alpha}')

    # -- step 1 ------------------------------------------------------------
    def project(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """Input projections.

        Args:
            x: ``(..., C)`` tokens.

        Returns:
            ``q, k, v, g``, each ``(..., C)``: the authors' ``reshape(...,
            4, C)`` split of ``qkvg``, or of ``qg`` and ``kv`` for PVT. In
            CPU training on large token maps they are separate tensors made
            on runs of tokens (see
            :func:`~pola_mm.models.layers.token_runs.train_in_runs`; no
            4C-wide output or stacked gradient is allocated); elsewhere
            views into the projection output, split by ``unbind`` so that
            backward assembles the projection's gradient in one pass.
        """
        C = self.embed_dims

        def split(linear: nn.Linear, parts: int) -> Sequence[Tensor]:
            if train_in_runs(x, parts * C, linear):
                return split_linear_in_runs(x, linear, parts)
            return linear(x).unflatten(-1, (parts, C)).unbind(-2)

        if self.fused_qkvg:
            q, k, v, g = split(self.qkvg, 4)
        else:
            q, g = split(self.qg, 2)
            k, v = split(self.kv, 2)
        return q, k, v, g

    def _project_parts(self, x: Tensor,
                       parts: Tuple[int, int]) -> Tuple[Tensor, Tensor]:
        """Two of ``q, k, v, g`` (indices 0-3) without computing the others:
        ``(0, 3)`` gives ``q, g`` and ``(1, 2)`` gives ``k, v``, each
        ``(..., C)``, for inference in runs (:meth:`forward_in_runs`)."""
        C = self.embed_dims
        if not self.fused_qkvg:
            linear = self.qg if parts == (0, 3) else self.kv
            a, b = linear(x).unflatten(-1, (2, C)).unbind(-2)
            return a, b
        w, bias = self.qkvg.weight, self.qkvg.bias
        out = []
        for i in parts:
            rows = slice(i * C, (i + 1) * C)
            out.append(F.linear(x, w[rows],
                                None if bias is None else bias[rows]))
        return out[0], out[1]

    def positional_table(self, hw: Size2) -> Tensor:
        """``positional_encoding`` for a grid ``hw``: ``(1, H * W, C)``.

        Used unchanged at its reference grid; otherwise resized by bicubic
        interpolation (``align_corners=False``) on its 2-D grid.
        """
        return resize_pos_table(self.positional_encoding, self.ref_hw, hw)

    # -- step 2 ------------------------------------------------------------
    def mix(self, q: Tensor, k: Tensor, v: Tensor, hw: Size2) -> Tensor:
        """Attention and depth-wise conv on v over a whole grid of tokens.

        Under fp16/bf16 autocast the computation runs in float32; the result
        is returned in the inputs' dtype.

        Args:
            q, k, v: ``(B, N, C)`` from :meth:`project` (any strides),
                ``N = H * W`` tokens row-major on the stage map ``hw``;
                ``k`` without the positional table.
            hw: ``(H, W)``.

        Returns:
            ``(B', N, C)`` (before the gate).
        """
        out_dtype = q.dtype
        # float32 at least (float64 stays float64, e.g. for gradcheck)
        dt = torch.promote_types(out_dtype, torch.float32)
        with torch.autocast(device_type=q.device.type, enabled=False):
            q, k, v = q.to(dt), k.to(dt), v.to(dt)
            B, N, C = q.shape
            h, d = self.num_heads, self.head_dims
            pos = self.positional_table(hw).to(dt)  # (1, N, C)
            x = polarity_attention_kernel(
                q.unflatten(-1, (h, d)).transpose(1, 2),
                k.unflatten(-1, (h, d)).transpose(1, 2),
                v.unflatten(-1, (h, d)).transpose(1, 2),
                self.scale.to(dt).reshape(1, h, 1, d), self.power.to(dt),
                self.alpha, k_bias=pos.unflatten(-1, (h, d)).transpose(1, 2))
            # depth-wise conv on v: the per-head kernel repeated over the
            # heads, on the channels-last (B', C, H, W) map, so its output is
            # already token-major like the kernel's
            vmap = v.reshape(B, hw[0], hw[1], C).contiguous().permute(
                0, 3, 1, 2)
            conv = depthwise_conv2d(vmap, *self._dwc_params(dt),
                                    padding=self.dwc.padding)
            x = torch.add(x.transpose(1, 2).reshape(B, N, C),
                          conv.permute(0, 2, 3, 1).reshape(B, N, C))
        return x.to(out_dtype)

    def _dwc_params(self, dt: torch.dtype) -> Tuple[Tensor, Optional[Tensor]]:
        """The depth-wise conv's per-head kernel and bias repeated over the
        heads (one ``groups=C`` conv over all channels)."""
        h = self.num_heads
        weight = self.dwc.weight.to(dt).repeat(h, 1, 1, 1)
        bias = self.dwc.bias
        return weight, None if bias is None else bias.to(dt).repeat(h)

    def forward_in_runs(self, x: Tensor, hw: Size2, rows: int,
                        norm: Optional[nn.Module] = None,
                        residual: bool = False) -> Tensor:
        """Inference: :meth:`forward` on runs of ``rows`` grid rows.

        Two passes over the runs: the keys' state summed over all runs,
        then each run's queries, depth-wise conv (with a halo of rows),
        gate and output projection. The result is :meth:`forward`'s, but
        nothing larger than a run is allocated besides one ``v`` map for
        the conv. No autograd, no padding mask; float32/float64 inputs.

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
        pos = self.positional_table(hw).view(1, H, W, C).to(x.dtype)
        scale = self.scale.to(x.dtype).reshape(1, h, 1, d)
        power = self.power.to(x.dtype)
        runs = [(r, min(r + rows, H)) for r in range(0, H, rows)]

        def inputs(r0: int, r1: int) -> Tensor:
            run = xmap[:, r0:r1]
            return run if norm is None else norm(run)

        def heads(t: Tensor) -> Tensor:  # (B', r, W, C) -> (B', h, r W, d)
            return t.reshape(t.shape[0], -1, h, d).transpose(1, 2)

        vmap = x.new_empty(B, H, W, C)
        state: Optional[Tensor] = None
        for r0, r1 in runs:
            k, v = self._project_parts(inputs(r0, r1), (1, 2))
            vmap[:, r0:r1] = v
            part = polarity_key_state(heads(k), heads(v), scale, power,
                                      self.alpha, heads(pos[:, r0:r1]))
            state = part if state is None else state.add_(part)
        assert state is not None
        weight, bias = self._dwc_params(x.dtype)
        ph, pw = self.dwc.padding
        vchw = vmap.permute(0, 3, 1, 2)  # channels-last (B, C, H, W)
        # The results overwrite the v map once no later run's conv halo
        # reads their rows (one full-size allocation fewer).
        pending: List[Tuple[int, int, Tensor]] = []
        for r0, r1 in runs:
            q, g = self._project_parts(inputs(r0, r1), (0, 3))
            y = polarity_query_apply(heads(q), state, float(N), scale, power,
                                     self.alpha)
            lo, hi = max(r0 - ph, 0), min(r1 + ph, H)
            band = F.pad(vchw[:, :, lo:hi],
                         (0, 0, ph - (r0 - lo), ph - (hi - r1)))
            conv = depthwise_conv2d(band, weight, bias, (0, pw))
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

    # -- step 3 ------------------------------------------------------------
    def output(self, x: Tensor, g: Tensor) -> Tensor:
        """Gate and output projection: ``proj(x * g)``; ``(..., C)``."""
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
        q, k, v, g = self.project(x)
        return self.output(self.mix(q, k, v, hw), g)


class _DepthwiseConv2d(torch.autograd.Function):
    """``F.conv2d(..., groups=C)`` with its bias gradient taken as a plain
    sum: PyTorch's CPU convolution backward computes the bias gradient of a
    channels-last depth-wise conv about as slowly as the weight gradient
    (15 ms against 0.1 ms for ``sum`` at Pola-Swin-T's first stage, batch
    8). For channels-last float32 maps with the fused CPU loops built, the
    weight gradient is their ``dwconv_weight_grad`` and the input gradient
    the conv with the flipped kernel; otherwise both are PyTorch's."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor],
                padding: Tuple[int, int]) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.padding = padding
        ctx.has_bias = bias is not None
        return F.conv2d(x, weight, bias, padding=padding,
                        groups=x.shape[1])

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = dw = db = None
        C, _, kh, kw = weight.shape
        ph, pw = ctx.padding
        ext = None
        if (x.dtype == torch.float32 and grad.dtype == torch.float32
                and x.stride(1) == 1 and grad.stride(1) == 1
                and ph < kh and pw < kw and grad.shape == x.shape):
            ext = cpu_ext()
        if ext is not None:
            # channels-last float32: the input gradient is the conv of the
            # gradient with the flipped kernel, the weight gradient one
            # fused pass (see dwconv_weight_grad in polarity_cpu.cpp)
            if need_x:
                dx = F.conv2d(grad, weight.flip(-2, -1),
                              padding=(kh - 1 - ph, kw - 1 - pw), groups=C)
            if need_w:
                dw = weight.new_empty(C, kh, kw)
                ext.dwconv_weight_grad(x, grad, kh, kw, ph, pw, dw)
                dw = dw.view(C, 1, kh, kw)
        elif need_x or need_w:
            dx, dw, _ = torch.ops.aten.convolution_backward(
                grad, x, weight, None, [1, 1], list(ctx.padding), [1, 1],
                False, [0, 0], x.shape[1], [need_x, need_w, False])
        if ctx.has_bias and need_b:
            db = grad.sum(dim=(0, 2, 3))
        return dx, dw, db, None


def depthwise_conv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor],
                     padding: Tuple[int, int]) -> Tensor:
    """Depth-wise 2-D conv (stride 1, ``groups = channels``) of ``x``
    ``(B, C, H, W)`` with ``weight`` ``(C, 1, kh, kw)``."""
    if torch.is_grad_enabled() and x.device.type == 'cpu' and any(
            t is not None and t.requires_grad for t in (x, weight, bias)):
        return _DepthwiseConv2d.apply(x, weight, bias, tuple(padding))
    return F.conv2d(x, weight, bias, padding=padding, groups=x.shape[1])


def resize_pos_table(table: Tensor, ref_hw: Size2, hw: Size2) -> Tensor:
    """Resize a learned ``(1, Hr * Wr, C)`` token table to ``(1, H * W, C)``.

    Bicubic, ``align_corners=False``, on the 2-D grid; the table itself is
    returned at its reference size. Where no gradient is needed (inference,
    frozen tables), the resized table is cached on ``table`` for the last
    ``hw`` and reused until the table changes (in place or by a move); the
    result must then not be modified in place.
    """
    if tuple(hw) == tuple(ref_hw):
        return table
    cache = not (torch.is_grad_enabled() and table.requires_grad) and \
        not is_compiling()
    if cache:
        key = (tuple(int(i) for i in hw), tuple(ref_hw), table._version,
               table.data_ptr(), table.dtype, table.device)
        hit = getattr(table, '_pola_resized', None)
        if hit is not None and hit[0] == key:
            return hit[1]
    C = table.shape[-1]
    grid = table.reshape(1, ref_hw[0], ref_hw[1], C).permute(0, 3, 1, 2)
    dt = torch.promote_types(table.dtype, torch.float32)
    grid = F.interpolate(grid.to(dt), size=(int(hw[0]), int(hw[1])),
                         mode='bicubic', align_corners=False)
    out = grid.flatten(2).transpose(1, 2).to(table.dtype)
    if cache:
        table._pola_resized = (key, out)
    return out
