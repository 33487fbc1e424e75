"""Softmax attention (Swin's windows, PolaPP's rotary blocks): the op.

:func:`softmax_attention` runs PyTorch's ``scaled_dot_product_attention``
where it is the faster choice (on GPUs; on the CPU in inference, where it
is several times faster, while for CPU forward + backward the explicit
form is faster: docs/performance.md), else its plain reference
:func:`softmax_attention_pytorch`, the product, softmax and product
written out (fast paths off, export, ``torch.compile``). The two agree up
to float rounding.
"""
from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from .dispatch import records_grad, use_fast

__all__ = ['softmax_attention', 'softmax_attention_pytorch']


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
