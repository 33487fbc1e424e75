"""``linear(gelu(h))`` saving only ``h`` (the op
:func:`pola_mm.ops.gelu_linear`): its fast function against the plain
reference's values and gradients (float64 gradcheck, autocast), what it
saves for backward, and where the MLP takes it (fast paths on, autograd
recording, no graph captured)."""
import importlib

import pytest
import torch
import torch.nn as nn
from helpers import count_calls, saved_storages
from torch.autograd import gradcheck

import pola_mm.ops as ops
from pola_mm.models.layers import Mlp
from pola_mm.ops.gelu_linear import (GeluLinearFunction, gelu_linear,
                                     gelu_linear_pytorch)


def _linear(weight, bias) -> nn.Linear:
    """An ``nn.Linear`` with (copies of) ``weight`` and ``bias``."""
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None,
                    dtype=weight.dtype)
    with torch.no_grad():
        lin.weight.copy_(weight)
        if bias is not None:
            lin.bias.copy_(bias)
    return lin


@pytest.mark.parametrize('approximate', ['none', 'tanh'])
@pytest.mark.parametrize('bias', [True, False])
def test_gradcheck_and_equals_reference(approximate, bias):
    torch.manual_seed(0)
    h = torch.randn(2, 7, 10, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 10, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True) \
        if bias else None
    inputs = (h, w, b)
    assert gradcheck(lambda *t: GeluLinearFunction.apply(*t, approximate),
                     inputs)
    lin = _linear(w, b)
    inputs = (h, lin.weight, lin.bias)
    out = gelu_linear(h, lin, approximate)
    ref = gelu_linear_pytorch(*inputs, approximate)
    assert out.grad_fn.name() == 'GeluLinearFunctionBackward'
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    g = torch.randn(ref.shape, dtype=torch.float64)
    wanted = [t for t in inputs if t is not None]
    for a, r in zip(torch.autograd.grad(out, wanted, g),
                    torch.autograd.grad(ref, wanted, g)):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)


def test_only_needed_gradients():
    """A frozen weight or an input without gradient: the other gradients
    still match the reference."""
    torch.manual_seed(1)
    h = torch.randn(9, 6, dtype=torch.float64)
    lin = _linear(torch.randn(4, 6, dtype=torch.float64),
                  torch.randn(4, dtype=torch.float64))
    w, b = lin.weight, lin.bias
    out = gelu_linear(h, lin)
    assert out.grad_fn.name() == 'GeluLinearFunctionBackward'
    for a, r in zip(torch.autograd.grad(out.sum(), [w, b]),
                    torch.autograd.grad(gelu_linear_pytorch(h, w, b).sum(),
                                        [w, b])):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)
    h.requires_grad_(True)
    w.requires_grad_(False)
    out = gelu_linear(h, lin)
    assert out.grad_fn.name() == 'GeluLinearFunctionBackward'
    torch.testing.assert_close(
        torch.autograd.grad(out.sum(), h)[0],
        torch.autograd.grad(gelu_linear_pytorch(h, w, b).sum(), h)[0],
        rtol=1e-12, atol=1e-12)


def test_saves_only_the_pre_activation():
    """The function keeps ``h`` and the weight (a parameter, no extra
    memory); the plain layers keep ``gelu(h)`` too."""
    torch.manual_seed(2)
    h = torch.randn(3, 8, 12, requires_grad=True)
    fc2 = nn.Linear(12, 8)
    params = {fc2.weight.untyped_storage()._cdata,
              fc2.bias.untyped_storage()._cdata}
    out, saved = saved_storages(gelu_linear, h, fc2)
    kept = {s for s, _ in saved} - params
    assert kept == {h.untyped_storage()._cdata}
    ref, ref_saved = saved_storages(gelu_linear_pytorch, h, fc2.weight,
                                    fc2.bias)
    assert len({s for s, _ in ref_saved} - params) == 2  # h and gelu(h)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_autocast_saves_low_precision_h_and_matches_plain():
    """Under (CPU bf16) autocast: same output dtype and values as the
    plain layers, the bf16 ``h`` kept and neither bf16 copy of the weight
    nor ``gelu(h)``; gradients in each input's dtype, equal to the plain
    layers' up to bf16 rounding."""
    torch.manual_seed(3)
    fc1, fc2 = nn.Linear(16, 64), nn.Linear(64, 16)
    x = torch.randn(2, 50, 16)
    params = [fc2.weight, fc2.bias]
    results = []
    for fn in (lambda h: gelu_linear(h, fc2),
               lambda h: gelu_linear_pytorch(h, *params)):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            h = fc1(x).detach().requires_grad_()
            out, saved = saved_storages(fn, h)
        assert h.dtype == out.dtype == torch.bfloat16
        kept = [dt for s, dt in saved if s not in {
            p.untyped_storage()._cdata for p in params}]
        results.append((out, kept, torch.autograd.grad(
            out.float().square().sum(), [h] + params)))
    (out, kept, grads), (ref, ref_kept, ref_grads) = results
    assert kept == [torch.bfloat16]  # h only
    assert len(ref_kept) > 1
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    for a, r in zip(grads, ref_grads):
        assert a.dtype == r.dtype
        torch.testing.assert_close(a, r, rtol=2e-2, atol=1e-2)


def _mlp_step(m: Mlp, x: torch.Tensor):
    m.zero_grad()
    xi = x.clone().requires_grad_()
    out = m(xi)
    out.backward(torch.linspace(-1, 1, out.numel()).view(out.shape))
    return out.detach(), [xi.grad] + [p.grad.clone()
                                      for p in m.parameters()]


@pytest.mark.parametrize('approximate', ['none', 'tanh'])
def test_mlp_fast_and_plain_paths_agree(monkeypatch, approximate):
    """The MLP takes the function with fast paths on and the plain layers
    with them off; outputs and every gradient agree."""
    torch.manual_seed(4)
    m = Mlp(24, 96, act_cfg=dict(type='GELU', approximate=approximate))
    x = torch.randn(2, 33, 24)
    calls = count_calls(monkeypatch, GeluLinearFunction, 'apply')
    fast_out, fast_grads = _mlp_step(m, x)
    assert len(calls) == 1
    with ops.use_implementation('graph'):
        plain_out, plain_grads = _mlp_step(m, x)
    assert len(calls) == 1
    torch.testing.assert_close(fast_out, plain_out, rtol=0, atol=0)
    for a, b in zip(fast_grads, plain_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_mlp_where_the_function_runs(monkeypatch):
    """Not in inference, not with active dropout, not while a graph is
    captured (``torch.export`` of a training forward), and in training
    with the fast paths on only."""
    torch.manual_seed(5)
    calls = count_calls(monkeypatch, GeluLinearFunction, 'apply')
    m = Mlp(8, 32)
    x = torch.randn(4, 8)
    with torch.no_grad():
        m(x)
    Mlp(8, 32, drop=0.5).train()(x)
    exported = torch.export.export(m, (x.clone().requires_grad_(), ))
    assert 'GeluLinear' not in str(exported.graph)
    with ops.use_implementation('graph'):
        m(x.clone().requires_grad_()).sum().backward()
    assert calls == []
    m(x.clone().requires_grad_()).sum().backward()
    assert len(calls) == 1


@pytest.mark.parametrize('approximate', ['none', 'tanh'])
def test_mlp_runs_of_tokens_in_cpu_inference(monkeypatch, approximate):
    """CPU inference on more tokens than one run: the MLP op walks runs of
    tokens through one hidden buffer (a last run shorter than the others
    included) and gives the plain layers' values; not in training, not
    under autocast, not with the fast paths off, not for one run's worth
    of tokens."""
    module = importlib.import_module('pola_mm.ops.gelu_linear')
    monkeypatch.setattr(module, 'MLP_RUN_ELEMENTS', 64 * 40)
    monkeypatch.setattr(module, 'MLP_MIN_TOKENS', 8)
    runs = count_calls(monkeypatch, module, '_gelu_mlp_runs')
    addmm = count_calls(monkeypatch, torch, 'addmm')
    torch.manual_seed(6)
    m = Mlp(12, 40, act_cfg=dict(type='GELU', approximate=approximate))
    m.eval()
    x = torch.randn(2, 333, 12)  # 666 tokens, runs of 64: 11 runs
    with torch.no_grad():
        fast = m(x)
        with ops.use_implementation('graph'):
            plain = m(x)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            m(x)
        m(x[:, :30])  # 60 tokens: one run, the plain layers
    assert len(runs) == 1 and len(addmm) == 2 * 11
    assert fast.shape == plain.shape == (2, 333, 12)
    torch.testing.assert_close(fast, plain, rtol=1e-6, atol=1e-6)
    m.train()
    m(x.requires_grad_()).sum().backward()
    assert len(runs) == 1
