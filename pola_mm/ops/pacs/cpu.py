"""The PaCS polarity attention (PolaFormer++) on the CPU (and on GPUs
without Triton): memory-lean, in torch operations.

The PaCS feature map is the plain formula's
(:func:`~pola_mm.ops.features.pacs_features`, which
:func:`~.naive.pacs_attention_pytorch` uses too), for
PolaPP's :class:`~pola_mm.models.layers.PaCSAttention` and for
``PolarityAttention(feature_map='pacs')`` alike.

:func:`pacs_attention_cpu` computes exactly the plain formula,
rearranged:

- One key-value product for both flows: the rotary-encoded key features
  ``R(k')`` ``(N, 2d)`` times all of ``v`` ``(N, d)`` gives ``M = [M1, M2]``;
  the same-signed flow uses ``M1``, the opposite-signed one ``M2``, and both
  normalisers share ``mean_N(k')``. (Unlike PolaFormer's power, the two
  flows have their own temperatures, so the query features cannot be shared
  by swapping halves.)
- Products over tokens that fill a GPU (:func:`~.token_product.
  token_product`, split into chunks of tokens where the device would be
  mostly idle); without rotary tables the normaliser ``sum(k')`` is a
  column of ones beside ``v`` in the key product, and the backward's
  ``qf^T da`` and ``qf^T dz`` are one product.
- Recomputation. A custom autograd function saves ``q``, ``k``, ``v``, the
  output, the normalisers ``1 / z`` ``(B, h, N, 2)``, ``M`` and ``mean(k')``,
  never an ``(N, 2d)`` feature map; backward recomputes the features
  elementwise (``exp`` is its own derivative: ``d(e^c - 1) = e^c dc``) and
  applies the adjoint of the rotary encoding, with no matrix product of the
  forward repeated.
- Fewer passes over ``(N, 2d)`` tensors: ``[relu(x), relu(-x)]`` is one
  concatenation rectified in place, the temperature and ``exp(.) - 1``
  apply in place (:func:`~.features.pacs_features`), and
  the rotary encoding (and its adjoint) is one complex product per channel
  pair, ``(x0 + i x1)(cos + i sin)``, since the tables of
  :func:`~pola_mm.ops.rotary.rotary_tables` give both channels of
  a pair the same angle (other tables take the plain
  :func:`~pola_mm.ops.rotary.theta_shift`).

Callers compute in float32 at least (the op
:func:`~.op.pacs_attention` disables autocast
around it: ``exp`` overflows fp16 above 11).

The feature map is written ``exp(x) - 1`` as the authors write it (every
ONNX exporter knows ``exp``; the TorchScript exporter has no
``aten::expm1``). This code never sees a captured graph: the op then runs
the plain formula.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ...type_aliases import Size2
from ..dispatch import records_grad
from ..features import (EPS, pacs_features, polar_halves, split_signs_grad,
                        sum_to)
from ..rotary import rotary_tables, rotate_every_two, theta_shift
from ..token_product import token_product
from .naive import pacs_attention_pytorch

__all__ = ['pacs_attention_cpu', 'pacs_attention_torch',
           'PaCSAttentionFunction']


def _phasor(sin: Tensor, cos: Tensor) -> Optional[Tensor]:
    """``(N, w)`` tables -> ``(N, w / 2)`` complex ``cos + i sin`` when each
    channel pair shares its angle (as :func:`rotary_tables` makes them), so
    that the rotary encoding is one complex product per pair; else None.
    On the ``meta`` device (shapes only: memory estimates, timm's config
    tests) the tables are taken to be :func:`rotary_tables`'."""
    s0, s1 = sin[..., 0::2].contiguous(), sin[..., 1::2].contiguous()
    c0, c1 = cos[..., 0::2].contiguous(), cos[..., 1::2].contiguous()
    if sin.device.type != 'meta' and not (torch.equal(s0, s1)
                                          and torch.equal(c0, c1)):
        return None
    return torch.complex(c0, s0)


def _complex_mul(x: Tensor, e: Tensor) -> Tensor:
    """Pairs of ``x`` ``(..., N, w)`` as complex numbers times ``e``."""
    xc = torch.view_as_complex(x.contiguous().unflatten(-1, (-1, 2)))
    return torch.view_as_real(xc * e).flatten(-2)


#: Rotary tables ``sin``, ``cos`` ``(N, w)`` and, when usable, their
#: complex phasor (:func:`_phasor`); all None without rotary encoding.
_Rotary = Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]


def _rotary(sin: Optional[Tensor], cos: Optional[Tensor]) -> _Rotary:
    """The tables with their phasor (None where the tables do not pair
    up)."""
    if sin is None or cos is None:
        return None, None, None
    return sin, cos, _phasor(sin, cos)


def _rot(x: Tensor, r: _Rotary) -> Tensor:
    """The rotary encoding :func:`~pola_mm.ops.rotary.theta_shift`,
    ``x cos + rotate_every_two(x) sin`` (identity without tables); pairs as
    complex numbers times ``cos + i sin`` when the tables allow."""
    sin, cos, e = r
    if sin is None or cos is None:
        return x
    if e is None:
        return theta_shift(x, sin, cos)
    return _complex_mul(x, e)


def _rot_t(y: Tensor, r: _Rotary) -> Tensor:
    """Adjoint of :func:`_rot`: ``y cos - rotate_every_two(y sin)`` (times
    ``cos - i sin`` as complex pairs)."""
    sin, cos, e = r
    if sin is None or cos is None:
        return y
    if e is None:
        return y * cos - rotate_every_two(y * sin)
    return _complex_mul(y, e.conj())


def _forward(q: Tensor, k: Tensor, v: Tensor, t1: Tensor, t2: Tensor,
             sin: Optional[Tensor], cos: Optional[Tensor], eps: float
             ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Output ``(B, h, N, d)``, ``M`` ``(B, h, 2d, d)``, ``mean(k')``
    ``(B, h, 2d, 1)`` and ``1 / z`` ``(B, h, N, 2)``."""
    N, d = q.shape[-2], q.shape[-1]
    half = d // 2
    r = _rotary(sin, cos)
    kf = pacs_features(k)
    if r[0] is None:  # the normaliser in the same product: k'^T [v, 1]
        R = token_product(kf, v, ones=True).div_(N)
        M, k_mean = R[..., :d], R[..., d:]
    else:
        k_mean = kf.mean(dim=-2, keepdim=True).transpose(-2, -1)
        M = token_product(_rot(kf, r), v).div_(N)
    del kf
    outs, rzs = [], []
    for t, swap, Mc in ((t1, False, M[..., :half]), (t2, True, M[..., half:])):
        qf = pacs_features(q, t, swap)
        rz = (qf @ k_mean).add_(eps).reciprocal_()  # (B, h, N, 1)
        outs.append((_rot(qf, r) @ Mc).mul_(rz))
        rzs.append(rz)
    return torch.cat(outs, -1), M, k_mean, torch.cat(rzs, -1)


class PaCSAttentionFunction(torch.autograd.Function):
    """PaCS attention with feature maps recomputed in backward (see the
    module docstring and :func:`pacs_attention_cpu`)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, s1: Tensor,
                s2: Tensor, sin: Optional[Tensor], cos: Optional[Tensor],
                eps: float) -> Tensor:
        t1, t2 = torch.sigmoid(s1), torch.sigmoid(s2)
        x, M, k_mean, rz = _forward(q, k, v, t1, t2, sin, cos, eps)
        ctx.save_for_backward(q, k, v, s1, s2, sin, cos, x, M, k_mean, rz)
        return x

    @staticmethod
    def backward(ctx, dx: Tensor):
        q, k, v, s1, s2, sin, cos, x, M, k_mean, rz = ctx.saved_tensors
        N, d = q.shape[-2], q.shape[-1]
        half = d // 2
        t1, t2 = torch.sigmoid(s1), torch.sigmoid(s2)
        r = _rotary(sin, cos)
        dq = torch.zeros_like(q)
        dk_mean = None
        dM = []
        dts = []
        flows = ((t1, False, slice(0, half), 0),
                 (t2, True, slice(half, d), 1))
        for t, swap, cols, j in flows:
            # the flow's features, recomputed (pacs_features, keeping c):
            # qf = exp(c t) - 1
            c = polar_halves(q, swap)
            qf = (c * t).exp_().sub_(1)
            rz_j = rz[..., j:j + 1]
            dxj = dx[..., cols]
            da = dxj * rz_j  # d(numerator)
            dz = -(dxj * x[..., cols]).sum(-1, keepdim=True) * rz_j
            if r[0] is None:  # one product for both: qf^T [da, dz]
                both = token_product(qf, torch.cat([da, dz], -1))
                dM.append(both[..., :half])
                part = both[..., half:]  # (B, h, 2d, 1)
            else:
                dM.append(token_product(_rot(qf, r), da))
                part = token_product(qf, dz)
            dqf = _rot_t(da @ M[..., cols].transpose(-2, -1), r)
            dqf = dqf.add_(dz * k_mean.transpose(-2, -1))
            dk_mean = part if dk_mean is None else dk_mean.add_(part)
            dpre = dqf.mul_(qf.add_(1))  # d(c * t)
            dts.append((dpre * c).sum(dim=(0, 2), keepdim=True))
            dq += split_signs_grad(dpre.mul_(t), q, swap)  # d(c) -> dq
        assert dk_mean is not None
        dMc = torch.cat(dM, -1) / N  # (B, h, 2d, d)
        kf = pacs_features(k)  # recomputed
        dv = None
        if ctx.needs_input_grad[2]:
            dv = _rot(kf, r) @ dMc
        dkf = _rot_t(v @ dMc.transpose(-2, -1), r)
        dkf = dkf.add_(dk_mean.transpose(-2, -1) / N).mul_(kf.add_(1))
        dk = split_signs_grad(dkf, k)

        def dparam(dt: Tensor, t: Tensor, s: Tensor) -> Tensor:
            return sum_to(dt * t * (1 - t), s.shape)  # sigmoid'

        ds1 = dparam(dts[0], t1, s1) if ctx.needs_input_grad[3] else None
        ds2 = dparam(dts[1], t2, s2) if ctx.needs_input_grad[4] else None
        return dq, dk, dv, ds1, ds2, None, None, None


def pacs_attention_cpu(q: Tensor, k: Tensor, v: Tensor, s1: Tensor,
                        s2: Tensor, sin: Optional[Tensor] = None,
                        cos: Optional[Tensor] = None,
                        eps: float = EPS) -> Tensor:
    """PaCS polarity attention (the published formula, see
    :func:`~.naive.pacs_attention_pytorch`).

    Args:
        q, k, v: ``(B, h, N, d)``, ``d`` even.
        s1, s2: raw temperatures, ``(1, h, 1, 2d)``.
        sin, cos: optional ``(N, 2d)`` rotary tables of the products.
        eps: added to the normalisers.

    Returns:
        ``(B, h, N, d)``.
    """
    if records_grad(q, k, v, s1, s2):
        return PaCSAttentionFunction.apply(q, k, v, s1, s2, sin, cos, eps)
    t1, t2 = torch.sigmoid(s1), torch.sigmoid(s2)
    return _forward(q, k, v, t1, t2, sin, cos, eps)[0]


def pacs_attention_torch(q: Tensor, k: Tensor, v: Tensor, s1: Tensor,
                         s2: Tensor, scale: Optional[Tensor] = None,
                         k_bias: Optional[Tensor] = None,
                         hw: Optional[Size2] = None, eps: float = EPS,
                         formula: bool = False) -> Tensor:
    """The op's arguments (:func:`~pola_mm.ops.pacs_attention`) by the
    torch implementations, on float32 copies (float64 stays): ``q /
    softplus(scale)`` and ``(k + k_bias) / softplus(scale)``, the rotary
    tables of the map ``hw``, then :func:`pacs_attention_cpu` where it fits
    (as many keys as queries) unless ``formula``, else the formula
    :func:`~.naive.pacs_attention_pytorch`.

    Returns:
        ``(B, h, N, d)`` in float32 (float64 for float64 inputs).
    """
    dt = torch.promote_types(q.dtype, torch.float32)
    q, k, v, s1, s2 = (t.to(dt) for t in (q, k, v, s1, s2))
    if k_bias is not None:
        k = k + k_bias.to(dt)
    if scale is not None:
        s = F.softplus(scale.to(dt))
        q, k = q / s, k / s
    sin = cos = None
    if hw is not None:
        sin, cos = rotary_tables(hw, 2 * q.shape[-1], device=q.device,
                                 dtype=dt)
    fast = not formula and k.shape[-2] == q.shape[-2]
    fn = pacs_attention_cpu if fast else pacs_attention_pytorch
    return fn(q, k, v, s1, s2, sin, cos, eps)
