"""Swin's cyclic shift (:func:`pola_mm.ops.cyclic_shift.cyclic_shift`): one
``roll`` in eager mode, the gather of its reference while a graph is
captured; both equal ``torch.roll`` by ``-shift`` (``+shift`` reversed)."""
import pytest
import torch

from pola_mm.ops import use_implementation
from pola_mm.ops.cyclic_shift import cyclic_shift, cyclic_shift_pytorch


@pytest.mark.parametrize('shift', [(3, 4), (0, 2), (3, 0), (0, 0), (7, 1)])
@pytest.mark.parametrize('reverse', [False, True])
def test_equals_roll(shift, reverse):
    x = torch.randn(2, 7, 9, 3)
    want = torch.roll(x, [s if reverse else -s for s in shift], (1, 2))
    assert torch.equal(cyclic_shift(x, shift, reverse), want)
    assert torch.equal(cyclic_shift_pytorch(x, shift, reverse), want)
    with use_implementation('graph'):
        assert torch.equal(cyclic_shift(x, shift, reverse), want)


def test_eager_is_one_roll_and_a_trace_follows_the_size():
    """Eager: one ``roll`` forward and backward. Traced with the shift taken
    from the map's size, the graph gathers and shifts a map of another size
    by its own amount (a roll would keep the traced constant)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    x = torch.randn(1, 8, 8, 2, requires_grad=True)
    with Ops() as rec:
        cyclic_shift(x, (2, 3)).sum().backward()
    assert rec.names.count('roll') == 2 and 'index_select' not in rec.names

    def f(m):
        return cyclic_shift(m, (m.shape[1] // 4, m.shape[2] // 4))

    traced = torch.jit.trace(f, torch.randn(1, 8, 8, 2), check_trace=False)
    y = torch.randn(1, 12, 16, 2)
    assert torch.equal(traced(y), torch.roll(y, (-3, -4), (1, 2)))
