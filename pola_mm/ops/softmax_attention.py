"""Softmax attention (Swin's windows, PolaPP's rotary blocks): the op.

:func:`softmax_attention` runs PyTorch's ``scaled_dot_product_attention``
where it is the faster choice (on GPUs; on the CPU in inference, where it
is several times faster, while for CPU forward + backward the explicit
form is faster: docs/performance.md), else its plain reference
:func:`softmax_attention_pytorch`, the product, softmax and product
written out (fast paths off, export, ``torch.compile``). The two agree up
to float rounding.

Inputs may carry more than one leading dim, e.g. ``(B, nW, h, N, d)`` for
the windows of ``B`` images, with a bias shared by the images
(``(nW, h, N, M)``). In eager mode the op broadcasts that bias and never
tiles it over the batch: the reference adds it to the batched product,
and the fused kernel, which takes 4-D inputs, runs once per image. While
a graph is captured the leading dims are flattened and the bias expanded
to them, one branch-free 4-D product whatever the sizes.
"""
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from . import symbolic_sizes
from .dispatch import (DynamicShapeExportError, capturing, exporting,
                       records_grad, use_fast)

__all__ = ['softmax_attention', 'softmax_attention_pytorch',
           'check_window_export']


def check_window_export(owner: str, hw: Sequence) -> None:
    """Refuse ``torch.export`` (the dynamo ONNX exporter) of shifted-window
    attention with a dynamic height/width outside
    :func:`~.symbolic_sizes.dynamic_export`.

    With symbolic map sizes and torch's default reasoning, ``torch.export``
    turns the window counts (one window or several) into guards that fix
    the input size: the export fails with a long list of unsatisfied
    guards. This raises one :class:`DynamicShapeExportError` instead,
    naming what works. Costs nothing in eager mode, under
    ``torch.compile`` (symbolic sizes allowed, guards being re-compiles
    there), for the tracer (0-d tensor sizes) and inside
    :func:`~.symbolic_sizes.dynamic_export`.
    """
    if not any(isinstance(s, torch.SymInt) for s in hw[:2]):
        return
    config = symbolic_sizes.fx_config()
    if config is not None and config.backed_size_oblivious:
        return
    if exporting():
        fix = ('export inside pola_mm.ops.dynamic_export() (the export '
               'tools do)' if config is not None else
               'this torch lacks the setting (torch.fx\'s '
               'backed_size_oblivious) that pola_mm.ops.dynamic_export() '
               'needs; export')
        raise DynamicShapeExportError(
            f'{owner}: shifted-window attention cannot be exported by '
            'torch.export (the dynamo ONNX exporter) with a dynamic '
            'height/width under torch\'s default size reasoning: its window '
            f'counts become guards that fix the input size. {fix[0].upper()}'
            f'{fix[1:]}, or with the TorchScript exporter '
            "(torch.onnx.export(..., dynamo=False, dynamic_axes={'input': "
            "{2: 'H', 3: 'W'}}); pytorch2onnx.py --exporter torchscript "
            '--dynamic), or with a static height/width')


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, scale: float,
                      bias: Optional[Tensor] = None,
                      dropout_p: float = 0.) -> Tensor:
    """``softmax(scale q k^T + bias) v``, dropout ``dropout_p`` on the
    weights.

    Args:
        q: ``(..., h, N, d)``: ``(B, h, N, d)``, or with more leading dims,
            e.g. ``(B, nW, h, N, d)`` for windows.
        k, v: ``(..., h, M, d)``, the leading dims of ``q``.
        scale: factor of the logits.
        bias: optional additive logits broadcastable to ``(..., h, N, M)``
            (relative position bias, shift masks; e.g. ``(nW, h, N, M)``
            shared by the images), cast to ``q``'s dtype. Broadcast, never
            tiled, in eager mode (see the module docstring).
        dropout_p: dropout rate of the attention weights (pass 0 in eval).

    Returns:
        ``(..., h, N, d)``.
    """
    if bias is not None:
        bias = bias.to(q.dtype)
    if capturing() and q.dim() > 4:
        return _flat_attention(softmax_attention_pytorch, q, k, v, scale,
                               bias, dropout_p)
    if use_fast(q) and (q.device.type != 'cpu'
                        or not records_grad(q, k, v, bias)):
        return _sdpa(q, k, v, scale, bias, dropout_p)
    return softmax_attention_pytorch(q, k, v, scale, bias, dropout_p)


def _flat_attention(attend: Callable[..., Tensor], q: Tensor, k: Tensor,
                    v: Tensor, scale: float, bias: Optional[Tensor],
                    dropout_p: float) -> Tensor:
    """``attend`` (4-D) on inputs with several leading dims, flattened into
    one (views of the inputs), the bias expanded to them: one product for
    every size, without a branch on a size (a captured graph's form: the
    exporters' and runtimes' usual 4-D attention)."""
    if bias is not None:
        bias = bias.expand(*q.shape[:-2], -1, -1).flatten(0, -4)
    return _flat(attend, q, k, v, scale, bias, dropout_p)


def _flat(attend: Callable[..., Tensor], q: Tensor, k: Tensor, v: Tensor,
          scale: float, bias: Optional[Tensor], dropout_p: float) -> Tensor:
    """``attend`` (4-D) on the leading dims flattened into one, with a
    ``bias`` that broadcasts over the flattened dim as it is."""
    y = attend(q.flatten(0, -4), k.flatten(0, -4), v.flatten(0, -4), scale,
               bias, dropout_p)
    return y.view(*q.shape[:-1], v.shape[-1])


def _sdpa_4d(q: Tensor, k: Tensor, v: Tensor, scale: float,
             bias: Optional[Tensor], dropout_p: float) -> Tensor:
    """``scaled_dot_product_attention`` in :func:`softmax_attention`'s
    argument order."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, scale: float,
          bias: Optional[Tensor], dropout_p: float) -> Tensor:
    """``scaled_dot_product_attention``, whose fused kernels take 4-D
    inputs, on inputs with any leading dims, a bias shared over them
    broadcast:

    - one bias for every leading entry (``(1, h, N, M)``): one call on the
      flattened inputs;
    - else one call per entry of the first dim (per image), each with its
      part of the bias; in training (autograd records, e.g. on a GPU) with
      more than one image, one call with the bias expanded to the batch
      instead, since each call's output is kept for backward and their
      stacked copy would be kept again.
    """
    if q.dim() <= 4:
        return _sdpa_4d(q, k, v, scale, bias, dropout_p)
    if bias is None or bias.dim() <= 3 or bias.shape[:-3].numel() == 1:
        if bias is not None:
            # 4-D: PyTorch's fused CPU kernel takes a 4-D mask only (a 3-D
            # one falls back to its unfused math)
            bias = bias.reshape(1, *bias.shape[-3:])
        return _flat(_sdpa_4d, q, k, v, scale, bias, dropout_p)
    if q.shape[0] > 1 and records_grad(q, k, v, bias):
        return _flat_attention(_sdpa_4d, q, k, v, scale, bias, dropout_p)

    def part(i: int) -> Tensor:
        if bias.dim() < q.dim():
            return bias  # broadcast over the first dim already
        return bias[i if bias.shape[0] > 1 else 0]

    outs = [_sdpa(q[i], k[i], v[i], scale, part(i), dropout_p)
            for i in range(q.shape[0])]
    if len(outs) == 1:
        return outs[0].unsqueeze(0)
    # stacked with tokens before heads in memory (the fused kernels' own
    # output layout): a caller's transpose to (..., N, h, d) is then a view
    return torch.stack([o.transpose(-3, -2) for o in outs]).transpose(-3, -2)


def softmax_attention_pytorch(q: Tensor, k: Tensor, v: Tensor, scale: float,
                              bias: Optional[Tensor] = None,
                              dropout_p: float = 0.) -> Tensor:
    """The plain reference of :func:`softmax_attention` (same arguments)."""
    attn = (q * scale) @ k.transpose(-2, -1)
    if bias is not None:
        attn = attn + bias
    attn = attn.softmax(dim=-1)
    if dropout_p > 0:
        attn = F.dropout(attn, dropout_p)
    return attn @ v
