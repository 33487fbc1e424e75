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
  keys ``k' = [e^(pos tk) - 1, e^(neg tk) - 1]`` of ``x = k + k_bias``,
  ``tk`` the keys' temperature (1 and no bias unless given: PolaFormer's
  ``softplus(scale)`` divides q and k + k_bias, which is ``t / s`` and
  ``tk = 1 / s``, :func:`pacs_attention_triton`);
- ``k_mean = sum_n k' / n`` ``(2d)``, ``M = R(k')^T v / N`` ``(2d, d)`` (as
  the reference: divided by the number of queries ``N``);
- ``z_j = q_j . k_mean``, ``x_j = R(q_j) M_j / (z_j + eps)`` with ``M_sim``
  the first ``d / 2`` columns of ``M``, ``M_opp`` the last; out ``[x_sim,
  x_opp]``.

``R`` is the rotary encoding :func:`~pola_mm.ops.rotary.theta_shift` of
an ``(H, W)`` map when ``hw`` is given (else the identity). The kernels
read its separable factors (:func:`~pola_mm.ops.rotary.rotary_factors`,
``(2, H + W, d)`` float32, a few kilobytes): half ``a`` of a token's
tables is its row's, half ``b`` its column's. Per channel,
``R(f)[c] = f[c] cos[c] + sgn(c) f[c^1] sin[c]`` with ``sgn(c) = -1`` on
even, ``+1`` on odd channels (``rotate_every_two``), and its adjoint
``R^T(y)[c] = y[c] cos[c] - sgn(c) y[c^1] sin[c^1]``. The partner values
``f[c^1]`` are the tile's own channel pairs exchanged in registers
(:func:`_swap_pairs`, a reshape; ``d`` is even, so the partner stays in its
half): nothing is loaded twice.

Four kernels, launched by :func:`pacs_forward` and :func:`pacs_backward`:

- forward, key pass (grid ``(B h, chunks)``): partial sums of ``R(k')^T v``
  and ``k'`` over chunks of keys, added atomically (or, deterministic, one
  slot per chunk summed by torch:
  :func:`~pola_mm.ops.launch.reduce_atomically`; so are the backward's);
- forward, query pass (grid ``(B h, blocks of queries)``): ``x`` and
  ``1 / (z + eps)``;
- backward, query pass (grid ``(B h, chunks, 2)``, one program per flow):
  ``dq`` and partial sums of ``dM``, ``dk_mean`` and the temperatures'
  gradients;
- backward, key pass (grid ``(B h, blocks of keys)``): ``dk``, ``dv`` and
  partial sums of the keys' temperature gradient.

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
import torch.nn.functional as F
from torch import Tensor

from ...type_aliases import Size2
from ..custom_ops import register_kernel
from ..dispatch import capturing, records_grad
from ..features import EPS, sum_to
from ..launch import (WIDTHS, LaunchConfig, config_key, guarded, launch_config,
                      on_device, partial_sums, probe_inputs, recomputed_grads,
                      reduce_atomically, split_tokens, sum_slots)
from ..position import has_storage
from ..rotary import rotary_factors
from .cpu import pacs_attention_torch

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
    from ..launch import add_partial, slot_row

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
    def _angles(rot_ptr, rows, cols, mask, HM, WM, D: tl.constexpr):
        """``sin_a, sin_b, cos_a, cos_b`` ``(BLOCK_N, D)``: the rotary
        tables' halves at tokens ``rows`` of an ``HM x WM`` map
        (row-major), from its factors ``(2, HM + WM, D)`` (float32,
        contiguous; :func:`~pola_mm.ops.rotary.rotary_factors`): half ``a``
        is the row's, half ``b`` the column's."""
        r = rows // WM
        c = HM + rows % WM
        cos_ptr = rot_ptr + (HM + WM) * D
        return (_tile(rot_ptr, r, cols, D, 1, mask),
                _tile(rot_ptr, c, cols, D, 1, mask),
                _tile(cos_ptr, r, cols, D, 1, mask),
                _tile(cos_ptr, c, cols, D, 1, mask))

    @triton.jit
    def _keys(k_base, kb_base, rows, cols, mask, s_kn, s_kd, s_bn, s_bd,
              SCALED: tl.constexpr):
        """The keys ``x = k + k_bias`` (``k`` alone unless ``SCALED``)
        ``(BLOCK_N, D)`` float32, zero where ``mask`` is false."""
        x = _tile(k_base, rows, cols, s_kn, s_kd, mask)
        if SCALED:
            x += _tile(kb_base, rows, cols, s_bn, s_bd, mask)
        return x

    @triton.jit
    def _key_temperature(tk_ptr, hh, cols, D: tl.constexpr,
                         SCALED: tl.constexpr):
        """Head ``hh``'s key temperature ``(1, D)`` (``tk`` ``(h, D)``
        float32, contiguous), 1 unless ``SCALED``."""
        if SCALED:
            tk = tl.load(tk_ptr + hh * D + cols)[None, :]
        else:
            tk = tl.full((1, D), 1.0, tl.float32)
        return tk

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
    def _fwd_keys_kernel(k_ptr, v_ptr, kb_ptr, tk_ptr, rot_ptr, m_part_ptr,
                         ks_part_ptr, H, n, per_chunk, HM, WM,
                         s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
                         s_bb, s_bh, s_bn, s_bd,
                         D: tl.constexpr, BLOCK_N: tl.constexpr,
                         HAS_ROT: tl.constexpr, SCALED: tl.constexpr,
                         ATOMIC: tl.constexpr, DOT: tl.constexpr):
        """Forward, key pass: program ``(bh, chunk)`` sums over its chunk
        of ``per_chunk`` blocks of keys ``R(k')^T v`` (``(2D, D)``, into
        ``m_part[bh, slot]``) and ``k'`` (``(2D)``, into
        ``ks_part[bh, slot]``; :func:`~pola_mm.ops.launch.slot_row`)."""
        bh = tl.program_id(0)
        chunk = tl.program_id(1)
        b = (bh // H).to(tl.int64)
        hh = (bh % H).to(tl.int64)
        k_base = k_ptr + b * s_kb + hh * s_kh
        v_base = v_ptr + b * s_vb + hh * s_vh
        kb_base = kb_ptr + b * s_bb + hh * s_bh
        cols = tl.arange(0, D)
        sgn = _pair_sign(cols)
        tk = _key_temperature(tk_ptr, hh, cols, D, SCALED)
        m_a = tl.zeros((D, D), dtype=tl.float32)  # rows 0..D-1 of R(k')^T v
        m_b = tl.zeros((D, D), dtype=tl.float32)  # rows D..2D-1
        sum_a = tl.zeros((D, ), dtype=tl.float32)
        sum_b = tl.zeros((D, ), dtype=tl.float32)
        first = chunk * per_chunk
        last = tl.minimum(first + per_chunk, tl.cdiv(n, BLOCK_N))
        for blk in range(first, last):
            rows = blk * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = (rows < n)[:, None]  # keys past n: k = v = 0, k' = 0
            x = _keys(k_base, kb_base, rows, cols, mask, s_kn, s_kd, s_bn,
                      s_bd, SCALED)
            vv = _tile(v_base, rows, cols, s_vn, s_vd, mask)
            fa = _expm1(tl.maximum(x, 0.0) * tk)  # e^(relu(x) tk) - 1
            fb = _expm1(tl.maximum(-x, 0.0) * tk)  # e^(relu(-x) tk) - 1
            sum_a += tl.sum(fa, axis=0)
            sum_b += tl.sum(fb, axis=0)
            if HAS_ROT:  # R(k')
                sin_a, sin_b, cos_a, cos_b = _angles(rot_ptr, rows, cols,
                                                     mask, HM, WM, D)
                fa = _rot(fa, sin_a, cos_a, sgn)
                fb = _rot(fb, sin_b, cos_b, sgn)
            m_a = tl.dot(tl.trans(fa), vv, m_a, input_precision=DOT)
            m_b = tl.dot(tl.trans(fb), vv, m_b, input_precision=DOT)
        bh64 = bh.to(tl.int64)
        chunks = tl.num_programs(1)
        m_base = slot_row(m_part_ptr, bh64, chunk, chunks, 2 * D * D, ATOMIC)
        add_partial(m_base + cols[:, None] * D + cols[None, :], m_a, None,
                    ATOMIC)
        add_partial(m_base + (D + cols)[:, None] * D + cols[None, :], m_b,
                    None, ATOMIC)
        ks_base = slot_row(ks_part_ptr, bh64, chunk, chunks, 2 * D, ATOMIC)
        add_partial(ks_base + cols, sum_a, None, ATOMIC)
        add_partial(ks_base + D + cols, sum_b, None, ATOMIC)

    @triton.jit
    def _fwd_queries_kernel(q_ptr, t1_ptr, t2_ptr, rot_ptr, m_ptr,
                            km_ptr, x_ptr, rz_ptr, H, N, eps, HM, WM,
                            s_qb, s_qh, s_qn, s_qd, s_xb, s_xh, s_xn,
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
            sin_a, sin_b, cos_a, cos_b = _angles(rot_ptr, rows, cols,
                                                 rmask[:, None], HM, WM, D)
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
    def _bwd_queries_kernel(dx_ptr, q_ptr, x_ptr, t_ptr, rot_ptr,
                            m_ptr, km_ptr, rz_ptr, dq_ptr,
                            dm_part_ptr, dkm_part_ptr, dt_part_ptr,
                            H, N, per_chunk, HM, WM,
                            s_db, s_dh, s_dn, s_dd, s_qb, s_qh, s_qn, s_qd,
                            s_xb, s_xh, s_xn, s_xd,
                            D: tl.constexpr, HALF: tl.constexpr,
                            W: tl.constexpr, BLOCK_N: tl.constexpr,
                            HAS_ROT: tl.constexpr, USE_X: tl.constexpr,
                            ATOMIC: tl.constexpr, DOT: tl.constexpr):
        """Backward, query pass: program ``(bh, chunk, flow)`` walks its
        chunk of ``per_chunk`` blocks of queries for one flow (0: the
        same-signed, 1: the opposite-signed; the flows share no state, so
        a program holds half of it). It adds its flow's part of ``dq`` to
        the float32 ``dq`` (zeros, contiguous ``(B h, N, D)``: two addends,
        an exact and order-free sum) and its partial sums (into the slot
        of :func:`~pola_mm.ops.launch.slot_row`): its columns of ``dM =
        [R(q_sim)^T da_sim, R(q_opp)^T da_opp]`` ``(2D, D)`` into
        ``dm_part[bh, slot]``, ``q_j^T dz_j`` ``(2D)`` into
        ``dkm_part[bh, slot, flow]``, the gradient of its temperatures
        ``(2D)`` into ``dt_part[bh, slot, flow]``.

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
                sin_a, sin_b, cos_a, cos_b = _angles(
                    rot_ptr, rows, cols, rmask[:, None], HM, WM, D)
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
        chunks = tl.num_programs(1)
        dm_mask = wmask[None, :]
        ptrs_a = (slot_row(dm_part_ptr, bh64, chunk, chunks, 2 * D * D,
                           ATOMIC) + cols[:, None] * D + col0 +
                  wcols[None, :])
        add_partial(ptrs_a, dm_a, dm_mask, ATOMIC)
        add_partial(ptrs_a + D * D, dm_b, dm_mask, ATOMIC)
        flow_row = 2 * D * flow
        dkm_base = slot_row(dkm_part_ptr, bh64, chunk, chunks, 4 * D,
                            ATOMIC) + flow_row
        add_partial(dkm_base + cols, dkm_a, None, ATOMIC)
        add_partial(dkm_base + D + cols, dkm_b, None, ATOMIC)
        dt_base = slot_row(dt_part_ptr, bh64, chunk, chunks, 4 * D,
                           ATOMIC) + flow_row
        add_partial(dt_base + cols, dt_a, None, ATOMIC)
        add_partial(dt_base + D + cols, dt_b, None, ATOMIC)

    @triton.jit
    def _bwd_keys_kernel(k_ptr, v_ptr, kb_ptr, tk_ptr, rot_ptr, dm_ptr,
                         dkm_ptr, dk_ptr, dv_ptr, dtk_part_ptr, H, n, HM, WM,
                         s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
                         s_bb, s_bh, s_bn, s_bd,
                         D: tl.constexpr, BLOCK_N: tl.constexpr,
                         HAS_ROT: tl.constexpr, SCALED: tl.constexpr,
                         NEED_V: tl.constexpr, ATOMIC: tl.constexpr,
                         DOT: tl.constexpr):
        """Backward, key pass: program ``(bh, block)`` writes ``dk`` (and
        ``dv`` with ``NEED_V``), contiguous ``(B h, n, D)`` in the dtypes
        of their pointers, from ``dM = dL/dM / N`` ``(B h, 2D, D)`` and
        ``dk_mean / n`` ``(B h, 2D)`` (float32, contiguous):
        ``dk' = R^T(v dM^T) + dk_mean``, ``dv = R(k') dM``. With
        ``SCALED`` also its block's part of the key temperature's gradient
        ``(D)`` into ``dtk_part[bh, slot]``
        (:func:`~pola_mm.ops.launch.slot_row`)."""
        bh = tl.program_id(0)
        b = (bh // H).to(tl.int64)
        hh = (bh % H).to(tl.int64)
        bh64 = bh.to(tl.int64)
        rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < n
        cols = tl.arange(0, D)
        k_base = k_ptr + b * s_kb + hh * s_kh
        v_base = v_ptr + b * s_vb + hh * s_vh
        kb_base = kb_ptr + b * s_bb + hh * s_bh
        x = _keys(k_base, kb_base, rows, cols, rmask[:, None], s_kn, s_kd,
                  s_bn, s_bd, SCALED)
        vv = _tile(v_base, rows, cols, s_vn, s_vd, rmask[:, None])
        tk = _key_temperature(tk_ptr, hh, cols, D, SCALED)
        fa = _expm1(tl.maximum(x, 0.0) * tk)
        fb = _expm1(tl.maximum(-x, 0.0) * tk)
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
            sin_a, sin_b, cos_a, cos_b = _angles(rot_ptr, rows, cols,
                                                 rmask[:, None], HM, WM, D)
            ya = _rot_t(ya, sin_a, cos_a, sgn)
            yb = _rot_t(yb, sin_b, cos_b, sgn)
            if NEED_V:
                ra = _rot(fa, sin_a, cos_a, sgn)
                rb = _rot(fb, sin_b, cos_b, sgn)
        dkm_base = dkm_ptr + bh64 * (2 * D)
        dkm_a = tl.load(dkm_base + cols)[None, :]
        dkm_b = tl.load(dkm_base + D + cols)[None, :]
        # dk' (f + 1) = d(pre-activation relu(+-x) tk);
        # dk = tk (dpos [x > 0] - dneg [x < 0])
        dpa = (ya + dkm_a) * (fa + 1.0)
        dpb = (yb + dkm_b) * (fb + 1.0)
        dk = tk * (tl.where(x > 0, dpa, 0.0) - tl.where(x < 0, dpb, 0.0))
        offs = bh64 * n * D + rows[:, None] * D + cols[None, :]
        tl.store(dk_ptr + offs, dk.to(dk_ptr.dtype.element_ty),
                 mask=rmask[:, None])
        if SCALED:  # d tk = sum_n dpos relu(x) + dneg relu(-x)
            dtk = tl.sum(dpa * tl.maximum(x, 0.0) + dpb * tl.maximum(-x, 0.0),
                         axis=0)
            dtk_base = slot_row(dtk_part_ptr, bh64, tl.program_id(1),
                                tl.num_programs(1), D, ATOMIC)
            add_partial(dtk_base + cols, dtk, None, ATOMIC)
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


def _config(kernel: str, d: int) -> LaunchConfig:
    """The launch configuration of this op's ``kernel`` at head width ``d``
    (:func:`~pola_mm.ops.launch.launch_config`)."""
    return launch_config('pacs', kernel, d)


def fits(q: Tensor, k: Tensor, v: Tensor, hw: Optional[Size2] = None,
         k_bias: Optional[Tensor] = None) -> bool:
    """Whether the kernels take these inputs (else the op falls back on the
    torch implementations): ``q`` ``(B, h, N, d)``, ``k`` and ``v`` ``(B,
    h, n, d)`` float32, float16 or bfloat16 and not empty, ``d`` one of
    :data:`~pola_mm.ops.launch.WIDTHS` (16, 32, 64); with the rotary map
    ``hw``, ``H W = n = N``; ``k_bias`` broadcastable to ``k``; all on one
    device. (Whether Triton runs there is
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
    if hw is not None and (k.shape[2] != N or hw[0] * hw[1] != N):
        return False  # (no int(): a traced graph's sizes stay symbolic)
    tensors = (q, k, v)
    if k_bias is not None:
        try:
            if torch.broadcast_shapes(k_bias.shape, k.shape) != k.shape:
                return False
        except RuntimeError:
            return False
        tensors += (k_bias, )
    return len({t.device for t in tensors}) == 1


def _check(q: Tensor, k: Tensor, v: Tensor, hw: Optional[Size2],
           k_bias: Optional[Tensor]) -> None:
    """ValueError where :func:`fits` is False."""
    if not fits(q, k, v, hw, k_bias):
        shapes = [None if t is None else (tuple(t.shape), t.dtype, t.device)
                  for t in (q, k, v, k_bias)]
        raise ValueError('pacs triton kernels: inputs not supported (see '
                         f'fits()): q, k, v, k_bias = {shapes}, hw = {hw}')


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


def _temps(t: Tensor, h: int, width: int) -> Tensor:
    """Temperatures broadcastable to ``(1, h, 1, width)`` as ``(h,
    width)`` float32, contiguous."""
    t = torch.broadcast_to(t.to(torch.float32), (1, h, 1, width))
    return t.reshape(h, width).contiguous()


def _rotary(hw: Optional[Size2], q: Tensor) -> Tuple[Optional[Tensor], int]:
    """The kernels' rotary arguments for the queries ``q``: the factors
    ``(2, H + W, d)`` of the map ``hw``
    (:func:`~pola_mm.ops.rotary.rotary_factors`, float32; cached in eager
    mode for tensors with data and a map of plain ints) and ``W``; ``(None,
    0)`` without rotary encoding."""
    if hw is None:
        return None, 0
    cache = (not capturing() and all(type(s) is int for s in hw)
             and has_storage(q))
    return (rotary_factors(hw, 2 * q.shape[-1], device=q.device,
                           cache=cache), hw[1])


def _rot_args(rot: Optional[Tensor], map_w: int,
              dummy: Tensor) -> Tuple[Tensor, int, int]:
    """The kernels' ``rot_ptr, HM, WM``: the factors and the map's height
    and width, or ``dummy`` (never read) and ``1, 1`` without them."""
    if rot is None:
        return dummy, 1, 1
    return rot, rot.shape[1] - map_w, map_w


def _key_args(k: Tensor, k_bias: Optional[Tensor], tk: Optional[Tensor]
              ) -> Tuple[Tensor, Tensor, Tuple[int, ...]]:
    """The kernels' ``kb_ptr, tk_ptr`` and the bias's strides: ``k_bias``
    broadcast to ``k`` (zeros when only ``tk`` is given), ``tk`` ``(h,
    d)`` float32 (ones when only ``k_bias`` is given); ``k`` twice and
    zero strides (never read) with neither."""
    if k_bias is None and tk is None:
        return k, k, (0, 0, 0, 0)
    h, d = k.shape[1], k.shape[3]
    kb = (k.new_zeros(()) if k_bias is None else k_bias).expand(k.shape)
    tk = (k.new_ones((h, d), dtype=torch.float32) if tk is None else tk)
    return kb, tk, kb.stride()


# --- the kernels as torch custom ops (..custom_ops), one per launch; the
# sums between them stay plain torch operations


def key_pass(k: Tensor, v: Tensor, k_bias: Optional[Tensor],
             tk: Optional[Tensor], rot: Optional[Tensor], map_w: int,
             chunks: int, per: int, block: int,
             atomic: bool) -> Tuple[Tensor, Tensor]:
    """The forward's key pass: partial ``R(k')^T v`` ``(B h, slots, 2d,
    d)`` and ``sum k'`` ``(B h, slots, 2d)``, float32
    (:func:`~pola_mm.ops.launch.partial_sums`)."""
    m_part, ks_part = _key_pass_fake(k, v, k_bias, tk, rot, map_w, chunks,
                                     per, block, atomic)
    B, H, n, d = k.shape
    kb, tk_arg, s_b = _key_args(k, k_bias, tk)
    rot_ptr, hm, wm = _rot_args(rot, map_w, m_part)
    with on_device(k):
        _fwd_keys_kernel[(B * H, chunks)](
            k, v, kb, tk_arg, rot_ptr, m_part, ks_part, H, n, per, hm, wm,
            *k.stride(), *v.stride(), *s_b,
            D=d, BLOCK_N=block, HAS_ROT=rot is not None,
            SCALED=k_bias is not None or tk is not None, ATOMIC=atomic,
            **_config('key_pass', d).options())
    return m_part, ks_part


def _key_pass_fake(k, v, k_bias, tk, rot, map_w, chunks, per, block,
                   atomic):
    B, H, _, d = k.shape
    return (partial_sums(B * H, chunks, (2 * d, d), k.device, atomic),
            partial_sums(B * H, chunks, (2 * d, ), k.device, atomic))


def query_pass(q: Tensor, t1: Tensor, t2: Tensor, rot: Optional[Tensor],
               map_w: int, M: Tensor, k_mean: Tensor, eps: float,
               block: int) -> Tuple[Tensor, Tensor]:
    """The forward's query pass: ``x`` ``(B, h, N, d)`` in ``q``'s dtype
    and ``1 / (z + eps)`` ``(B, h, N, 2)`` float32."""
    B, H, N, d = q.shape
    x = _token_major(B, H, N, d, q, _store_dtype(q.dtype))
    rz = torch.empty((B, H, N, 2), dtype=torch.float32, device=q.device)
    rot_ptr, hm, wm = _rot_args(rot, map_w, t1)
    with on_device(q):
        _fwd_queries_kernel[(B * H, triton.cdiv(N, block))](
            q, t1, t2, rot_ptr, M, k_mean, x, rz, H, N, float(eps), hm, wm,
            *q.stride(), *x.stride()[:3],
            D=d, HALF=d // 2, W=max(d // 2, 16), BLOCK_N=block,
            HAS_ROT=rot is not None,
            **_config('query_pass', d).options())
    return x.to(q.dtype), rz


def _query_pass_fake(q, t1, t2, rot, map_w, M, k_mean, eps, block):
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
               rot: Optional[Tensor], map_w: int, M: Tensor,
               k_mean: Tensor, rz: Tensor, chunks: int, per: int,
               block: int,
               atomic: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward's query pass (one program per chunk and flow, ``t``
    the temperatures of both flows ``(2, h, 2d)``): ``dq`` (float32, the
    two flows' parts added) and the partial
    ``dM`` ``(B h, slots, 2d, d)``, ``dk_mean`` ``(B h, slots, 2, 2d)``
    and temperature gradients ``(B h, slots, 2, 2d)``, float32."""
    B, H, N, d = q.shape
    dq = torch.zeros((B, H, N, d), dtype=torch.float32, device=q.device)
    dm_part, dkm_part, dt_part = _query_grad_parts(q, chunks, atomic)
    rot_ptr, hm, wm = _rot_args(rot, map_w, t)
    with on_device(q):
        _bwd_queries_kernel[(B * H, chunks, 2)](
            dx, q, x, t, rot_ptr, M, k_mean, rz, dq,
            dm_part, dkm_part, dt_part, H, N, per, hm, wm,
            *dx.stride(), *q.stride(), *x.stride(),
            D=d, HALF=d // 2, W=max(d // 2, 16), BLOCK_N=block,
            HAS_ROT=rot is not None, USE_X=x.dtype == torch.float32,
            ATOMIC=atomic, **_config('query_grad', d).options())
    return dq, dm_part, dkm_part, dt_part


def _query_grad_parts(q: Tensor, chunks: int,
                      atomic: bool) -> Tuple[Tensor, ...]:
    """The query backward's float32 partial sums: ``dM``, ``dk_mean`` and
    the temperatures' gradients."""
    B, H, N, d = q.shape
    return tuple(partial_sums(B * H, chunks, tail, q.device, atomic)
                 for tail in ((2 * d, d), (2, 2 * d), (2, 2 * d)))


def _query_grad_fake(dx, q, x, t, rot, map_w, M, k_mean, rz, chunks, per,
                     block, atomic):
    return (torch.empty(q.shape, dtype=torch.float32, device=q.device),
            *_query_grad_parts(q, chunks, atomic))


def key_grad(k: Tensor, v: Tensor, k_bias: Optional[Tensor],
             tk: Optional[Tensor], rot: Optional[Tensor], map_w: int,
             dM: Tensor, dkm: Tensor, need_v: bool, block: int,
             atomic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """The backward's key pass: ``dk`` and ``dv`` (empty unless
    ``need_v``) in their inputs' dtypes, and the partial gradients of the
    key temperature ``(B h, slots, d)`` float32 (empty unless scaled)."""
    B, H, n, d = k.shape
    dk = torch.empty((B, H, n, d), dtype=_store_dtype(k.dtype),
                     device=k.device)
    dv = (torch.empty((B, H, n, d), dtype=_store_dtype(v.dtype),
                      device=k.device) if need_v else dk)
    scaled = k_bias is not None or tk is not None
    dtk_part = _dtk_part(k, scaled, block, atomic)
    kb, tk_arg, s_b = _key_args(k, k_bias, tk)
    rot_ptr, hm, wm = _rot_args(rot, map_w, dM)
    with on_device(k):
        _bwd_keys_kernel[(B * H, triton.cdiv(n, block))](
            k, v, kb, tk_arg, rot_ptr, dM, dkm, dk, dv, dtk_part, H, n, hm,
            wm, *k.stride(), *v.stride(), *s_b,
            D=d, BLOCK_N=block, HAS_ROT=rot is not None, SCALED=scaled,
            NEED_V=need_v, ATOMIC=atomic, **_config('key_grad', d).options())
    return (dk.to(k.dtype), dv.to(v.dtype) if need_v else v.new_empty(0),
            dtk_part)


def _dtk_part(k: Tensor, scaled: bool, block: int, atomic: bool) -> Tensor:
    """The key backward's partial gradients of the key temperature:
    ``(B h, slots, d)`` float32 when scaled, else empty."""
    B, H, n, d = k.shape
    if not scaled:
        return torch.empty(0, dtype=torch.float32, device=k.device)
    return partial_sums(B * H, -(-n // block), (d, ), k.device, atomic)


def _key_grad_fake(k, v, k_bias, tk, rot, map_w, dM, dkm, need_v, block,
                   atomic):
    return (torch.empty(k.shape, dtype=k.dtype, device=k.device),
            torch.empty(v.shape, dtype=v.dtype, device=v.device)
            if need_v else v.new_empty(0),
            _dtk_part(k, k_bias is not None or tk is not None, block,
                      atomic))


key_pass = register_kernel('pacs_key_pass', key_pass, _key_pass_fake)
query_pass = register_kernel('pacs_query_pass', query_pass, _query_pass_fake)
query_grad = register_kernel('pacs_query_grad', query_grad, _query_grad_fake)
key_grad = register_kernel('pacs_key_grad', key_grad, _key_grad_fake)


def pacs_forward(q: Tensor, k: Tensor, v: Tensor, t1: Tensor, t2: Tensor,
                 hw: Optional[Size2] = None, eps: float = EPS, *,
                 tk: Optional[Tensor] = None,
                 k_bias: Optional[Tensor] = None,
                 block_n: Optional[int] = None,
                 chunks: Optional[int] = None,
                 atomic: Optional[bool] = None
                 ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """PaCS attention forward in two fused kernels (the formula:
    :func:`~.naive.pacs_attention_pytorch`).

    Args:
        q: ``(B, h, N, d)`` queries, any strides, float32/16 or bfloat16.
        k, v: ``(B, h, n, d)`` (``n == N`` with the rotary map).
        t1, t2: the queries' temperatures (``sigmoid(s1)``,
            ``sigmoid(s2)``, divided by ``softplus(scale)`` when scaled),
            broadcastable to ``(1, h, 1, 2d)``.
        hw: the ``(H, W)`` map of the rotary encoding (``H W = N``), or
            None.
        eps: added to the normalisers.
        tk: the keys' temperature, broadcastable to ``(1, h, 1, d)``, or
            None (1).
        k_bias: broadcastable to ``k``, added to the keys, or None.
        block_n: tokens per block (a power of two >= 16; default the
            launch rule's, :func:`~pola_mm.ops.launch.launch_config`).
        chunks: programs per image and head of the key pass (default: about
            two per multiprocessor in all; 2 on the CPU).
        atomic: add the chunks' partial sums atomically (default:
            :func:`~pola_mm.ops.launch.reduce_atomically`).

    Returns:
        ``x`` ``(B, h, N, d)`` in ``q.dtype`` (laid out ``(B, N, h, d)``:
        the heads merge back without a copy), ``M = R(k')^T v
        / N`` ``(B, h, 2d, d)``, ``k_mean`` ``(B, h, 2d)`` and ``1 / (z +
        eps)`` of both flows ``(B, h, N, 2)``, these three float32.

    Raises:
        ValueError: where :func:`fits` is False.
    """
    _check(q, k, v, hw, k_bias)
    B, H, N, d = q.shape
    n = k.shape[2]
    block = _block_size(block_n, 'key_pass', d)
    t1c, t2c = _temps(t1, H, 2 * d), _temps(t2, H, 2 * d)
    tkc = None if tk is None else _temps(tk, H, d)
    rot, map_w = _rotary(hw, q)
    nchunks, per = split_tokens(n, block, B * H, q.device, chunks)
    atomic = reduce_atomically() if atomic is None else atomic
    m_part, ks_part = key_pass(k, v, k_bias, tkc, rot, map_w, nchunks, per,
                               block, atomic)
    M = sum_slots(m_part).div_(N)
    k_mean = sum_slots(ks_part).div_(n)
    x, rz = query_pass(q, t1c, t2c, rot, map_w, M, k_mean, float(eps),
                       _block_size(block_n, 'query_pass', d))
    return x, M.view(B, H, 2 * d, d), k_mean.view(B, H, 2 * d), rz


def pacs_backward(dx: Tensor, q: Tensor, k: Tensor, v: Tensor, t1: Tensor,
                  t2: Tensor, hw: Optional[Size2], x: Tensor, M: Tensor,
                  k_mean: Tensor, rz: Tensor, *,
                  tk: Optional[Tensor] = None,
                  k_bias: Optional[Tensor] = None, need_v: bool = True,
                  block_n: Optional[int] = None,
                  chunks: Optional[int] = None,
                  atomic: Optional[bool] = None
                  ) -> Tuple[Tensor, Tensor, Optional[Tensor], Tensor,
                             Tensor, Optional[Tensor]]:
    """PaCS attention backward in two fused kernels, the features
    recomputed.

    Args:
        dx: ``(B, h, N, d)`` gradient of the output, any dtype and strides.
        q, k, v, t1, t2, hw, tk, k_bias: the inputs of
            :func:`pacs_forward`.
        x, M, k_mean, rz: its outputs (``x`` any strides, read only when
            float32: else recomputed in float32).
        need_v: compute ``dv`` (else None).
        block_n: tokens per block (as :func:`pacs_forward`).
        chunks: programs per image and head of the query pass (default:
            about two per multiprocessor in all; 2 on the CPU).
        atomic: as :func:`pacs_forward`.

    Returns:
        ``dq`` ``(B, h, N, d)``, ``dk``, ``dv`` ``(B, h, n, d)`` in the
        dtypes of ``q``, ``k``, ``v`` (contiguous; ``dv`` None without
        ``need_v``; ``dk`` is also the gradient of ``k + k_bias``),
        ``dt1``, ``dt2`` ``(h, 2d)`` and ``dtk`` ``(h, d)`` (None unless
        ``tk`` or ``k_bias`` is given) float32: the gradients of the
        temperatures themselves, summed over the batch and the tokens.

    Raises:
        ValueError: where :func:`fits` is False.
    """
    _check(q, k, v, hw, k_bias)
    B, H, N, d = q.shape
    n = k.shape[2]
    block = _block_size(block_n, 'query_grad', d)
    t1c, t2c = _temps(t1, H, 2 * d), _temps(t2, H, 2 * d)
    tkc = None if tk is None else _temps(tk, H, d)
    rot, map_w = _rotary(hw, q)
    M = M.to(torch.float32).contiguous()
    k_mean = k_mean.to(torch.float32).contiguous()
    rz = rz.to(torch.float32).contiguous()
    nchunks, per = split_tokens(N, block, B * H, q.device, chunks)
    atomic = reduce_atomically() if atomic is None else atomic
    dq, dm_part, dkm_part, dt_part = query_grad(
        dx, q, x, torch.stack((t1c, t2c)), rot, map_w, M, k_mean, rz,
        nchunks, per, block, atomic)
    dM = sum_slots(dm_part).div_(N)  # M = R(k')^T v / N
    dkm = sum_slots(dkm_part).sum(dim=1).div_(n)  # k_mean = sum(k') / n
    dt = dt_part.view(B, H, -1, 2, 2 * d).sum(dim=(0, 2))
    dk, dv, dtk_part = key_grad(k, v, k_bias, tkc, rot, map_w, dM, dkm,
                                need_v, _block_size(block_n, 'key_grad', d),
                                atomic)
    dtk = (dtk_part.view(B, H, -1, d).sum(dim=(0, 2))
           if dtk_part.numel() else None)
    return (dq.to(q.dtype), dk, dv if need_v else None, dt[:, 0], dt[:, 1],
            dtk)


def temperatures(s1: Tensor, s2: Tensor, scale: Optional[Tensor], h: int,
                 d: int) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """The kernels' temperatures of the op's raw parameters, float32:
    ``t1 = sigmoid(s1)``, ``t2 = sigmoid(s2)`` ``(1, h, 1, 2d)`` and, with
    ``scale``, ``tk = 1 / softplus(scale)`` ``(1, h, 1, d)`` by which
    ``t1`` and ``t2`` are multiplied too (dividing ``q`` and ``k`` by
    ``softplus(scale)``: ``relu(q / s) = relu(q) / s``)."""
    t1, t2 = (torch.sigmoid(s.to(torch.float32)).expand(1, h, 1, 2 * d)
              for s in (s1, s2))
    if scale is None:
        return t1, t2, None
    tk = (1 / F.softplus(scale.to(torch.float32))).expand(1, h, 1, d)
    both = tk.repeat(1, 1, 1, 2)
    return t1 * both, t2 * both, tk


class PaCSTritonFunction(torch.autograd.Function):
    """The kernels with their backward, as a function of the raw
    parameters ``s1``, ``s2``, ``scale`` (:func:`temperatures`): saves
    ``q``, ``k``, ``v`` as given (half precision stays half), the
    parameters, the output, ``M``, ``k_mean`` and ``1 / (z + eps)``; no
    feature map."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, s1: Tensor,
                s2: Tensor, scale: Optional[Tensor],
                k_bias: Optional[Tensor], hw: Optional[Size2],
                eps: float) -> Tensor:
        t1, t2, tk = temperatures(s1, s2, scale, q.shape[1], q.shape[3])
        x, M, k_mean, rz = pacs_forward(q, k, v, t1, t2, hw, eps, tk=tk,
                                        k_bias=k_bias)
        ctx.save_for_backward(q, k, v, s1, s2, scale, k_bias, x, M, k_mean,
                              rz)
        ctx.hw, ctx.eps = hw, eps
        return x

    @staticmethod
    def backward(ctx, dx: Tensor):
        q, k, v, s1, s2, scale, k_bias = ctx.saved_tensors[:7]
        need = ctx.needs_input_grad

        def by_torch():
            inputs = (q, k, v, s1, s2, scale, k_bias, ctx.hw, ctx.eps)
            return recomputed_grads(pacs_attention_torch, inputs, need, dx)

        key = config(q, ctx.hw, scale is not None or k_bias is not None)
        return guarded(key, lambda: _kernel_grads(ctx, dx, need), by_torch)


def _kernel_grads(ctx, dx: Tensor, need: Tuple[bool, ...]) -> tuple:
    """:class:`PaCSTritonFunction`'s gradients by the kernels; those of the
    raw parameters through :func:`temperatures` by the chain rule
    (:func:`_param_grads`)."""
    q, k, v, s1, s2, scale, k_bias, x, M, k_mean, rz = ctx.saved_tensors
    h, d = q.shape[1], q.shape[3]
    t1, t2, tk = temperatures(s1, s2, scale, h, d)
    dq, dk, dv, dt1, dt2, dtk = pacs_backward(
        dx, q, k, v, t1, t2, ctx.hw, x, M, k_mean, rz, tk=tk, k_bias=k_bias,
        need_v=need[2])
    ds1, ds2, dscale = _param_grads(s1, s2, scale, dt1, dt2, dtk, h, d)
    dbias = (sum_to(dk, k_bias.shape).to(k_bias.dtype)
             if k_bias is not None and need[6] else None)
    return (dq, dk, dv, ds1 if need[3] else None, ds2 if need[4] else None,
            dscale if need[5] else None, dbias, None, None)


def _param_grads(s1: Tensor, s2: Tensor, scale: Optional[Tensor],
                 dt1: Tensor, dt2: Tensor, dtk: Optional[Tensor], h: int,
                 d: int) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """The gradients of the raw ``s1``, ``s2``, ``scale`` from those of
    :func:`temperatures`' ``t1``, ``t2`` ``(h, 2d)`` and ``tk`` ``(h,
    d)``: ``t_j = sigmoid(s_j) u`` with ``u = [tk, tk]`` (1 without
    ``scale``), ``tk = 1 / softplus(scale)``, ``dtk / dscale =
    -sigmoid(scale) tk^2``. (By hand, not by ``torch.autograd.grad``,
    which a compiled graph's backward cannot hold.)"""
    g1, g2 = dt1.view(1, h, 1, 2 * d), dt2.view(1, h, 1, 2 * d)
    sig1, sig2 = (torch.sigmoid(s.to(torch.float32)) for s in (s1, s2))
    u = 1.0
    if scale is not None:
        tk = 1 / F.softplus(scale.to(torch.float32))
        u = tk.expand(1, h, 1, d).repeat(1, 1, 1, 2)
    ds1 = sum_to(g1 * u * sig1 * (1 - sig1), s1.shape).to(s1.dtype)
    ds2 = sum_to(g2 * u * sig2 * (1 - sig2), s2.shape).to(s2.dtype)
    if scale is None:
        return ds1, ds2, None
    du = g1 * sig1 + g2 * sig2  # (1, h, 1, 2d): d/du, both halves
    dtk_all = dtk.view(1, h, 1, d) + du[..., :d] + du[..., d:]
    sig = torch.sigmoid(scale.to(torch.float32))
    dscale = sum_to(-dtk_all * sig * tk * tk, scale.shape)
    return ds1, ds2, dscale.to(scale.dtype)


def probe(key: tuple) -> None:
    """Forward and backward of the kernels once, on small inputs of the
    configuration ``key`` (:func:`config`'s) on its device: a failure of
    the configuration there raises (:func:`~pola_mm.ops.launch.usable`)."""
    q, k, v, flags = probe_inputs(key)
    d, device = q.shape[-1], q.device
    s1, s2 = (torch.zeros(1, 2, 1, 2 * d, device=device, requires_grad=True)
              for _ in range(2))
    scale = k_bias = None
    if flags.get('scaled'):
        scale = torch.zeros(1, 2, 1, d, device=device, requires_grad=True)
        k_bias = torch.zeros_like(k, requires_grad=True)
    hw = (8, 10) if flags.get('rotary') else None  # probe_inputs: 80 tokens
    out = pacs_attention_triton(q, k, v, s1, s2, hw=hw, scale=scale,
                                k_bias=k_bias)
    out.float().sum().backward()


def config(q: Tensor, hw: Optional[Size2], scaled: bool) -> tuple:
    """The kernel configuration of these inputs, as a failure is
    remembered (:func:`~pola_mm.ops.launch.guarded`)."""
    return config_key('pacs', q, rotary=hw is not None, scaled=scaled)


def pacs_attention_triton(q: Tensor, k: Tensor, v: Tensor, s1: Tensor,
                          s2: Tensor, scale: Optional[Tensor] = None,
                          k_bias: Optional[Tensor] = None,
                          hw: Optional[Size2] = None,
                          eps: float = EPS) -> Tensor:
    """PaCS polarity attention by the fused kernels (the op's arguments:
    :func:`~pola_mm.ops.pacs_attention`; ``s1``, ``s2``, ``scale`` the
    raw parameters).

    ``q``, ``k``, ``v`` stay in their dtypes in memory (fp16/bf16 under
    autocast); the kernels compute in float32 registers.

    Returns:
        ``(B, h, N, d)`` in ``q``'s dtype.
    """
    if records_grad(q, k, v, s1, s2, scale, k_bias):
        return PaCSTritonFunction.apply(q, k, v, s1, s2, scale, k_bias, hw,
                                        eps)
    t1, t2, tk = temperatures(s1, s2, scale, q.shape[1], q.shape[3])
    return pacs_forward(q, k, v, t1, t2, hw, eps, tk=tk, k_bias=k_bias)[0]
