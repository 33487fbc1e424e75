"""PaCS polarity attention of PolaFormer++ (the authors'
``AddLinearAttention``).

PaCS, the polarity-aware feature map with channel-wise spikiness, replaces
PolaFormer's learned power by ``phi(x; t) = exp(t * x) - 1`` with learned
per-channel temperatures ``t = sigmoid(s)``, one for the same-signed and one
for the opposite-signed flow; the keys take ``exp(x) - 1``. In PolaPP the
products (not the normalisers) carry a 2-D rotary encoding.

One PaCS serves both attentions that use it, PolaPP's
:class:`PaCSAttention` and ``PolarityAttention(feature_map='pacs')``: the
feature map :func:`~pola_mm.ops.pacs_kernel.pacs_features`, the formula
:func:`pacs_linear_attention`, the kernel
:func:`~pola_mm.ops.pacs_kernel.pacs_attention_kernel`, the choice between
the last two (:func:`pacs_attend`) and the temperatures ``s1``, ``s2``
(:func:`add_pacs_temperatures`, :func:`reset_pacs_temperatures`).
"""
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ...ops.dispatch import PLAIN, Path
from ...ops.pacs_kernel import pacs_attention_kernel, pacs_features
from ...ops.precision import no_autocast
from ...type_aliases import Size2
from .attention_args import polarity_head_dims
from .module import PolaModule
from .rotary import rotary_tables, theta_shift

__all__ = [
    'PaCSAttention', 'pacs_features', 'pacs_linear_attention', 'pacs_attend',
    'add_pacs_temperatures', 'reset_pacs_temperatures'
]


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


def pacs_linear_attention(q: Tensor, k: Tensor, v: Tensor, s1: Tensor,
                          s2: Tensor, sin: Optional[Tensor] = None,
                          cos: Optional[Tensor] = None,
                          eps: float = 1e-6) -> Tensor:
    """PaCS polarity attention, the formula as written (float32 or float64).

    With ``h`` heads of width ``d``, ``t1 = sigmoid(s1)``,
    ``t2 = sigmoid(s2)``:

    - ``q_sim = exp([relu(q), relu(-q)] * t1) - 1``,
      ``q_opp = exp([relu(-q), relu(q)] * t2) - 1``,
      ``k' = exp([relu(k), relu(-k)]) - 1`` (``(B, h, N, 2d)``);
    - normalisers on the maps as they are:
      ``z_sim = q_sim . mean_N(k')``, ``z_opp = q_opp . mean_N(k')``;
    - products on the rotary-encoded maps ``R(.)`` (:func:`theta_shift`,
      when ``sin``/``cos`` are given, else the identity):
      ``x_sim = R(q_sim) (R(k')^T v1 / N) / (z_sim + eps)``, ``x_opp`` the
      same with ``q_opp`` and ``v2`` (``v = [v1, v2]`` split per head);
    - output per head ``[x_sim, x_opp]``.

    Like the authors, ``R(k')`` and ``v`` are each scaled by ``N^-1/2``
    before their product.

    Args:
        q, k: ``(B, h, N, d)``.
        v: ``(B, h, N, d)``, ``d`` even.
        s1, s2: raw temperatures broadcastable to ``(1, h, 1, 2d)``.
        sin, cos: optional ``(N, 2d)`` rotary tables.
        eps: added to the normalisers.

    Returns:
        ``(B, h, N, d)``.
    """
    N = q.shape[-2]
    q_sim = pacs_features(q, torch.sigmoid(s1))
    q_opp = pacs_features(q, torch.sigmoid(s2), swap=True)
    kk = pacs_features(k)
    k_mean = kk.mean(dim=-2, keepdim=True).transpose(-2, -1)  # (B,h,2d,1)
    z_sim = q_sim @ k_mean
    z_opp = q_opp @ k_mean
    if sin is not None and cos is not None:
        q_sim = theta_shift(q_sim, sin, cos)
        q_opp = theta_shift(q_opp, sin, cos)
        kk = theta_shift(kk, sin, cos)
    v1, v2 = torch.chunk(v, 2, dim=-1)
    kt = kk.transpose(-2, -1) * N**-0.5
    x_sim = q_sim @ (kt @ (v1 * N**-0.5)) * (1 / (z_sim + eps))
    x_opp = q_opp @ (kt @ (v2 * N**-0.5)) * (1 / (z_opp + eps))
    return torch.cat([x_sim, x_opp], dim=-1)


def pacs_attend(q: Tensor, k: Tensor, v: Tensor, s1: Tensor, s2: Tensor,
                sin: Optional[Tensor] = None, cos: Optional[Tensor] = None,
                fast: bool = True) -> Tensor:
    """PaCS attention of head tensors, the one entry of both PaCS modules:
    :func:`~pola_mm.ops.pacs_kernel.pacs_attention_kernel` when ``fast``,
    else the formula :func:`pacs_linear_attention` (same outputs and
    gradients).

    Args:
        q, k, v: ``(B, h, N, d)``, float32 or float64.
        s1, s2: raw temperatures ``(1, h, 1, 2d)``.
        sin, cos: optional ``(N, 2d)`` rotary tables of the products.
        fast: the kernel (the call's ``Path.kernels``) or the formula.

    Returns:
        ``(B, h, N, d)``.
    """
    if not torch.jit.is_scripting() and fast:  # (compiled: the formula)
        return pacs_attention_kernel(q, k, v, s1, s2, sin, cos)
    return pacs_linear_attention(q, k, v, s1, s2, sin, cos)


class PaCSAttention(PolaModule):
    """PolaFormer++'s linear attention block part (the authors'
    ``AddLinearAttention``), on tokens of a stage map.

    ``qkvg`` Linear(C, 4C) -> q, k, v, g; :func:`pacs_linear_attention`
    with the rotary encoding of width ``2d`` over the whole map; plus
    ``lepe``, a depth-wise 5x5 conv of v over all C channels; then
    ``proj(x * g)``. Under fp16/bf16 autocast the attention and ``lepe``
    compute in float32 (``exp`` of fp16 overflows above 11) and return the
    input dtype.

    The attention runs the kernel
    (:func:`~pola_mm.ops.pacs_kernel.pacs_attention_kernel`) where the
    call's :class:`~pola_mm.ops.dispatch.Path` allows (chosen once in
    :meth:`forward`), else the formula (fast paths off, export):
    :func:`pacs_attend`.

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

    def extra_repr(self) -> str:
        return f'embed_dims={self.embed_dims}, num_heads={self.num_heads}'

    def mix(self, q: Tensor, k: Tensor, v: Tensor, hw: Size2,
            path: Path = PLAIN) -> Tensor:
        """Attention plus ``lepe`` (before the gate), float32 at least.

        Args:
            q, k, v: ``(B, N, C)``, ``N = H * W`` row-major on ``hw``.
            path: the call's fast paths (:meth:`forward`).

        Returns:
            ``(B, N, C)`` in the dtype of ``q``.
        """
        if not torch.jit.is_scripting():  # (compiled code: no autocast)
            with no_autocast(q.device.type):
                return self._mix(q, k, v, hw, path)
        return self._mix(q, k, v, hw, path)

    def _mix(self, q: Tensor, k: Tensor, v: Tensor, hw: Size2,
             path: Path) -> Tensor:
        """:meth:`mix` with autocast off."""
        out_dtype = q.dtype
        dt = torch.promote_types(out_dtype, torch.float32)
        B, N, C = q.shape
        sin, cos = rotary_tables(hw, 2 * self.head_dims, device=q.device,
                                 dtype=dt)
        x = pacs_attend(self._heads(q, dt), self._heads(k, dt),
                        self._heads(v, dt), self.s1.to(dt), self.s2.to(dt),
                        sin, cos, fast=path.kernels)
        vmap = v.to(dt).reshape(B, hw[0], hw[1], C).permute(0, 3, 1, 2)
        bias = self.lepe.bias
        lepe = F.conv2d(vmap, self.lepe.weight.to(dt),
                        None if bias is None else bias.to(dt),
                        padding=self.lepe.padding, groups=C)
        x = x.transpose(1, 2).reshape(B, N, C) + \
            lepe.flatten(2).transpose(1, 2)
        return x.to(out_dtype)

    def _heads(self, t: Tensor, dt: torch.dtype) -> Tensor:
        """``(B, N, C)`` -> ``(B, h, N, d)`` in ``dt``."""
        return t.to(dt).reshape(t.shape[0], t.shape[1], self.num_heads,
                                self.head_dims).transpose(1, 2)

    def mix_flops(self, batch: int, tokens: int) -> Tuple[str, Dict[str, int]]:
        """FLOPs of :meth:`mix` on ``batch`` maps of ``tokens`` tokens (1
        multiply-add = 1 FLOP): ``('pacs_attention',``
        :func:`~pola_mm.analysis.flops.pacs_attention_flops` ``)`` with the
        rotary encoding and ``lepe``."""
        from ...analysis.flops import pacs_attention_flops
        return 'pacs_attention', pacs_attention_flops(
            batch, tokens, self.embed_dims, self.num_heads,
            self.lepe.kernel_size[0], rotary=True)

    def forward(self, x: Tensor, hw: Size2) -> Tensor:
        """``(B, N, C)`` tokens on the grid ``hw`` -> ``(B, N, C)``."""
        path = self.select_path(x)
        q, k, v, g = self.qkvg(x).reshape(x.shape[0], x.shape[1], 4,
                                          self.embed_dims).unbind(-2)
        return self.proj(self.mix(q, k, v, hw, path) * g)
