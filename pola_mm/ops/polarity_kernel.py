"""A fast, memory-lean kernel of the polarity-aware linear attention.

Computes exactly the published formula (see
:func:`polarity_attention_kernel`), rearranged so that it does less work:

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
- Key bias. A positional table added to the keys (PolaFormer's
  ``positional_encoding``) can be passed as ``k_bias`` and is added inside
  the kernel, so ``k + table`` is never materialised or saved.
- Cache-sized work on CPU: the elementwise chains run on runs of tokens
  small enough to stay in cache (about 2x faster than streaming every
  intermediate through memory), writing straight into the outputs.

For inference over long sequences the key side and the query side are also
available separately (:func:`polarity_key_state`, summed over runs of keys,
then :func:`polarity_query_apply` on runs of queries), so that a caller can
stream a stage without holding any full-size intermediate.

Everything is whole-tensor torch operations without host synchronisation or
data-dependent Python control flow; on GPUs the whole input is one run.

Beside the kernel, :func:`polarity_attention_pytorch` is the same
computation in plain PyTorch operations (the reference, as mmcv keeps a
``*_pytorch`` function beside each kernel): what runs when the fast paths
are off and whenever a graph is captured (``torch.compile``, tracing,
export; see :func:`~.dispatch.capturing`), so the kernel itself never sees
a capture.
"""
from typing import Any, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import dispatch
from .cpu_ext import cpu_ext

__all__ = [
    'polarity_attention_kernel', 'polarity_attention_pytorch',
    'PolarityAttentionFunction', 'polarity_key_state', 'polarity_query_apply'
]

_EPS = 1e-6
#: float32's smallest normal number (``torch.finfo(torch.float32).tiny``).
_FLOAT32_TINY = 1.1754943508222875e-38


def _plan(x: Tensor) -> Tuple[List[slice], int]:
    """Runs for ``x`` ``(B, h, N, d)``: slices of B, and a token step.

    One run on GPUs and when everything fits. Otherwise seq_runs of ``b``
    sequences (as many as fit with at least
    ``min(N, _MIN_TOKENS)`` tokens each), each walked in equal runs of
    tokens that fit.
    """
    B, h, N, d = x.shape
    budget = dispatch.KERNEL_RUN_ELEMENTS
    if x.device.type != 'cpu' or B * h * N * d <= budget:
        return [slice(0, B)], N
    per_token = max(h * d, 1)
    b = max(1, min(B, budget //
                   (per_token * min(N, dispatch.KERNEL_MIN_TOKENS))))
    runs = -(-(b * per_token * N) // budget)
    step = -(-N // runs)
    return [slice(i, min(i + b, B)) for i in range(0, B, b)], step


def _token_runs(N: int, step: int) -> List[slice]:
    return [slice(i, min(i + step, N)) for i in range(0, N, step)]


def _token_major(q: Tensor) -> Tensor:
    """An empty ``(B, h, N, d)`` laid out ``(B, N, h, d)`` in memory, so that
    the caller's ``x.transpose(1, 2).reshape(B, N, h * d)`` is free."""
    B, h, N, d = q.shape
    return q.new_empty(B, N, h, d).transpose(1, 2)


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


def _sum_to(t: Tensor, shape: torch.Size) -> Tensor:
    """Sum ``t`` over the dims where ``shape`` broadcasts (size 1)."""
    dims = [i for i, (a, b) in enumerate(zip(t.shape, shape)) if b == 1
            and a != 1]
    return t.sum(dim=dims, keepdim=True) if dims else t


class _Params:
    """Per-call constants derived from the raw parameters (all tiny)."""

    def __init__(self, scale: Tensor, power: Tensor, alpha: float,
                 k_bias: Optional[Tensor]) -> None:
        self.inv_s = F.softplus(scale).reciprocal()
        self.p = 1 + alpha * torch.sigmoid(power)
        # (k + bias) / s = k * inv_s + bias * inv_s: one fused op per run
        self.kb_s = None if k_bias is None else k_bias * self.inv_s
        self.ext: Optional[Any] = None

    def uses_cpu_loops(self, x: Tensor) -> bool:
        """Whether the runs of ``x`` ``(B, h, N, d)`` take the compiled
        CPU loops (:mod:`.cpu_ext`): float32 on CPU, built. Prepares their
        ``(h, d)`` constants."""
        if (x.device.type != 'cpu' or x.dtype != torch.float32
                or x.stride(-1) != 1):
            return False
        if self.ext is None:
            self.ext = cpu_ext()
            if self.ext is None:
                return False
            h, d = x.shape[1], x.shape[3]
            self.inv_hd = self.inv_s.expand(1, h, 1, d).reshape(h, d) \
                .contiguous()
            self.p_hd = self.p.expand(1, h, 1, d).reshape(h, d).contiguous()
            if self.kb_s is not None and self.kb_s.stride(-1) != 1:
                self.kb_s = self.kb_s.contiguous()
        return True


def _scaled_keys(k: Tensor, c: slice, prm: _Params) -> Tensor:
    """``(k + k_bias) / s`` for the tokens ``c`` of ``k``."""
    if prm.kb_s is None:
        return k[:, :, c] * prm.inv_s
    return torch.addcmul(prm.kb_s[:, :, c], k[:, :, c], prm.inv_s)


def _features(xs: Tensor, p: Tensor, with_log: bool,
              buf: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor],
                                                     Optional[Tensor]]:
    """``[f+, f-]`` ``(..., 2d)`` of scaled inputs ``xs`` ``(..., d)``.

    ``|xs|^p`` is taken once (as ``exp(p log|xs|)``) and split by the sign
    of ``xs``: ``f+ = relu(t)`` and ``f- = f+ - t`` with
    ``t = sign(xs) |xs|^p`` (exact: the two have disjoint supports).
    ``|xs|`` is clamped to the smallest normal number, which leaves every
    ``|xs| >= 1.2e-38`` (float32) unchanged, makes the features underflow to
    0 at ``xs = 0`` and keeps ``log|xs|`` finite for the derivatives.

    ``buf`` (``(B, h, >= n, 2d)``), when given, is reused for the features
    instead of a fresh allocation per run.

    Returns:
        ``[f+, f-]`` and, when ``with_log``,
        ``xs`` with ``|xs|`` clamped (the divisor of the derivative) and
        ``log|xs|``.
    """
    ax = xs.abs().clamp_min_(torch.finfo(xs.dtype).tiny)
    la = ax.log()
    t = (la * p).exp_().copysign_(xs)
    # written straight into the halves of one buffer
    d = xs.shape[-1]
    f = _feature_buffer(xs, buf)
    pos = torch.clamp_min(t, 0, out=f[..., :d])
    torch.sub(pos, t, out=f[..., d:])
    if with_log:
        return f, ax.copysign_(xs), la
    return f, None, None


def _feature_buffer(xc: Tensor, buf: Optional[Tensor]) -> Tensor:
    """Where the features ``(..., n, 2d)`` of a run ``xc`` ``(..., n, d)``
    go: the front of ``buf`` (see :func:`_scratch`) or a new tensor."""
    if buf is None:
        return xc.new_empty(xc.shape[:-1] + (2 * xc.shape[-1], ))
    return buf[:, :, :xc.shape[-2]]


def _scratch(x: Tensor, step: int) -> Optional[Tensor]:
    """A feature buffer ``(B, h, step, 2d)`` reused by every run of a
    walk over tokens (None when there is one run)."""
    B, h, N, d = x.shape
    if step >= N:
        return None
    return x.new_empty(B, h, step, 2 * d)


_NONE = torch.empty(0)  # "no tensor" for the fused loops' optional inputs
_ROWS = 64  # tokens per block of the fused loops' partial sums (kRows)


def _loop_key_bias(c: slice, prm: _Params, key: bool) -> Tensor:
    """Key bias of tokens ``c`` for the CPU loops (empty: none)."""
    return prm.kb_s[:, :, c] if key and prm.kb_s is not None else _NONE


def _loop_features(x: Tensor, c: slice, prm: _Params, key: bool,
                   buf: Optional[Tensor],
                   with_sum: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
    """:func:`_features` of tokens ``c`` of ``x`` (keys: with the key bias)
    in one pass of the CPU loops; with ``with_sum`` also their sum over
    the tokens ``(B, h, 2d)``."""
    B, h, _, d = x.shape
    xc = x[:, :, c]
    n = xc.shape[-2]
    f = _feature_buffer(xc, buf)
    fsum = xc.new_empty(B, h, -(-n // _ROWS), 2 * d) if with_sum else _NONE
    prm.ext.features(xc, prm.inv_hd, prm.p_hd, _loop_key_bias(c, prm, key),
                     f, fsum)
    return f, (fsum.sum(2) if with_sum else None)


def _loop_feature_grads(df: Tensor, x: Tensor, c: slice, prm: _Params,
                        key: bool, buf: Optional[Tensor],
                        dx_out: Optional[Tensor]
                        ) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`_features` and :func:`_power_grads` of tokens ``c`` of ``x``
    in one pass of the CPU loops. Returns the features, ``dL/dx`` and the
    sums of ``[g, g log|xs|]`` over ``B`` and the tokens ``(1, h, 1, 2d)``.
    """
    xc = x[:, :, c]
    B, h, n, d = xc.shape
    f = _feature_buffer(xc, buf)
    dx = _token_major(xc) if dx_out is None else dx_out
    w = xc.new_empty(B, h, -(-n // _ROWS), 2 * d)
    prm.ext.power_grads(df, xc, prm.inv_hd, prm.p_hd,
                        _loop_key_bias(c, prm, key), dx, w, f)
    return f, dx, w.sum(dim=(0, 2), keepdim=True)


def _run_features(x: Tensor, c: slice, prm: _Params, key: bool,
                  buf: Optional[Tensor], loops: bool, with_log: bool = False,
                  with_sum: bool = False):
    """``[f+, f-]`` of tokens ``c`` of ``x`` (keys: with the key bias), by
    the CPU loops or by :func:`_features`.

    Returns:
        the features ``(B, h, n, 2d)``, their sum over the tokens
        ``(B, h, 2d)`` when ``with_sum``, and, by the torch ops with
        ``with_log``, ``(xs, log|xs|)`` for :func:`_power_grads` (None for
        the CPU loops, whose backward pass recomputes them).
    """
    if loops:
        f, fsum = _loop_features(x, c, prm, key, buf, with_sum)
        return f, fsum, None
    xs = _scaled_keys(x, c, prm) if key else x[:, :, c] * prm.inv_s
    f, xsafe, la = _features(xs, prm.p, with_log, buf)
    return f, (f.sum(-2) if with_sum else None), (xsafe, la)


def _key_product(k: Tensor, v: Tensor, prm: _Params, step: int) -> Tensor:
    """``[f+, f-]^T [v, 1]`` of the keys, summed over tokens:
    ``(B, h, 2d, d + 1)``."""
    N = k.shape[-2]
    r: Optional[Tensor] = None
    buf = _scratch(k, step)
    loops = prm.uses_cpu_loops(k)
    for c in _token_runs(N, step):
        f, fsum, _ = _run_features(k, c, prm, True, buf, loops,
                                   with_sum=True)
        rc = torch.cat([f.transpose(-2, -1) @ v[:, :, c],
                        fsum.unsqueeze(-1)], dim=-1)
        r = rc if r is None else r.add_(rc)
    assert r is not None
    return r


def _query_run(q: Tensor, S: Tensor, prm: _Params, eps: float, step: int,
               x: Optional[Tensor], rz: Optional[Tensor]):
    """Outputs of the queries ``q`` against the mix matrix ``S``, walking
    tokens by ``step``; into ``x`` and ``rz`` when given. Returns ``x`` and
    ``1 / z``."""
    d = q.shape[-1]
    half = d // 2
    buf = _scratch(q, step)
    loops = prm.uses_cpu_loops(q)
    for c in _token_runs(q.shape[-2], step):
        f, _, _ = _run_features(q, c, prm, False, buf, loops)
        u = f @ S  # (B, h, n_c, d + 2): [numerators, z_sim, z_opp]
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
    """:func:`_key_product` of all keys, run by run:
    ``(B, h, 2d, d + 1)``."""
    seq_runs, step = _plan(k)
    if len(seq_runs) == 1:
        return _key_product(k, v, prm, step)
    return torch.cat([_key_product(k[b], v[b], prm, step) for b in seq_runs])


def _queries(q: Tensor, S: Tensor, prm: _Params,
             eps: float) -> Tuple[Tensor, Tensor]:
    """:func:`_query_run` of all queries, run by run: ``x`` and
    ``1 / z``; fresh tensors for one run (GPUs, ``torch.compile``), else
    written into token-major outputs."""
    seq_runs, step = _plan(q)
    if len(seq_runs) == 1 and step >= q.shape[-2]:
        return _query_run(q, S, prm, eps, step, None, None)
    B, h, N, d = q.shape
    x = _token_major(q)
    rz = q.new_empty(B, h, N, 2)
    for b in seq_runs:
        _query_run(q[b], S[b], prm, eps, step, x[b], rz[b])
    return x, rz


def _forward(q: Tensor, k: Tensor, v: Tensor, prm: _Params, eps: float):
    """Both flows: ``x``, the mix matrix ``S`` ``(B, h, 2d, d + 2)`` and
    ``1 / z`` ``(B, h, N, 2)``."""
    S = _mix_matrix(_key_state(k, v, prm), float(k.shape[-2]))
    x, rz = _queries(q, S, prm, eps)
    return x, S, rz


def _power_grads(df: Tensor, f: Tensor, xsafe: Tensor, la: Tensor,
                 pinv: Tensor,
                 dx_out: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """Chain rule through ``f+ = relu(xs)^p``, ``f- = relu(-xs)^p``,
    ``xs = x / s``.

    With ``g = df+ f+ + df- f-``: ``dL/dxs = p g / xs`` (``f'(xs) = p f /
    xs`` for both features), ``dL/dp`` per element is ``g log|xs|`` and
    ``sum(dL/dxs * xs) = p sum(g)``. Writes ``dL/dx`` into ``dx_out`` when
    given.

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
    if dx_out is None:
        return g.div_(xsafe), w
    return torch.div(g, xsafe, out=dx_out), w


def _run_feature_grads(df: Tensor, x: Tensor, c: slice, prm: _Params,
                       key: bool, buf: Optional[Tensor], loops: bool,
                       pinv: Tensor, dx_out: Optional[Tensor]
                       ) -> Tuple[Tensor, Tensor, Tensor]:
    """Backward through the features of tokens ``c`` of ``x`` (keys: with
    the key bias), given ``df = dL/d[f+, f-]``: the CPU loops in one pass,
    or :func:`_features` and :func:`_power_grads`.

    Returns:
        the features ``(B, h, n, 2d)`` (which the caller's products need),
        ``dL/dx`` (into ``dx_out`` when given) and the sums of
        ``[g, g log|xs|]`` over ``B`` and the tokens, ``(1, h, 1, 2d)``.
    """
    if loops:
        return _loop_feature_grads(df, x, c, prm, key, buf, dx_out)
    f, _, aux = _run_features(x, c, prm, key, buf, False, with_log=True)
    assert aux is not None
    dx, w = _power_grads(df, f, aux[0], aux[1], pinv, dx_out)
    return f, dx, w.sum(dim=(0, 2), keepdim=True)


def _backward_run(dx: Tensor, q: Tensor, k: Tensor, v: Tensor, S: Tensor,
                  rz: Tensor, x: Tensor, n: float, prm: _Params, need_v: bool,
                  step: int, out: Optional[Tuple[Tensor, Tensor,
                                                 Optional[Tensor]]]):
    """Gradients on whole sequences, walking tokens by ``step``.

    Returns:
        ``dq``, ``dk``, ``dv`` (None unless ``need_v``) ``(B, h, N, d)``,
        written into ``out`` when given, and ``w`` ``(1, h, 1, 2d)``: the
        sums over ``B`` and ``N`` of ``[g, g log|xs|]`` (see
        :func:`_power_grads`) for the parameter gradients.
    """
    B, h, N, d = q.shape
    half = d // 2
    runs = _token_runs(N, step)
    pinv = prm.p * prm.inv_s
    w: Optional[Tensor] = None
    dS: Optional[Tensor] = None
    dq = dk = dv = None
    if out is not None:
        dq, dk, dv = out

    def acc(total: Optional[Tensor], part: Tensor) -> Tensor:
        return part if total is None else total.add_(part)

    # queries: u = [f+, f-] @ S = [num, z]; x = num / z per half. The
    # normaliser columns of du are stored with the opposite sign (fewer
    # operations per token); S and dS are flipped to match.
    S_flip = torch.cat([S[..., :d], -S[..., d:]], -1)
    S_t = S_flip.transpose(-2, -1)  # (B, h, d + 2, 2d)
    buf = _scratch(q, step)
    loops = prm.uses_cpu_loops(q)
    for c in runs:
        rz_c = rz[:, :, c]
        dx_c = dx[:, :, c]
        du = q.new_empty(B, h, c.stop - c.start, d + 2)
        if loops and dx_c.stride(-1) == 1:
            prm.ext.query_du(dx_c, x[:, :, c], rz_c, du)
        else:
            dxh = dx_c.unflatten(-1, (2, half))
            dz = (dx_c * x[:, :, c]).unflatten(-1, (2, half)).sum(-1)
            torch.mul(dxh, rz_c.unsqueeze(-1),
                      out=du[..., :d].unflatten(-1, (2, half)))
            torch.mul(dz, rz_c, out=du[..., d:])
        dq_out = None if dq is None else dq[:, :, c]
        f, dq_c, w_c = _run_feature_grads(du @ S_t, q, c, prm, False, buf,
                                          loops, pinv, dq_out)
        dS = acc(dS, f.transpose(-2, -1) @ du)
        if dq is None:
            dq = dq_c
        w = acc(w, w_c)
    assert dS is not None
    dS = torch.cat([dS[..., :d], -dS[..., d:]], -1)

    # keys and values: S = mix(R), R = [f+, f-]^T [v, 1]
    dR = _mix_matrix_grad(dS, n)
    dR_v = dR[..., :d]  # (B, h, 2d, d)
    dR_vt = dR_v.transpose(-2, -1)  # (B, h, d, 2d)
    dR_1 = dR[..., d:].transpose(-2, -1)  # (B, h, 1, 2d)
    for c in runs:
        df = (v[:, :, c] @ dR_vt).add_(dR_1)
        dk_out = None if out is None else dk[:, :, c]
        f, dk_c, w_c = _run_feature_grads(df, k, c, prm, True, buf, loops,
                                          pinv, dk_out)
        if need_v:
            if dv is None:
                dv = f @ dR_v
            else:
                dv[:, :, c] = f @ dR_v
        if out is None:
            dk = dk_c
        w = acc(w, w_c)
    return dq, dk, dv, w


def _compute_dtype(q: Tensor, scale: Tensor) -> torch.dtype:
    """The kernel's dtype: ``q``'s promoted with the parameters' (fp16/bf16
    inputs with float32 parameters compute in float32)."""
    return torch.promote_types(q.dtype, scale.dtype)


class PolarityAttentionFunction(torch.autograd.Function):
    """Polarity attention with feature maps recomputed in backward.

    Saves ``q``, ``k``, ``v`` as given (fp16/bf16 inputs stay fp16/bf16:
    upcast again in backward), the parameters, the key bias, the output,
    its normalisers ``1 / z`` (``(B, h, N, 2)``) and the small mix matrix,
    but none of the ``(B, h, N, 2d)`` feature maps, which backward
    recomputes elementwise (no matrix product is recomputed). See
    :func:`polarity_attention_kernel` for the arguments.
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
        seq_runs, step = _plan(q)
        if len(seq_runs) == 1 and step >= q.shape[-2]:
            dq, dk, dv, w = _backward_run(dx, q, k, v, S, rz, x, n, prm,
                                          need_v, step, None)
        else:
            dq = _token_major(q)
            dk = _token_major(k)
            dv = _token_major(v) if need_v else None
            w = None
            for b in seq_runs:
                _, _, _, wb = _backward_run(
                    dx[b], q[b], k[b], v[b], S[b], rz[b], x[b], n, prm,
                    need_v, step,
                    (dq[b], dk[b], None if dv is None else dv[b]))
                w = wb if w is None else w.add_(wb)
        assert w is not None and dk is not None
        d = q.shape[-1]
        g1_sum, dp = w[..., :d], w[..., d:]
        dscale = dpower = dbias = None
        if ctx.needs_input_grad[3]:
            # sum(dL/dxs * xs) = p sum(g1); xs = x / s, s = softplus(scale)
            sig_s = torch.sigmoid(scale)
            dscale = _sum_to(g1_sum * prm.p * (-prm.inv_s) * sig_s,
                             scale.shape)
        if ctx.needs_input_grad[4]:
            sig_p = torch.sigmoid(power)
            dpower = _sum_to(dp * alpha * sig_p * (1 - sig_p), power.shape)
        if ctx.needs_input_grad[7]:
            dbias = _sum_to(dk, k_bias.shape)
        dq, dk = dq.to(in_dtypes[0]), dk.to(in_dtypes[1])
        dv = None if dv is None else dv.to(in_dtypes[2])
        return dq, dk, dv, dscale, dpower, None, None, dbias


def polarity_key_state(k: Tensor, v: Tensor, scale: Tensor, power: Tensor,
                       alpha: float, k_bias: Optional[Tensor] = None
                       ) -> Tensor:
    """Inference: what a run of keys contributes to the attention.

    For callers that stream the keys of long sequences in runs (the sums of
    several runs add up) and then the queries in runs with
    :func:`polarity_query_apply`, so that no full-size intermediate is ever
    held. No autograd.

    Args:
        k, v: ``(B, h, n, d)`` keys and values of a run of tokens.
        scale, power, alpha: as in :func:`polarity_attention_kernel`.
        k_bias: optional ``(1, h, n, d)`` positional table of these tokens.

    Returns:
        ``(B, h, 2d, d + 1)``: ``[f+(k), f-(k)]^T [v, 1]``.
    """
    return _key_state(k, v, _Params(scale, power, alpha, k_bias))


def polarity_query_apply(q: Tensor, state: Tensor, n: float, scale: Tensor,
                         power: Tensor, alpha: float,
                         eps: float = _EPS) -> Tensor:
    """Inference: outputs of a run of queries given the keys' summed
    :func:`polarity_key_state` of ``n`` keys (no autograd).

    Returns:
        ``(B, h, n_q, d)`` like :func:`polarity_attention_kernel`.
    """
    prm = _Params(scale, power, alpha, None)
    return _queries(q, _mix_matrix(state, n), prm, eps)[0]


def polarity_attention_kernel(q: Tensor,
                              k: Tensor,
                              v: Tensor,
                              scale: Tensor,
                              power: Tensor,
                              alpha: float,
                              eps: float = _EPS,
                              k_bias: Optional[Tensor] = None) -> Tensor:
    """Polarity-aware linear attention (the published formula), fast.

    Computes :func:`polarity_attention_pytorch` (see there for the formula
    and the arguments) with the rearrangements of this module's docstring.

    ``q``, ``k``, ``v`` may be in a lower precision than the parameters
    (fp16/bf16 under autocast, float32 ``scale``): the kernel computes in
    the promoted dtype and keeps the inputs as given for backward (no
    float32 copies saved).

    Returns:
        ``(B, h, N, d)`` in the dtype of ``q`` promoted with ``scale``'s,
        laid out ``(B, N, h, d)`` in memory on the CPU path.
    """
    if torch.is_grad_enabled() and any(
            t is not None and t.requires_grad
            for t in (q, k, v, scale, power, k_bias)):
        return PolarityAttentionFunction.apply(q, k, v, scale, power, alpha,
                                               eps, k_bias)
    dt = _compute_dtype(q, scale)
    return _forward(q.to(dt), k.to(dt), v.to(dt),
                    _Params(scale, power, alpha, k_bias), eps)[0]


def polarity_attention_pytorch(q: Tensor,
                               k: Tensor,
                               v: Tensor,
                               scale: Tensor,
                               power: Tensor,
                               alpha: float,
                               eps: float = _EPS,
                               k_bias: Optional[Tensor] = None,
                               channels_first: bool = False) -> Tensor:
    """Polarity-aware linear attention (the published formula) in plain
    PyTorch operations: the reference of :func:`polarity_attention_kernel`,
    and what runs with the fast paths off and in captured graphs (export).

    With ``h`` heads of width ``d`` (even), ``s = softplus(scale)``,
    ``p = 1 + alpha * sigmoid(power)``, ``f+(t) = relu(t)^p``,
    ``f-(t) = relu(-t)^p``, ``k <- k + k_bias`` (when given),
    ``q_sim = [f+(q/s), f-(q/s)]``, ``q_opp = [f-(q/s), f+(q/s)]``,
    ``k' = [f+(k/s), f-(k/s)]`` and ``v = [v1, v2]`` split per head::

        x_sim = q_sim (k'^T v1 / n) / (q_sim . mean(k') + eps)
        x_opp = q_opp (k'^T v2 / n) / (q_opp . mean(k') + eps)
        out   = [x_sim, x_opp]

    written in its cheap algebraic form, which touches each query and key
    only with ``abs``, the power (as ``exp(p log|t|)``), a sign mask, one
    product and one difference (elementwise), and two matrix products:

    - ``|t / s|^p = c |t|^p`` with the per-channel ``c = (1 / s)^p``, so
      ``c`` scales rows of the small matrices below instead of every token;
    - ``f+`` and ``f-`` have disjoint supports: both are selected from one
      ``a = |t|^p`` by the sign of ``t`` (``a * [t > 0]`` and its
      complement ``a - a * [t > 0]``, each exactly ``a`` or 0);
    - the opposite-signed flow uses the same key products with the roles of
      ``f+(q)`` and ``f-(q)`` swapped, so both flows and both normalisers
      are two products of the query features with small ``(d, d + 2)``
      matrices::

        [num_sim, num_opp, z_sim, z_opp] = f+(q) [P1, Q2, kp, kn]
                                         + f-(q) [Q1, P2, kn, kp]

    with ``P = f+(k)^T v``, ``Q = f-(k)^T v`` (halves 1, 2 of the value
    channels), ``kp``, ``kn`` the sums of ``f+(k)``, ``f-(k)`` over keys,
    and ``z + eps n`` dividing its flow's half of the channels.
    No feature map is concatenated; every operation exports to ONNX opset
    11. (The paper's form, with the concatenated features, is kept in the
    tests as the arbiter.)

    The computation runs channel-major (``(B, h, d, N)``: channels by
    tokens), the layout in which a projection ``W x^T`` delivers q, k, v:
    with ``channels_first`` the inputs and the result are in that layout,
    and an exported graph needs no transposes of token maps (ONNX Runtime
    runs Pola-Swin-T about 8% faster than with token-major heads;
    docs/deployment.md); without it they are token-major ``(B, h, N, d)``
    and only views are transposed.

    Args:
        q: ``(B, h, N, d)`` queries (``(B, h, d, N)`` with
            ``channels_first``).
        k: ``(B, h, n, d)`` keys (``n`` may differ from ``N``).
        v: ``(B, h, n, d)`` values.
        scale: raw ``scale`` broadcastable to ``(1, h, 1, d)`` (in either
            layout).
        power: raw ``power``, ``(1, h, 1, d)`` (in either layout).
        alpha: exponent range; ``p`` lies in ``(1, 1 + alpha)``.
        eps: added to the normalisers (of the means over keys).
        k_bias: optional tensor broadcastable to ``k`` (in its layout),
            added to the keys (a positional table).
        channels_first: q, k, v, k_bias and the result are ``(B, h, d,
            N)``.

    Returns:
        ``(B, h, N, d)`` (``(B, h, d, N)`` with ``channels_first``).
    """
    if k_bias is not None:
        k = k + k_bias
    if not channels_first:  # views
        q, k, v = q.transpose(-2, -1), k.transpose(-2, -1), v.transpose(-2, -1)
    p = 1 + alpha * torch.sigmoid(power)
    c = ((1 / F.softplus(scale)).expand_as(p) ** p).transpose(-2, -1)
    p = p.transpose(-2, -1)  # (1, h, d, 1): per channel, over the tokens
    n = k.shape[-1]
    d = q.shape[-2]
    half = d // 2

    qp, qn = _signed_powers(q, p)  # f+(q) / c, f-(q) / c; (B, h, d, N)
    kp, kn = _signed_powers(k, p)
    vt = v.transpose(-2, -1)  # (B, h, n, d), a view
    P = c * (kp @ vt)  # f+(k)^T v, (B, h, d, d); c scales the rows
    Q = c * (kn @ vt)  # f-(k)^T v
    sp = c * kp.sum(-1, keepdim=True)  # (B, h, d, 1)
    sn = c * kn.sum(-1, keepdim=True)
    m_pos = torch.cat([P[..., :half], Q[..., half:], sp, sn], -1)
    m_neg = torch.cat([Q[..., :half], P[..., half:], sn, sp], -1)
    # (B, h, d + 2, N): the flows' numerators, then their normalisers
    u = ((c * m_pos).transpose(-2, -1) @ qp
         + (c * m_neg).transpose(-2, -1) @ qn)
    z = u[:, :, d:] + eps * n  # n (mean + eps) = sum + eps n
    B, h, N = u.shape[0], u.shape[1], u.shape[-1]
    y = (u[:, :, :d].reshape(B, h, 2, half, N) / z.unsqueeze(-2)).reshape(
        B, h, d, N)
    return y if channels_first else y.transpose(-2, -1)


def _signed_powers(t: Tensor, p: Tensor,
                   tiny: float = _FLOAT32_TINY) -> Tuple[Tensor, Tensor]:
    """``relu(t)^p`` and ``relu(-t)^p`` from one ``|t|^p``.

    ``|t|^p`` is ``exp(p log|t|)`` with ``|t|`` clamped to ``tiny``
    (float32's smallest normal number), as in the kernel: the same values
    (the clamp changes no ``|t| >= 1.2e-38``; at ``t = 0`` the power
    underflows to at most that number) and finite gradients everywhere
    (zero at ``t = 0``, as ``|t|^p``'s for ``p > 1``). In ONNX Runtime
    ``Log``, ``Mul``, ``Exp`` take about half the time of ``Pow`` with a
    per-channel exponent.
    """
    a = torch.exp(p * torch.log(t.abs().clamp_min(tiny)))
    pos = a * (t > 0).to(a.dtype)  # exactly a or 0, so a - pos is too
    return pos, a - pos
