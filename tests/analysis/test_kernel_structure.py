"""What a GPU runs with the attention kernels, proved on ``meta`` tensors
(no GPU needed: on ``meta`` the layers and ops take the GPU's code paths,
the attention ops the kernels', whose custom ops give their outputs'
shapes; fake CUDA tensors cannot run a backward without a GPU): at
800x1344, batch 2, a training step writes no ``(B, h, N, 2d)`` feature map
in the attention, and Pola-Swin-T launches fewer kernels than mmdet's
Swin-T.

Every aten op that computes counts as one kernel launch; views,
allocations and ``detach`` launch nothing. The kernels' custom ops count
one each (one Triton launch per op)."""
import contextlib
from typing import Set, Tuple

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pola_mm.analysis.zoo import build
from pola_mm.ops import dispatch, observe_calls

pytestmark = pytest.mark.kernels

#: Ops that write nothing: allocations and aliases without a view tag.
_NO_KERNEL = {'empty', 'empty_like', 'new_empty', 'empty_strided',
              'new_empty_strided', 'detach', 'lift_fresh', 'alias',
              '_reshape_alias', '_unsafe_view', 'set_', 'resize_',
              'promote_types'}


def _launches(func) -> bool:
    name = func.overloadpacket.__name__
    return not (getattr(func, 'is_view', False) or name in _NO_KERNEL)


class _Recorder(TorchDispatchMode):
    """Counts kernel launches and records the shapes of every output."""

    def __init__(self):
        super().__init__()
        self.launches = 0
        self.shapes: Set[Tuple[int, ...]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _launches(func):
            self.launches += 1
            for t in out if isinstance(out, (tuple, list)) else (out, ):
                if isinstance(t, torch.Tensor):
                    self.shapes.add(tuple(t.shape))
        return out


@contextlib.contextmanager
def _feature_shapes(found: Set[Tuple[int, ...]]):
    """The shapes a feature map of each attention call would have:
    ``(B, h, N, 2d)`` of the queries and ``(B, h, n, 2d)`` of the keys."""

    @contextlib.contextmanager
    def observer(op, arguments):
        if op.__name__ not in ('polarity_attention', 'pacs_attention'):
            yield
            return
        q, k = arguments['q'], arguments['k']
        found.add(tuple(q.shape[:-1]) + (2 * q.shape[-1], ))
        found.add(tuple(k.shape[:-1]) + (2 * k.shape[-1], ))
        yield

    with observe_calls(observer):
        yield


def _train_step(name: str, batch: int = 2) -> Tuple[_Recorder, set]:
    built = build(name)
    model = built.model
    model.train()
    model.to('meta')
    x = torch.empty(batch, 3, 800, 1344, device='meta')
    forbidden: Set[Tuple[int, ...]] = set()
    with built.paths(), _feature_shapes(forbidden), _Recorder() as rec:
        outs = built.forward(x)
        sum(o.sum() for o in outs).backward()
    return rec, forbidden


@pytest.mark.parametrize('name', ['pola_swin_t', 'pola_pvt_t', 'polapp_b2'])
def test_no_feature_map_is_written(name):
    rec, forbidden = _train_step(name)
    assert forbidden, 'no attention op was called'
    assert not rec.shapes & forbidden, sorted(rec.shapes & forbidden)


def test_the_check_sees_the_feature_maps_of_the_torch_path():
    """Without the kernels (the torch path on ``meta``) the feature maps
    are written: the check above can fail."""
    dispatch.set_implementation('cpu')
    try:
        rec, forbidden = _train_step('pola_pvt_t')
    finally:
        dispatch.set_implementation('auto')
    assert rec.shapes & forbidden


def test_pola_swin_t_launches_fewer_kernels_than_swin_t():
    pola, _ = _train_step('pola_swin_t')
    swin, _ = _train_step('swin_t')
    print(f'kernel launches per training step at 800x1344, batch 2: '
          f'Pola-Swin-T {pola.launches}, Swin-T {swin.launches}')
    assert pola.launches < swin.launches
