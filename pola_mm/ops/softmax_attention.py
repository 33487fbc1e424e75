"""Softmax attention (Swin's windows, PolaPP's rotary blocks): the op.

:func:`softmax_attention` runs PyTorch's ``scaled_dot_product_attention``
where it is the faster choice (on GPUs; on the CPU in inference, where it
is several times faster, while for CPU forward + backward the explicit
form is faster: docs/performance.md), else its plain reference
:func:`softmax_attention_pytorch`, the product, softmax and product
written out (fast paths off, export, ``torch.compile``). The two agree up
to float rounding.
"""
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .dispatch import (DynamicShapeExportError, exporting, records_grad,
                       use_fast)

__all__ = ['softmax_attention', 'softmax_attention_pytorch',
           'check_window_export']


def check_window_export(owner: str, hw: Sequence) -> None:
    """Refuse ``torch.export`` (the dynamo ONNX exporter) of shifted-window
    attention with a dynamic height/width.

    With symbolic map sizes, ``torch.export`` turns the window counts,
    padding and shift masks into guards that fix the input size: the
    export fails with a long list of unsatisfied guards. This raises one
    :class:`DynamicShapeExportError` instead, naming what works: the
    TorchScript exporter (``dynamo=False`` with ``dynamic_axes``, whose
    traced sizes stay graph values) or a static size. Costs nothing in
    eager mode, under ``torch.compile`` (symbolic sizes allowed, guards
    being re-compiles there) and for the tracer (0-d tensor sizes).
    """
    if not any(isinstance(s, torch.SymInt) for s in hw[:2]):
        return
    if exporting():
        raise DynamicShapeExportError(
            f'{owner}: shifted-window attention cannot be exported by '
            'torch.export (the dynamo ONNX exporter) with a dynamic '
            'height/width: its window counts, padding and shift masks '
            'become guards that fix the input size. Export with the '
            'TorchScript exporter (torch.onnx.export(..., dynamo=False, '
            "dynamic_axes={'input': {2: 'H', 3: 'W'}}); pytorch2onnx.py "
            '--exporter torchscript --dynamic), or with a static '
            'height/width')


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, scale: float,
                      bias: Optional[Tensor] = None,
                      dropout_p: float = 0.) -> Tensor:
    """``softmax(scale q k^T + bias) v``, dropout ``dropout_p`` on the
    weights.

    Args:
        q: ``(B, h, N, d)``.
        k, v: ``(B, h, M, d)``.
        scale: factor of the logits.
        bias: optional additive logits broadcastable to ``(B, h, N, M)``
            (relative position bias, shift masks), cast to ``q``'s dtype.
        dropout_p: dropout rate of the attention weights (pass 0 in eval).

    Returns:
        ``(B, h, N, d)``.
    """
    if bias is not None:
        bias = bias.to(q.dtype)
    if use_fast(q) and (q.device.type != 'cpu'
                        or not records_grad(q, k, v, bias)):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)
    return softmax_attention_pytorch(q, k, v, scale, bias, dropout_p)


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
