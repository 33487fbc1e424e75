"""``linear(x * g)`` saving only ``x`` and ``g`` (the op
:func:`pola_mm.ops.gate_linear`): its fast function against the plain
reference's values and gradients (float64 gradcheck, autocast), what it
saves for backward, and the polarity attention with it and without."""
import pytest
import torch
from helpers import count_calls, randomise, saved_storages
from torch.autograd import gradcheck

import pola_mm.ops as ops
from pola_mm.models.layers import PolarityAttention
from pola_mm.ops.gate_linear import (GateLinearFunction, gate_linear,
                                     gate_linear_pytorch)


def _linear(weight, bias) -> torch.nn.Linear:
    """An ``nn.Linear`` with (copies of) ``weight`` and ``bias``."""
    lin = torch.nn.Linear(weight.shape[1], weight.shape[0],
                          bias=bias is not None, dtype=weight.dtype)
    with torch.no_grad():
        lin.weight.copy_(weight)
        if bias is not None:
            lin.bias.copy_(bias)
    return lin


@pytest.mark.parametrize('bias', [True, False])
def test_gradcheck_and_equals_reference(bias):
    torch.manual_seed(0)
    x, g = (torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    w = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True) \
        if bias else None
    inputs = (x, g, w, b)
    assert gradcheck(GateLinearFunction.apply, inputs)
    lin = _linear(w, b)
    inputs = (x, g, lin.weight, lin.bias)
    out, ref = gate_linear(x, g, lin), gate_linear_pytorch(*inputs)
    assert out.grad_fn.name() == 'GateLinearFunctionBackward'
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    wanted = [t for t in inputs if t is not None]
    gy = torch.randn(ref.shape, dtype=torch.float64)
    for a, r in zip(torch.autograd.grad(out, wanted, gy),
                    torch.autograd.grad(ref, wanted, gy)):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)


def test_saves_only_inputs_and_autocast():
    """Keeps ``x``, ``g`` and the weight, not ``x * g`` (float32 and bf16
    autocast, where neither the bf16 product nor the bf16 weight copy is
    kept); under autocast the values and gradient dtypes of the plain
    layers."""
    torch.manual_seed(1)
    lin = torch.nn.Linear(8, 8)
    x0, g0 = torch.randn(3, 7, 8), torch.randn(3, 7, 8)
    for amp in (False, True):
        results = []
        for fn in (lambda x, g: gate_linear(x, g, lin),
                   lambda x, g: gate_linear_pytorch(x, g, lin.weight,
                                                    lin.bias)):
            x, g = (t.clone().requires_grad_() for t in (x0, g0))
            with torch.autocast('cpu', dtype=torch.bfloat16, enabled=amp):
                out, saved = saved_storages(fn, x, g)
            own = {t.untyped_storage()._cdata
                   for t in (x, g, lin.weight, lin.bias)}
            extra = {s for s, _ in saved} - own
            grads = torch.autograd.grad(out.float().square().sum(),
                                        [x, g, lin.weight, lin.bias])
            results.append((out, extra, grads, (x, g)))
        (out, extra, grads, _), (ref, ref_extra, ref_grads, _) = results
        assert extra == set() and len(ref_extra) >= 1
        assert out.dtype == ref.dtype
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        for a, r in zip(grads, ref_grads):
            assert a.dtype == r.dtype
            torch.testing.assert_close(a, r, rtol=2e-2, atol=2e-2)


def test_attention_fast_and_plain_paths_agree(monkeypatch):
    """The attention's output step takes the function with fast paths on
    and the plain layers with them off; outputs and gradients agree."""
    torch.manual_seed(2)
    a = PolarityAttention(16, 2, (5, 6))
    randomise(a, std=0.3)
    x = torch.randn(2, 7 * 9, 16)
    calls = count_calls(monkeypatch, GateLinearFunction, 'apply')
    results = []
    for plain in (False, True):
        a.zero_grad()
        xi = x.clone().requires_grad_()
        with ops.use_implementation('graph') if plain else torch.enable_grad():
            y = a(xi, (7, 9))
        y.square().sum().backward()
        results.append([y.detach(), xi.grad] +
                       [p.grad.clone() for p in a.parameters()])
        assert len(calls) == 1
    for u, w in zip(*results):  # the kernel against the plain formula
        torch.testing.assert_close(u, w, rtol=1e-3, atol=1e-4)
