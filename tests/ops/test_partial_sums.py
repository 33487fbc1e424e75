"""How the kernels' programs combine their partial sums (both ops, under
Triton's interpreter): float32 atomic additions into one slot per image and
head by default, one slot per chunk summed by torch in a fixed order under
``torch.use_deterministic_algorithms(True)`` (mmengine's
``randomness=dict(deterministic=True)``). Both equal the torch
implementation; the per-chunk form gives the same bits on every run."""
import contextlib

import pytest
import torch

import pola_mm.ops.pacs.triton as pacs_kernels
import pola_mm.ops.polarity.triton as polarity_kernels
from pola_mm.ops import launch
from pola_mm.ops.pacs.cpu import pacs_attention_torch
from pola_mm.ops.polarity.cpu import polarity_attention_cpu

pytestmark = pytest.mark.kernels

B, H, N, D = 2, 2, 70, 32


def _inputs(op: str):
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(B, H, N, D, generator=g) for _ in range(3))
    bias = 0.3 * torch.randn(1, H, N, D, generator=g)
    scale = 0.3 * torch.randn(1, H, 1, D, generator=g)
    if op == 'polarity':
        params = (scale, torch.randn(1, H, 1, D, generator=g), bias)
    else:
        params = tuple(torch.randn(1, H, 1, 2 * D, generator=g)
                       for _ in range(2)) + (scale, bias)
    return [t.requires_grad_() for t in (q, k, v) + params]


def _run(op: str, kernels: bool, leaves):
    q, k, v, *params = leaves
    if op == 'polarity':
        scale, power, bias = params
        fn = (polarity_kernels.polarity_attention_triton if kernels else
              polarity_attention_cpu)
        out = fn(q, k, v, scale, power, 4.0, k_bias=bias)
    else:
        s1, s2, scale, bias = params
        fn = (pacs_kernels.pacs_attention_triton if kernels else
              pacs_attention_torch)
        out = fn(q, k, v, s1, s2, scale, bias, (7, 10))
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    return (out, ) + torch.autograd.grad(out, leaves, dy)


@contextlib.contextmanager
def _deterministic(on: bool):
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize('op', ['polarity', 'pacs'])
@pytest.mark.parametrize('deterministic', [False, True],
                         ids=['atomic', 'per-chunk'])
def test_partial_sums_meet_atomically_or_per_chunk(op, deterministic,
                                                   monkeypatch):
    module = polarity_kernels if op == 'polarity' else pacs_kernels
    slots = []

    def recording(bh, chunks, tail, device, atomic):
        slots.append((chunks, atomic))
        return launch.partial_sums(bh, chunks, tail, device, atomic)

    monkeypatch.setattr(module, 'partial_sums', recording)
    leaves = _inputs(op)
    want = _run(op, False, leaves)
    with _deterministic(deterministic):
        assert launch.reduce_atomically() is not deterministic
        got = _run(op, True, leaves)
        again = _run(op, True, leaves)
    # every pass that sums over chunks took the mode, with 2 chunks on the
    # CPU (the interpreter runs the split)
    assert slots and {a for _, a in slots} == {not deterministic}
    assert any(c > 1 for c, _ in slots)
    for a, b in zip(got, want):
        err = float((a - b).detach().abs().max() / b.detach().abs().max())
        assert err < 1e-5, err
    if deterministic:  # the fixed order: the same bits again
        assert all(torch.equal(a, b) for a, b in zip(got, again))


def test_slot_buffers():
    """One zeroed slot for atomic additions, one slot per chunk
    otherwise; summing the slots of an atomic buffer is a view."""
    atomic = launch.partial_sums(6, 4, (3, 2), torch.device('cpu'), True)
    assert atomic.shape == (6, 1, 3, 2) and not atomic.any()
    per_chunk = launch.partial_sums(6, 4, (3, ), torch.device('cpu'), False)
    assert per_chunk.shape == (6, 4, 3)
    assert launch.sum_slots(atomic).data_ptr() == atomic.data_ptr()
    per_chunk.copy_(torch.arange(72.).view(6, 4, 3))
    assert torch.equal(launch.sum_slots(per_chunk), per_chunk.sum(1))
