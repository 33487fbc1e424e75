"""Polarity-aware linear attention as fused Triton kernels.

The feature maps ``f+(t) = relu(t)^p`` and ``f-(t) = relu(-t)^p`` of the
scaled queries and keys (``t = x / softplus(scale)``, ``x = k + k_bias``
for the keys) are computed in float32 registers inside the products and
never written to memory. Four kernels, each reading every token map once:

- **key pass** (:func:`_key_pass`): grid ``(B h, chunks)``; each program
  walks its chunk of keys and accumulates ``[f+(k), f-(k)]^T v`` (two
  ``d x d`` products, ``tl.dot`` in float32) and the key sums of ``f+``
  and ``f-``. The chunks' partial sums meet in float32 atomic additions
  (or, deterministic, one slot per chunk summed by torch:
  :func:`~pola_mm.ops.launch.reduce_atomically`); the chunks split the
  tokens so that the grid fills the GPU (a product per image and head
  alone would run a few programs over 67200 tokens).
- **query pass** (:func:`_query_pass`): grid ``(B h, blocks of N)``; each
  program takes a tile of queries, multiplies its features with the small
  mix matrices (both flows at once: ``num = f+(q) A+ + f-(q) A-``, see
  :func:`mix_matrices`), divides by the two normalisers and writes ``x``
  (in the queries' dtype) and ``1 / z`` (float32, for the backward).
- **query backward** and **key backward** (:func:`_query_grad`,
  :func:`_key_grad`): the features recomputed in registers; ``dq``,
  ``dk``, ``dv`` written once; the small matrices' gradients and the
  parameters' gradients (``scale``, ``power``: their softplus and sigmoid
  are taken in the kernels too) accumulated per program and added as
  the key pass's.

With ``P = f+(k)^T v``, ``Q = f-(k)^T v`` (halves ``1``, ``2`` of the value
channels), ``kp``, ``kn`` the key sums of ``f+``, ``f-`` and ``n`` keys,
both flows of PolaFormer are::

    num = f+(q) [P1, Q2] / n + f-(q) [Q1, P2] / n        # (N, d)
    z_sim = (f+(q) kp + f-(q) kn) / n,   z_opp = (f+(q) kn + f-(q) kp) / n
    x = [num_1 / (z_sim + eps), num_2 / (z_opp + eps)]

Half-precision inputs (autocast) stay half precision in memory: the
kernels load them, compute in float32 registers and write ``x``, ``dq``,
``dk``, ``dv`` in the inputs' dtypes; only the ``d x d`` matrices, ``1 / z``
``(B, h, N, 2)`` and the per-program partial sums are float32.

Each launch is a torch custom op with a fake implementation
(:mod:`~pola_mm.ops.custom_ops`), and :class:`PolarityTritonFunction`
gives them their autograd. Without
Triton this module imports and :data:`HAVE_TRITON` is False. Under
``TRITON_INTERPRET=1`` (set before this module is imported) the kernels
run on CPU tensors: that is how the tests prove them equal to the formula.
"""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..custom_ops import register_kernel
from ..dispatch import records_grad
from ..features import EPS, sum_to
from ..launch import (WIDTHS, LaunchConfig, config_key, guarded, launch_config,
                      on_device, partial_sums, probe_inputs, recomputed_grads,
                      reduce_atomically, split_tokens, sum_slots)
from .cpu import polarity_attention_cpu

try:
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the installation
    triton = tl = None
    HAVE_TRITON = False

__all__ = ['HAVE_TRITON', 'fits', 'polarity_attention_triton',
           'polarity_forward', 'polarity_backward']

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _config(kernel: str, d: int) -> LaunchConfig:
    """The launch configuration of this op's ``kernel`` at head width ``d``
    (:func:`~pola_mm.ops.launch.launch_config`)."""
    return launch_config('polarity', kernel, d)


def fits(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether the kernels take these inputs: 4-D float32/fp16/bf16 heads
    whose width ``d`` is one of :data:`~pola_mm.ops.launch.WIDTHS` (16, 32,
    64: the widths whose every launch is compiled and resource-checked).
    (Whether Triton runs here is
    :func:`~pola_mm.ops.dispatch.implementation`'s question.)"""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return False
    d = q.shape[-1]
    return (d in WIDTHS and k.shape[-1] == d
            and v.shape[-1] == d
            and all(t.dtype in _DTYPES for t in (q, k, v)))


def _strides(t: Tensor) -> Tuple[int, int, int, int]:
    """Strides of a ``(B, h, L, d)`` tensor (0 where it is broadcast)."""
    return tuple(t.stride())  # type: ignore[return-value]


def _token_major(B: int, h: int, N: int, d: int, like: Tensor,
                 dtype: Optional[torch.dtype] = None) -> Tensor:
    """A new ``(B, h, N, d)`` tensor laid out ``(B, N, h, d)`` in memory:
    the models merge the heads back into ``(B, N, h d)`` without a copy."""
    return like.new_empty(B, N, h, d,
                          dtype=dtype or like.dtype).transpose(1, 2)


if HAVE_TRITON:
    from ..launch import add_partial, slot_row

    @triton.jit
    def _params(S, PW, hh, cols, ss_h, ss_d, sp_h, sp_d, alpha):
        """The per-channel constants of head ``hh`` from the raw
        parameters: ``1 / softplus(scale)``, ``p = 1 + alpha
        sigmoid(power)``, ``sigmoid(scale)`` and ``sigmoid(power)``."""
        s = tl.load(S + hh * ss_h + cols * ss_d).to(tl.float32)
        pw = tl.load(PW + hh * sp_h + cols * sp_d).to(tl.float32)
        # softplus(s) = max(s, 0) + log1p(exp(-|s|)); log1p(e) written as
        # log(u) - ((u - 1) - e) / u with u = 1 + e (exact to rounding)
        e = tl.exp(-tl.abs(s))
        u = 1.0 + e
        softplus = tl.maximum(s, 0.0) + tl.log(u) - ((u - 1.0) - e) / u
        sig_s = 1.0 / (1.0 + tl.exp(-s))
        sig_p = 1.0 / (1.0 + tl.exp(-pw))
        return 1.0 / softplus, 1.0 + alpha * sig_p, sig_s, sig_p

    @triton.jit
    def _features(x, inv_s, p):
        """``f+``, ``f-`` of ``t = x inv_s`` (float32 tiles), with ``t``
        clamped away from 0 keeping its sign (the derivatives' divisor) and
        ``log|t|``. ``|t|`` is clamped to float32's smallest normal number
        inside the logarithm; the features of ``t = 0`` are 0 by their sign
        masks."""
        t = x * inv_s[None, :]
        at = tl.maximum(tl.abs(t), 1.1754943508222875e-38)
        la = tl.log(at)
        a = tl.exp(p[None, :] * la)
        fp = tl.where(t > 0, a, 0.0)
        fn = tl.where(t < 0, a, 0.0)
        ts = tl.where(t < 0, -at, at)
        return fp, fn, ts, la

    @triton.jit
    def _tile_ptrs(base, b, hh, rows, cols, s_b, s_h, s_n, s_d):
        """Pointers to the ``(len(rows), len(cols))`` tile of image ``b``,
        head ``hh`` of a ``(B, h, L, d)`` map with strides ``s_*``, in
        int64 (the maps of a batch may pass 2^31 elements)."""
        return (base + b * s_b + hh * s_h + rows.to(tl.int64)[:, None] * s_n
                + cols.to(tl.int64)[None, :] * s_d)

    @triton.jit
    def _load_keys(K, KB, b, hh, rows, mask, cols, sk_b, sk_h, sk_n, sk_d,
                   sb_b, sb_h, sb_n, sb_d, HAS_BIAS: tl.constexpr):
        """A float32 tile of keys (plus the key bias) of one image and
        head."""
        k = tl.load(_tile_ptrs(K, b, hh, rows, cols, sk_b, sk_h,
                    sk_n, sk_d), mask=mask[:, None],
                    other=0.0).to(tl.float32)
        if HAS_BIAS:
            k += tl.load(_tile_ptrs(KB, b, hh, rows, cols, sb_b, sb_h,
                         sb_n, sb_d), mask=mask[:, None],
                         other=0.0).to(tl.float32)
        return k

    @triton.jit
    def _key_pass(K, V, KB, S, PW, ss_h, ss_d, sp_h, sp_d, alpha,
                  PART, H, n, span,
                  sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d,
                  sb_b, sb_h, sb_n, sb_d,
                  HAS_BIAS: tl.constexpr, D: tl.constexpr,
                  BLOCK: tl.constexpr, ATOMIC: tl.constexpr,
                  DOT: tl.constexpr):
        """Partial ``[f+, f-]^T v`` and key sums of one chunk of ``span``
        keys, into the row ``PART[bh, slot]``
        (:func:`~pola_mm.ops.launch.slot_row`): ``P``, ``Q`` (``D x D``
        each), ``kp``, ``kn`` (``D`` each)."""
        pid = tl.program_id(0)  # int32 division, then int64 offsets
        bh = pid.to(tl.int64)
        c = tl.program_id(1)
        chunks = tl.num_programs(1)
        b = (pid // H).to(tl.int64)
        hh = (pid % H).to(tl.int64)
        cols = tl.arange(0, D)
        inv_s, p, sig_s, sig_p = _params(S, PW, hh, cols, ss_h, ss_d, sp_h,
                                         sp_d, alpha)
        acc_p = tl.zeros((D, D), dtype=tl.float32)
        acc_n = tl.zeros((D, D), dtype=tl.float32)
        sum_p = tl.zeros((D, ), dtype=tl.float32)
        sum_n = tl.zeros((D, ), dtype=tl.float32)
        start = c * span
        end = tl.minimum(start + span, n)
        for s in range(start, end, BLOCK):
            rows = s + tl.arange(0, BLOCK)
            mask = rows < end
            k = _load_keys(K, KB, b, hh, rows, mask, cols, sk_b, sk_h, sk_n,
                           sk_d, sb_b, sb_h, sb_n, sb_d, HAS_BIAS)
            v = tl.load(_tile_ptrs(V, b, hh, rows, cols, sv_b, sv_h,
                        sv_n, sv_d), mask=mask[:, None],
                        other=0.0).to(tl.float32)
            fp, fn, _, _ = _features(k, inv_s, p)
            acc_p += tl.dot(tl.trans(fp), v, input_precision=DOT)
            acc_n += tl.dot(tl.trans(fn), v, input_precision=DOT)
            sum_p += tl.sum(fp, 0)
            sum_n += tl.sum(fn, 0)
        row = slot_row(PART, bh, c, chunks, 2 * D * D + 2 * D, ATOMIC)
        mat = cols[:, None] * D + cols[None, :]
        add_partial(row + mat, acc_p, None, ATOMIC)
        add_partial(row + D * D + mat, acc_n, None, ATOMIC)
        add_partial(row + 2 * D * D + cols, sum_p, None, ATOMIC)
        add_partial(row + 2 * D * D + D + cols, sum_n, None, ATOMIC)

    @triton.jit
    def _load_mix(R, bh, cols, inv_n, D: tl.constexpr):
        """The mix matrices and key means from the summed key row ``R[bh]``
        (``P``, ``Q``, ``kp``, ``kn``): ``A+ = [P1, Q2] / n`` (rows for
        ``f+(q)``), ``A- = [Q1, P2] / n`` (rows for ``f-(q)``), ``kp / n``,
        ``kn / n``."""
        row = R + bh * (2 * D * D + 2 * D)
        mat = cols[:, None] * D + cols[None, :]
        P = tl.load(row + mat)
        Q = tl.load(row + D * D + mat)
        first = cols[None, :] < D // 2
        a_pos = tl.where(first, P, Q) * inv_n
        a_neg = tl.where(first, Q, P) * inv_n
        kp = tl.load(row + 2 * D * D + cols) * inv_n
        kn = tl.load(row + 2 * D * D + D + cols) * inv_n
        return a_pos, a_neg, kp, kn

    @triton.jit
    def _query_pass(Q, R, S, PW, ss_h, ss_d, sp_h, sp_d, alpha,
                    X, RZ, H, N, inv_n,
                    eps,
                    sq_b, sq_h, sq_n, sq_d, sx_b, sx_h, sx_n, sx_d,
                    D: tl.constexpr, BLOCK: tl.constexpr,
                    DOT: tl.constexpr):
        """``x`` and ``1 / z`` of one tile of queries."""
        pid = tl.program_id(0)  # int32 division, then int64 offsets
        bh = pid.to(tl.int64)
        b = (pid // H).to(tl.int64)
        hh = (pid % H).to(tl.int64)
        cols = tl.arange(0, D)
        rows = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = rows < N
        inv_s, p, sig_s, sig_p = _params(S, PW, hh, cols, ss_h, ss_d, sp_h,
                                         sp_d, alpha)
        q = tl.load(_tile_ptrs(Q, b, hh, rows, cols, sq_b, sq_h,
                    sq_n, sq_d), mask=mask[:, None],
                    other=0.0).to(tl.float32)
        fp, fn, _, _ = _features(q, inv_s, p)
        a_pos, a_neg, kp, kn = _load_mix(R, bh, cols, inv_n, D)
        num = tl.dot(fp, a_pos, input_precision=DOT)
        num += tl.dot(fn, a_neg, input_precision=DOT)
        rz_sim = 1.0 / (tl.sum(fp * kp[None, :] + fn * kn[None, :], 1) + eps)
        rz_opp = 1.0 / (tl.sum(fp * kn[None, :] + fn * kp[None, :], 1) + eps)
        first = cols[None, :] < D // 2
        x = num * tl.where(first, rz_sim[:, None], rz_opp[:, None])
        tl.store(_tile_ptrs(X, b, hh, rows, cols, sx_b, sx_h,
                 sx_n, sx_d), x.to(X.dtype.element_ty),
                 mask=mask[:, None])
        tl.store(RZ + bh * N * 2 + rows * 2, rz_sim, mask=mask)
        tl.store(RZ + bh * N * 2 + rows * 2 + 1, rz_opp, mask=mask)

    @triton.jit
    def _query_grad(Q, DX, RZ, R, S, PW, ss_h, ss_d, sp_h, sp_d, alpha,
                    DQ, PART, H, N,
                    inv_n, span,
                    sq_b, sq_h, sq_n, sq_d, sg_b, sg_h, sg_n, sg_d,
                    so_b, so_h, so_n, so_d,
                    D: tl.constexpr, BLOCK: tl.constexpr,
                    ATOMIC: tl.constexpr, DOT: tl.constexpr):
        """``dq`` of one chunk of ``span`` queries, and its partial sums
        into the row ``PART[bh, slot]``
        (:func:`~pola_mm.ops.launch.slot_row`): ``dA+``, ``dA-`` (``D x
        D``), the key means' gradients ``dkp``, ``dkn`` and the queries'
        part of the gradients of ``scale`` and ``power``
        (:func:`polarity_backward`), ``D`` each. The
        output ``x`` is recomputed from the features (two small products)
        rather than read back: exact in float32 whatever its stored dtype,
        and never saved."""
        pid = tl.program_id(0)  # int32 division, then int64 offsets
        bh = pid.to(tl.int64)
        c = tl.program_id(1)
        chunks = tl.num_programs(1)
        b = (pid // H).to(tl.int64)
        hh = (pid % H).to(tl.int64)
        cols = tl.arange(0, D)
        first = cols[None, :] < D // 2
        inv_s, p, sig_s, sig_p = _params(S, PW, hh, cols, ss_h, ss_d, sp_h,
                                         sp_d, alpha)
        a_pos, a_neg, kp, kn = _load_mix(R, bh, cols, inv_n, D)
        da_pos = tl.zeros((D, D), dtype=tl.float32)
        da_neg = tl.zeros((D, D), dtype=tl.float32)
        dkp = tl.zeros((D, ), dtype=tl.float32)
        dkn = tl.zeros((D, ), dtype=tl.float32)
        w_g = tl.zeros((D, ), dtype=tl.float32)
        w_l = tl.zeros((D, ), dtype=tl.float32)
        start = c * span
        end = tl.minimum(start + span, N)
        for s in range(start, end, BLOCK):
            rows = s + tl.arange(0, BLOCK)
            mask = rows < end
            m2 = mask[:, None]
            q = tl.load(_tile_ptrs(Q, b, hh, rows, cols, sq_b, sq_h,
                        sq_n, sq_d), mask=m2,
                        other=0.0).to(tl.float32)
            dx = tl.load(_tile_ptrs(DX, b, hh, rows, cols, sg_b, sg_h,
                         sg_n, sg_d), mask=m2,
                         other=0.0).to(tl.float32)
            rz_sim = tl.load(RZ + bh * N * 2 + rows * 2, mask=mask, other=0.0)
            rz_opp = tl.load(RZ + bh * N * 2 + rows * 2 + 1, mask=mask,
                             other=0.0)
            fp, fn, ts, la = _features(q, inv_s, p)
            # x = num / z per half: d(num) and d(z) of both flows
            rz = tl.where(first, rz_sim[:, None], rz_opp[:, None])
            num = tl.dot(fp, a_pos, input_precision=DOT)
            num += tl.dot(fn, a_neg, input_precision=DOT)
            dnum = dx * rz
            dxx = dnum * num  # dx * x
            dz_sim = -tl.sum(tl.where(first, dxx, 0.0), 1) * rz_sim
            dz_opp = -tl.sum(tl.where(first, 0.0, dxx), 1) * rz_opp
            # through num = f+ A+ + f- A- and the normalisers
            dfp = tl.dot(dnum, tl.trans(a_pos), input_precision=DOT)
            dfp += (dz_sim[:, None] * kp[None, :] +
                    dz_opp[:, None] * kn[None, :])
            dfn = tl.dot(dnum, tl.trans(a_neg), input_precision=DOT)
            dfn += (dz_sim[:, None] * kn[None, :] +
                    dz_opp[:, None] * kp[None, :])
            da_pos += tl.dot(tl.trans(fp), dnum, input_precision=DOT)
            da_neg += tl.dot(tl.trans(fn), dnum, input_precision=DOT)
            dkp += tl.sum(fp * dz_sim[:, None] + fn * dz_opp[:, None], 0)
            dkn += tl.sum(fn * dz_sim[:, None] + fp * dz_opp[:, None], 0)
            # through f = |t|^p: df/dt = p f / t, df/dp = f log|t|
            g = dfp * fp + dfn * fn
            w_g += tl.sum(g, 0)
            w_l += tl.sum(g * la, 0)
            dq = p[None, :] * g / ts * inv_s[None, :]
            tl.store(_tile_ptrs(DQ, b, hh, rows, cols, so_b, so_h,
                     so_n, so_d), dq.to(DQ.dtype.element_ty),
                     mask=m2)
        row = slot_row(PART, bh, c, chunks, 2 * D * D + 4 * D, ATOMIC)
        mat = cols[:, None] * D + cols[None, :]
        add_partial(row + mat, da_pos, None, ATOMIC)
        add_partial(row + D * D + mat, da_neg, None, ATOMIC)
        add_partial(row + 2 * D * D + cols, dkp, None, ATOMIC)
        add_partial(row + 2 * D * D + D + cols, dkn, None, ATOMIC)
        # the parameters' gradients (see polarity_backward)
        add_partial(row + 2 * D * D + 2 * D + cols,
                    w_g * -p * inv_s * sig_s, None, ATOMIC)
        add_partial(row + 2 * D * D + 3 * D + cols,
                    w_l * alpha * sig_p * (1.0 - sig_p), None, ATOMIC)

    @triton.jit
    def _key_grad(K, V, KB, G, S, PW, ss_h, ss_d, sp_h, sp_d, alpha,
                  DK, DV, W, H, n,
                  inv_n, span,
                  sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d,
                  sb_b, sb_h, sb_n, sb_d, so_b, so_h, so_n, so_d,
                  sw_b, sw_h, sw_n, sw_d,
                  HAS_BIAS: tl.constexpr, NEED_V: tl.constexpr,
                  D: tl.constexpr, BLOCK: tl.constexpr,
                  ATOMIC: tl.constexpr, DOT: tl.constexpr):
        """``dk`` (and ``dv``) of one chunk of ``span`` keys from the summed
        query-gradient row ``G[bh]`` (:func:`_query_grad`'s); the keys'
        part of the gradients of ``scale`` and ``power`` into ``W[bh,
        slot]`` ``(2, D)`` (:func:`~pola_mm.ops.launch.slot_row`; the
        first chunk adds the queries')."""
        pid = tl.program_id(0)  # int32 division, then int64 offsets
        bh = pid.to(tl.int64)
        c = tl.program_id(1)
        chunks = tl.num_programs(1)
        b = (pid // H).to(tl.int64)
        hh = (pid % H).to(tl.int64)
        cols = tl.arange(0, D)
        inv_s, p, sig_s, sig_p = _params(S, PW, hh, cols, ss_h, ss_d, sp_h,
                                         sp_d, alpha)
        # adjoint of the mix: dP = [dA+_1, dA-_2] / n, dQ = [dA-_1, dA+_2] / n
        first = cols[None, :] < D // 2
        row = G + bh * (2 * D * D + 4 * D)
        mat = cols[:, None] * D + cols[None, :]
        da_pos = tl.load(row + mat)
        da_neg = tl.load(row + D * D + mat)
        dP = tl.where(first, da_pos, da_neg) * inv_n
        dQ = tl.where(first, da_neg, da_pos) * inv_n
        dkp = tl.load(row + 2 * D * D + cols) * inv_n
        dkn = tl.load(row + 2 * D * D + D + cols) * inv_n
        w_g = tl.zeros((D, ), dtype=tl.float32)
        w_l = tl.zeros((D, ), dtype=tl.float32)
        start = c * span
        end = tl.minimum(start + span, n)
        for s in range(start, end, BLOCK):
            rows = s + tl.arange(0, BLOCK)
            mask = rows < end
            m2 = mask[:, None]
            k = _load_keys(K, KB, b, hh, rows, mask, cols, sk_b, sk_h, sk_n,
                           sk_d, sb_b, sb_h, sb_n, sb_d, HAS_BIAS)
            v = tl.load(_tile_ptrs(V, b, hh, rows, cols, sv_b, sv_h,
                        sv_n, sv_d), mask=m2,
                        other=0.0).to(tl.float32)
            fp, fn, ts, la = _features(k, inv_s, p)
            # P = f+^T v, Q = f-^T v, kp = sum f+, kn = sum f-
            dfp = tl.dot(v, tl.trans(dP), input_precision=DOT)
            dfp += dkp[None, :]
            dfn = tl.dot(v, tl.trans(dQ), input_precision=DOT)
            dfn += dkn[None, :]
            if NEED_V:
                dv = tl.dot(fp, dP, input_precision=DOT)
                dv += tl.dot(fn, dQ, input_precision=DOT)
                tl.store(_tile_ptrs(DV, b, hh, rows, cols, sw_b, sw_h,
                         sw_n, sw_d), dv.to(DV.dtype.element_ty),
                         mask=m2)
            g = dfp * fp + dfn * fn
            w_g += tl.sum(g, 0)
            w_l += tl.sum(g * la, 0)
            dk = p[None, :] * g / ts * inv_s[None, :]
            tl.store(_tile_ptrs(DK, b, hh, rows, cols, so_b, so_h,
                     so_n, so_d), dk.to(DK.dtype.element_ty),
                     mask=m2)
        # the parameters' gradients (see polarity_backward); the first chunk
        # adds the queries' (summed in G)
        dscale = w_g * -p * inv_s * sig_s
        dpower = w_l * alpha * sig_p * (1.0 - sig_p)
        if c == 0:
            dscale += tl.load(row + 2 * D * D + 2 * D + cols)
            dpower += tl.load(row + 2 * D * D + 3 * D + cols)
        out = slot_row(W, bh, c, chunks, 2 * D, ATOMIC)
        add_partial(out + cols, dscale, None, ATOMIC)
        add_partial(out + D + cols, dpower, None, ATOMIC)


def _bias_args(k_bias: Optional[Tensor], k: Tensor):
    """The key bias broadcast to ``k``'s shape (strides 0 where it is
    broadcast) and its strides; ``k`` itself as a dummy without bias."""
    if k_bias is None:
        return k, (0, 0, 0, 0)
    kb = k_bias.expand(k.shape)
    return kb, _strides(kb)


def _span(n: int, chunks: int, block: int) -> int:
    """Tokens per chunk: a multiple of the block, ``chunks`` of them
    covering ``n``."""
    return math.ceil(math.ceil(n / chunks) / block) * block


def key_row(d: int) -> int:
    """Length of a key pass's row: ``P``, ``Q``, ``kp``, ``kn``."""
    return 2 * d * d + 2 * d


def grad_row(d: int) -> int:
    """Length of a query-gradient row: ``dA+``, ``dA-``, ``dkp``,
    ``dkn``, and the sums of ``g`` and ``g log|t|``."""
    return 2 * d * d + 4 * d


# --- the kernels as torch custom ops (..custom_ops), one per launch; the
# sums between them stay plain torch operations


def _param_args(scale: Tensor, power: Tensor, h: int, d: int) -> tuple:
    """The raw parameters and their head and channel strides (0 where
    they are broadcast), as the kernels read them."""
    scale = scale.expand(1, h, 1, d)
    power = power.expand(1, h, 1, d)
    return (scale, power, scale.stride(1), scale.stride(3), power.stride(1),
            power.stride(3))


def key_pass(k: Tensor, v: Tensor, k_bias: Optional[Tensor], scale: Tensor,
             power: Tensor, alpha: float, chunks: int, block: int,
             atomic: bool) -> Tensor:
    """The key pass: ``(B h, slots, key_row(d))`` float32 partial rows
    (:func:`~pola_mm.ops.launch.partial_sums`)."""
    B, h, n, d = k.shape
    part = _key_pass_fake(k, v, k_bias, scale, power, alpha, chunks, block,
                          atomic)
    kb, sb = _bias_args(k_bias, k)
    with on_device(k):
        _key_pass[(B * h, chunks)](
            k, v, kb, *_param_args(scale, power, h, d), alpha, part, h, n,
            _span(n, chunks, block), *_strides(k), *_strides(v), *sb,
            HAS_BIAS=k_bias is not None, D=d, BLOCK=block, ATOMIC=atomic,
            **_config('key_pass', d).options())
    return part


def _key_pass_fake(k, v, k_bias, scale, power, alpha, chunks, block,
                   atomic):
    B, h, _, d = k.shape
    return partial_sums(B * h, chunks, (key_row(d), ), k.device, atomic)


def query_pass(q: Tensor, R: Tensor, scale: Tensor, power: Tensor,
               alpha: float, n: int, eps: float,
               block: int) -> Tuple[Tensor, Tensor]:
    """The query pass: ``x`` ``(B, h, N, d)`` in ``q``'s dtype (laid out
    ``(B, N, h, d)``) and ``1 / z`` ``(B, h, N, 2)`` float32, from the
    summed key rows ``R`` ``(B h, key_row(d))``."""
    B, h, N, d = q.shape
    x, rz = _query_pass_fake(q, R, scale, power, alpha, n, eps, block)
    with on_device(q):
        _query_pass[(B * h, triton.cdiv(N, block))](
            q, R, *_param_args(scale, power, h, d), alpha, x, rz, h, N,
            1.0 / n, eps, *_strides(q), *_strides(x), D=d, BLOCK=block,
            **_config('query_pass', d).options())
    return x, rz


def _query_pass_fake(q, R, scale, power, alpha, n, eps, block):
    B, h, N, d = q.shape
    return (_token_major(B, h, N, d, q),
            q.new_empty(B, h, N, 2, dtype=torch.float32))


def query_grad(q: Tensor, dx: Tensor, rz: Tensor, R: Tensor, scale: Tensor,
               power: Tensor, alpha: float, n: int, chunks: int,
               block: int, atomic: bool) -> Tuple[Tensor, Tensor]:
    """The queries' backward: ``dq`` and ``(B h, slots, grad_row(d))``
    float32 partial rows."""
    B, h, N, d = q.shape
    dq, part = _query_grad_fake(q, dx, rz, R, scale, power, alpha, n, chunks,
                                block, atomic)
    with on_device(q):
        _query_grad[(B * h, chunks)](
            q, dx, rz, R, *_param_args(scale, power, h, d), alpha, dq, part,
            h, N, 1.0 / n, _span(N, chunks, block), *_strides(q),
            *_strides(dx), *_strides(dq), D=d, BLOCK=block, ATOMIC=atomic,
            **_config('query_grad', d).options())
    return dq, part


def _query_grad_fake(q, dx, rz, R, scale, power, alpha, n, chunks, block,
                     atomic):
    B, h, N, d = q.shape
    return (_token_major(B, h, N, d, q),
            partial_sums(B * h, chunks, (grad_row(d), ), q.device, atomic))


def key_grad(k: Tensor, v: Tensor, k_bias: Optional[Tensor], G: Tensor,
             scale: Tensor, power: Tensor, alpha: float, chunks: int,
             block: int, need_v: bool,
             atomic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """The keys' backward from the summed query-gradient rows ``G`` ``(B
    h, grad_row(d))``: ``dk``, ``dv`` (empty unless ``need_v``) and ``(B
    h, slots, 2, d)`` float32 partial gradients of ``scale`` and
    ``power`` (the queries' included)."""
    B, h, n, d = k.shape
    dk, dv, w = _key_grad_fake(k, v, k_bias, G, scale, power, alpha, chunks,
                               block, need_v, atomic)
    kb, sb = _bias_args(k_bias, k)
    dv_arg = dv if need_v else dk
    with on_device(k):
        _key_grad[(B * h, chunks)](
            k, v, kb, G, *_param_args(scale, power, h, d), alpha, dk, dv_arg,
            w, h, n, 1.0 / n, _span(n, chunks, block), *_strides(k),
            *_strides(v), *sb, *_strides(dk), *_strides(dv_arg),
            HAS_BIAS=k_bias is not None, NEED_V=need_v, D=d, BLOCK=block,
            ATOMIC=atomic, **_config('key_grad', d).options())
    return dk, dv, w


def _key_grad_fake(k, v, k_bias, G, scale, power, alpha, chunks, block,
                   need_v, atomic):
    B, h, n, d = k.shape
    dv = (_token_major(B, h, n, d, v) if need_v else v.new_empty(0))
    return (_token_major(B, h, n, d, k), dv,
            partial_sums(B * h, chunks, (2, d), k.device, atomic))


key_pass = register_kernel('polarity_key_pass', key_pass, _key_pass_fake)
query_pass = register_kernel('polarity_query_pass', query_pass,
                             _query_pass_fake)
query_grad = register_kernel('polarity_query_grad', query_grad,
                             _query_grad_fake)
key_grad = register_kernel('polarity_key_grad', key_grad, _key_grad_fake)


def polarity_forward(q: Tensor, k: Tensor, v: Tensor, scale: Tensor,
                     power: Tensor, alpha: float,
                     k_bias: Optional[Tensor] = None, eps: float = EPS, *,
                     block_n: Optional[int] = None,
                     chunks: Optional[int] = None,
                     atomic: Optional[bool] = None
                     ) -> Tuple[Tensor, Tensor, Tensor]:
    """The forward kernels: key pass, sum of its chunks, query pass.

    Args:
        q: ``(B, h, N, d)`` queries, any strides, float32/fp16/bf16.
        k, v: ``(B, h, n, d)`` keys and values, any strides.
        scale, power: the raw parameters, broadcastable to ``(1, h, 1,
            d)``; alpha: the exponent range (as for
            :func:`~.graph.polarity_attention_pytorch`).
        k_bias: optional, broadcastable to ``k``.
        eps: added to the normalisers (of the key means).
        block_n: tokens per tile (default: the launch rule's,
            :func:`~pola_mm.ops.launch.launch_config`).
        chunks: programs per image and head of the key pass (default
            :func:`~pola_mm.ops.launch.split_tokens`).
        atomic: add the chunks' partial sums atomically (default:
            :func:`~pola_mm.ops.launch.reduce_atomically`).

    Returns:
        ``x`` ``(B, h, N, d)`` in ``q``'s dtype (laid out ``(B, N, h,
        d)``), ``1 / z`` ``(B, h, N, 2)`` and the key rows ``R`` ``(B h,
        key_row(d))`` (``P``, ``Q``, ``kp``, ``kn`` summed over keys),
        float32.
    """
    B, h, N, d = q.shape
    n = k.shape[2]
    kb_block = block_n or _config('key_pass', d).block
    chunks, _ = split_tokens(n, kb_block, B * h, q.device, chunks)
    atomic = reduce_atomically() if atomic is None else atomic
    R = sum_slots(key_pass(k, v, k_bias, scale, power, alpha, chunks,
                           kb_block, atomic))
    x, rz = query_pass(q, R, scale, power, alpha, n, eps,
                       block_n or _config('query_pass', d).block)
    return x, rz, R


def polarity_backward(dx: Tensor, q: Tensor, k: Tensor, v: Tensor,
                      scale: Tensor, power: Tensor, alpha: float,
                      k_bias: Optional[Tensor], rz: Tensor, R: Tensor, *,
                      need_v: bool = True, block_n: Optional[int] = None,
                      chunks: Optional[int] = None,
                      atomic: Optional[bool] = None
                      ) -> Tuple[Tensor, Tensor, Optional[Tensor], Tensor,
                                 Tensor]:
    """The backward kernels: queries, sum of their chunks, keys.

    Args:
        dx: ``(B, h, N, d)`` gradient of the output, any strides.
        q, k, v, scale, power, alpha, k_bias: as for
            :func:`polarity_forward`.
        rz, R: what :func:`polarity_forward` returned (beside ``x``).
        need_v: compute ``dv``.
        block_n, chunks, atomic: as for :func:`polarity_forward`
            (``chunks`` for both passes).

    Returns:
        ``dq``, ``dk``, ``dv`` (None unless ``need_v``) in their inputs'
        dtypes, and the gradients of ``scale`` and ``power`` per head and
        channel, ``(h, d)`` float32 each (summed over images and tokens).
        With ``t = x / s``, ``s = softplus(scale)``, ``f = |t|^p`` and ``g
        = df+ f+ + df- f-`` per element: ``dL/d(1/s) = sum(dL/dt x) = p
        sum(g) s`` and ``d(1/s)/dscale = -sigmoid(scale) / s^2``, so
        ``dL/dscale = -p sum(g) sigmoid(scale) / s``; ``dL/dp = sum(g
        log|t|)`` and ``dp/dpower = alpha sigmoid'(power)``.
    """
    B, h, N, d = q.shape
    n = k.shape[2]
    bh = B * h
    qb = block_n or _config('query_grad', d).block
    kb = block_n or _config('key_grad', d).block
    cq, _ = split_tokens(N, qb, bh, q.device, chunks)
    ck, _ = split_tokens(n, kb, bh, q.device, chunks)
    atomic = reduce_atomically() if atomic is None else atomic
    dq, part = query_grad(q, dx, rz, R, scale, power, alpha, n, cq, qb,
                          atomic)
    G = sum_slots(part)
    dk, dv, w = key_grad(k, v, k_bias, G, scale, power, alpha, ck, kb,
                         need_v, atomic)
    dparams = w.view(B, h, -1, 2, d).sum((0, 2))
    return dq, dk, dv if need_v else None, dparams[:, 0], dparams[:, 1]


class PolarityTritonFunction(torch.autograd.Function):
    """The kernels with their backward: saves ``q``, ``k``, ``v`` as
    given (half precision stays half), the parameters, the key bias,
    ``1 / z`` and the key rows; no feature map, and not the output (the
    backward recomputes it in registers)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, scale: Tensor,
                power: Tensor, alpha: float, eps: float,
                k_bias: Optional[Tensor]) -> Tensor:
        x, rz, R = polarity_forward(q, k, v, scale, power, alpha, k_bias, eps)
        ctx.save_for_backward(q, k, v, scale, power, k_bias, rz, R)
        ctx.alpha = alpha
        return x

    @staticmethod
    def backward(ctx, dx: Tensor):
        q, k, v, scale, power, k_bias, rz, R = ctx.saved_tensors
        need = ctx.needs_input_grad

        def by_torch():
            inputs = (q, k, v, scale, power, ctx.alpha, None, k_bias)
            return recomputed_grads(_torch_form, inputs, need, dx)

        return guarded(config(q, k_bias),
                       lambda: _kernel_grads(ctx, dx, need), by_torch)


def _torch_form(q, k, v, scale, power, alpha, eps, k_bias):
    """The torch implementation with the Function's arguments (the
    fallback of a configuration whose kernels failed)."""
    return polarity_attention_cpu(q, k, v, scale, power, alpha,
                                  k_bias=k_bias)


def _kernel_grads(ctx, dx: Tensor, need: Tuple[bool, ...]) -> tuple:
    """:class:`PolarityTritonFunction`'s gradients by the kernels."""
    q, k, v, scale, power, k_bias, rz, R = ctx.saved_tensors
    h, d = q.shape[1], q.shape[3]
    dq, dk, dv, ds, dp = polarity_backward(dx, q, k, v, scale, power,
                                           ctx.alpha, k_bias, rz, R,
                                           need_v=need[2])
    dscale = dpower = dbias = None
    if need[3]:
        dscale = sum_to(ds.view(1, h, 1, d), scale.shape).to(scale.dtype)
    if need[4]:
        dpower = sum_to(dp.view(1, h, 1, d), power.shape).to(power.dtype)
    if need[7]:
        dbias = sum_to(dk, k_bias.shape).to(k_bias.dtype)
    return dq, dk, dv, dscale, dpower, None, None, dbias


def probe(key: tuple) -> None:
    """Forward and backward of the kernels once, on small inputs of the
    configuration ``key`` (:func:`config`'s) on its device: a failure of
    the configuration there raises (:func:`~pola_mm.ops.launch.usable`)."""
    q, k, v, flags = probe_inputs(key)
    d, device = q.shape[-1], q.device
    params = [torch.zeros(1, 2, 1, d, device=device, requires_grad=True)
              for _ in range(2)]
    kb = torch.zeros_like(k) if flags.get('k_bias') else None
    out = polarity_attention_triton(q, k, v, *params, 4.0, k_bias=kb)
    out.float().sum().backward()


def config(q: Tensor, k_bias: Optional[Tensor]) -> tuple:
    """The kernel configuration of these inputs, as a failure is
    remembered (:func:`~pola_mm.ops.launch.guarded`)."""
    return config_key('polarity', q, k_bias=k_bias is not None)


def polarity_attention_triton(q: Tensor, k: Tensor, v: Tensor,
                              scale: Tensor, power: Tensor, alpha: float,
                              eps: float = EPS,
                              k_bias: Optional[Tensor] = None) -> Tensor:
    """Polarity-aware linear attention by the fused kernels (the formula
    and the arguments: :func:`~.graph.polarity_attention_pytorch`).

    ``q``, ``k``, ``v`` stay in their dtypes in memory (fp16/bf16 under
    autocast); the kernels compute in float32 registers.

    Returns:
        ``(B, h, N, d)`` in ``q``'s dtype, laid out ``(B, N, h, d)``.
    """
    if records_grad(q, k, v, scale, power, k_bias):
        return PolarityTritonFunction.apply(q, k, v, scale, power, alpha,
                                            eps, k_bias)
    return polarity_forward(q, k, v, scale, power, alpha, k_bias, eps)[0]
