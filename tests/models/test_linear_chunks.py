"""``linear_chunks``: the parts of one projection (q, k, v, g) are the same
numbers whether computed per part (the CPU path, contiguous parts) or as
views of one product, and a Linear that is observed or replaced is called
as a module (its hooks fire, a subclass's forward runs)."""
import pytest
import torch
import torch.nn as nn

from pola_mm.models.layers.bricks import linear_chunks


@pytest.mark.parametrize('bias', [True, False])
def test_parts_equal_the_views_of_one_product(bias):
    torch.manual_seed(0)
    lin = nn.Linear(12, 4 * 6, bias=bias)
    x = torch.randn(2, 5, 12)
    parts = linear_chunks(lin, x, 4)
    want = lin(x).reshape(2, 5, 4, 6).unbind(-2)
    assert len(parts) == 4
    for p, w in zip(parts, want):
        assert p.shape == (2, 5, 6)
        assert p.is_contiguous()  # per-part products, not strided views
        torch.testing.assert_close(p, w, rtol=1e-6, atol=1e-6)


def test_hooked_or_replaced_linear_is_called_as_a_module():
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8)
    lin = nn.Linear(8, 16)
    calls = []
    handle = lin.register_forward_hook(lambda m, i, o: calls.append(o))
    parts = linear_chunks(lin, x, 2)
    handle.remove()
    assert len(calls) == 1  # a FLOP counter's or extractor's hook sees it
    torch.testing.assert_close(torch.cat(parts, -1), calls[0])

    class Doubled(nn.Linear):  # a wrapper (e.g. an adapter) changes forward
        def forward(self, t):
            return 2 * super().forward(t)

    dbl = Doubled(8, 16)
    torch.testing.assert_close(torch.cat(linear_chunks(dbl, x, 2), -1),
                               dbl(x))
    assert not torch.allclose(torch.cat(linear_chunks(dbl, x, 2), -1),
                              nn.functional.linear(x, dbl.weight, dbl.bias))
