"""What each aten operation costs: the counter's per-operation handlers
(shapes -> FLOPs, 1 multiply-add = 1 FLOP).

- matrix products (``mm``, ``addmm``, ``bmm``, ``baddbmm``): ``m k n``;
- convolutions: output elements x ``in_channels / groups`` x kernel area
  (transposed: every input element meets a full kernel);
- every ``scaled_dot_product_attention`` kernel: its two products,
  :func:`~.formulas.softmax_attention_flops`;
- normalisation as mmengine charges it: LayerNorm / GroupNorm 5 per
  element with an affine transform, 4 without; BatchNorm in eval 2 per
  element with affine, 1 without (in training as LayerNorm);
- bilinear upsampling and ``grid_sample`` 4 per output element, nearest
  1; adaptive average pooling and ``mean`` (global average pooling) 1 per
  input element.

Every other aten op (elementwise work, data movement) is not counted, as
in mmengine. :data:`SHAPE_ONLY` and :func:`zeros_of_shape` are how a count
with ``compute=False`` skips the heavy ops.
"""
from typing import Any, Callable, Dict, Optional, Sequence

import torch
from torch import Tensor

from .formulas import softmax_attention_flops

__all__ = ['aten_costs', 'SHAPE_ONLY', 'zeros_of_shape']

aten = torch.ops.aten

Shape = Sequence[int]


def _prod(shape: Shape) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def _mm(args: tuple, out: Any) -> int:
    a, b = args[0], args[1]
    return _prod(a.shape) * b.shape[-1]


def _addmm(args: tuple, out: Any) -> int:
    return _mm(args[1:], out)


def _bmm(args: tuple, out: Any) -> int:
    a, b = args[0], args[1]
    return _prod(a.shape) * b.shape[-1]


def _baddbmm(args: tuple, out: Any) -> int:
    return _bmm(args[1:], out)


def _conv(args: tuple, out: Any) -> int:
    # aten.convolution(input, weight, bias, stride, padding, dilation,
    #                  transposed, output_padding, groups)
    x, w = args[0], args[1]
    transposed = bool(args[6]) if len(args) > 6 else False
    if transposed:  # every input element meets a full kernel
        return _prod(x.shape) * _prod(w.shape[1:])
    return _prod(out.shape) * _prod(w.shape[1:])


def _sdpa(args: tuple, out: Any) -> int:
    q, k, v = args[0], args[1], args[2]
    *lead, nq, d = q.shape
    return softmax_attention_flops(_prod(lead), 1, nq, k.shape[-2], d,
                                   v.shape[-1])


def _norm(affine_index: int) -> Callable[[tuple, Any], int]:
    def handler(args: tuple, out: Any) -> int:
        w = args[affine_index] if len(args) > affine_index else None
        return _prod(args[0].shape) * (5 if w is not None else 4)
    return handler


def _batch_norm(weight_index: int, training: Optional[int]) -> Callable:
    def handler(args: tuple, out: Any) -> int:
        train = bool(args[training]) if training is not None else False
        has_affine = args[weight_index] is not None
        if train:
            return _prod(args[0].shape) * (5 if has_affine else 4)
        return _prod(args[0].shape) * (2 if has_affine else 1)
    return handler


def _first_out(out: Any) -> Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def _per_output(scale: int) -> Callable[[tuple, Any], int]:
    return lambda args, out: scale * _first_out(out).numel()


def _per_input(scale: int) -> Callable[[tuple, Any], int]:
    return lambda args, out: scale * args[0].numel()


def aten_costs() -> Dict[Any, Callable[[tuple, Any], int]]:
    """The counted aten ops (overload packets) and their costs
    ``handler(args, out) -> FLOPs``; the ops not in it are not counted."""
    table: Dict[str, Callable[[tuple, Any], int]] = {
        'mm': _mm, 'addmm': _addmm, 'bmm': _bmm, 'baddbmm': _baddbmm,
        'convolution': _conv, '_convolution': _conv,
        '_scaled_dot_product_flash_attention_for_cpu': _sdpa,
        '_scaled_dot_product_flash_attention': _sdpa,
        '_scaled_dot_product_efficient_attention': _sdpa,
        '_scaled_dot_product_cudnn_attention': _sdpa,
        '_scaled_dot_product_fused_attention_overrideable': _sdpa,
        'native_layer_norm': _norm(2),
        'native_group_norm': _norm(1),
        'native_batch_norm': _batch_norm(1, 5),
        '_native_batch_norm_legit': _batch_norm(1, 5),
        '_native_batch_norm_legit_no_training': _batch_norm(1, None),
        'upsample_nearest2d': _per_output(1),
        'upsample_bilinear2d': _per_output(4),
        '_adaptive_avg_pool2d': _per_input(1),
        'mean': _per_input(1),  # global average pooling
        'grid_sampler_2d': _per_output(4),
    }
    return {getattr(aten, name): fn for name, fn in table.items()
            if hasattr(aten, name)}


#: aten ops a count with ``compute=False`` does not run (the matrix products,
#: convolutions and fused attention: the bulk of a forward's work): their
#: outputs are zeros of the shape and strides their meta kernels give.
SHAPE_ONLY = (
    'mm', 'addmm', 'bmm', 'baddbmm', 'convolution', '_convolution',
    '_scaled_dot_product_flash_attention_for_cpu',
    '_scaled_dot_product_flash_attention',
    '_scaled_dot_product_efficient_attention',
    '_scaled_dot_product_cudnn_attention',
    '_scaled_dot_product_fused_attention_overrideable')


def zeros_of_shape(func: Any, args: tuple, kwargs: dict) -> Any:
    """What ``func(*args, **kwargs)`` returns, as zeros: the op runs on meta
    tensors (shapes only) and its outputs are made real on the inputs'
    device."""
    from torch.utils._pytree import tree_leaves, tree_map
    device = next((t.device for t in tree_leaves((args, kwargs))
                   if isinstance(t, Tensor)), torch.device('cpu'))

    def meta(t: Any) -> Any:
        return t.to('meta') if isinstance(t, Tensor) else t

    def real(t: Any) -> Any:
        if not isinstance(t, Tensor):
            return t
        return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype,
                                   device=device).zero_()

    return tree_map(real, func(*tree_map(meta, args),
                               **tree_map(meta, kwargs)))
