"""The structure of a GPU step, proved on ``meta`` tensors (no GPU needed):
at 800x1344 no batched product over tokens leaves a 132-multiprocessor GPU
idle, and no positional table resizes through the atomic
``upsample_bicubic2d_backward``.

A batched product ``(b, M, K) @ (b, K, N)`` runs ``b ceil(M/128)
ceil(N/128)`` output tiles of 128x128; where ``K`` is long (at least
``8 max(M, N)``) it must have at least one tile per multiprocessor, or the
GPU runs a few thread blocks for ``K`` steps each (an H200 profile of a
Pola-Swin-T training step: 11.4 ms of its 76.9 ms). On ``meta`` the ops take
the GPU's path (one run, split products for 132 multiprocessors)."""
import collections
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pola_mm.analysis.zoo import build
from pola_mm.ops import dispatch
from pola_mm.ops.token_product import META_MULTIPROCESSORS, TILE

aten = torch.ops.aten


class _Products(TorchDispatchMode):
    """Records every batched product's ``(b, M, K, N)`` and counts ops."""

    def __init__(self):
        super().__init__()
        self.products = []
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        self.ops[packet.__name__] += 1
        if packet in (aten.bmm, aten.baddbmm):
            a, b = args[:2] if packet is aten.bmm else args[1:3]
            self.products.append((a.shape[0], a.shape[1], a.shape[2],
                                  b.shape[2]))
        return func(*args, **(kwargs or {}))


def _idle(b, M, K, N):
    tiles = b * math.ceil(M / TILE) * math.ceil(N / TILE)
    return tiles < META_MULTIPROCESSORS and K >= 8 * max(M, N)


@pytest.mark.parametrize('kernels', [True, False],
                         ids=['kernels', 'torch-path'])
@pytest.mark.parametrize('train', [True, False], ids=['train', 'infer'])
@pytest.mark.parametrize('name', ['pola_swin_t', 'pola_pvt_t', 'polapp_b2'])
def test_products_fill_the_gpu_at_800x1344(name, train, kernels):
    """With the attention's Triton kernels (the GPU's default) the
    products over tokens are inside the kernels, whose grid splits the
    tokens; without them (``POLA_MM_OPS=cpu``) the torch path's products
    are split."""
    built = build(name)
    model = built.model
    model.train(train)
    model.to('meta')
    x = torch.empty(2 if train else 1, 3, 800, 1344, device='meta')
    dispatch.set_implementation('auto' if kernels else 'cpu')
    try:
        with _Products() as rec:
            if train:
                outs = built.forward(x)
                sum(o.sum() for o in outs).backward()
            else:
                with torch.no_grad():
                    built.forward(x)
    finally:
        dispatch.set_implementation('auto')
    kernel_ops = [op for op in rec.ops if op.endswith('_pass')]
    if kernels:
        assert kernel_ops, sorted(rec.ops)
    else:
        # the products over tokens exist (head-sized outputs summed over a
        # stage's tokens, split or not) ...
        assert not kernel_ops
        assert any(b * K >= 16800 and max(M, N) <= 256
                   for b, M, K, N in rec.products), rec.products
    # ... and none of them leaves the GPU idle
    idle = [p for p in rec.products if _idle(*p)]
    assert not idle, f'{name}: products with too few tiles: {idle}'
    assert rec.ops['upsample_bicubic2d_backward'] == 0
    assert rec.ops['upsample_bicubic2d'] == 0  # the separable products


def test_the_rule_sees_the_unsplit_product():
    """The check fails the product shape the H200 profile found (6 images x
    heads, 64 x 33 outputs, K = 67200) and passes its split."""
    assert _idle(6, 64, 67200, 33)
    from pola_mm.ops.token_product import split_count
    c = split_count(6, 64, 33, 67200, torch.device('meta'))
    assert c > 1 and not _idle(6 * c, 64, 67200 // c, 33)
