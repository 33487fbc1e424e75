"""A fast, memory-lean kernel of the polarity-aware linear attention.

Computes exactly the published formula (see
:func:`polarity_attention_kernel`), rearranged so that it does less work:

- ``relu(t)^p`` and ``relu(-t)^p`` come from one ``|t|^p`` and the sign of
  ``t`` (they have disjoint supports), so the power is taken once per
  element, not twice.
- The opposite-signed flow is the same-signed flow with the halves of the
  key-value product swapped: with ``P = f+(k)^T v`` and ``Q = f-(k)^T v``,
  ``x_sim = f+(q) P1 + f-(q) Q1`` and ``x_opp = f+(q) Q2 + f-(q) P2``. Both
  flows, and both normalisers, are therefore one product of
  ``q' = [f+(q), f-(q)]`` (N, 2d) with one (2d, d + 2) matrix ``M`` built
  from a single key-value product ``k'^T [v, 1]``: two matrix products in
  all, instead of four plus two normaliser products and four concatenations.
- A custom autograd function keeps only ``q``, ``k``, ``v`` (and the tiny
  parameters) for backward and recomputes the feature maps there, with
  hand-written derivatives of ``|t|^p`` that reuse the recomputed power.

Everything is whole-tensor torch operations without host synchronisation or
data-dependent Python control flow, so the function runs unchanged on GPUs
and traces into a single ``torch.compile`` graph.
"""
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ['polarity_attention_kernel', 'PolarityAttentionFunction']

_EPS = 1e-6


def _features(x: Tensor, s: Tensor, p: Tensor,
              mask: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """Polarity feature map of ``x`` scaled by ``s``.

    Args:
        x: ``(B, h, N, d)``.
        s: ``(1, h, 1, d)`` positive scale.
        p: ``(1, h, 1, d)`` exponent, > 1.
        mask: optional ``(B, 1, N, 1)`` 0/1 weights of the tokens.

    Returns:
        ``xs = x / s``; ``a = |xs|^p`` (times ``mask``), both
        ``(B, h, N, d)``; and ``[f+(xs), f-(xs)]`` of shape ``(B, h, N, 2d)``
        (times ``mask``).
    """
    xs = x / s
    a = xs.abs().pow(p)
    if mask is not None:
        a = a * mask
    feat = a.new_empty(a.shape[:-1] + (2, a.shape[-1]))
    pos, neg = feat.unbind(-2)
    torch.mul(a, xs > 0, out=pos)
    torch.sub(a, pos, out=neg)  # exact: supports are disjoint, a = 0 at 0
    return xs, a, feat.flatten(-2)


def _mix_matrix(r: Tensor, n: Union[float, Tensor]) -> Tensor:
    """The (2d, d + 2) matrix that both flows and normalisers multiply.

    Args:
        r: ``(B, h, 2d, d + 1)`` = ``k'^T [v, 1]`` = ``[[P, sum f+(k)],
            [Q, sum f-(k)]]``.
        n: number of keys (float, or ``(B, 1, 1, 1)``).

    Returns:
        ``(B, h, 2d, d + 2)``: rows for ``f+(q)`` are ``[P1, Q2, kp, kn]``,
        rows for ``f-(q)`` are ``[Q1, P2, kn, kp]``, all divided by ``n``.
    """
    d = r.shape[-1] - 1
    half = d // 2
    top, bot = r.chunk(2, dim=-2)  # (B, h, d, d + 1) each: [P | kp], [Q | kn]
    m_top = torch.cat(
        [top[..., :half], bot[..., half:d], top[..., d:], bot[..., d:]], -1)
    m_bot = torch.cat(
        [bot[..., :half], top[..., half:d], bot[..., d:], top[..., d:]], -1)
    return torch.cat([m_top, m_bot], dim=-2) / n


def _mix_matrix_grad(dm: Tensor, n: Union[float, Tensor]) -> Tensor:
    """Adjoint of :func:`_mix_matrix`: ``(B, h, 2d, d + 2)`` ->
    ``(B, h, 2d, d + 1)``."""
    d = dm.shape[-1] - 2
    half = d // 2
    dm = dm / n
    dtop, dbot = dm.chunk(2, dim=-2)
    r_top = torch.cat([
        dtop[..., :half], dbot[..., half:d],
        dtop[..., d:d + 1] + dbot[..., d + 1:]
    ], -1)
    r_bot = torch.cat([
        dbot[..., :half], dtop[..., half:d],
        dtop[..., d + 1:] + dbot[..., d:d + 1]
    ], -1)
    return torch.cat([r_top, r_bot], dim=-2)


def _with_ones(v: Tensor) -> Tensor:
    """``[v, 1]`` along the last dim: ``(..., d)`` -> ``(..., d + 1)``."""
    out = v.new_empty(v.shape[:-1] + (v.shape[-1] + 1, ))
    out[..., :-1] = v
    out[..., -1] = 1
    return out


def _forward(q: Tensor, k: Tensor, v: Tensor, s: Tensor, p: Tensor,
             mask: Optional[Tensor], n: Union[float, Tensor], eps: float):
    """Shared forward; returns the output and what backward needs."""
    qs, aq, qf = _features(q, s, p, None)
    ks, ak, kf = _features(k, s, p, mask)
    ve = _with_ones(v if mask is None else v * mask)  # (B, h, N, d + 1)
    r = kf.transpose(-2, -1) @ ve  # (B, h, 2d, d + 1)
    m = _mix_matrix(r, n)  # (B, h, 2d, d + 2)
    u = qf @ m  # (B, h, N, d + 2)
    d = v.shape[-1]
    z = u[..., d:] + eps  # (B, h, N, 2)
    x = (u[..., :d].unflatten(-1, (2, d // 2)) / z.unsqueeze(-1)).flatten(-2)
    return x, (qs, aq, qf, ks, ak, kf, ve, m, z)


def _power_grad(da: Tensor, xs: Tensor, a: Tensor, p: Tensor,
                tiny: float) -> Tuple[Tensor, Tensor]:
    """Derivatives of ``a = |xs|^p`` given ``dL/da``.

    Returns ``dL/dxs`` (``p a / xs``, 0 where ``xs = 0``) and the per-element
    ``dL/dp`` (``a log|xs|``, 0 where ``a = 0``), both ``(B, h, N, d)``.
    """
    xs_safe = torch.where(xs == 0, torch.ones_like(xs), xs)
    da_a = da * a
    dxs = da_a * p / xs_safe
    dp = da_a * xs.abs().clamp_min(tiny).log()
    return dxs, dp


def _sum_to(t: Tensor, shape: torch.Size) -> Tensor:
    """Sum ``t`` over the dims where ``shape`` broadcasts (size 1)."""
    dims = [i for i, (a, b) in enumerate(zip(t.shape, shape)) if b == 1
            and a != 1]
    return t.sum(dim=dims, keepdim=True) if dims else t


class PolarityAttentionFunction(torch.autograd.Function):
    """Polarity attention with feature maps recomputed in backward.

    Saves only ``q``, ``k``, ``v``, ``scale``, ``power`` and the mask;
    see :func:`polarity_attention_kernel` for the arguments.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, scale: Tensor,
                power: Tensor, alpha: float, mask: Optional[Tensor],
                n: Union[float, Tensor], eps: float) -> Tensor:
        s = F.softplus(scale)
        p = 1 + alpha * torch.sigmoid(power)
        x, _ = _forward(q, k, v, s, p, mask, n, eps)
        ctx.save_for_backward(q, k, v, scale, power, mask,
                              n if isinstance(n, Tensor) else None)
        ctx.alpha = alpha
        ctx.n = n if not isinstance(n, Tensor) else None
        ctx.eps = eps
        return x

    @staticmethod
    def backward(ctx, dx: Tensor):
        q, k, v, scale, power, mask, n_t = ctx.saved_tensors
        n = n_t if n_t is not None else ctx.n
        alpha = ctx.alpha
        with torch.enable_grad():
            pass  # (all derivatives below are explicit)
        sig_s = torch.sigmoid(scale)
        s = F.softplus(scale)
        sig_p = torch.sigmoid(power)
        p = 1 + alpha * sig_p
        x, (qs, aq, qf, ks, ak, kf, ve, m, z) = _forward(
            q, k, v, s, p, mask, n, ctx.eps)
        d = v.shape[-1]
        half = d // 2
        tiny = torch.finfo(q.dtype).tiny

        # x = num / z per half; u = [num, z - eps]
        dx = dx.unflatten(-1, (2, half))  # (B, h, N, 2, d/2)
        xh = x.unflatten(-1, (2, half))
        du_num = (dx / z.unsqueeze(-1)).flatten(-2)  # (B, h, N, d)
        du_z = -(dx * xh).sum(-1) / z  # (B, h, N, 2)
        du = torch.cat([du_num, du_z], dim=-1)  # (B, h, N, d + 2)
        # u = qf @ m
        dqf = du @ m.transpose(-2, -1)  # (B, h, N, 2d)
        dm = qf.transpose(-2, -1) @ du  # (B, h, 2d, d + 2)
        dr = _mix_matrix_grad(dm, n)  # (B, h, 2d, d + 1)
        # r = kf^T ve
        dkf = ve @ dr.transpose(-2, -1)  # (B, h, N, 2d)
        dv = None
        if ctx.needs_input_grad[2]:
            dv = kf @ dr[..., :d]  # (B, h, N, d)
            if mask is not None:
                dv = dv * mask

        # feature maps: f = [a (t > 0), a (t < 0)]
        def feat_grad(dfeat: Tensor, ts: Tensor) -> Tensor:
            dpos, dneg = dfeat.unflatten(-1, (2, d)).unbind(-2)
            return torch.where(ts > 0, dpos, dneg)

        daq = feat_grad(dqf, qs)
        dak = feat_grad(dkf, ks)  # ak already carries the mask
        dqs, dpq = _power_grad(daq, qs, aq, p, tiny)
        dks, dpk = _power_grad(dak, ks, ak, p, tiny)
        # xs = x / s
        dq = dqs / s
        dk = dks / s
        dscale = dpower = None
        if ctx.needs_input_grad[3]:
            ds = -(_sum_to(dqs * qs, s.shape) + _sum_to(dks * ks, s.shape))
            ds = _sum_to(ds, s.shape) / s
            dscale = _sum_to(ds * sig_s, scale.shape)
        if ctx.needs_input_grad[4]:
            dp = _sum_to(dpq, p.shape) + _sum_to(dpk, p.shape)
            dpower = _sum_to(dp * alpha * sig_p * (1 - sig_p), power.shape)
        return dq, dk, dv, dscale, dpower, None, None, None, None


def polarity_attention_kernel(q: Tensor,
                              k: Tensor,
                              v: Tensor,
                              scale: Tensor,
                              power: Tensor,
                              alpha: float,
                              valid: Optional[Tensor] = None,
                              eps: float = _EPS) -> Tensor:
    """Polarity-aware linear attention (the published formula).

    With ``h`` heads of width ``d`` (even), ``s = softplus(scale)``,
    ``p = 1 + alpha * sigmoid(power)``, ``f+(t) = relu(t)^p``,
    ``f-(t) = relu(-t)^p``, ``q_sim = [f+(q/s), f-(q/s)]``,
    ``q_opp = [f-(q/s), f+(q/s)]``, ``k' = [f+(k/s), f-(k/s)]`` and
    ``v = [v1, v2]`` split per head::

        x_sim = q_sim (k'^T v1 / n) / (q_sim . mean(k') + eps)
        x_opp = q_opp (k'^T v2 / n) / (q_opp . mean(k') + eps)
        out   = [x_sim, x_opp]

    With ``valid``, padded keys contribute nothing (``k'`` and ``v`` are
    zero there) and ``n`` is the number of valid keys of each sequence
    (at least 1); without it ``n = N``. The outputs at padded queries are
    computed like any other and meant to be discarded.

    Args:
        q: ``(B, h, N, d)`` queries.
        k: ``(B, h, N, d)`` keys, positional encoding already added.
        v: ``(B, h, N, d)`` values.
        scale: raw ``scale`` broadcastable to ``(1, h, 1, d)``.
        power: raw ``power``, ``(1, h, 1, d)``.
        alpha: exponent range; ``p`` lies in ``(1, 1 + alpha)``.
        valid: optional ``(B, N)`` bool, True for real keys.
        eps: added to the normalisers.

    Returns:
        ``(B, h, N, d)`` in the dtype of ``q``.
    """
    N = q.shape[-2]
    if valid is None:
        mask = None
        n: Union[float, Tensor] = float(N)
    else:
        mask = valid[:, None, :, None].to(q.dtype)  # (B, 1, N, 1)
        n = mask.sum(dim=-2, keepdim=True).clamp(min=1.0)  # (B, 1, 1, 1)
    if torch.is_grad_enabled() and any(
            t.requires_grad for t in (q, k, v, scale, power)):
        return PolarityAttentionFunction.apply(q, k, v, scale, power, alpha,
                                               mask, n, eps)
    s = F.softplus(scale)
    p = 1 + alpha * torch.sigmoid(power)
    return _forward(q, k, v, s, p, mask, n, eps)[0]
