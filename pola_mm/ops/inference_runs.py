"""CPU inference of the backbones' blocks in runs.

At detection sizes the large intermediates of the first stages (the 4C
projection, the MLP's hidden layer, at large sizes every full-map tensor)
are larger than glibc's mmap ceiling, so each one is handed back to the OS
when freed and page-faulted afresh the next time. The functions here compute
what the blocks compute, on runs of tokens or grid rows, so that every
intermediate stays small and is reused:

- :func:`polarity_attention_in_runs`: a polarity attention over a whole
  stage map in two passes over runs of grid rows (the keys' state summed
  over all runs, then each run's queries, depth-wise conv on a halo of rows,
  gate and output projection);
- :func:`ffn_in_runs`: a block's feed-forward half on runs of tokens with
  one reused hidden buffer;
- :func:`block_forward_in_runs`: a whole pre-norm block with both;
- :func:`norm_in_place`: a LayerNorm applied in place, in runs.

All are inference only (no autograd) and exact: the tests compare them with
the plain forward. Where they apply is decided by
:func:`~.dispatch.cpu_inference`.
"""
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..typing import Size2
from . import dispatch
from .depthwise_conv import depthwise_conv2d
from .polarity_kernel import polarity_key_state, polarity_query_apply
from .token_runs import linear_out


def _project_parts(attn: nn.Module, x: Tensor,
                   parts: Tuple[int, int]) -> Tuple[Tensor, Tensor]:
    """Two of a polarity attention's ``q, k, v, g`` (indices 0-3) without
    computing the others: ``(0, 3)`` gives ``q, g`` and ``(1, 2)`` gives
    ``k, v``, each ``(..., C)``."""
    C = attn.embed_dims
    if not attn.fused_qkvg:
        linear = attn.qg if parts == (0, 3) else attn.kv
        a, b = linear(x).unflatten(-1, (2, C)).unbind(-2)
        return a, b
    w, bias = attn.qkvg.weight, attn.qkvg.bias
    out = []
    for i in parts:
        rows = slice(i * C, (i + 1) * C)
        out.append(F.linear(x, w[rows], None if bias is None else bias[rows]))
    return out[0], out[1]


def polarity_attention_in_runs(attn: nn.Module, x: Tensor, hw: Size2,
                               rows: int, norm: Optional[nn.Module] = None,
                               residual: bool = False) -> Tensor:
    """``attn(x, hw)`` of a ``PolarityAttention`` on runs of ``rows`` grid
    rows; nothing larger than a run is allocated besides one ``v`` map for
    the conv, which the results then overwrite. No autograd; float32 or
    float64.

    Args:
        attn: the ``PolarityAttention``.
        x: ``(B, N, C)`` tokens of the grid ``hw``.
        hw: ``(H, W)``.
        rows: grid rows per run.
        norm: applied to each run of ``x`` first (a block's ``norm1``, so
            that the normalised map is never held whole).
        residual: return ``x + attention`` instead.

    Returns:
        ``(B, N, C)``.
    """
    B, N, C = x.shape
    H, W = hw
    h, d = attn.num_heads, attn.head_dims
    xmap = x.view(B, H, W, C)
    pos = attn.positional_table(hw).view(1, H, W, C).to(x.dtype)
    scale = attn.scale.to(x.dtype).reshape(1, h, 1, d)
    power = attn.power.to(x.dtype)
    runs = [(r, min(r + rows, H)) for r in range(0, H, rows)]

    def inputs(r0: int, r1: int) -> Tensor:
        run = xmap[:, r0:r1]
        return run if norm is None else norm(run)

    def heads(t: Tensor) -> Tensor:  # (B', r, W, C) -> (B', h, r W, d)
        return t.reshape(t.shape[0], -1, h, d).transpose(1, 2)

    vmap = x.new_empty(B, H, W, C)
    state: Optional[Tensor] = None
    for r0, r1 in runs:
        k, v = _project_parts(attn, inputs(r0, r1), (1, 2))
        vmap[:, r0:r1] = v
        part = polarity_key_state(heads(k), heads(v), scale, power,
                                  attn.alpha, heads(pos[:, r0:r1]))
        state = part if state is None else state.add_(part)
    assert state is not None
    weight, bias = attn.dwc_params(x.dtype)
    ph, pw = attn.dwc.padding
    vchw = vmap.permute(0, 3, 1, 2)  # channels-last (B, C, H, W)
    # The results overwrite the v map once no later run's conv halo reads
    # their rows (one full-size allocation fewer).
    pending: List[Tuple[int, int, Tensor]] = []
    for r0, r1 in runs:
        q, g = _project_parts(attn, inputs(r0, r1), (0, 3))
        y = polarity_query_apply(heads(q), state, float(N), scale, power,
                                 attn.alpha)
        lo, hi = max(r0 - ph, 0), min(r1 + ph, H)
        halo = F.pad(vchw[:, :, lo:hi],
                     (0, 0, ph - (r0 - lo), ph - (hi - r1)))
        conv = depthwise_conv2d(halo, weight, bias, (0, pw))
        y = torch.add(y.transpose(1, 2).reshape(B, r1 - r0, W, C),
                      conv.permute(0, 2, 3, 1))
        y = attn.output(y, g)
        if residual:
            y = y.add_(xmap[:, r0:r1])
        pending.append((r0, r1, y))
        while pending and pending[0][1] <= r1 - ph:
            a, b, done = pending.pop(0)
            vmap[:, a:b] = done
    for a, b, done in pending:
        vmap[:, a:b] = done
    return vmap.view(B, N, C)


def mlp_into(mlp: nn.Module, x: Tensor, out: Tensor, hidden: Tensor) -> None:
    """``fc2(act(fc1(x)))`` of an ``Mlp`` written into ``out`` ``(T, C)``,
    its hidden layer into ``hidden`` (at least ``(T, hidden_features)``),
    so that a caller walking runs of tokens reuses one buffer. Dropout is
    skipped (eval mode); no autograd."""
    h = hidden[:x.shape[0]]
    linear_out(x, mlp.fc1.weight.t(), mlp.fc1.bias, h)
    if type(mlp.act) is nn.GELU:
        torch.ops.aten.gelu_(h, approximate=mlp.act.approximate)
    else:
        h = mlp.act(h)
    linear_out(h, mlp.fc2.weight.t(), mlp.fc2.bias, out)


def ffn_in_runs(block: nn.Module, x: Tensor, inplace: bool = False) -> Tensor:
    """``x + mlp(norm2(x))`` of a block in eval mode, in runs of tokens (one
    reused hidden buffer); with ``inplace`` (for a contiguous ``x`` the
    block itself made) the runs are added into ``x``. Small maps run in
    one go."""
    mlp, norm2 = block.mlp, block.norm2
    C = x.shape[-1]
    step = max(dispatch.FFN_RUN_ELEMENTS // mlp.fc1.out_features,
               dispatch.FFN_MIN_TOKENS)
    if x.numel() <= step * C:
        return x + mlp(norm2(x))
    flat = x.view(-1, C) if inplace else x.reshape(-1, C)
    out = flat if inplace else torch.empty_like(flat)
    fused = (not dispatch.cpu_autocast_enabled()
             and mlp.fc1.weight.dtype == x.dtype)
    hidden = (flat.new_empty(step, mlp.fc1.out_features) if fused else None)
    scratch = flat.new_empty(step, C) if fused and inplace else None
    for i in range(0, flat.shape[0], step):
        t, o = flat[i:i + step], out[i:i + step]
        if hidden is None:
            o.copy_(t + mlp(norm2(t)))
        elif scratch is None:  # one hidden buffer for every run
            mlp_into(mlp, norm2(t), o, hidden)
            o.add_(t)
        else:
            y = scratch[:t.shape[0]]
            mlp_into(mlp, norm2(t), y, hidden)
            t.add_(y)
    return out.view(x.shape)


def block_forward_in_runs(block: nn.Module, x: Tensor, hw: Size2) -> Tensor:
    """A pre-norm block (``norm1``, ``attn``, ``norm2``, ``mlp``) in eval
    mode: a polarity attention over a map taller than one run goes through
    :func:`polarity_attention_in_runs` (with its residual), any other
    attention through the block's own ``_attend``; then
    :func:`ffn_in_runs`."""
    from ..models.layers.polarity_attention import PolarityAttention
    rows = max(1, dispatch.ATTN_RUN_ELEMENTS // (hw[1] * x.shape[-1]))
    if (isinstance(block.attn, PolarityAttention) and rows < hw[0]
            and block.attn.feature_map == 'power'
            and block.attn.sr_ratio == 1
            and x.dtype in (torch.float32, torch.float64)
            and not dispatch.cpu_autocast_enabled()):
        x = polarity_attention_in_runs(block.attn, x, hw, rows,
                                       norm=block.norm1, residual=True)
        return ffn_in_runs(block, x, inplace=True)
    return ffn_in_runs(block, x + block._attend(block.norm1(x), hw))


def norm_in_place(norm: nn.Module, x: Tensor) -> Tensor:
    """``norm(x)`` for a contiguous ``x`` ``(..., C)``, written over ``x``
    in runs of ``dispatch.NORM_RUN_ELEMENTS`` (no second full-size map);
    returns ``x``."""
    flat = x.view(-1, x.shape[-1])
    step = max(1, dispatch.NORM_RUN_ELEMENTS // flat.shape[1])
    for i in range(0, flat.shape[0], step):
        flat[i:i + step] = norm(flat[i:i + step])
    return x
