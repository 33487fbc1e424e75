"""The polarity-aware linear attention on the CPU (and on GPUs without
Triton): fast and memory-lean, in torch operations.

Computes exactly the published formula (see
:func:`polarity_attention_cpu`), rearranged so that it does less work:

- One power for both signs: ``relu(t)^p`` and ``relu(-t)^p`` come from
  one ``|t|^p`` (as ``exp(p log|t|)``) and the sign of ``t`` (they have
  disjoint supports), written straight into the halves of one buffer.
- Shared key-value product. The opposite-signed flow is the same-signed
  flow with the halves of the key-value product swapped: with
  ``P = f+(k)^T v`` and ``Q = f-(k)^T v``, ``x_sim = f+(q) P1 + f-(q) Q1``
  and ``x_opp = f+(q) Q2 + f-(q) P2``. Both flows and both normalisers are
  one product of the query features ``[f+(q), f-(q)]`` (N, 2d) with one
  ``(2d, d + 2)`` matrix built from a single key product
  ``[f+(k), f-(k)]^T [v, 1]``.
- Recomputation. A custom autograd function keeps ``q``, ``k``, ``v``, the
  output, its normalisers and the tiny matrices, never an ``(N, 2d)``
  feature map; backward recomputes the features elementwise (no matrix
  product is recomputed), with hand-written derivatives that reuse them.
- Scale outside the powers (as the plain reference): ``|t / s|^p =
  c |t|^p`` with the per-channel ``c = (1 / s)^p``, so the forward takes
  the powers of the unscaled inputs and ``c`` scales the rows of the small
  matrices. (The backward works on the scaled inputs, whose logarithms its
  derivatives need.)
- Key bias. A positional table added to the keys (PolaFormer's
  ``positional_encoding``) can be passed as ``k_bias`` and is added inside
  the implementation, run by run, so ``k + table`` is never materialised
  or saved.
- Products over tokens that fill a GPU: the key product with its
  normaliser (a column of ones beside ``v``) and the backward's ``f^T du``
  are :func:`~.token_product.token_product`, split into chunks of tokens
  where the device would otherwise be mostly idle.
- Cache-sized work on CPU: the forward's elementwise chains run on runs
  of tokens small enough to stay in cache (about 2x faster than streaming
  every intermediate through memory), in place in dense buffers reused by
  every run, writing straight into the outputs (the runs are planned by
  :mod:`~.runs`). The backward runs on whole sequences.

Everything is whole-tensor torch operations without host synchronisation or
data-dependent Python control flow; on GPUs the whole input is one run.

The op :func:`~.op.polarity_attention` picks this code, the kernels
(:mod:`.triton`) or the graph form
(:func:`~.graph.polarity_attention_pytorch`); this code never sees a
captured graph.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..dispatch import records_grad
from ..features import EPS, split_signs, sum_to
from ..runs import RunBuffers, plan_runs, token_major, token_runs
from ..token_product import token_product

__all__ = ['polarity_attention_cpu', 'PolarityAttentionFunction']

#: CPU: runs of about this many elements of one ``(B, h, N, d)`` input, so
#: that the forward's elementwise chains stay in cache ...
RUN_ELEMENTS = 1 << 18
#: ... holding at least this many tokens per sequence when sequences are
#: longer (fewer, larger matrix products).
MIN_RUN_TOKENS = 256


def _plan(x: Tensor) -> Tuple[List[slice], int]:
    """:func:`~.runs.plan_runs` of ``x`` with this module's budget."""
    return plan_runs(x, RUN_ELEMENTS, MIN_RUN_TOKENS)


def _mix_matrix(r: Tensor, n: float) -> Tensor:
    """The (2d, d + 2) matrix that both flows and normalisers multiply.

    Args:
        r: ``(B, h, 2d, d + 1)`` = ``[f+(k), f-(k)]^T [v, 1]`` =
            ``[[P, sum f+(k)], [Q, sum f-(k)]]``.
        n: number of keys.

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


def _mix_matrix_grad(dm: Tensor, n: float) -> Tensor:
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


class _Params:
    """Per-call constants derived from the raw parameters (all tiny)."""

    def __init__(self, scale: Tensor, power: Tensor, alpha: float,
                 k_bias: Optional[Tensor]) -> None:
        self.inv_s = F.softplus(scale).reciprocal()
        self.p = 1 + alpha * torch.sigmoid(power)
        self.k_bias = k_bias
        # |t / s|^p = c |t|^p: the forward takes powers of the unscaled
        # inputs and scales the rows of the small matrices by c instead
        c = self.inv_s.expand_as(self.p)**self.p  # (1, h, 1, d)
        self.cc = torch.cat([c, c], -1).transpose(-2, -1)  # (1, h, 2d, 1)


def _features(x: Tensor, p: Tensor, f: Tensor, scratch: Sequence[Tensor],
              bias: Optional[Tensor] = None) -> None:
    """``[f+, f-]`` of ``t = x (+ bias)`` without the scale, written into
    ``f`` ``(B, h, n, 2d)``.

    ``|t|^p`` is taken once, as ``exp(p log|t|)``, and split by the sign of
    ``t`` (:func:`~.features.split_signs`). At ``t = 0`` the logarithm is
    ``-inf`` and both features are 0. ``t`` is first written into
    ``scratch[1]`` and every later step works in place on ``scratch[0]``:
    both dense ``(B, h, n, d)`` whatever the strides of ``x`` (a view of
    the projection) and, on CPU runs, in cache (docs/performance.md).
    """
    if bias is not None:
        x = torch.add(x, bias, out=scratch[1])
    else:
        x = scratch[1].copy_(x)
    d = f.shape[-1] // 2
    split_signs(
        torch.abs(x, out=scratch[0]).log_().mul_(p).exp_().copysign_(x),
        out=(f[..., :d], f[..., d:]))


def _run_features(bufs: RunBuffers, x: Tensor, p: Tensor,
                  bias: Optional[Tensor] = None) -> Tensor:
    """:func:`_features` of the run ``x`` ``(b, h, n, d)`` in the reused
    buffers ``bufs`` (features ``2d`` wide, two ``d``-wide scratches)."""
    f, *scratch = bufs.take(x)
    _features(x, p, f, scratch, bias)
    return f


def _buffers(x: Tensor, step: int) -> RunBuffers:
    """The buffers of :func:`_run_features` for runs of ``step`` tokens."""
    d = x.shape[-1]
    return RunBuffers(x, step, (2 * d, d, d))


def _key_product(k: Tensor, v: Tensor, prm: _Params, step: int,
                 k_bias: Optional[Tensor]) -> Tensor:
    """``[f+, f-]^T [v, 1]`` of the unscaled keys (with ``k_bias``), summed
    over tokens: ``(B, h, 2d, d + 1)``."""
    N = k.shape[-2]
    r: Optional[Tensor] = None
    bufs = _buffers(k, step)
    for c in token_runs(N, step):
        f = _run_features(bufs, k[:, :, c], prm.p,
                          None if k_bias is None else k_bias[:, :, c])
        rc = token_product(f, v[:, :, c], ones=True)
        r = rc if r is None else r.add_(rc)
    assert r is not None
    return r


def _query_run(q: Tensor, S: Tensor, prm: _Params, eps: float, step: int,
               x: Optional[Tensor], rz: Optional[Tensor]):
    """Outputs of the queries ``q`` against the mix matrix ``S`` (its rows
    scaled for unscaled features), walking tokens by ``step``; into ``x``
    and ``rz`` when given. Returns ``x`` and ``1 / z``."""
    d = q.shape[-1]
    half = d // 2
    bufs = _buffers(q, step)
    for c in token_runs(q.shape[-2], step):
        # (B, h, n_c, d + 2): [numerators, z_sim, z_opp]
        u = _run_features(bufs, q[:, :, c], prm.p) @ S
        num = u[..., :d].unflatten(-1, (2, half))
        if x is None or rz is None:
            rz_c = (u[..., d:] + eps).reciprocal_()
            return (num * rz_c.unsqueeze(-1)).flatten(-2), rz_c
        rz_c = rz[:, :, c]
        torch.add(u[..., d:], eps, out=rz_c)
        rz_c.reciprocal_()
        torch.mul(num, rz_c.unsqueeze(-1),
                  out=x[:, :, c].unflatten(-1, (2, half)))
    return x, rz


def _key_state(k: Tensor, v: Tensor, prm: _Params) -> Tensor:
    """:func:`_key_product` of all keys, run by run, its rows scaled by
    ``c``: ``[f+, f-]^T [v, 1]`` of the scaled keys ``(B, h, 2d, d + 1)``.
    """
    seq_runs, step = _plan(k)
    kb = prm.k_bias
    if kb is not None:
        kb = kb.expand_as(k)
    if len(seq_runs) == 1:
        r = _key_product(k, v, prm, step, kb)
    else:
        r = torch.cat([
            _key_product(k[b], v[b], prm, step, None if kb is None else kb[b])
            for b in seq_runs
        ])
    return r.mul_(prm.cc)


def _queries(q: Tensor, S: Tensor, prm: _Params,
             eps: float) -> Tuple[Tensor, Tensor]:
    """:func:`_query_run` of all queries, run by run: ``x`` and
    ``1 / z``; fresh tensors for one run (GPUs), else written into
    token-major outputs."""
    seq_runs, step = _plan(q)
    S = S * prm.cc  # rows scaled for the unscaled query features
    if len(seq_runs) == 1 and step >= q.shape[-2]:
        return _query_run(q, S, prm, eps, step, None, None)
    B, h, N, d = q.shape
    x = token_major(q)
    rz = q.new_empty(B, h, N, 2)
    for b in seq_runs:
        _query_run(q[b], S[b], prm, eps, step, x[b], rz[b])
    return x, rz


def _forward(q: Tensor, k: Tensor, v: Tensor, prm: _Params, eps: float):
    """Both flows: ``x``, the mix matrix ``S`` ``(B, h, 2d, d + 2)`` (of
    the scaled features) and ``1 / z`` ``(B, h, N, 2)``."""
    S = _mix_matrix(_key_state(k, v, prm), float(k.shape[-2]))
    x, rz = _queries(q, S, prm, eps)
    return x, S, rz


def _scaled_features(x: Tensor, prm: _Params, key: bool):
    """Backward: ``[f+, f-]`` of the scaled ``xs = (x (+ k_bias)) / s``,
    ``xs`` with ``|xs|`` clamped to the smallest normal number (the divisor
    of the derivative; the clamp leaves every ``|xs| >= 1.2e-38`` (float32)
    unchanged) and ``log|xs|``."""
    if key and prm.k_bias is not None:
        xs = (x + prm.k_bias) * prm.inv_s
    else:
        xs = x * prm.inv_s
    ax = xs.abs().clamp_min_(torch.finfo(xs.dtype).tiny)
    la = ax.log()
    t = (la * prm.p).exp_().copysign_(xs)
    d = xs.shape[-1]
    f = xs.new_empty(xs.shape[:-1] + (2 * d, ))
    split_signs(t, out=(f[..., :d], f[..., d:]))
    return f, ax.copysign_(xs), la


def _power_grads(df: Tensor, f: Tensor, xsafe: Tensor, la: Tensor,
                 pinv: Tensor) -> Tuple[Tensor, Tensor]:
    """Chain rule through ``f+ = relu(xs)^p``, ``f- = relu(-xs)^p``,
    ``xs = x / s``.

    With ``g = df+ f+ + df- f-``: ``dL/dxs = p g / xs`` (``f'(xs) = p f /
    xs`` for both features), ``dL/dp`` per element is ``g log|xs|`` and
    ``sum(dL/dxs * xs) = p sum(g)``.

    Returns:
        ``dL/dx`` and ``[g, g log|xs|]`` (``(..., 2d)``, for the parameter
        gradients).
    """
    d = la.shape[-1]
    prod = df * f
    w = prod.new_empty(prod.shape)
    g = torch.add(prod[..., :d], prod[..., d:], out=w[..., :d])
    torch.mul(g, la, out=w[..., d:])
    g = g * pinv
    return g.div_(xsafe), w


def _run_feature_grads(df: Tensor, x: Tensor, prm: _Params, key: bool,
                       pinv: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Backward through the features of ``x`` (keys: with the key bias),
    given ``df = dL/d[f+, f-]``: :func:`_scaled_features` and
    :func:`_power_grads`.

    Returns:
        the features ``(B, h, N, 2d)`` (which the caller's products need),
        ``dL/dx`` and the sums of ``[g, g log|xs|]`` over ``B`` and the
        tokens, ``(1, h, 1, 2d)``.
    """
    f, xsafe, la = _scaled_features(x, prm, key)
    dx, w = _power_grads(df, f, xsafe, la, pinv)
    return f, dx, w.sum(dim=(0, 2), keepdim=True)


def _backward(dx: Tensor, q: Tensor, k: Tensor, v: Tensor, S: Tensor,
              rz: Tensor, x: Tensor, n: float, prm: _Params, need_v: bool):
    """Gradients of whole sequences.

    Returns:
        ``dq``, ``dk``, ``dv`` (None unless ``need_v``) ``(B, h, N, d)`` and
        ``w`` ``(1, h, 1, 2d)``: the sums over ``B`` and ``N`` of ``[g, g
        log|xs|]`` (see :func:`_power_grads`) for the parameter gradients.
    """
    d = q.shape[-1]
    half = d // 2
    pinv = prm.p * prm.inv_s
    # queries: u = [f+, f-] @ S = [num, z]; x = num / z per half. The
    # normaliser columns of du are stored with the opposite sign (fewer
    # operations per token); S and dS are flipped to match.
    S_flip = torch.cat([S[..., :d], -S[..., d:]], -1)
    dxh = dx.unflatten(-1, (2, half))
    dz = (dx * x).unflatten(-1, (2, half)).sum(-1)
    du = torch.cat([(dxh * rz.unsqueeze(-1)).flatten(-2), dz * rz], -1)
    f, dq, w = _run_feature_grads(du @ S_flip.transpose(-2, -1), q, prm,
                                  False, pinv)
    dS = token_product(f, du)
    dS = torch.cat([dS[..., :d], -dS[..., d:]], -1)

    # keys and values: S = mix(R), R = [f+, f-]^T [v, 1]
    dR = _mix_matrix_grad(dS, n)
    dR_v = dR[..., :d]  # (B, h, 2d, d)
    df = (v @ dR_v.transpose(-2, -1)).add_(dR[..., d:].transpose(-2, -1))
    f, dk, w_k = _run_feature_grads(df, k, prm, True, pinv)
    dv = f @ dR_v if need_v else None
    return dq, dk, dv, w.add_(w_k)


def _compute_dtype(q: Tensor, scale: Tensor) -> torch.dtype:
    """The computation's dtype: ``q``'s promoted with the parameters'
    (fp16/bf16 inputs with float32 parameters compute in float32)."""
    return torch.promote_types(q.dtype, scale.dtype)


class PolarityAttentionFunction(torch.autograd.Function):
    """Polarity attention with feature maps recomputed in backward.

    Saves ``q``, ``k``, ``v`` as given (fp16/bf16 inputs stay fp16/bf16:
    upcast again in backward), the parameters, the key bias, the output,
    its normalisers ``1 / z`` (``(B, h, N, 2)``) and the small mix matrix,
    but none of the ``(B, h, N, 2d)`` feature maps, which backward
    recomputes elementwise (no matrix product is recomputed). See
    :func:`polarity_attention_cpu` for the arguments.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, scale: Tensor,
                power: Tensor, alpha: float, eps: float,
                k_bias: Optional[Tensor]) -> Tensor:
        prm = _Params(scale, power, alpha, k_bias)
        dt = _compute_dtype(q, scale)
        x, S, rz = _forward(q.to(dt), k.to(dt), v.to(dt), prm, eps)
        ctx.save_for_backward(q, k, v, scale, power, S, rz, x, k_bias)
        ctx.alpha = alpha
        return x

    @staticmethod
    def backward(ctx, dx: Tensor):
        q, k, v, scale, power, S, rz, x, k_bias = ctx.saved_tensors
        in_dtypes = (q.dtype, k.dtype, v.dtype)
        dt = _compute_dtype(q, scale)
        q, k, v = q.to(dt), k.to(dt), v.to(dt)
        n = float(k.shape[-2])
        alpha = ctx.alpha
        prm = _Params(scale, power, alpha, k_bias)
        need_v = ctx.needs_input_grad[2]
        dq, dk, dv, w = _backward(dx, q, k, v, S, rz, x, n, prm, need_v)
        assert w is not None and dk is not None
        d = q.shape[-1]
        g1_sum, dp = w[..., :d], w[..., d:]
        dscale = dpower = dbias = None
        if ctx.needs_input_grad[3]:
            # sum(dL/dxs * xs) = p sum(g1); xs = x / s, s = softplus(scale)
            sig_s = torch.sigmoid(scale)
            dscale = sum_to(g1_sum * prm.p * (-prm.inv_s) * sig_s,
                             scale.shape)
        if ctx.needs_input_grad[4]:
            sig_p = torch.sigmoid(power)
            dpower = sum_to(dp * alpha * sig_p * (1 - sig_p), power.shape)
        if ctx.needs_input_grad[7]:
            dbias = sum_to(dk, k_bias.shape)
        dq, dk = dq.to(in_dtypes[0]), dk.to(in_dtypes[1])
        dv = None if dv is None else dv.to(in_dtypes[2])
        return dq, dk, dv, dscale, dpower, None, None, dbias


def polarity_attention_cpu(q: Tensor, k: Tensor, v: Tensor, scale: Tensor,
                           power: Tensor, alpha: float, eps: float = EPS,
                           k_bias: Optional[Tensor] = None) -> Tensor:
    """Polarity-aware linear attention (the published formula), fast.

    Computes :func:`~.graph.polarity_attention_pytorch` (see there for the
    formula and the arguments) with the rearrangements of this module's
    docstring.

    ``q``, ``k``, ``v`` may be in a lower precision than the parameters
    (fp16/bf16 under autocast, float32 ``scale``): the computation runs in
    the promoted dtype and keeps the inputs as given for backward (no
    float32 copies saved).

    Returns:
        ``(B, h, N, d)`` in the dtype of ``q`` promoted with ``scale``'s,
        laid out ``(B, N, h, d)`` in memory on the CPU path.
    """
    if records_grad(q, k, v, scale, power, k_bias):
        return PolarityAttentionFunction.apply(q, k, v, scale, power, alpha,
                                               eps, k_bias)
    dt = _compute_dtype(q, scale)
    return _forward(q.to(dt), k.to(dt), v.to(dt),
                    _Params(scale, power, alpha, k_bias), eps)[0]
