"""Inputs the attention ops refuse or accept at the edges: integer tensors
get a TypeError naming the dtype and the fix; keys without tokens a
ValueError; queries without tokens an empty output (no computation)."""
import pytest
import torch

from pola_mm.ops import pacs_attention, polarity_attention


def _pola(q, k, v):
    h, d = q.shape[1], q.shape[3]
    return polarity_attention(q, k, v, torch.zeros(1, h, 1, d),
                              torch.zeros(1, h, 1, d), 4.0)


def _pacs(q, k, v):
    h, d = q.shape[1], q.shape[3]
    return pacs_attention(q, k, v, torch.zeros(1, h, 1, 2 * d),
                          torch.zeros(1, h, 1, 2 * d))


OPS = {'polarity_attention': _pola, 'pacs_attention': _pacs}


@pytest.mark.parametrize('name', sorted(OPS))
@pytest.mark.parametrize('which', [0, 1, 2])
def test_integer_inputs_are_refused(name, which):
    qkv = [torch.randn(1, 2, 5, 4) for _ in range(3)]
    qkv[which] = torch.randint(-3, 3, (1, 2, 5, 4))
    with pytest.raises(TypeError, match=r'floating-point .*torch\.int64.*'
                       r'\.float\(\)'):
        OPS[name](*qkv)


@pytest.mark.parametrize('name', sorted(OPS))
def test_keys_without_tokens_are_refused(name):
    q = torch.randn(1, 2, 5, 4)
    k = torch.randn(1, 2, 0, 4)
    with pytest.raises(ValueError, match='at least one token'):
        OPS[name](q, k, k)


@pytest.mark.parametrize('name', sorted(OPS))
@pytest.mark.parametrize('fast', [True, False])
def test_queries_without_tokens_give_an_empty_output(name, fast):
    from pola_mm.ops import use_implementation
    q = torch.randn(2, 2, 0, 4, requires_grad=True)
    k = torch.randn(2, 2, 5, 4)
    with use_implementation('auto' if fast else 'graph'):
        out = OPS[name](q, k, k)
    assert out.shape == (2, 2, 0, 4)
    out.sum().backward()
    assert q.grad.shape == q.shape
