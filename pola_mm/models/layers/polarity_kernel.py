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


def _features(x: Tensor, inv_s: Tensor, p: Tensor,
              mask: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """Polarity feature map of ``x`` scaled by ``1 / inv_s`` (forward).

    ``|t|^p`` is taken once, as ``exp(p log|t|)`` (cheaper than ``pow`` with
    a tensor exponent), and split by the sign of ``t``:
    ``f+ = relu(sign(t) |t|^p)``, ``f- = f+ - sign(t) |t|^p``, exact since
    the two have disjoint supports.

    Args:
        x: ``(B, h, N, d)``.
        inv_s: ``(1, h, 1, d)`` inverse of the positive scale.
        p: ``(1, h, 1, d)`` exponent, > 1.
        mask: optional ``(B, 1, N, 1)`` 0/1 weights of the tokens.

    Returns:
        ``xs = x / s`` ``(B, h, N, d)`` and ``[f+(xs), f-(xs)]`` of shape
        ``(B, h, N, 2d)`` (times ``mask``).
    """
    xs = x * inv_s
    a = (xs.abs().log_() * p).exp_()  # log 0 = -inf -> exp(-inf) = 0
    if mask is not None:
        a = a.mul_(mask)
    signed = a.copysign_(xs)
    pos = torch.relu(signed)
    return xs, torch.cat([pos, pos.sub(signed)], dim=-1)


def _features_for_backward(x: Tensor, inv_s: Tensor, p: Tensor,
                           mask: Optional[Tensor]):
    """What the derivatives of the feature map need, recomputed from ``x``.

    ``|xs|`` is offset by the smallest normal number, which leaves every
    ``|xs| > 1e-30`` (float32) unchanged and keeps ``log`` finite.

    Returns:
        ``xs = x / s``, ``sign(xs)``, ``|xs| + tiny``, ``log(|xs| + tiny)``,
        ``a = |xs|^p`` (times ``mask``) and ``t = sign(xs) a``, all
        ``(B, h, N, d)``. The features are ``f+ = (a + t) / 2`` and
        ``f- = (a - t) / 2`` (both 0 where ``xs = 0``, up to ``tiny^p``).
    """
    xs = x * inv_s
    sg = torch.sign(xs)
    ax = xs.abs().add_(torch.finfo(xs.dtype).tiny)
    la = ax.log()
    a = (la * p).exp_()
    if mask is not None:
        a = a.mul_(mask)
    return xs, sg, ax, la, a, a * sg


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


def _to_sign_basis(m: Tensor) -> Tensor:
    """``[[A], [B]]`` -> ``[[(A + B) / 2], [(A - B) / 2]]`` along dim -2.

    With ``f+ = (a + t) / 2`` and ``f- = (a - t) / 2`` (``t = sign * a``),
    ``[f+, f-] @ X = [a, t] @ _to_sign_basis(X)``: used in backward to get
    the gradients of ``a`` without selecting by sign.
    """
    top, bot = m.chunk(2, dim=-2)
    return torch.cat([top + bot, top - bot], dim=-2) * 0.5


def _attend(qf: Tensor, kf: Tensor, v: Tensor, mask: Optional[Tensor],
            n: Union[float, Tensor], eps: float):
    """Both flows from the features.

    Args:
        qf, kf: ``(B, h, N, 2d)`` features of q and (masked) k.
        v: ``(B, h, N, d)``.

    Returns:
        ``x`` ``(B, h, N, d)``, the mix matrix ``m`` ``(B, h, 2d, d + 2)``
        and ``1 / z`` ``(B, h, N, 2)``.
    """
    d = v.shape[-1]
    vm = v if mask is None else v * mask
    kt = kf.transpose(-2, -1)  # (B, h, 2d, N)
    r = torch.cat([kt @ vm, kt.sum(-1, keepdim=True)], dim=-1)  # [k'^T v, sum]
    m = _mix_matrix(r, n)  # (B, h, 2d, d + 2)
    u = qf @ m  # (B, h, N, d + 2)
    rz = (u[..., d:] + eps).reciprocal_()  # (B, h, N, 2)
    x = (u[..., :d].unflatten(-1, (2, d // 2)) * rz.unsqueeze(-1)).flatten(-2)
    return x, m, rz


def _sum_to(t: Tensor, shape: torch.Size) -> Tensor:
    """Sum ``t`` over the dims where ``shape`` broadcasts (size 1)."""
    dims = [i for i, (a, b) in enumerate(zip(t.shape, shape)) if b == 1
            and a != 1]
    return t.sum(dim=dims, keepdim=True) if dims else t


class PolarityAttentionFunction(torch.autograd.Function):
    """Polarity attention with feature maps recomputed in backward.

    Saves ``q``, ``k``, ``v``, the parameters, the mask, the output, its
    normalisers ``1 / z`` (``(B, h, N, 2)``) and the small mix matrix, but
    none of the ``(B, h, N, 2d)`` feature maps, which backward recomputes
    elementwise (no matrix product is recomputed). See
    :func:`polarity_attention_kernel` for the arguments.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, scale: Tensor,
                power: Tensor, alpha: float, mask: Optional[Tensor],
                n: Union[float, Tensor], eps: float) -> Tensor:
        inv_s = F.softplus(scale).reciprocal()
        p = 1 + alpha * torch.sigmoid(power)
        _, qf = _features(q, inv_s, p, None)
        _, kf = _features(k, inv_s, p, mask)
        x, m, rz = _attend(qf, kf, v, mask, n, eps)
        ctx.save_for_backward(q, k, v, scale, power, mask,
                              n if isinstance(n, Tensor) else None, m, rz, x)
        ctx.alpha = alpha
        ctx.n = n if not isinstance(n, Tensor) else None
        return x

    @staticmethod
    def backward(ctx, dx: Tensor):
        q, k, v, scale, power, mask, n_t, m, rz, x = ctx.saved_tensors
        n = n_t if n_t is not None else ctx.n
        alpha = ctx.alpha
        d = v.shape[-1]
        sig_s = torch.sigmoid(scale)
        inv_s = F.softplus(scale).reciprocal()
        sig_p = torch.sigmoid(power)
        p = 1 + alpha * sig_p

        # x = num / z per half, u = qf @ m = [num, z - eps]
        dxh = dx.unflatten(-1, (2, d // 2))  # (B, h, N, 2, d/2)
        du_num = (dxh * rz.unsqueeze(-1)).flatten(-2)  # (B, h, N, d)
        du_z = (dxh * x.unflatten(-1, (2, d // 2))).sum(-1).mul_(rz).neg_()
        du = torch.cat([du_num, du_z], dim=-1)  # (B, h, N, d + 2)
        del dxh, du_num, du_z

        # features f+ = (a + t) / 2, f- = (a - t) / 2: work with a and t
        qs, sq, axq, lq, aq, tq = _features_for_backward(q, inv_s, p, None)
        dm = _from_sign_basis(aq.transpose(-2, -1) @ du,
                              tq.transpose(-2, -1) @ du)  # (B, h, 2d, d + 2)
        dq_at = du @ _to_sign_basis(m).transpose(-2, -1)  # (B, h, N, 2d)
        del du
        dqs, dpq = _through_power(dq_at, qs, sq, axq, lq, aq, p)
        del dq_at, sq, axq, lq, aq, tq

        # m = mix(r), r = [k'^T v, sum k']
        dr = _to_sign_basis(_mix_matrix_grad(dm, n))  # (B, h, 2d, d + 1)
        vm = v if mask is None else v * mask
        drt = dr.transpose(-2, -1)  # (B, h, d + 1, 2d)
        dk_at = (vm @ drt[..., :d, :]).add_(drt[..., d:, :])  # (B, h, N, 2d)
        ks, sk, axk, lk, ak, tk = _features_for_backward(k, inv_s, p, mask)
        dv = None
        if ctx.needs_input_grad[2]:
            dr_a, dr_t = dr[..., :d].chunk(2, dim=-2)
            dv = (ak @ dr_a).add_(tk @ dr_t)  # (B, h, N, d)
            if mask is not None:
                dv = dv.mul_(mask)
        dks, dpk = _through_power(dk_at, ks, sk, axk, lk, ak, p)
        del dk_at, sk, axk, lk, ak, tk

        dq = dqs * inv_s
        dk = dks * inv_s
        dscale = dpower = None
        if ctx.needs_input_grad[3]:
            ds = (_sum_to(dqs.mul_(qs), p.shape) +
                  _sum_to(dks.mul_(ks), p.shape)).mul_(-inv_s)
            dscale = _sum_to(ds * sig_s, scale.shape)
        if ctx.needs_input_grad[4]:
            dp = _sum_to(dpq, p.shape) + _sum_to(dpk, p.shape)
            dpower = _sum_to(dp * alpha * sig_p * (1 - sig_p), power.shape)
        return dq, dk, dv, dscale, dpower, None, None, None, None


def _from_sign_basis(da: Tensor, dt: Tensor) -> Tensor:
    """Gradient of ``[f+, f-]`` from those of ``a`` and ``t`` products:
    ``f+^T X = (a^T X + t^T X) / 2``, ``f-^T X = (a^T X - t^T X) / 2``;
    returns them stacked along dim -2."""
    return torch.cat([da + dt, da - dt], dim=-2) * 0.5


def _through_power(dat: Tensor, xs: Tensor, sg: Tensor, ax: Tensor,
                   la: Tensor, a: Tensor,
                   p: Tensor) -> Tuple[Tensor, Tensor]:
    """Chain rule through ``t = sign(xs) a``, ``a = |xs|^p``.

    Args:
        dat: ``(B, h, N, 2d)``, gradients w.r.t. ``a`` and ``t``.

    Returns:
        ``dL/dxs`` (``p a sign / |xs|``) and the per-element ``dL/dp``
        (``a log|xs|``), both ``(B, h, N, d)``.
    """
    da, dt = dat.chunk(2, dim=-1)
    g = da.addcmul(dt, sg).mul_(a)  # dL/da_total * a
    dxs = (g * p).mul_(sg).div_(ax)
    return dxs, g.mul_(la)


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
    inv_s = F.softplus(scale).reciprocal()
    p = 1 + alpha * torch.sigmoid(power)
    _, qf = _features(q, inv_s, p, None)
    _, kf = _features(k, inv_s, p, mask)
    return _attend(qf, kf, v, mask, n, eps)[0]
