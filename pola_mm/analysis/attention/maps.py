"""The attention rows a block implies, recomputed from its input and its
parameters.

A linear attention never forms its ``N x N`` attention matrix, but every
polarity flow has one implicitly. Per head, with ``q, k`` already divided by
``softplus(scale)`` (and ``k`` plus ``positional_encoding``), ``p = 1 +
alpha * sigmoid(power)``, ``f+(t) = relu(t)^p``, ``f-(t) = relu(-t)^p``:

- same-signed flow: ``S_sim[i, j] = [f+(q_i), f-(q_i)] . [f+(k_j), f-(k_j)]``
  (q and k of the same sign interact);
- opposite-signed flow: ``S_opp[i, j] = [f-(q_i), f+(q_i)] . [f+(k_j),
  f-(k_j)]`` (q and k of opposite signs interact);
- the module computes ``x_sim_i = sum_j S_sim[i, j] v1_j / (sum_j S_sim[i, j]
  + N * 1e-6)`` and ``x_opp`` alike with ``S_opp`` and ``v2`` (the two halves
  of ``v`` per head), so the normalised rows ``S[i] / sum_j S[i, j]`` are the
  attention weights of each flow (up to the module's ``1e-6``);
- **combined** (our definition: the module has no single attention matrix,
  since the flows read different halves of ``v``, the gate ``g`` multiplies
  each channel with its own sign and ``proj`` mixes channels): the mixture
  ``(G_sim A_sim[i] + G_opp A_opp[i]) / (G_sim + G_opp)`` of the two
  normalised rows, where ``G_sim`` (``G_opp``) is the sum of ``|g_i|`` over
  the head's channels that the same-signed (opposite-signed) flow writes.
  It is how much each key contributes to the head's gated attention output
  (summed over channels, in magnitude) at query ``i`` when every channel of
  ``v`` carries the same non-negative value (the conv is not part of it);
- with PolaFormer++'s PaCS feature map (``feature_map='pacs'``) the same
  two flows with ``[f+, f-]`` replaced by ``exp(t_s [relu(q), relu(-q)]) -
  1`` (same-signed), ``exp(t_o [relu(-q), relu(q)]) - 1`` (opposite-signed)
  and ``exp([relu(k), relu(-k)]) - 1`` (``t_s = sigmoid(s1)``, ``t_o =
  sigmoid(s2)`` per channel);
- for comparison, plain ReLU linear attention with the same ``q, k``:
  ``S_relu[i, j] = relu(q_i) . relu(k_j)`` (``p = 1``, no opposite flow);
- the depth-wise conv on ``v`` adds, for channel ``c``, the local matrix
  ``D_c[i, j] = w_c[offset(j - i)]`` (zero outside the ``K x K``
  neighbourhood and the map). The attention plus conv of channel ``c`` is
  the linear map ``A + D_c`` from ``v[:, c]`` to the output (its bias
  aside), the matrix whose rank the paper says the conv restores.

Softmax blocks (Pola-Swin's ``'S'`` stages): the softmax row of a query over
its (shifted, padded) window, laid out over the whole stage map (zero
outside the window).

Only the rows asked for are materialised (``R x N`` per head), so this works
at detection sizes. Everything is computed in float64. For polarity blocks
the module is not re-written: its own forward runs on its captured input
(:func:`~.capture.capture_blocks`) and the q, k, v, positional table,
scale, power (or temperatures) and gate its ops receive are observed
(:func:`polarity_qk`); the conv rows read ``dwc``. For softmax blocks:
``qkv``, the relative position bias and the module's window plan.
"""
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ...models.layers import PolarityAttention
from ...models.layers.window import (cyclic_shift, grid_padding,
                                     shift_region_mask, window_partition)
from ...ops import (gate_linear, pacs_attention, polarity_attention,
                    use_implementation)
from ...ops.features import pacs_features
from ...ops.polarity.naive import feature_params, polarity_features
from ...type_aliases import Size2
from .capture import BlockCapture, op_calls

__all__ = [
    'PolarityQK', 'polarity_qk', 'polarity_scores', 'normalise_rows',
    'combined_rows', 'dwc_rows', 'softmax_rows', 'attention_rows',
    'query_tokens'
]


# -- polarity flows ----------------------------------------------------------
@dataclass
class PolarityQK:
    """A polarity block's per-head tensors, float64.

    Attributes:
        q: ``(B, h, N, d)`` ``q / softplus(scale)``.
        k: ``(B, h, N, d)`` ``(k + positional_encoding) / softplus(scale)``.
        v: ``(B, h, N, d)``.
        g: ``(B, h, N, d)`` gate.
        p: ``(1, h, 1, d)`` exponent ``1 + alpha * sigmoid(power)``
            (``feature_map='power'``), else None.
        hw: the stage map.
        t_same, t_opp: ``(1, h, 1, 2d)`` PaCS temperatures
            ``sigmoid(s1)``, ``sigmoid(s2)`` (``feature_map='pacs'``), else
            None.
    """
    q: Tensor
    k: Tensor
    v: Tensor
    g: Tensor
    p: Optional[Tensor]
    hw: Size2
    t_same: Optional[Tensor] = None
    t_opp: Optional[Tensor] = None

    @property
    def num_tokens(self) -> int:
        return self.q.shape[-2]


@torch.no_grad()
def polarity_qk(attn: PolarityAttention, x: Tensor, hw: Size2) -> PolarityQK:
    """q, k, v, g of a :class:`PolarityAttention` on its input tokens, as its
    own forward hands them to the ops.

    The module runs once on ``x`` (fast paths off) while the calls of the
    attention op (:func:`~pola_mm.ops.polarity_attention` or
    :func:`~pola_mm.ops.pacs_attention`) and of the gated projection
    (:func:`~pola_mm.ops.gate_linear`) are observed
    (:func:`~.capture.op_calls`); their inputs are taken as received, in
    float64, and only the op's own first step is applied to them:
    ``softplus(scale)``, ``k_bias`` and the power of
    :func:`~pola_mm.ops.polarity_attention` (for the PaCS op ``scale`` and
    ``k_bias`` likewise, its temperatures ``sigmoid(s1)``,
    ``sigmoid(s2)``).

    Args:
        attn: the module (all keys: ``sr_ratio`` 1, as every published
            model).
        x: ``(B, N, C)`` its input, ``N = H * W``.
        hw: ``(H, W)``.
    """
    if attn.sr_ratio != 1:
        raise ValueError(f'sr_ratio={attn.sr_ratio}: the rows of reduced '
                         'keys are not analysed (every published model has '
                         'sr_ratio 1)')
    h, d = attn.num_heads, attn.head_dims
    with use_implementation('graph'), op_calls(
            polarity_attention, pacs_attention, gate_linear) as calls:
        attn(x, hw)

    def received(op) -> Dict:
        found = [c.args for c in calls if c.op is op]
        if not found:
            raise RuntimeError(
                f'{type(attn).__name__}.forward did not call '
                f'pola_mm.ops.{op.__name__}: its rows cannot be observed')
        return found[0]

    gate = received(gate_linear)['g'].double()  # (B, N, C)
    g = gate.unflatten(-1, (h, d)).transpose(1, 2)
    pacs = attn.feature_map == 'pacs'
    a = received(pacs_attention if pacs else polarity_attention)
    k = a['k'].double()
    if a['k_bias'] is not None:
        k = k + a['k_bias'].double()
    if pacs:
        s = F.softplus(a['scale'].double())
        return PolarityQK(a['q'].double() / s, k / s, a['v'].double(), g,
                          None, hw, torch.sigmoid(a['s1'].double()),
                          torch.sigmoid(a['s2'].double()))
    s, p = feature_params(a['scale'].double(), a['power'].double(),
                          a['alpha'])
    return PolarityQK(a['q'].double() / s, k / s, a['v'].double(), g, p, hw)


def polarity_scores(qk: PolarityQK, rows: Tensor) -> Dict[str, Tensor]:
    """Unnormalised, non-negative score rows of chosen queries.

    Args:
        qk: from :func:`polarity_qk`.
        rows: ``(R,)`` long, query token indices.

    Returns:
        ``{'same': S_sim, 'opposite': S_opp, 'relu': S_relu}``, each
        ``(B, h, R, N)`` float64 (see the module docstring).
    """
    qr = qk.q[:, :, rows]
    relu = F.relu(qr) @ F.relu(qk.k).transpose(-2, -1)
    if qk.p is None:  # PaCS: exp(t [relu(x), relu(-x)]) - 1
        kk = pacs_features(qk.k).transpose(-2, -1)  # (B, h, 2d, N)
        return dict(same=pacs_features(qr, qk.t_same) @ kk,
                    opposite=pacs_features(qr, qk.t_opp, swap=True) @ kk,
                    relu=relu)
    q_pos, q_neg = polarity_features(qr, qk.p)
    k_pos, k_neg = polarity_features(qk.k, qk.p)
    kk = torch.cat([k_pos, k_neg], -1).transpose(-2, -1)  # (B, h, 2d, N)
    return dict(
        same=torch.cat([q_pos, q_neg], -1) @ kk,
        opposite=torch.cat([q_neg, q_pos], -1) @ kk,
        relu=relu)


def normalise_rows(scores: Tensor) -> Tensor:
    """``scores / scores.sum(-1)``: rows that sum to 1 (a row of zeros stays
    zero)."""
    total = scores.sum(-1, keepdim=True)
    return scores / torch.where(total > 0, total, torch.ones_like(total))


def combined_rows(same: Tensor, opposite: Tensor, g: Tensor) -> Tensor:
    """The gate-weighted mixture of the two flows' normalised rows.

    Args:
        same, opposite: ``(B, h, R, N)`` normalised rows.
        g: ``(B, h, R, d)`` the gate at the same queries; the first ``d/2``
            channels of a head carry the same-signed flow, the rest the
            opposite-signed one.

    Returns:
        ``(B, h, R, N)``, rows summing to 1.
    """
    d = g.shape[-1]
    g_sim = g[..., :d // 2].abs().sum(-1, keepdim=True)
    g_opp = g[..., d // 2:].abs().sum(-1, keepdim=True)
    total = (g_sim + g_opp).clamp_min(1e-300)
    return (g_sim * same + g_opp * opposite) / total


def dwc_rows(attn: PolarityAttention, hw: Size2, rows: Tensor,
             channel: int) -> Tensor:
    """Rows of the depth-wise conv's matrix ``D_c`` for one channel.

    ``(D_c v)[i] = sum_j D_c[i, j] v[j]`` is the conv (zero padding, bias
    aside) of channel ``c`` of a head (the kernel is shared by the heads).

    Args:
        attn: the module.
        hw: ``(H, W)``.
        rows: ``(R,)`` query token indices.
        channel: ``0 <= c < d``.

    Returns:
        ``(R, N)`` float64.
    """
    H, W = hw
    w = attn.dwc.weight[channel, 0].double()  # (K, K)
    K = w.shape[-1]
    r = K // 2
    out = torch.zeros(len(rows), H * W, dtype=torch.float64)
    yi, xi = rows // W, rows % W
    for dy in range(-r, r + 1):
        for dx in range(-r, r + 1):
            y, x = yi + dy, xi + dx
            ok = (y >= 0) & (y < H) & (x >= 0) & (x < W)
            idx = torch.nonzero(ok).flatten()
            out[idx, (y * W + x)[idx]] = w[dy + r, dx + r]
    return out


# -- softmax blocks ----------------------------------------------------------
def _window_ids(hw: Size2, win: Size2, shift: Size2) -> Tensor:
    """``(nW, wh * ww)`` long: the token index (row-major on the map) at each
    window position after padding and the cyclic shift; -1 for padding."""
    H, W = hw
    pad = grid_padding(hw, win)
    Hp, Wp = H + pad[1], W + pad[3]
    ids = torch.full((1, Hp, Wp, 1), -1, dtype=torch.long)
    ids[0, :H, :W, 0] = torch.arange(H * W).view(H, W)
    return window_partition(cyclic_shift(ids, shift), win).squeeze(-1)


@torch.no_grad()
def softmax_rows(cap: BlockCapture, rows: Tensor) -> Tensor:
    """Softmax rows of chosen queries of a Swin window block, over the whole
    stage map (zero outside the query's window).

    The window and shift are the module's own (``window_plan``). Where the
    map is padded to the window and the block does not mask padded keys
    (mmdet's Swin rule, the default), part of each row's mass lies on the
    zero-padded tokens, outside the map: those rows sum to less than 1, and
    the missing mass times the value of a zero token (the ``qkv`` bias) is
    the rest of the block's output.

    Args:
        cap: a softmax block's capture.
        rows: ``(R,)`` query token indices.

    Returns:
        ``(B, h, R, N)`` float64, rows summing to at most 1.
    """
    attn = cap.attn
    hw = cap.hw
    B, N, C = cap.x.shape
    h = attn.num_heads
    win, shift = attn.window_plan(hw)
    ids = _window_ids(hw, win, shift)  # (nW, Nw)
    nW, Nw = ids.shape
    pad = grid_padding(hw, win)
    mask = torch.zeros(nW, Nw, Nw, dtype=torch.float64)
    if shift != (0, 0):
        mask += shift_region_mask((hw[0] + pad[1], hw[1] + pad[3]), win,
                                  shift).double()
    qkv = attn.qkv(cap.x).double().reshape(B, N, 3, h, C // h)
    q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)
    # a zero-padded token's key: the qkv bias (zeros without a bias)
    k_pad = attn.qkv(cap.x.new_zeros(1, C)).double().reshape(3, h, C // h)[1]
    bias = attn.relative_bias(win).double()  # (h, Nw, Nw)
    # where each query sits: its window and its position inside it
    flat = ids.flatten()
    where = torch.full((N, ), -1, dtype=torch.long)
    where[flat[flat >= 0]] = torch.nonzero(flat >= 0).flatten()
    pos = where[rows]
    w_idx, p_idx = pos // Nw, pos % Nw
    keys = ids[w_idx]  # (R, Nw)
    kr = k[:, :, keys.clamp_min(0)]  # (B, h, R, Nw, d)
    kr = torch.where((keys < 0)[None, None, :, :, None],
                     k_pad[None, :, None, None], kr)
    logits = torch.einsum('bhrd,bhrnd->bhrn', q[:, :, rows] * attn.scale, kr)
    logits = logits + bias[:, p_idx][None] + mask[w_idx, p_idx][None, None]
    a = logits.softmax(-1)
    out = torch.zeros(B, h, len(rows), N, dtype=torch.float64)
    valid = keys >= 0
    r_idx = torch.arange(len(rows))[:, None].expand_as(keys)
    out[:, :, r_idx[valid], keys[valid]] = a[:, :, valid]
    return out


# -- public rows -------------------------------------------------------------
def attention_rows(cap: BlockCapture, rows: Tensor,
                   flows: Optional[Sequence[str]] = None
                   ) -> Dict[str, Tensor]:
    """Normalised attention rows of chosen queries over all keys.

    Args:
        cap: a block's capture.
        rows: ``(R,)`` query token indices.
        flows: which rows to return. Polarity blocks: ``'same'``,
            ``'opposite'``, ``'combined'``, ``'relu'`` (default all);
            softmax blocks: ``'softmax'``.

    Returns:
        ``{flow: (B, h, R, N) float64}``, every row summing to 1.
    """
    rows = torch.as_tensor(rows, dtype=torch.long)
    if cap.kind == 'softmax':
        return {'softmax': softmax_rows(cap, rows)}
    qk = polarity_qk(cap.attn, cap.x, cap.hw)
    sc = polarity_scores(qk, rows)
    out = {name: normalise_rows(s) for name, s in sc.items()}
    out['combined'] = combined_rows(out['same'], out['opposite'],
                                    qk.g[:, :, rows])
    order = ['same', 'opposite', 'combined', 'relu']
    flows = order if flows is None else list(flows)
    bad = [f for f in flows if f not in order]
    if bad:
        raise ValueError(f'unknown flows {bad} for a polarity block; '
                         f'choose from {order}')
    return {f: out[f] for f in flows}


def query_tokens(points: Sequence[Tuple[float, float]], image_hw: Size2,
                 map_hw: Size2) -> Tensor:
    """Token indices of image points on a stage map.

    Args:
        points: ``(x, y)`` pixel coordinates on the (resized) input image.
        image_hw: ``(H, W)`` of the input image.
        map_hw: ``(H', W')`` of the stage map.

    Returns:
        ``(R,)`` long, row-major token indices.
    """
    out = []
    for x, y in points:
        if not (0 <= x < image_hw[1] and 0 <= y < image_hw[0]):
            raise ValueError(
                f'query ({x}, {y}) lies outside the {image_hw[1]}x'
                f'{image_hw[0]} (WxH) input image; give x,y pixel '
                'coordinates inside it')
        ty = min(int(y * map_hw[0] / image_hw[0]), map_hw[0] - 1)
        tx = min(int(x * map_hw[1] / image_hw[1]), map_hw[1] - 1)
        out.append(ty * map_hw[1] + tx)
    return torch.tensor(out, dtype=torch.long)
