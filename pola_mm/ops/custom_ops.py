"""The attention kernels as torch custom ops.

Each Triton kernel launch of :mod:`pola_mm.ops` is one torch custom op
(``pola_mm::<name>``) with a fake implementation: on ``meta`` and fake CUDA
tensors the op gives its outputs' shapes, dtypes and strides without
running, so the memory estimates and the structure tests see what a GPU
runs, one launch per op. On torch < 2.4 (no ``torch.library.custom_op``)
the functions stay plain functions and the kernels are not used
(:func:`~pola_mm.ops.dispatch.implementation`).
"""
from typing import Callable

import torch

__all__ = ['register_kernel']


def register_kernel(name: str, fn: Callable, fake: Callable) -> Callable:
    """``fn`` as the custom op ``pola_mm::name`` with the fake
    implementation ``fake`` (same arguments; allocates the outputs only);
    ``fn`` itself on torch < 2.4. ``fn``'s annotations give the op's
    schema; it must not return its inputs or views of them."""
    custom_op = getattr(torch.library, 'custom_op', None)
    if custom_op is None:  # pragma: no cover - torch < 2.4
        return fn
    op = custom_op(f'pola_mm::{name}', fn, mutates_args=())
    op.register_fake(fake)
    return op
