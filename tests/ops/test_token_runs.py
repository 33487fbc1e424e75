"""The run-based CPU training functions (``ops/token_runs.py``): same
outputs and gradients as the plain layers, taken exactly where they apply,
and no full-size hidden tensor allocated in the MLP's backward."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import gradcheck
from torch.profiler import ProfilerActivity, profile

from pola_mm.models import PolaPVT, PolaSwinTransformer
from pola_mm.models.layers import Mlp, PolarityAttention
from pola_mm.ops import dispatch, token_runs
from pola_mm.ops.token_runs import runs_pay
from pola_mm.ops.token_runs import mlp_in_runs, split_linear_in_runs

from helpers import PVT_TINY, SWIN_TINY_DEPTH2


@pytest.fixture
def small_runs(monkeypatch):
    """Runs of 2^9 elements: several runs, the last one shorter."""
    monkeypatch.setattr(dispatch, 'TRAIN_RUN_ELEMENTS', 1 << 9)
    monkeypatch.setattr(dispatch, 'TRAIN_MIN_TOKENS', 1)


def _grads(out, inputs, seed=0):
    outs = out if isinstance(out, (tuple, list)) else (out, )
    gen = torch.Generator().manual_seed(seed)
    gs = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs]
    return torch.autograd.grad(outs, inputs, gs)


@pytest.mark.parametrize('approximate', ['none', 'tanh'])
@pytest.mark.parametrize('bias', [True, False])
def test_mlp_in_runs_equals_plain_layers(small_runs, approximate, bias):
    torch.manual_seed(0)
    fc1 = nn.Linear(12, 40, bias=bias).double()
    fc2 = nn.Linear(40, 12, bias=bias).double()
    x = torch.randn(3, 37, 12, dtype=torch.float64, requires_grad=True)
    assert len(token_runs._runs(3 * 37, 40)) > 3  # really runs
    params = [x] + list(fc1.parameters()) + list(fc2.parameters())
    ref = fc2(F.gelu(fc1(x), approximate=approximate))
    out = mlp_in_runs(x, fc1, fc2, approximate)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    assert out.grad_fn.name() == '_MlpRunsBackward'
    for a, b in zip(_grads(out, params), _grads(ref, params)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


def test_mlp_in_runs_gradcheck(small_runs):
    torch.manual_seed(1)
    fc1 = nn.Linear(4, 10).double()
    fc2 = nn.Linear(10, 4).double()
    x = torch.randn(2, 30, 4, dtype=torch.float64, requires_grad=True)

    def f(x, w1, b1, w2, b2):
        return token_runs._MlpRuns.apply(x, w1, b1, w2, b2, 'none')

    assert gradcheck(f, (x, fc1.weight, fc1.bias, fc2.weight, fc2.bias))


def test_mlp_in_runs_only_needed_gradients(small_runs):
    torch.manual_seed(2)
    fc1, fc2 = nn.Linear(8, 16).double(), nn.Linear(16, 8).double()
    fc1.requires_grad_(False)
    x = torch.randn(50, 8, dtype=torch.float64)  # no gradient wanted
    out = mlp_in_runs(x, fc1, fc2)
    ref = fc2(F.gelu(fc1(x)))
    for a, b in zip(_grads(out, list(fc2.parameters())),
                    _grads(ref, list(fc2.parameters()))):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # fc2 frozen, fc1 and x trained
    fc1.requires_grad_(True)
    fc2.requires_grad_(False)
    x.requires_grad_(True)
    inputs = [x, fc1.weight, fc1.bias]
    for a, b in zip(_grads(mlp_in_runs(x, fc1, fc2), inputs),
                    _grads(fc2(F.gelu(fc1(x))), inputs)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize('bias', [True, False])
def test_split_linear_in_runs_equals_unbind(small_runs, bias):
    torch.manual_seed(3)
    lin = nn.Linear(10, 4 * 6, bias=bias).double()
    x = torch.randn(2, 41, 10, dtype=torch.float64, requires_grad=True)
    outs = split_linear_in_runs(x, lin, 4)
    refs = lin(x).unflatten(-1, (4, 6)).unbind(-2)
    assert len(outs) == 4
    for o, r in zip(outs, refs):
        assert o.shape == r.shape == (2, 41, 6)
        assert o.is_contiguous()
        torch.testing.assert_close(o, r, rtol=0, atol=1e-12)
    params = [x] + list(lin.parameters())
    for a, b in zip(_grads(outs, params), _grads(refs, params)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)
    # parts that get no gradient (unused outputs) count as zero
    q, k, v, g = split_linear_in_runs(x, lin, 4)
    gk = torch.randn_like(k)
    mine = torch.autograd.grad([k], params, [gk])
    rq, rk, rv, rg = lin(x).unflatten(-1, (4, 6)).unbind(-2)
    ref = torch.autograd.grad([rk], params, [gk])
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


def test_split_linear_in_runs_gradcheck(small_runs):
    torch.manual_seed(4)
    lin = nn.Linear(3, 8).double()
    x = torch.randn(25, 3, dtype=torch.float64, requires_grad=True)

    def f(x, w, b):
        return token_runs._SplitLinearRuns.apply(x, w, b, 2)

    assert gradcheck(f, (x, lin.weight, lin.bias))


def test_split_linear_in_runs_rejects_uneven_parts():
    with pytest.raises(ValueError, match='not divisible into 3 parts'):
        split_linear_in_runs(torch.randn(2, 4), nn.Linear(4, 8), 3)


def cpu_training(x, *modules):
    return dispatch.select(x, *modules).cpu_training


def test_cpu_training_path():
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    assert cpu_training(x, lin)  # trainable weights
    assert cpu_training(x.double(), lin.double())
    lin.float()
    with torch.no_grad():
        assert not cpu_training(x, lin)
        assert dispatch.select(x, lin).cpu_inference
    lin.requires_grad_(False)
    assert not cpu_training(x, lin)  # nothing to differentiate
    assert cpu_training(x.requires_grad_(), lin)
    lin.requires_grad_(True)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert not cpu_training(x, lin)
        assert dispatch.select(x, lin).kernels
    assert not cpu_training(x.detach().bfloat16(), lin.bfloat16())
    assert not cpu_training(x.detach(), lin)  # bf16 weights, float32 x
    with dispatch.plain_paths():
        assert dispatch.select(x, lin) == dispatch.PLAIN


def test_runs_pay_needs_min_runs(small_runs):
    need = dispatch.TRAIN_MIN_RUNS * dispatch.TRAIN_RUN_ELEMENTS  # 2048
    assert runs_pay(torch.randn(need // 32, 8), 32)
    assert not runs_pay(torch.randn(need // 32 - 1, 8), 32)
    assert runs_pay(torch.randn(2, need // 64, 8), 32)


def test_plain_path_while_compiling(monkeypatch):
    lin = nn.Linear(4, 4)
    # (meta keeps the kernels: the memory estimates measure their storage)
    assert dispatch.select(torch.randn(2, 4, device='meta'), lin).kernels
    monkeypatch.setattr(dispatch, 'is_compiling', lambda: True)
    assert dispatch.select(torch.randn(2, 4), lin) == dispatch.PLAIN


def test_mlp_dispatch(small_runs):
    m = Mlp(8, 32).train()
    x = torch.randn(4, 20, 8)  # 80 tokens x 32 hidden: 5 runs
    assert m(x).grad_fn.name() == '_MlpRunsBackward'
    assert m(x[:, :10]).grad_fn.name() != '_MlpRunsBackward'  # < MIN_RUNS
    ref = m.fc2(m.act(m.fc1(x)))
    torch.testing.assert_close(m(x), ref)
    with torch.no_grad():
        assert m(x).grad_fn is None
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert m(x).grad_fn.name() != '_MlpRunsBackward'
    dropping = Mlp(8, 32, drop=0.5).train()
    assert dropping(x).grad_fn.name() != '_MlpRunsBackward'
    relu = Mlp(8, 32, act_cfg=dict(type='ReLU')).train()
    assert relu(x).grad_fn.name() != '_MlpRunsBackward'


@pytest.mark.parametrize('fused', [True, False], ids=['qkvg', 'qg_kv'])
def test_project_dispatch_and_values(small_runs, fused):
    torch.manual_seed(5)
    attn = PolarityAttention(8, 2, (4, 4), fused_qkvg=fused).double()
    x = torch.randn(2, 80, 8, dtype=torch.float64, requires_grad=True)
    parts = attn.project(x, dispatch.select(x, attn))
    assert all(t.grad_fn.name() == '_SplitLinearRunsBackward'
               for t in parts)
    if fused:
        refs = attn.qkvg(x).unflatten(-1, (4, 8)).unbind(-2)
    else:
        q, g = attn.qg(x).unflatten(-1, (2, 8)).unbind(-2)
        k, v = attn.kv(x).unflatten(-1, (2, 8)).unbind(-2)
        refs = (q, k, v, g)
    layers = [attn.qkvg] if fused else [attn.qg, attn.kv]
    params = [x] + [p for m in layers for p in m.parameters()]
    for a, b in zip(parts, refs):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    mine = _grads(parts, params, seed=1)
    ref = _grads(refs, params, seed=1)
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)
    with torch.no_grad():  # inference keeps the views of one output
        q = attn.project(x, dispatch.select(x, attn))[0]
        assert q.stride(-2) == (4 if fused else 2) * 8


@pytest.mark.parametrize('model_cls, arch', [
    (PolaSwinTransformer, SWIN_TINY_DEPTH2),
    (PolaPVT, PVT_TINY)],
                         ids=['swin', 'pvt'])
def test_backbone_training_step_unchanged(small_runs, monkeypatch, model_cls,
                                          arch):
    """A whole training step (float64) with and without the run-based
    functions: same outputs, same gradients for every parameter."""
    torch.manual_seed(6)
    model = model_cls(arch=arch).double().train()
    x = torch.randn(2, 3, 64, 80, dtype=torch.float64)

    def step():
        torch.manual_seed(7)  # same drop-path draws
        outs = model(x)
        loss = sum((o * torch.linspace(-1, 1, o.shape[-1],
                                       dtype=o.dtype)).sum() for o in outs)
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        grads = torch.autograd.grad(
            loss, [p for p in model.parameters() if p.requires_grad],
            allow_unused=True)
        return [o.detach() for o in outs], dict(zip(names, grads))

    used = []
    for fn in (token_runs._MlpRuns, token_runs._SplitLinearRuns):
        def spy(*args, _real=fn.apply, _name=fn.__name__):
            used.append(_name)
            return _real(*args)
        monkeypatch.setattr(fn, 'apply', spy)
    outs_runs, grads_runs = step()
    assert {'_MlpRuns', '_SplitLinearRuns'} <= set(used)
    used.clear()
    monkeypatch.setattr(dispatch, 'select',
                        lambda *a: dispatch.Path(kernels=True, autograd=True))
    outs_plain, grads_plain = step()
    assert not used
    for a, b in zip(outs_runs, outs_plain):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert grads_runs.keys() == grads_plain.keys()
    for name in grads_plain:
        a, b = grads_runs[name], grads_plain[name]
        assert (a is None) == (b is None), name
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10,
                                       msg=lambda m: f'{name}: {m}')


def test_mlp_backward_allocates_no_full_hidden_tensor():
    """The point of the runs: in backward nothing (tokens, hidden)-sized is
    allocated (the plain layers allocate the GELU output's gradient and the
    pre-activation's gradient whole)."""
    torch.manual_seed(8)
    tokens, hidden = 8192, 512  # 4M elements, 4 runs of 2^20
    m = Mlp(64, hidden).train()
    x = torch.randn(tokens, 64, requires_grad=True)
    full = tokens * hidden * 4

    def largest_backward_allocation(use_runs: bool) -> int:
        fn = mlp_in_runs if use_runs else (
            lambda x, a, b, ap: b(F.gelu(a(x), approximate=ap)))
        y = fn(x, m.fc1, m.fc2, 'none')
        g = torch.randn_like(y)
        with profile(activities=[ProfilerActivity.CPU],
                     profile_memory=True) as prof:
            y.backward(g)
        return max(e.cpu_memory_usage for e in prof.events())

    assert largest_backward_allocation(False) >= full
    assert largest_backward_allocation(True) < full // 2
