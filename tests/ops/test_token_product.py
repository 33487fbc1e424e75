"""Products over tokens split into chunks (:mod:`pola_mm.ops.token_product`):
the split equals the plain product, its count fills the device, and both
attention kernels equal their references with the split forced on the CPU
(the path a GPU takes)."""
import pytest
import torch

from pola_mm.ops import (pacs_attention, pacs_attention_pytorch,
                         polarity_attention, polarity_attention_naive,
                         rotary_tables)
from pola_mm.ops import token_product as tp

D64 = torch.float64


def _pair(B=2, h=3, K=1000, M=12, N=7, dtype=D64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, h, K, M, generator=g, dtype=dtype),
            torch.randn(B, h, K, N, generator=g, dtype=dtype))


@pytest.mark.parametrize('chunks', [1, 4, 8, 7, 999])  # 7, 999: with a tail
@pytest.mark.parametrize('ones', [False, True])
def test_split_equals_one_product(chunks, ones):
    a, b = _pair()
    want = a.transpose(-2, -1) @ b
    if ones:
        want = torch.cat([want, a.sum(-2).unsqueeze(-1)], -1)
    got = tp.token_product(a, b, ones=ones, chunks=chunks)
    assert got.shape == want.shape and got.dtype == D64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-11)


def test_split_of_bfloat16_inputs_sums_in_float32():
    """Partial products in bfloat16, their sum in float32, the result in
    the inputs' dtype: as close to the exact sum as one bfloat16 rounding
    of it."""
    a, b = (t.bfloat16() for t in _pair(K=4096, dtype=torch.float32))
    got = tp.token_product(a, b, chunks=16)
    assert got.dtype == torch.bfloat16
    want = a.double().transpose(-2, -1) @ b.double()
    err = (got.double() - want).abs().max() / want.abs().max()
    assert err < 8e-3  # bfloat16's rounding is 2^-8 = 3.9e-3 relative


def test_split_gradients_equal_one_product():
    a, b = (t.requires_grad_() for t in _pair(K=300))
    g = torch.randn(2, 3, 12, 8, dtype=D64)
    got = torch.autograd.grad(tp.token_product(a, b, ones=True, chunks=7),
                              (a, b), g)
    want = torch.autograd.grad(
        torch.cat([a.transpose(-2, -1) @ b, a.sum(-2).unsqueeze(-1)], -1),
        (a, b), g)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y)


@pytest.mark.parametrize('batch,m,n,k', [
    (6, 64, 33, 67200), (2, 128, 65, 1050), (1, 64, 33, 16800),
    (12, 64, 33, 4200), (2, 64, 33, 67201), (6, 64, 6, 67200)])
def test_split_count_fills_the_device(batch, m, n, k):
    """On the device the structure tests model (132 multiprocessors): each
    split has a tile per multiprocessor, or chunks shorter than 8 max(m,
    n); a split that divides k leaves no tail; the CPU never splits."""
    meta = torch.device('meta')
    c = tp.split_count(batch, m, n, k, meta)
    tiles = batch * tp._tiles(m, n) * c
    assert tiles >= tp.META_MULTIPROCESSORS or k // c < 8 * max(m, n)
    assert k // c >= 2 * max(m, n) or c == 1  # a divisor up to 2x the count
    if k % c and k % 2 == 0:
        pytest.fail(f'{c} chunks leave a tail of an even k={k}')
    assert tp.split_count(batch, m, n, k, torch.device('cpu')) == 1


@pytest.fixture
def split_on_cpu(monkeypatch):
    """Every token product on the CPU split into 3 chunks (a tail where
    the count does not divide), counted."""
    calls = []
    real = tp.split_count

    def forced(batch, m, n, k, device):
        calls.append((batch, m, n, k))
        return min(3, k) if device.type == 'cpu' else real(
            batch, m, n, k, device)

    monkeypatch.setattr(tp, 'split_count', forced)
    return calls


@pytest.mark.parametrize('N,n', [(40, 40), (41, 40), (40, 13)])
def test_polarity_fast_with_split_equals_formula(split_on_cpu, N, n):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, N, 8, generator=g, dtype=D64)
    k, v = (torch.randn(2, 3, n, 8, generator=g, dtype=D64)
            for _ in range(2))
    scale, power = (torch.randn(1, 3, 1, 8, generator=g, dtype=D64)
                    for _ in range(2))
    bias = torch.randn(1, 3, n, 8, generator=g, dtype=D64)
    leaves = [t.requires_grad_() for t in (q, k, v, scale, power, bias)]
    dy = torch.randn(2, 3, N, 8, dtype=D64)
    got = polarity_attention(*leaves[:5], 2.5, k_bias=leaves[5])
    got_g = torch.autograd.grad(got, leaves, dy)
    assert len(split_on_cpu) == 2  # the key product and the backward's
    want = polarity_attention_naive(q, k + bias, v, scale, power, 2.5)
    want_g = torch.autograd.grad(want, leaves, dy)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for a, b in zip(got_g, want_g):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize('rope', [False, True])
def test_pacs_fast_with_split_equals_formula(split_on_cpu, rope):
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 20, 6, generator=g, dtype=D64)
               for _ in range(3))
    s1, s2 = (torch.randn(1, 2, 1, 12, generator=g, dtype=D64)
              for _ in range(2))
    sin, cos = rotary_tables((4, 5), 12, dtype=D64) if rope else (None, None)
    leaves = [t.requires_grad_() for t in (q, k, v, s1, s2)]
    dy = torch.randn(2, 2, 20, 6, dtype=D64)
    got = pacs_attention(*leaves, hw=(4, 5) if rope else None)
    got_g = torch.autograd.grad(got, leaves, dy)
    # forward: one key product; backward: one per flow without rotary
    # tables, two per flow with them
    assert len(split_on_cpu) == (5 if rope else 3)
    want = pacs_attention_pytorch(*leaves, sin, cos)
    want_g = torch.autograd.grad(want, leaves, dy)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for a, b in zip(got_g, want_g):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
