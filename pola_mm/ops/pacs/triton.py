"""Fused Triton kernels of the PaCS polarity attention (PolaFormer++).

The formula is :func:`~.naive.pacs_attention_pytorch`'s;
these kernels compute it with every ``(N, 2d)`` feature map in registers,
recomputed where the backward needs it, never written to memory. Per
image and head, with ``t1``, ``t2`` the temperatures (sigmoids) and the
polar halves ``pos = relu(x)``, ``neg = relu(-x)``:

- features, ``2d`` wide, kept as two ``d``-wide halves ``a`` (channels
  ``0..d-1``) and ``b`` (``d..2d-1``):
  same-signed ``q_sim = [e^(pos t1a) - 1, e^(neg t1b) - 1]``,
  opposite-signed ``q_opp = [e^(neg t2a) - 1, e^(pos t2b) - 1]``,
  keys ``k' = [e^pos - 1, e^neg - 1]``;
- ``k_mean = sum_n k' / n`` ``(2d)``, ``M = R(k')^T v / N`` ``(2d, d)`` (as
  the reference: divided by the number of queries ``N``);
- ``z_j = q_j . k_mean``, ``x_j = R(q_j) M_j / (z_j + eps)`` with ``M_sim``
  the first ``d / 2`` columns of ``M``, ``M_opp`` the last; out ``[x_sim,
  x_opp]``.

``R`` is the rotary encoding :func:`~pola_mm.ops.rotary.theta_shift` when
the tables ``sin``, ``cos`` ``(N, 2d)`` are given (else the identity):
``R(f)[c] = f[c] cos[c] + sgn(c) f[c^1] sin[c]`` with ``sgn(c) = -1`` on
even, ``+1`` on odd channels (``rotate_every_two``), and its adjoint
``R^T(y)[c] = y[c] cos[c] - sgn(c) y[c^1] sin[c^1]``. The partner values
``f[c^1]`` are the tile's own channel pairs exchanged in registers
(:func:`_swap_pairs`, a reshape; ``d`` is even, so the partner stays in its
half): nothing is loaded twice.

Four kernels, launched by :func:`pacs_forward` and :func:`pacs_backward`:

- forward, key pass (grid ``(B h, chunks)``): partial sums of ``R(k')^T v``
  and ``k'`` over chunks of keys, summed in torch (deterministic);
- forward, query pass (grid ``(B h, blocks of queries)``): ``x`` and
  ``1 / (z + eps)``;
- backward, query pass (grid ``(B h, chunks, 2)``, one program per flow):
  ``dq`` and partial sums of ``dM``, ``dk_mean`` and the temperatures'
  gradients;
- backward, key pass (grid ``(B h, blocks of keys)``): ``dk`` and ``dv``.

Every product is a ``tl.dot`` in IEEE float32, on inputs of any float
dtype and strides. The half-width products of a flow (``d / 2`` columns,
8 for ``d = 16``, below ``tl.dot``'s 16) run on ``W = max(d / 2, 16)``
columns with the extra ones masked to zero. :func:`fits` says which
inputs the kernels take (``d`` of 16, 32 or 64); the op
falls back on the torch implementations for others.

Each launch is a torch custom op with a fake implementation
(:mod:`~pola_mm.ops.custom_ops`: ``meta`` and fake CUDA tensors see the
GPU's path), and :class:`PaCSTritonFunction` gives them their autograd.

Half precision: the backward reads the output ``x`` (for ``dz = -sum(dx
x) / (z + eps)``) only when it is float32 and otherwise recomputes it in
float32, since a rounded ``x`` would show in the temperatures' float32
gradients. Under Triton's CPU interpreter, whose float32 -> bfloat16 cast
truncates, bfloat16 outputs are written in float32 and rounded by torch.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..custom_ops import register_kernel
from ..dispatch import records_grad
from ..features import EPS, sum_to
from ..launch import (WIDTHS, LaunchConfig, config_key, guarded, launch_config,
                      on_device, probe_inputs, recomputed_grads, split_tokens)
from .cpu import pacs_attention_cpu
from .naive import pacs_attention_pytorch

try:
    import triton
    import triton.language as tl
except ImportError:  # the module imports anyway (no kernel defined)
    triton = None
    tl = None

__all__ = ['HAVE_TRITON', 'fits', 'pacs_attention_triton', 'pacs_forward',
           'pacs_backward']

#: Whether triton is importable (else no kernel is defined).
HAVE_TRITON = triton is not None

#: Input dtypes the kernels read (they compute in float32).
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


if HAVE_TRITON:

    @triton.jit
    def _tile(base, rows, cols, s_row, s_col, mask):
        """``base[rows, cols]`` ``(len(rows), len(cols))`` as float32, zero
        where ``mask`` (broadcast to the tile) is false."""
        ptrs = (base + rows.to(tl.int64)[:, None] * s_row +
                cols.to(tl.int64)[None, :] * s_col)
        return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)

    @triton.jit
    def _expm1(c):
        """The PaCS feature of a pre-activation: ``e^c - 1``."""
        return tl.exp(c) - 1.0

    @triton.jit
    def _pair_sign(cols):
        """``sgn(c)`` ``(len(cols))``: ``rotate_every_two(f)[c] = sgn(c)
        f[c ^ 1]``, -1 on even channels, +1 on odd ones."""
        return tl.where(cols % 2 == 0, -1.0, 1.0)

    @triton.jit
    def _swap_pairs(x):
        """``x[:, c ^ 1]`` of a ``(rows, D)`` tile: each channel pair's two
        values exchanged (a reshape, no memory access)."""
        even, odd = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))
        return tl.reshape(tl.join(odd, even), (x.shape[0], x.shape[1]))

    @triton.jit
    def _rot(f, sin, cos, sgn):
        """``R(f) = f cos + rotate_every_two(f) sin`` on a ``(BLOCK_N, D)``
        half: ``rotate_every_two(f)[c] = sgn(c) f[c ^ 1]``."""
        return f * cos + sgn[None, :] * _swap_pairs(f) * sin

    @triton.jit
    def _rot_t(y, sin, cos, sgn):
        """Adjoint of :func:`_rot`: ``R^T(y)[c] = y[c] cos[c] - sgn(c)
        y[c^1] sin[c^1]``."""
        return y * cos - sgn[None, :] * _swap_pairs(y * sin)

    @triton.jit
    def _halves(ptr, rows, cols, s_row, s_col, mask, D: tl.constexpr):
        """Both ``D``-wide halves ``(BLOCK_N, D)`` of a ``(N, 2D)`` table
        at channels ``cols`` and ``D + cols``."""
        return (_tile(ptr, rows, cols, s_row, s_col, mask),
                _tile(ptr, rows, D + cols, s_row, s_col, mask))

    @triton.jit
    def _temperatures(t_ptr, hh, cols, D: tl.constexpr):
        """Head ``hh``'s temperatures at channels ``cols`` of both halves,
        ``(1, D)`` each (``t`` is ``(h, 2D)`` float32, contiguous)."""
        base = t_ptr + hh * (2 * D)
        return (tl.load(base + cols)[None, :],
                tl.load(base + D + cols)[None, :])

    @triton.jit
    def _query_features(pos, neg, t1a, t1b, t2a, t2b):
        """The two flows' feature halves from the polar halves ``pos =
        relu(q)``, ``neg = relu(-q)``: same-signed ``[e^(pos t1a) - 1,
        e^(neg t1b) - 1]``, opposite-signed ``[e^(neg t2a) - 1, e^(pos t2b)
        - 1]``."""
        return (_expm1(pos * t1a), _expm1(neg * t1b),
                _expm1(neg * t2a), _expm1(pos * t2b))

    @triton.jit
    def _m_cols(m_base, m_rows, col0, wcols, wmask, D: tl.constexpr):
        """``(D, W)`` tile ``[l, w] = M[m_rows[l], col0 + w]`` of a
        row-major ``(2D, D)`` matrix, zero where ``wmask`` is false."""
        ptrs = m_base + m_rows[:, None] * D + (col0 + wcols)[None, :]
        return tl.load(ptrs, mask=wmask[None, :], other=0.0)

    @triton.jit
    def _fwd_keys_kernel(k_ptr, v_ptr, sin_ptr, cos_ptr, m_part_ptr,
                         ks_part_ptr, H, n, per_chunk,
                         s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
                         s_tn, s_tc,
                         D: tl.constexpr, BLOCK_N: tl.constexpr,
                         HAS_ROT: tl.constexpr,
                         DOT: tl.constexpr):
        """Forward, key pass: program ``(bh, chunk)`` sums over its chunk
        of ``per_chunk`` blocks of keys ``R(k')^T v`` (``(2D, D)``, written
        to ``m_part[bh, chunk]``) and ``k'`` (``(2D)``, to
        ``ks_part[bh, chunk]``)."""
        bh = tl.program_id(0)
        chunk = tl.program_id(1)
        b = (bh // H).to(tl.int64)
        hh = (bh % H).to(tl.int64)
        k_base = k_ptr + b * s_kb + hh * s_kh
        v_base = v_ptr + b * s_vb + hh * s_vh
        cols = tl.arange(0, D)
        sgn = _pair_sign(cols)
        m_a = tl.zeros((D, D), dtype=tl.float32)  # rows 0..D-1 of R(k')^T v
        m_b = tl.zeros((D, D), dtype=tl.float32)  # rows D..2D-1
        sum_a = tl.zeros((D, ), dtype=tl.float32)
        sum_b = tl.zeros((D, ), dtype=tl.float32)
        first = chunk * per_chunk
        last = tl.minimum(first + per_chunk, tl.cdiv(n, BLOCK_N))
        for blk in range(first, last):
            rows = blk * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = (rows < n)[:, None]  # keys past n: k = v = 0, k' = 0
            kk = _tile(k_base, rows, cols, s_kn, s_kd, mask)
            vv = _tile(v_base, rows, cols, s_vn, s_vd, mask)
            fa = _expm1(tl.maximum(kk, 0.0))  # e^relu(k) - 1
            fb = _expm1(tl.maximum(-kk, 0.0))  # e^relu(-k) - 1
            sum_a += tl.sum(fa, axis=0)
            sum_b += tl.sum(fb, axis=0)
            if HAS_ROT:  # R(k')
                sin_a, sin_b = _halves(sin_ptr, rows, cols, s_tn, s_tc,
                                       mask, D)
                cos_a, cos_b = _halves(cos_ptr, rows, cols, s_tn, s_tc,
                                       mask, D)
                fa = _rot(fa, sin_a, cos_a, sgn)
                fb = _rot(fb, sin_b, cos_b, sgn)
            m_a = tl.dot(tl.trans(fa), vv, m_a, input_precision=DOT)
            m_b = tl.dot(tl.trans(fb), vv, m_b, input_precision=DOT)
        out = bh.to(tl.int64) * tl.num_programs(1) + chunk
        m_base = m_part_ptr + out * (2 * D * D)
        tl.store(m_base + cols[:, None] * D + cols[None, :], m_a)
        tl.store(m_base + (D + cols)[:, None] * D + cols[None, :], m_b)
        ks_base = ks_part_ptr + out * (2 * D)
        tl.store(ks_base + cols, sum_a)
        tl.store(ks_base + D + cols, sum_b)

    @triton.jit
    def _fwd_queries_kernel(q_ptr, t1_ptr, t2_ptr, sin_ptr, cos_ptr, m_ptr,
                            km_ptr, x_ptr, rz_ptr, H, N, eps,
                            s_qb, s_qh, s_qn, s_qd, s_xb, s_xh, s_xn,
                            s_tn, s_tc,
                            D: tl.constexpr, HALF: tl.constexpr,
                            W: tl.constexpr, BLOCK_N: tl.constexpr,
                            HAS_ROT: tl.constexpr,
                            DOT: tl.constexpr):
        """Forward, query pass: program ``(bh, block)`` writes ``x``
        ``(BLOCK_N, D)`` (strides ``s_x*``: token-major, the dtype of
        ``x_ptr``) and ``1 / (z + eps)`` of both flows (``(B h, N, 2)``
        float32)."""
        bh = tl.program_id(0)
        b = (bh // H).to(tl.int64)
        hh = (bh % H).to(tl.int64)
        rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < N
        cols = tl.arange(0, D)
        q_base = q_ptr + b * s_qb + hh * s_qh
        q = _tile(q_base, rows, cols, s_qn, s_qd, rmask[:, None])
        t1a, t1b = _temperatures(t1_ptr, hh, cols, D)
        t2a, t2b = _temperatures(t2_ptr, hh, cols, D)
        sa, sb, oa, ob = _query_features(tl.maximum(q, 0.0),
                                         tl.maximum(-q, 0.0),
                                         t1a, t1b, t2a, t2b)
        # normalisers on the un-rotated features: z_j = q_j . k_mean
        km_base = km_ptr + bh.to(tl.int64) * (2 * D)
        km_a = tl.load(km_base + cols)[None, :]
        km_b = tl.load(km_base + D + cols)[None, :]
        rz_s = 1.0 / (tl.sum(sa * km_a + sb * km_b, axis=1) + eps)
        rz_o = 1.0 / (tl.sum(oa * km_a + ob * km_b, axis=1) + eps)
        if HAS_ROT:  # R(q_j)
            sgn = _pair_sign(cols)
            sin_a, sin_b = _halves(sin_ptr, rows, cols, s_tn, s_tc,
                                   rmask[:, None], D)
            cos_a, cos_b = _halves(cos_ptr, rows, cols, s_tn, s_tc,
                                   rmask[:, None], D)
            sa = _rot(sa, sin_a, cos_a, sgn)
            sb = _rot(sb, sin_b, cos_b, sgn)
            oa = _rot(oa, sin_a, cos_a, sgn)
            ob = _rot(ob, sin_b, cos_b, sgn)
        # x_j = R(q_j) M_j / (z_j + eps); M_sim = M[:, :HALF], M_opp =
        # M[:, HALF:], read W >= 16 columns wide (the extra ones zero)
        m_base = m_ptr + bh.to(tl.int64) * (2 * D * D)
        wcols = tl.arange(0, W)
        wmask = wcols < HALF
        x_s = tl.dot(sa, _m_cols(m_base, cols, 0, wcols, wmask, D),
                     input_precision=DOT)
        x_s = tl.dot(sb, _m_cols(m_base, D + cols, 0, wcols, wmask, D), x_s,
                     input_precision=DOT)
        x_o = tl.dot(oa, _m_cols(m_base, cols, HALF, wcols, wmask, D),
                     input_precision=DOT)
        x_o = tl.dot(ob, _m_cols(m_base, D + cols, HALF, wcols, wmask, D),
                     x_o, input_precision=DOT)
        x_base = x_ptr + b * s_xb + hh * s_xh  # token-major (B, N, h, D)
        x_ptrs = (x_base + rows.to(tl.int64)[:, None] * s_xn +
                  wcols[None, :])
        x_mask = rmask[:, None] & wmask[None, :]
        x_ty = x_ptr.dtype.element_ty
        tl.store(x_ptrs, (x_s * rz_s[:, None]).to(x_ty), mask=x_mask)
        tl.store(x_ptrs + HALF, (x_o * rz_o[:, None]).to(x_ty), mask=x_mask)
        rz_base = rz_ptr + bh.to(tl.int64) * N * 2
        tl.store(rz_base + rows * 2, rz_s, mask=rmask)
        tl.store(rz_base + rows * 2 + 1, rz_o, mask=rmask)

    @triton.jit
    def _flow_backward(dx_base, x_base, rows, rmask, wcols, wmask,
                       s_dn, s_dd, s_xn, s_xd, rz, fa, fb, ra, rb, m_base,
                       col0, cols, sgn, km_a, km_b, sin_a, sin_b, cos_a,
                       cos_b, D: tl.constexpr,
                       HAS_ROT: tl.constexpr, USE_X: tl.constexpr,
                       DOT: tl.constexpr):
        """One flow's backward through ``x_j = R(f) M_j rz`` with ``rz = 1
        / (f . k_mean + eps)``, for a block of queries whose feature halves
        are ``fa``, ``fb`` ``(BLOCK_N, D)`` (``ra``, ``rb`` rotary-encoded),
        with ``M_j`` the ``HALF`` columns of ``M`` from ``col0``. ``x_j`` is
        read from ``x`` with ``USE_X`` (a float32 ``x``), else recomputed
        in float32 (a half-precision ``x`` would round ``dz``).

        Returns ``da = dx_j rz`` ``(BLOCK_N, W)`` (zero past ``HALF``),
        ``dz = -sum(dx_j x_j) rz`` ``(BLOCK_N)`` and the gradients of the
        pre-activations ``c t`` of both halves, ``dpre = (R^T(da M_j^T) +
        dz k_mean) (f + 1)`` (``d(e^u - 1) = e^u du``), ``(BLOCK_N, D)``
        each."""
        mask = rmask[:, None] & wmask[None, :]
        ma = _m_cols(m_base, cols, col0, wcols, wmask, D)  # (D, W)
        mb = _m_cols(m_base, D + cols, col0, wcols, wmask, D)
        dxj = _tile(dx_base, rows, col0 + wcols, s_dn, s_dd, mask)
        if USE_X:
            xj = _tile(x_base, rows, col0 + wcols, s_xn, s_xd, mask)
        else:
            xj = tl.dot(ra, ma, input_precision=DOT)
            xj = tl.dot(rb, mb, xj, input_precision=DOT) * rz[:, None]
        da = dxj * rz[:, None]
        dz = -tl.sum(dxj * xj, axis=1) * rz
        # y = da M_j^T, the gradient of R(f), per half
        ya = tl.dot(da, tl.trans(ma), input_precision=DOT)
        yb = tl.dot(da, tl.trans(mb), input_precision=DOT)
        if HAS_ROT:  # R^T(y)
            ya = _rot_t(ya, sin_a, cos_a, sgn)
            yb = _rot_t(yb, sin_b, cos_b, sgn)
        dpre_a = (ya + dz[:, None] * km_a) * (fa + 1.0)
        dpre_b = (yb + dz[:, None] * km_b) * (fb + 1.0)
        return da, dz, dpre_a, dpre_b

    @triton.jit
    def _bwd_queries_kernel(dx_ptr, q_ptr, x_ptr, t_ptr, sin_ptr,
                            cos_ptr, m_ptr, km_ptr, rz_ptr, dq_ptr,
                            dm_part_ptr, dkm_part_ptr, dt_part_ptr,
                            H, N, per_chunk,
                            s_db, s_dh, s_dn, s_dd, s_qb, s_qh, s_qn, s_qd,
                            s_xb, s_xh, s_xn, s_xd, s_tn, s_tc,
                            D: tl.constexpr, HALF: tl.constexpr,
                            W: tl.constexpr, BLOCK_N: tl.constexpr,
                            HAS_ROT: tl.constexpr, USE_X: tl.constexpr,
                            DOT: tl.constexpr):
        """Backward, query pass: program ``(bh, chunk, flow)`` walks its
        chunk of ``per_chunk`` blocks of queries for one flow (0: the
        same-signed, 1: the opposite-signed; the flows share no state, so
        a program holds half of it). It adds its flow's part of ``dq`` to
        the float32 ``dq`` (zeros, contiguous ``(B h, N, D)``: two addends,
        an exact and order-free sum) and writes its partial sums: its
        columns of ``dM = [R(q_sim)^T da_sim, R(q_opp)^T da_opp]`` ``(2D,
        D)`` to ``dm_part[bh, chunk]``, ``q_j^T dz_j`` ``(2D)`` to
        ``dkm_part[bh, chunk, flow]``, the gradient of its temperatures
        ``(2D)`` to ``dt_part[bh, chunk, flow]``.

        With ``u = q`` (same-signed) or ``-q`` (opposite-signed) and the
        flow's temperatures ``t``, the feature halves are ``[e^(relu(u)
        t_a) - 1, e^(relu(-u) t_b) - 1]``."""
        bh = tl.program_id(0)
        chunk = tl.program_id(1)
        flow = tl.program_id(2)
        b = (bh // H).to(tl.int64)
        hh = (bh % H).to(tl.int64)
        bh64 = bh.to(tl.int64)
        sign = 1.0 - 2.0 * flow.to(tl.float32)  # u = sign q
        col0 = flow * HALF  # the flow's columns of M and x
        cols = tl.arange(0, D)
        sgn = _pair_sign(cols)
        wcols = tl.arange(0, W)
        wmask = wcols < HALF
        dx_base = dx_ptr + b * s_db + hh * s_dh
        q_base = q_ptr + b * s_qb + hh * s_qh
        x_base = x_ptr + b * s_xb + hh * s_xh
        m_base = m_ptr + bh64 * (2 * D * D)
        km_base = km_ptr + bh64 * (2 * D)
        km_a = tl.load(km_base + cols)[None, :]
        km_b = tl.load(km_base + D + cols)[None, :]
        rz_base = rz_ptr + bh64 * N * 2 + flow
        dq_base = dq_ptr + bh64 * N * D
        t_base = t_ptr + flow * (H * 2 * D)  # t: (2, H, 2D), t1 then t2
        ta, tb = _temperatures(t_base, hh, cols, D)
        dm_a = tl.zeros((D, W), dtype=tl.float32)  # rows 0..D-1 of dM
        dm_b = tl.zeros((D, W), dtype=tl.float32)  # rows D..2D-1
        dkm_a = tl.zeros((D, ), dtype=tl.float32)
        dkm_b = tl.zeros((D, ), dtype=tl.float32)
        dt_a = tl.zeros((D, ), dtype=tl.float32)
        dt_b = tl.zeros((D, ), dtype=tl.float32)
        first = chunk * per_chunk
        last = tl.minimum(first + per_chunk, tl.cdiv(N, BLOCK_N))
        for blk in range(first, last):
            rows = blk * BLOCK_N + tl.arange(0, BLOCK_N)
            rmask = rows < N  # queries past N: q = dx = 0, no contribution
            u = sign * _tile(q_base, rows, cols, s_qn, s_qd, rmask[:, None])
            ua = tl.maximum(u, 0.0)
            ub = tl.maximum(-u, 0.0)
            fa = _expm1(ua * ta)
            fb = _expm1(ub * tb)
            rz = tl.load(rz_base + rows * 2, mask=rmask, other=0.0)
            if HAS_ROT:  # R(f)
                sin_a, sin_b = _halves(sin_ptr, rows, cols, s_tn, s_tc,
                                       rmask[:, None], D)
                cos_a, cos_b = _halves(cos_ptr, rows, cols, s_tn, s_tc,
                                       rmask[:, None], D)
                ra = _rot(fa, sin_a, cos_a, sgn)
                rb = _rot(fb, sin_b, cos_b, sgn)
            else:  # (the tables unused)
                sin_a, sin_b, cos_a, cos_b = u, u, u, u
                ra, rb = fa, fb
            da, dz, dpa, dpb = _flow_backward(
                dx_base, x_base, rows, rmask, wcols, wmask, s_dn, s_dd,
                s_xn, s_xd, rz, fa, fb, ra, rb, m_base, col0, cols, sgn,
                km_a, km_b, sin_a, sin_b, cos_a, cos_b, D, HAS_ROT, USE_X,
                DOT)
            # temperatures: d(c t)/dt = c, the pre-temperature halves
            dt_a += tl.sum(dpa * ua, axis=0)
            dt_b += tl.sum(dpb * ub, axis=0)
            # dq: d(c t)/dc = t, on relu(u) and relu(-u), u = sign q
            du = tl.where(u > 0, dpa * ta, 0.0) - tl.where(u < 0, dpb * tb,
                                                            0.0)
            tl.atomic_add(dq_base + rows[:, None] * D + cols[None, :],
                          sign * du, mask=rmask[:, None], sem='relaxed')
            # normalisers: dk_mean = sum_j f_j^T dz_j (un-rotated)
            dkm_a += tl.sum(fa * dz[:, None], axis=0)
            dkm_b += tl.sum(fb * dz[:, None], axis=0)
            # products: dM_j = R(f_j)^T da_j
            dm_a = tl.dot(tl.trans(ra), da, dm_a, input_precision=DOT)
            dm_b = tl.dot(tl.trans(rb), da, dm_b, input_precision=DOT)
        out = bh64 * tl.num_programs(1) + chunk
        dm_mask = wmask[None, :]
        ptrs_a = (dm_part_ptr + out * (2 * D * D) + cols[:, None] * D +
                  col0 + wcols[None, :])
        tl.store(ptrs_a, dm_a, mask=dm_mask)
        tl.store(ptrs_a + D * D, dm_b, mask=dm_mask)
        part = out * 2 + flow
        dkm_base = dkm_part_ptr + part * (2 * D)
        tl.store(dkm_base + cols, dkm_a)
        tl.store(dkm_base + D + cols, dkm_b)
        dt_base = dt_part_ptr + part * (2 * D)
        tl.store(dt_base + cols, dt_a)
        tl.store(dt_base + D + cols, dt_b)

    @triton.jit
    def _bwd_keys_kernel(k_ptr, v_ptr, sin_ptr, cos_ptr, dm_ptr, dkm_ptr,
                         dk_ptr, dv_ptr, H, n,
                         s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
                         s_tn, s_tc,
                         D: tl.constexpr, BLOCK_N: tl.constexpr,
                         HAS_ROT: tl.constexpr, NEED_V: tl.constexpr,
                         DOT: tl.constexpr):
        """Backward, key pass: program ``(bh, block)`` writes ``dk`` (and
        ``dv`` with ``NEED_V``), contiguous ``(B h, n, D)`` in the dtypes
        of their pointers, from ``dM = dL/dM / N`` ``(B h, 2D, D)`` and
        ``dk_mean / n`` ``(B h, 2D)`` (float32, contiguous):
        ``dk' = R^T(v dM^T) + dk_mean``, ``dv = R(k') dM``."""
        bh = tl.program_id(0)
        b = (bh // H).to(tl.int64)
        hh = (bh % H).to(tl.int64)
        bh64 = bh.to(tl.int64)
        rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < n
        cols = tl.arange(0, D)
        k_base = k_ptr + b * s_kb + hh * s_kh
        v_base = v_ptr + b * s_vb + hh * s_vh
        kk = _tile(k_base, rows, cols, s_kn, s_kd, rmask[:, None])
        vv = _tile(v_base, rows, cols, s_vn, s_vd, rmask[:, None])
        fa = _expm1(tl.maximum(kk, 0.0))
        fb = _expm1(tl.maximum(-kk, 0.0))
        dm_base = dm_ptr + bh64 * (2 * D * D)
        # dR(k') = v dM^T per half: (D, D) tiles [j, l] = dM[l, j]
        ya = tl.dot(vv, tl.load(dm_base + cols[None, :] * D + cols[:, None]),
                    input_precision=DOT)
        yb = tl.dot(vv, tl.load(dm_base + (D + cols)[None, :] * D
                                + cols[:, None]), input_precision=DOT)
        ra = fa
        rb = fb
        if HAS_ROT:  # R^T(y), R(k')
            sgn = _pair_sign(cols)
            sin_a, sin_b = _halves(sin_ptr, rows, cols, s_tn, s_tc,
                                   rmask[:, None], D)
            cos_a, cos_b = _halves(cos_ptr, rows, cols, s_tn, s_tc,
                                   rmask[:, None], D)
            ya = _rot_t(ya, sin_a, cos_a, sgn)
            yb = _rot_t(yb, sin_b, cos_b, sgn)
            if NEED_V:
                ra = _rot(fa, sin_a, cos_a, sgn)
                rb = _rot(fb, sin_b, cos_b, sgn)
        dkm_base = dkm_ptr + bh64 * (2 * D)
        dkm_a = tl.load(dkm_base + cols)[None, :]
        dkm_b = tl.load(dkm_base + D + cols)[None, :]
        # dk' (f + 1) = d(pre-activation); dk = dpos [k > 0] - dneg [k < 0]
        dpa = (ya + dkm_a) * (fa + 1.0)
        dpb = (yb + dkm_b) * (fb + 1.0)
        dk = tl.where(kk > 0, dpa, 0.0) - tl.where(kk < 0, dpb, 0.0)
        offs = bh64 * n * D + rows[:, None] * D + cols[None, :]
        tl.store(dk_ptr + offs, dk.to(dk_ptr.dtype.element_ty),
                 mask=rmask[:, None])
        if NEED_V:  # dv = R(k') dM, per half of the rows of dM
            dv = tl.dot(ra, tl.load(dm_base + cols[:, None] * D
                                    + cols[None, :]), input_precision=DOT)
            dv = tl.dot(rb, tl.load(dm_base + (D + cols)[:, None] * D
                                    + cols[None, :]), dv,
                        input_precision=DOT)
            tl.store(dv_ptr + offs, dv.to(dv_ptr.dtype.element_ty),
                     mask=rmask[:, None])


def _interpreted() -> bool:
    """Whether the kernels run in Triton's interpreter (``TRITON_INTERPRET``
    set when this module was imported), which runs them on CPU tensors."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return False
    return isinstance(_fwd_keys_kernel, InterpretedFunction)


def _store_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels write an output of ``dtype`` in: float32 for
    bfloat16 under Triton's interpreter, whose float32 -> bfloat16 cast
    truncates (a GPU rounds to nearest even), torch rounding it after;
    else ``dtype`` itself."""
    if dtype == torch.bfloat16 and _interpreted():
        return torch.float32
    return dtype


def _is_table(t: Optional[Tensor], N: int, width: int) -> bool:
    """``t`` is a floating tensor broadcastable to ``(N, width)``."""
    if not isinstance(t, Tensor) or not t.is_floating_point():
        return False
    try:
        return torch.broadcast_shapes(t.shape, (N, width)) == (N, width)
    except RuntimeError:
        return False


def _config(kernel: str, d: int) -> LaunchConfig:
    """The launch configuration of this op's ``kernel`` at head width ``d``
    (:func:`~pola_mm.ops.launch.launch_config`)."""
    return launch_config('pacs', kernel, d)


def fits(q: Tensor, k: Tensor, v: Tensor, sin: Optional[Tensor] = None,
         cos: Optional[Tensor] = None) -> bool:
    """Whether the kernels take these inputs (else the op falls back on the
    torch implementations): ``q`` ``(B, h, N, d)``, ``k`` and ``v`` ``(B,
    h, n, d)`` float32, float16 or bfloat16 and not empty, ``d`` one of
    :data:`~pola_mm.ops.launch.WIDTHS` (16, 32, 64); the rotary tables
    both given (broadcastable to ``(N, 2d)``, ``n == N``) or neither; all
    on one device. (Whether Triton runs there is
    :func:`~pola_mm.ops.dispatch.implementation`'s question.)
    """
    if not all(isinstance(t, Tensor) for t in (q, k, v)):
        return False
    if any(t.dim() != 4 or t.dtype not in _DTYPES for t in (q, k, v)):
        return False
    B, h, N, d = q.shape
    if d not in WIDTHS:
        return False
    if k.shape != v.shape or k.shape[:2] != (B, h) or k.shape[3] != d:
        return False
    if q.numel() == 0 or k.numel() == 0:
        return False
    if (sin is None) != (cos is None):
        return False
    tables = () if sin is None else (sin, cos)
    if tables and (k.shape[2] != N or
                   not all(_is_table(t, N, 2 * d) for t in tables)):
        return False
    return len({t.device for t in (q, k, v) + tables}) == 1


def _check(q: Tensor, k: Tensor, v: Tensor, sin: Optional[Tensor],
           cos: Optional[Tensor]) -> None:
    """ValueError where :func:`fits` is False."""
    if not fits(q, k, v, sin, cos):
        shapes = [None if t is None else (tuple(t.shape), t.dtype, t.device)
                  for t in (q, k, v, sin, cos)]
        raise ValueError('pacs triton kernels: inputs not supported (see '
                         f'fits()): q, k, v, sin, cos = {shapes}')


def _block_size(block_n: Optional[int], kernel: str, d: int) -> int:
    """Tokens per block of ``kernel``: ``block_n`` (a power of two >= 16),
    by default the launch rule's
    (:func:`~pola_mm.ops.launch.launch_config`)."""
    if block_n is None:
        return _config(kernel, d).block
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f'block_n must be a power of two >= 16, got '
                         f'{block_n}')
    return int(block_n)


def _temps(t: Tensor, h: int, d: int) -> Tensor:
    """Temperatures broadcastable to ``(1, h, 1, 2d)`` as ``(h, 2d)``
    float32, contiguous."""
    t = torch.broadcast_to(t.to(torch.float32), (1, h, 1, 2 * d))
    return t.reshape(h, 2 * d).contiguous()


def _tables(sin: Optional[Tensor], cos: Optional[Tensor], N: int, d: int
            ) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """``sin``, ``cos`` as float32 ``(N, 2d)`` views (broadcast, not
    copied) with equal strides; None without tables."""
    if sin is None or cos is None:
        return None, None
    sin, cos = (torch.broadcast_to(t.to(torch.float32), (N, 2 * d))
                for t in (sin, cos))
    if sin.stride() != cos.stride():
        sin, cos = sin.contiguous(), cos.contiguous()
    return sin, cos


def _table_args(sin: Optional[Tensor], cos: Optional[Tensor],
                dummy: Tensor) -> Tuple[Tensor, Tensor, int, int]:
    """The kernels' table arguments: the tables and their strides, or
    ``dummy`` twice (never read) without tables."""
    if sin is None or cos is None:
        return dummy, dummy, 0, 0
    return sin, cos, sin.stride(0), sin.stride(1)


# --- the kernels as torch custom ops (..custom_ops), one per launch; the
# sums between them stay plain torch operations


def key_pass(k: Tensor, v: Tensor, sin: Optional[Tensor],
             cos: Optional[Tensor], chunks: int, per: int,
             block: int) -> Tuple[Tensor, Tensor]:
    """The forward's key pass: partial ``R(k')^T v`` ``(B h, chunks, 2d,
    d)`` and ``sum k'`` ``(B h, chunks, 2d)``, float32."""
    m_part, ks_part = _key_pass_fake(k, v, sin, cos, chunks, per, block)
    B, H, n, d = k.shape
    sin_t, cos_t, s_tn, s_tc = _table_args(sin, cos, m_part)
    with on_device(k):
        _fwd_keys_kernel[(B * H, chunks)](
            k, v, sin_t, cos_t, m_part, ks_part, H, n, per,
            *k.stride(), *v.stride(), s_tn, s_tc,
            D=d, BLOCK_N=block, HAS_ROT=sin is not None,
            **_config('key_pass', d).options())
    return m_part, ks_part


def _key_pass_fake(k, v, sin, cos, chunks, per, block):
    B, H, _, d = k.shape
    f32 = dict(dtype=torch.float32, device=k.device)
    return (torch.empty((B * H, chunks, 2 * d, d), **f32),
            torch.empty((B * H, chunks, 2 * d), **f32))


def query_pass(q: Tensor, t1: Tensor, t2: Tensor, sin: Optional[Tensor],
               cos: Optional[Tensor], M: Tensor, k_mean: Tensor, eps: float,
               block: int) -> Tuple[Tensor, Tensor]:
    """The forward's query pass: ``x`` ``(B, h, N, d)`` in ``q``'s dtype
    and ``1 / (z + eps)`` ``(B, h, N, 2)`` float32."""
    B, H, N, d = q.shape
    x = _token_major(B, H, N, d, q, _store_dtype(q.dtype))
    rz = torch.empty((B, H, N, 2), dtype=torch.float32, device=q.device)
    sin_t, cos_t, s_tn, s_tc = _table_args(sin, cos, t1)
    with on_device(q):
        _fwd_queries_kernel[(B * H, triton.cdiv(N, block))](
            q, t1, t2, sin_t, cos_t, M, k_mean, x, rz, H, N, float(eps),
            *q.stride(), *x.stride()[:3], s_tn, s_tc,
            D=d, HALF=d // 2, W=max(d // 2, 16), BLOCK_N=block,
            HAS_ROT=sin is not None,
            **_config('query_pass', d).options())
    return x.to(q.dtype), rz


def _query_pass_fake(q, t1, t2, sin, cos, M, k_mean, eps, block):
    B, H, N, d = q.shape
    return (_token_major(B, H, N, d, q, q.dtype),
            torch.empty((B, H, N, 2), dtype=torch.float32, device=q.device))


def _token_major(B: int, h: int, N: int, d: int, like: Tensor,
                 dtype: torch.dtype) -> Tensor:
    """A new ``(B, h, N, d)`` tensor laid out ``(B, N, h, d)`` in memory
    (the models merge the heads back into ``(B, N, h d)`` without a
    copy)."""
    return like.new_empty(B, N, h, d, dtype=dtype).transpose(1, 2)


def query_grad(dx: Tensor, q: Tensor, x: Tensor, t: Tensor,
               sin: Optional[Tensor], cos: Optional[Tensor], M: Tensor,
               k_mean: Tensor, rz: Tensor, chunks: int, per: int,
               block: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward's query pass (one program per chunk and flow, ``t``
    the temperatures of both flows ``(2, h, 2d)``): ``dq`` and the partial
    ``dM`` ``(B h, chunks, 2d, d)``, ``dk_mean`` ``(B h, chunks, 2, 2d)``
    and temperature gradients ``(B h, chunks, 2, 2d)``, float32."""
    B, H, N, d = q.shape
    dq = torch.zeros((B, H, N, d), dtype=torch.float32, device=q.device)
    dm_part, dkm_part, dt_part = _query_grad_parts(q, chunks)
    sin_t, cos_t, s_tn, s_tc = _table_args(sin, cos, t)
    with on_device(q):
        _bwd_queries_kernel[(B * H, chunks, 2)](
            dx, q, x, t, sin_t, cos_t, M, k_mean, rz, dq,
            dm_part, dkm_part, dt_part, H, N, per,
            *dx.stride(), *q.stride(), *x.stride(), s_tn, s_tc,
            D=d, HALF=d // 2, W=max(d // 2, 16), BLOCK_N=block,
            HAS_ROT=sin is not None, USE_X=x.dtype == torch.float32,
            **_config('query_grad', d).options())
    return dq.to(q.dtype), dm_part, dkm_part, dt_part


def _query_grad_parts(q: Tensor, chunks: int) -> Tuple[Tensor, ...]:
    """The query backward's float32 partial sums: ``dM``, ``dk_mean`` and
    the temperatures' gradients."""
    B, H, N, d = q.shape
    f32 = dict(dtype=torch.float32, device=q.device)
    return (torch.empty((B * H, chunks, 2 * d, d), **f32),
            torch.empty((B * H, chunks, 2, 2 * d), **f32),
            torch.empty((B * H, chunks, 2, 2 * d), **f32))


def _query_grad_fake(dx, q, x, t, sin, cos, M, k_mean, rz, chunks, per,
                     block):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            *_query_grad_parts(q, chunks))


def key_grad(k: Tensor, v: Tensor, sin: Optional[Tensor],
             cos: Optional[Tensor], dM: Tensor, dkm: Tensor, need_v: bool,
             block: int) -> Tuple[Tensor, Tensor]:
    """The backward's key pass: ``dk`` and ``dv`` (empty unless
    ``need_v``) in their inputs' dtypes."""
    B, H, n, d = k.shape
    dk = torch.empty((B, H, n, d), dtype=_store_dtype(k.dtype),
                     device=k.device)
    dv = (torch.empty((B, H, n, d), dtype=_store_dtype(v.dtype),
                      device=k.device) if need_v else dk)
    sin_t, cos_t, s_tn, s_tc = _table_args(sin, cos, dM)
    with on_device(k):
        _bwd_keys_kernel[(B * H, triton.cdiv(n, block))](
            k, v, sin_t, cos_t, dM, dkm, dk, dv, H, n,
            *k.stride(), *v.stride(), s_tn, s_tc,
            D=d, BLOCK_N=block, HAS_ROT=sin is not None, NEED_V=need_v,
            **_config('key_grad', d).options())
    return dk.to(k.dtype), dv.to(v.dtype) if need_v else v.new_empty(0)


def _key_grad_fake(k, v, sin, cos, dM, dkm, need_v, block):
    return (torch.empty(k.shape, dtype=k.dtype, device=k.device),
            torch.empty(v.shape, dtype=v.dtype, device=v.device)
            if need_v else v.new_empty(0))


key_pass = register_kernel('pacs_key_pass', key_pass, _key_pass_fake)
query_pass = register_kernel('pacs_query_pass', query_pass, _query_pass_fake)
query_grad = register_kernel('pacs_query_grad', query_grad, _query_grad_fake)
key_grad = register_kernel('pacs_key_grad', key_grad, _key_grad_fake)


def pacs_forward(q: Tensor, k: Tensor, v: Tensor, t1: Tensor, t2: Tensor,
                 sin: Optional[Tensor] = None, cos: Optional[Tensor] = None,
                 eps: float = EPS, *, block_n: Optional[int] = None,
                 chunks: Optional[int] = None
                 ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """PaCS attention forward in two fused kernels (the formula:
    :func:`~.naive.pacs_attention_pytorch`).

    Args:
        q: ``(B, h, N, d)`` queries, any strides, float32/16 or bfloat16.
        k, v: ``(B, h, n, d)`` (``n == N`` with the rotary tables).
        t1, t2: the temperatures ``sigmoid(s1)``, ``sigmoid(s2)``,
            broadcastable to ``(1, h, 1, 2d)``.
        sin, cos: optional rotary tables broadcastable to ``(N, 2d)``
            (both or neither; read as float32).
        eps: added to the normalisers.
        block_n: tokens per block (a power of two >= 16; default the
            launch rule's, :func:`~pola_mm.ops.launch.launch_config`).
        chunks: programs per image and head of the key pass (default: about
            two per multiprocessor in all; 2 on the CPU).

    Returns:
        ``x`` ``(B, h, N, d)`` in ``q.dtype`` (laid out ``(B, N, h, d)``:
        the heads merge back without a copy), ``M = R(k')^T v
        / N`` ``(B, h, 2d, d)``, ``k_mean`` ``(B, h, 2d)`` and ``1 / (z +
        eps)`` of both flows ``(B, h, N, 2)``, these three float32.

    Raises:
        ValueError: where :func:`fits` is False.
    """
    _check(q, k, v, sin, cos)
    B, H, N, d = q.shape
    n = k.shape[2]
    block = _block_size(block_n, 'key_pass', d)
    t1c, t2c = _temps(t1, H, d), _temps(t2, H, d)
    sin, cos = _tables(sin, cos, N, d)
    nchunks, per = split_tokens(n, block, B * H, q.device, chunks)
    m_part, ks_part = key_pass(k, v, sin, cos, nchunks, per, block)
    M = m_part.sum(dim=1).div_(N)
    k_mean = ks_part.sum(dim=1).div_(n)
    x, rz = query_pass(q, t1c, t2c, sin, cos, M, k_mean, float(eps),
                       _block_size(block_n, 'query_pass', d))
    return x, M.view(B, H, 2 * d, d), k_mean.view(B, H, 2 * d), rz


def pacs_backward(dx: Tensor, q: Tensor, k: Tensor, v: Tensor, t1: Tensor,
                  t2: Tensor, sin: Optional[Tensor], cos: Optional[Tensor],
                  x: Tensor, M: Tensor, k_mean: Tensor, rz: Tensor, *,
                  need_v: bool = True, block_n: Optional[int] = None,
                  chunks: Optional[int] = None
                  ) -> Tuple[Tensor, Tensor, Optional[Tensor], Tensor,
                             Tensor]:
    """PaCS attention backward in two fused kernels, the features
    recomputed.

    Args:
        dx: ``(B, h, N, d)`` gradient of the output, any dtype and strides.
        q, k, v, t1, t2, sin, cos: the inputs of :func:`pacs_forward`.
        x, M, k_mean, rz: its outputs (``x`` any strides, read only when
            float32: else recomputed in float32).
        need_v: compute ``dv`` (else None).
        block_n: tokens per block (as :func:`pacs_forward`).
        chunks: programs per image and head of the query pass (default:
            about two per multiprocessor in all; 2 on the CPU).

    Returns:
        ``dq`` ``(B, h, N, d)``, ``dk``, ``dv`` ``(B, h, n, d)`` in the
        dtypes of ``q``, ``k``, ``v`` (contiguous; ``dv`` None without
        ``need_v``), and ``dt1``, ``dt2`` ``(h, 2d)`` float32: the
        gradients of the temperatures ``t1``, ``t2`` themselves (not of
        the raw ``s``: the caller applies ``t (1 - t)``), summed over the
        batch and the tokens.

    Raises:
        ValueError: where :func:`fits` is False.
    """
    _check(q, k, v, sin, cos)
    B, H, N, d = q.shape
    n = k.shape[2]
    block = _block_size(block_n, 'query_grad', d)
    t1c, t2c = _temps(t1, H, d), _temps(t2, H, d)
    sin, cos = _tables(sin, cos, N, d)
    M = M.to(torch.float32).contiguous()
    k_mean = k_mean.to(torch.float32).contiguous()
    rz = rz.to(torch.float32).contiguous()
    nchunks, per = split_tokens(N, block, B * H, q.device, chunks)
    dq, dm_part, dkm_part, dt_part = query_grad(
        dx, q, x, torch.stack((t1c, t2c)), sin, cos, M, k_mean, rz, nchunks,
        per, block)
    dM = dm_part.sum(dim=1).div_(N)  # M = R(k')^T v / N
    dkm = dkm_part.sum(dim=(1, 2)).div_(n)  # k_mean = sum(k') / n
    dt = dt_part.view(B, H, nchunks, 2, 2 * d).sum(dim=(0, 2))
    dk, dv = key_grad(k, v, sin, cos, dM, dkm, need_v,
                      _block_size(block_n, 'key_grad', d))
    return dq, dk, dv if need_v else None, dt[:, 0], dt[:, 1]


class PaCSTritonFunction(torch.autograd.Function):
    """The kernels with their backward, as a function of the raw
    temperatures ``s1``, ``s2``: saves ``q``, ``k``, ``v`` as given (half
    precision stays half), the tables, the output, ``M``, ``k_mean`` and
    ``1 / (z + eps)``; no feature map."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, s1: Tensor,
                s2: Tensor, sin: Optional[Tensor], cos: Optional[Tensor],
                eps: float) -> Tensor:
        t1, t2 = torch.sigmoid(s1), torch.sigmoid(s2)
        x, M, k_mean, rz = pacs_forward(q, k, v, t1, t2, sin, cos, eps)
        ctx.save_for_backward(q, k, v, s1, s2, sin, cos, x, M, k_mean, rz)
        ctx.eps = eps
        return x

    @staticmethod
    def backward(ctx, dx: Tensor):
        q, k, v, s1, s2, sin, cos, x, M, k_mean, rz = ctx.saved_tensors
        need = ctx.needs_input_grad

        def by_torch():
            inputs = (q, k, v, s1, s2, sin, cos, ctx.eps)
            return recomputed_grads(torch_form, inputs, need, dx)

        return guarded(config(q, sin), lambda: _kernel_grads(ctx, dx, need),
                       by_torch)


def _kernel_grads(ctx, dx: Tensor, need: Tuple[bool, ...]) -> tuple:
    """:class:`PaCSTritonFunction`'s gradients by the kernels."""
    q, k, v, s1, s2, sin, cos, x, M, k_mean, rz = ctx.saved_tensors
    h, d = q.shape[1], q.shape[3]
    t1, t2 = torch.sigmoid(s1), torch.sigmoid(s2)
    dq, dk, dv, dt1, dt2 = pacs_backward(
        dx, q, k, v, t1, t2, sin, cos, x, M, k_mean, rz, need_v=need[2])

    def ds(dt: Tensor, t: Tensor, s: Tensor) -> Tensor:
        g = dt.view(1, h, 1, 2 * d) * t * (1 - t)  # sigmoid'
        return sum_to(g, s.shape).to(s.dtype)

    ds1 = ds(dt1, t1, s1) if need[3] else None
    ds2 = ds(dt2, t2, s2) if need[4] else None
    return dq, dk, dv, ds1, ds2, None, None, None


def torch_form(q: Tensor, k: Tensor, v: Tensor, s1: Tensor, s2: Tensor,
               sin: Optional[Tensor], cos: Optional[Tensor],
               eps: float = EPS) -> Tensor:
    """The torch implementation of the same arguments (the fallback of a
    configuration whose kernels failed): the CPU path where it fits (as
    many keys as queries), else the formula."""
    fn = (pacs_attention_cpu if k.shape[-2] == q.shape[-2] else
          pacs_attention_pytorch)
    return fn(q, k, v, s1, s2, sin, cos, eps)


def probe(key: tuple) -> None:
    """Forward and backward of the kernels once, on small inputs of the
    configuration ``key`` (:func:`config`'s) on its device: a failure of
    the configuration there raises (:func:`~pola_mm.ops.launch.usable`)."""
    q, k, v, flags = probe_inputs(key)
    d, device = q.shape[-1], q.device
    s1, s2 = (torch.zeros(1, 2, 1, 2 * d, device=device, requires_grad=True)
              for _ in range(2))
    tables = ((torch.rand(80, 2 * d, device=device), ) * 2
              if flags.get('rotary') else (None, None))
    out = pacs_attention_triton(q, k, v, s1, s2, *tables)
    out.float().sum().backward()


def config(q: Tensor, sin: Optional[Tensor]) -> tuple:
    """The kernel configuration of these inputs, as a failure is
    remembered (:func:`~pola_mm.ops.launch.guarded`)."""
    return config_key('pacs', q, rotary=sin is not None)


def pacs_attention_triton(q: Tensor, k: Tensor, v: Tensor, s1: Tensor,
                          s2: Tensor, sin: Optional[Tensor] = None,
                          cos: Optional[Tensor] = None,
                          eps: float = EPS) -> Tensor:
    """PaCS polarity attention by the fused kernels (the formula and the
    arguments: :func:`~.naive.pacs_attention_pytorch`; ``s1``, ``s2`` the
    raw temperatures).

    ``q``, ``k``, ``v`` stay in their dtypes in memory (fp16/bf16 under
    autocast); the kernels compute in float32 registers.

    Returns:
        ``(B, h, N, d)`` in ``q``'s dtype.
    """
    if records_grad(q, k, v, s1, s2):
        return PaCSTritonFunction.apply(q, k, v, s1, s2, sin, cos, eps)
    t1, t2 = torch.sigmoid(s1), torch.sigmoid(s2)
    return pacs_forward(q, k, v, t1, t2, sin, cos, eps)[0]
