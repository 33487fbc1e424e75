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
from typing import List, Optional, Tuple, Union

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
        ``xs = x / s`` and ``(f+(xs), f-(xs))`` (times ``mask``), all
        ``(B, h, N, d)``.
    """
    xs = x * inv_s
    a = (xs.abs().log_() * p).exp_()  # log 0 = -inf -> exp(-inf) = 0
    if mask is not None:
        a = a.mul_(mask)
    signed = a.copysign_(xs)
    pos = torch.relu(signed)
    return xs, (pos, pos.sub(signed))


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


#: On CPU the kernel works on slabs of about this many elements (of one
#: ``(b, h, n, d)`` tensor): whole sequences when they are small (a batch of
#: windows), runs of tokens of one sequence when it is long (a PVT stage), so
#: that its chain of elementwise operations runs in cache instead of
#: streaming every intermediate through memory (about 2x faster). GPUs and
#: ``torch.compile`` get one slab.
CPU_CHUNK_ELEMENTS = 1 << 17


def is_compiling() -> bool:
    """Whether torch.compile is tracing (False on torch without it)."""
    fn = getattr(getattr(torch, 'compiler', None), 'is_compiling', None)
    if fn is None:  # torch < 2.3
        fn = getattr(getattr(torch, '_dynamo', None), 'is_compiling', None)
    return bool(fn()) if fn is not None else False


def _plan(x: Tensor) -> Tuple[List[slice], int]:
    """Slabs for ``x`` ``(B, h, N, d)``: slices of B, and a token step."""
    B, h, N, d = x.shape
    if x.device.type != 'cpu' or is_compiling():
        return [slice(0, B)], N
    per_item = max(h * N * d, 1)
    if per_item <= CPU_CHUNK_ELEMENTS:
        step = max(1, CPU_CHUNK_ELEMENTS // per_item)
        return [slice(i, min(i + step, B)) for i in range(0, B, step)], N
    n_step = max(1, CPU_CHUNK_ELEMENTS // max(h * d, 1))
    return [slice(i, i + 1) for i in range(B)], n_step


def _token_chunks(N: int, step: int) -> List[slice]:
    return [slice(i, min(i + step, N)) for i in range(0, N, step)]


def _sub(t: Optional[Union[Tensor, float]], b: slice):
    """Rows ``b`` of a per-sequence tensor (masks, key counts)."""
    return t[b] if isinstance(t, Tensor) else t


def _chunk(mask: Optional[Tensor], c: slice) -> Optional[Tensor]:
    return None if mask is None else mask[:, :, c]


def _forward(q: Tensor, k: Tensor, v: Tensor, inv_s: Tensor, p: Tensor,
             mask: Optional[Tensor], n: Union[float, Tensor], eps: float):
    """Both flows, slab by slab.

    Args:
        q, k, v: ``(B, h, N, d)``.
        inv_s, p: ``(1, h, 1, d)``.
        mask: optional ``(B, 1, N, 1)`` 0/1 key weights.
        n: number of keys (float, or ``(B, 1, 1, 1)``).

    Returns:
        ``x`` ``(B, h, N, d)``, the mix matrix ``m`` ``(B, h, 2d, d + 2)``
        and ``1 / z`` ``(B, h, N, 2)``.
    """
    slabs, step = _plan(q)
    if len(slabs) == 1:
        return _forward_slab(q, k, v, inv_s, p, mask, n, eps, step)
    B, h, N, d = q.shape
    x = _token_major(q)
    rz = q.new_empty(B, h, N, 2)
    m = q.new_empty(B, h, 2 * d, d + 2)
    for b in slabs:
        _, m[b], rz[b] = _forward_slab(q[b], k[b], v[b], inv_s, p,
                                       _sub(mask, b), _sub(n, b), eps, step,
                                       out=x[b])
    return x, m, rz


def _token_major(q: Tensor) -> Tensor:
    """An empty ``(B, h, N, d)`` laid out ``(B, N, h, d)`` in memory, so that
    the caller's ``x.transpose(1, 2).reshape(B, N, h * d)`` is free."""
    B, h, N, d = q.shape
    return q.new_empty(B, N, h, d).transpose(1, 2)


def _forward_slab(q: Tensor, k: Tensor, v: Tensor, inv_s: Tensor, p: Tensor,
                  mask: Optional[Tensor], n: Union[float, Tensor], eps: float,
                  step: int, out: Optional[Tensor] = None):
    """:func:`_forward` on whole sequences, walking tokens by ``step``;
    writes ``x`` into ``out`` when given (eager CPU path only)."""
    B, h, N, d = q.shape
    chunks = _token_chunks(N, step)
    # r = [k'^T v, sum_N k'] (B, h, 2d, d + 1), halves of k' kept apart
    r: Optional[Tensor] = None
    for c in chunks:
        mc = _chunk(mask, c)
        _, kf = _features(k[:, :, c], inv_s, p, mc)
        # v needs no mask: the masked k' rows are exactly 0
        vc = v[:, :, c]
        rc = torch.cat([
            torch.cat([f.transpose(-2, -1) @ vc,
                       f.sum(-2).unsqueeze(-1)], dim=-1) for f in kf
        ], dim=-2)
        r = rc if r is None else r.add_(rc)
    m = _mix_matrix(r, n)  # (B, h, 2d, d + 2)
    m_pos, m_neg = m.chunk(2, dim=-2)

    def flows(qc: Tensor,
              dst: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        _, qf = _features(qc, inv_s, p, None)
        u = (qf[0] @ m_pos).add_(qf[1] @ m_neg)  # (B, h, n_c, d + 2)
        rz = (u[..., d:] + eps).reciprocal_()  # (B, h, n_c, 2)
        num = u[..., :d].unflatten(-1, (2, d // 2))
        if dst is None:
            return (num * rz.unsqueeze(-1)).flatten(-2), rz
        torch.mul(num, rz.unsqueeze(-1), out=dst.unflatten(-1, (2, d // 2)))
        return dst, rz

    if len(chunks) == 1:
        x, rz = flows(q, out)
        return x, m, rz
    x = _token_major(q) if out is None else out
    rz = q.new_empty(B, h, N, 2)
    for c in chunks:
        _, rz[:, :, c] = flows(q[:, :, c], x[:, :, c])
    return x, m, rz


def _backward_slab(dx: Tensor, q: Tensor, k: Tensor, v: Tensor, m: Tensor,
                   rz: Tensor, x: Tensor, mask: Optional[Tensor],
                   n: Union[float, Tensor], inv_s: Tensor, p: Tensor,
                   need_v: bool, step: int):
    """Gradients on whole sequences, walking tokens by ``step``.

    Returns:
        ``dq``, ``dk``, ``dv`` (None unless ``need_v``), all
        ``(B, h, N, d)``, and the sums over ``B`` and ``N`` of
        ``dL/dxs * xs`` and of ``dL/dp``, both ``p.shape``.
    """
    B, h, N, d = q.shape
    half = d // 2
    chunks = _token_chunks(N, step)
    one = len(chunks) == 1
    dq = None if one else q.new_empty(q.shape)
    dk = None if one else k.new_empty(k.shape)
    dv = None if one or not need_v else v.new_empty(v.shape)
    ds: Optional[Tensor] = None
    dp: Optional[Tensor] = None
    dm: Optional[Tensor] = None

    def acc(total: Optional[Tensor], part: Tensor) -> Tensor:
        return part if total is None else total.add_(part)

    # queries: u = [f+, f-] @ m = [num, z - eps], x = num / z per half
    mt = _to_sign_basis(m).transpose(-2, -1)  # (B, h, d + 2, 2d)
    for c in chunks:
        dxh = dx[:, :, c].unflatten(-1, (2, half))  # (B, h, n_c, 2, d/2)
        rzc = rz[:, :, c]
        du = torch.cat([
            (dxh * rzc.unsqueeze(-1)).flatten(-2),
            (dxh * x[:, :, c].unflatten(-1, (2, half))).sum(-1).mul_(
                rzc).neg_()
        ], dim=-1)  # (B, h, n_c, d + 2)
        # features f+ = (a + t) / 2, f- = (a - t) / 2: use a and t
        qs, sq, axq, lq, aq, tq = _features_for_backward(
            q[:, :, c], inv_s, p, None)
        dm = acc(dm, _from_sign_basis(aq.transpose(-2, -1) @ du,
                                      tq.transpose(-2, -1) @ du))
        dqs, dpq = _through_power(du @ mt, qs, sq, axq, lq, aq, p)
        if one:
            dq = dqs * inv_s
        else:
            dq[:, :, c] = dqs * inv_s
        ds = acc(ds, _sum_to(dqs.mul_(qs), p.shape))
        dp = acc(dp, _sum_to(dpq, p.shape))

    # keys and values: m = mix(r), r = [k'^T v, sum k']
    dr = _to_sign_basis(_mix_matrix_grad(dm, n))  # (B, h, 2d, d + 1)
    drt = dr.transpose(-2, -1)  # (B, h, d + 1, 2d)
    dr_a, dr_t = dr[..., :d].chunk(2, dim=-2)
    for c in chunks:
        mc = _chunk(mask, c)
        # at masked keys a = t = 0, so dv = 0 there and the (nonzero) dk_at
        # is multiplied by a = 0: no mask on v or on the gradients needed
        dk_at = (v[:, :, c] @ drt[..., :d, :]).add_(drt[..., d:, :])
        ks, sk, axk, lk, ak, tk = _features_for_backward(
            k[:, :, c], inv_s, p, mc)
        if need_v:
            dvc = (ak @ dr_a).add_(tk @ dr_t)  # (B, h, n_c, d)
            if one:
                dv = dvc
            else:
                dv[:, :, c] = dvc
        dks, dpk = _through_power(dk_at, ks, sk, axk, lk, ak, p)
        if one:
            dk = dks * inv_s
        else:
            dk[:, :, c] = dks * inv_s
        ds = acc(ds, _sum_to(dks.mul_(ks), p.shape))
        dp = acc(dp, _sum_to(dpk, p.shape))
    return dq, dk, dv, ds, dp


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
        x, m, rz = _forward(q, k, v, inv_s, p, mask, n, eps)
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
        sig_s = torch.sigmoid(scale)
        inv_s = F.softplus(scale).reciprocal()
        sig_p = torch.sigmoid(power)
        p = 1 + alpha * sig_p
        need_v = ctx.needs_input_grad[2]
        slabs, step = _plan(q)
        if len(slabs) == 1:
            dq, dk, dv, ds, dp = _backward_slab(dx, q, k, v, m, rz, x, mask,
                                                n, inv_s, p, need_v, step)
        else:
            dq = q.new_empty(q.shape)
            dk = k.new_empty(k.shape)
            dv = v.new_empty(v.shape) if need_v else None
            ds = dp = None
            for b in slabs:
                dqb, dkb, dvb, dsb, dpb = _backward_slab(
                    dx[b], q[b], k[b], v[b], m[b], rz[b], x[b],
                    _sub(mask, b), _sub(n, b), inv_s, p, need_v, step)
                dq[b], dk[b] = dqb, dkb
                if need_v:
                    dv[b] = dvb
                ds = dsb if ds is None else ds.add_(dsb)
                dp = dpb if dp is None else dp.add_(dpb)
        dscale = dpower = None
        if ctx.needs_input_grad[3]:
            # xs = x / s: dL/ds = -sum(dL/dxs * xs) / s; s = softplus(scale)
            dscale = _sum_to(ds.mul_(-inv_s).mul_(sig_s), scale.shape)
        if ctx.needs_input_grad[4]:
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
    return _forward(q, k, v, inv_s, p, mask, n, eps)[0]
