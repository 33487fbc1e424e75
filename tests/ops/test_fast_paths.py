"""One setting for every fast implementation (``POLA_MM_OPS=graph`` or
``pola_mm.ops.use_implementation('graph')``: off): every family
(Pola-Swin, Pola-PVT with ``la_sr_ratios`` and ``feature_map='pacs'``,
PolaPP) computes the same outputs and gradients with and without them,
and with them off no fast code runs (``helpers.spy_fast_code``)."""
import importlib
import subprocess
import sys
from typing import List, Tuple

import pytest
import torch
from helpers import (PVT_MINI, SWIN_MINI, SWIN_TINY_DEPTH2, fast_path_families,
                     ran, randomise, reference_file, reset, spy_fast_code,
                     subprocess_env)

import pola_mm.ops as ops
from pola_mm.models import PolaPVT, PolaSwinTransformer
from pola_mm.models.checkpoint import (backbone_state_dict,
                                       convert_official_checkpoint)
from pola_mm.models.layers import PolarityAttention
from pola_mm.ops import dispatch

#: name -> (class, constructor arguments, fast code that must run)
FAMILIES = fast_path_families()


def _build(name: str) -> torch.nn.Module:
    cls, kwargs, _ = FAMILIES[name]
    torch.manual_seed(0)
    model = cls(drop_path_rate=0., **kwargs)  # deterministic training
    randomise(model, std=0.3)
    return model


def _outputs_and_grads(model: torch.nn.Module, dtype: torch.dtype
                       ) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """Inference at two sizes, then a training step's outputs and every
    parameter's gradient (the model's state is restored after the step:
    PolaPP's BatchNorm statistics move)."""
    start = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()
    outs: List[torch.Tensor] = []
    with torch.no_grad():
        for size in [(64, 64), (57, 83)]:
            outs += model(torch.randn(
                1, 3, *size, dtype=dtype,
                generator=torch.Generator().manual_seed(size[0])))
    model.train()
    model.zero_grad()
    x = torch.randn(2, 3, 48, 72, dtype=dtype,
                    generator=torch.Generator().manual_seed(1))
    train_outs = model(x)
    sum((o * o).mean() for o in train_outs).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.load_state_dict(start)
    return outs + [o.detach() for o in train_outs], grads


def _assert_close_to_scale(got: List[torch.Tensor], want: List[torch.Tensor],
                           tol: float, floor: float = 0.) -> None:
    """Each pair within ``tol`` of the reference's largest magnitude, or of
    ``floor`` times the largest magnitude of all (for tensors that are zero
    up to rounding, such as the gradient of a conv bias before a
    BatchNorm)."""
    assert len(got) == len(want)
    top = max(float(b.abs().max()) for b in want)
    for i, (a, b) in enumerate(zip(got, want)):
        err = float((a - b).abs().max())
        scale = max(float(b.abs().max()), floor * top)
        assert err <= tol * scale, (i, err, scale)


@pytest.mark.parametrize('name', sorted(FAMILIES))
def test_same_outputs_and_gradients_without_fast_paths(monkeypatch, name):
    """float64, drop path 0: inference at two sizes and a training step
    give the same outputs and every parameter's gradient with the fast
    paths on and off; the family's fast code ran one way and nothing of
    it the other."""
    model = _build(name).double()
    calls = spy_fast_code(monkeypatch)
    fast_outs, fast_grads = _outputs_and_grads(model, torch.float64)
    assert FAMILIES[name][2] <= ran(calls), ran(calls)
    reset(calls)
    with ops.use_implementation('graph'):
        assert ops.get_implementation() == 'graph'
        plain_outs, plain_grads = _outputs_and_grads(model, torch.float64)
    assert ops.get_implementation() == 'auto'
    assert ran(calls) == set()
    _assert_close_to_scale(fast_outs, plain_outs, 1e-10)
    _assert_close_to_scale(fast_grads, plain_grads, 1e-9, floor=1e-3)


@pytest.mark.parametrize('name', ['swin', 'pvt'])
def test_float32_inference_uses_the_fast_code_only_when_on(monkeypatch,
                                                           name):
    """float32 CPU inference (where the polarity kernel's token runs and
    the cached table resize run): the same maps both ways, and with the
    switch off neither they nor any other fast code runs."""
    model = _build(name).eval()
    calls = spy_fast_code(monkeypatch)
    x = torch.randn(1, 3, 97, 161, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        fast = model(x)
        assert {'polarity_cpu', 'cached_resize', 'sdpa'} <= ran(calls)
        reset(calls)
        with ops.use_implementation('graph'):
            plain = model(x)
    assert ran(calls) == set()
    _assert_close_to_scale(list(fast), list(plain), 1e-5)


@pytest.mark.parametrize('name,cls,arch', [
    ('swin', PolaSwinTransformer, SWIN_MINI), ('pvt', PolaPVT, PVT_MINI)])
def test_plain_paths_reproduce_the_authors_logits(reference_dir, name, cls,
                                                  arch):
    """The plain model (readable formula, no fast path) is the published
    model too: the reference minis' features at 224 within 1e-4."""
    official = reference_file(reference_dir, name)
    io = reference_file(reference_dir, name, io=True)
    model = cls(arch=arch, out_indices=(3, )).eval()
    model.load_state_dict(backbone_state_dict(
        convert_official_checkpoint(official['model'])), strict=True)
    with torch.no_grad(), ops.use_implementation('graph'):
        feats = model(io['input'])[0].flatten(2).mean(-1)  # pooled
    assert (feats - io['features']).abs().max() <= 1e-4


def test_attn_drop_is_refused():
    """The linear attention has no attention matrix to drop: a non-zero
    rate raises instead of being silently ignored."""
    with pytest.raises(ValueError, match='attn_drop'):
        PolarityAttention(16, 2, (5, 6), attn_drop=0.1)
    with pytest.raises(ValueError, match='attn_drop'):
        PolaSwinTransformer(arch=SWIN_TINY_DEPTH2, attn_drop_rate=0.1)


def test_the_setting_and_its_old_names(monkeypatch):
    """``POLA_MM_OPS`` takes ``auto``, ``triton``, ``cpu``, ``graph`` (any
    case, spaces) and refuses anything else naming the values; the
    settings of earlier versions and the old functions give one line
    naming what replaces them (read at import:
    ``test_environment_switch_runs_the_plain_models`` runs a fresh
    process)."""
    assert dispatch.IMPLEMENTATION_ENV == 'POLA_MM_OPS'
    for value, want in [('auto', 'auto'), (' Graph ', 'graph'),
                        ('CPU', 'cpu'), ('triton', 'triton')]:
        monkeypatch.setenv('POLA_MM_OPS', value)
        assert dispatch._from_environment() == want, value
    monkeypatch.setenv('POLA_MM_OPS', '0')
    with pytest.raises(ValueError, match="POLA_MM_OPS='0': use one of auto"):
        dispatch._from_environment()
    monkeypatch.delenv('POLA_MM_OPS')
    for old, new in [('POLA_MM_FAST_PATHS', 'POLA_MM_OPS=graph'),
                     ('POLA_MM_KERNELS', 'POLA_MM_OPS=cpu')]:
        monkeypatch.setenv(old, '0')
        with pytest.raises(RuntimeError, match=f'set {new}') as err:
            dispatch._from_environment()
        assert '\n' not in str(err.value)
        monkeypatch.delenv(old)
    for name in ('plain_paths', 'no_kernels', 'set_kernels'):
        with pytest.raises(AttributeError, match='was replaced by '
                           'pola_mm.ops.set_implementation|use_implementation'):
            getattr(ops, name)
    with pytest.raises(ValueError, match='one of auto, triton, cpu, graph'):
        ops.set_implementation('fast')
    assert ops.get_implementation() == 'auto'
    with ops.use_implementation('graph'):
        assert ops.get_implementation() == 'graph'
    assert ops.get_implementation() == 'auto'


def test_environment_switch_runs_the_plain_models(tmp_path):
    """``POLA_MM_OPS=graph`` in a fresh process: Pola-Swin, Pola-PVT and
    PolaPP run a forward and a training step without any fast code, and
    give the in-process plain outputs."""
    names = ['swin', 'pvt', 'polapp']
    x = torch.randn(2, 3, 72, 88, generator=torch.Generator().manual_seed(3))
    want = {}
    for name in names:
        model = _build(name)
        torch.save(model.state_dict(), tmp_path / f'{name}.pth')
        with ops.use_implementation('graph'):
            want[name] = [o.detach() for o in model(x)]
    torch.save(x, tmp_path / 'x.pth')
    code = f'''
import pytest
import torch
from helpers import ran, spy_fast_code
from helpers import fast_path_families
import pola_mm.ops as ops
mp = pytest.MonkeyPatch()
calls = spy_fast_code(mp)
x = torch.load({str(tmp_path / 'x.pth')!r}, weights_only=True)
for name in {names!r}:
    cls, kwargs, _ = fast_path_families()[name]
    m = cls(drop_path_rate=0., **kwargs)
    m.load_state_dict(torch.load({str(tmp_path)!r} + f'/{{name}}.pth',
                                 weights_only=True))
    outs = m.train()(x)
    sum(o.square().mean() for o in outs).backward()
    torch.save([o.detach() for o in outs],
               {str(tmp_path)!r} + f'/{{name}}_out.pth')
print(ops.get_implementation(), sorted(ran(calls)))
'''
    env = subprocess_env(POLA_MM_OPS='graph')
    out = subprocess.run([sys.executable, '-c', code], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split('\n')[-2] == 'graph []', out.stdout
    for name in names:
        got = torch.load(tmp_path / f'{name}_out.pth', weights_only=True)
        _assert_close_to_scale(got, want[name], 1e-6)


def _linear(c_in: int, c_out: int, seed: int) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(c_in, c_out)


def _op_cases():
    """name -> (inputs builder, the op, its ``*_pytorch`` reference): every
    op of :mod:`pola_mm.ops`, each on inputs where its fast implementation
    runs (strided views, runs of tokens, a resized table)."""
    g = torch.Generator().manual_seed(0)

    def rand(*shape, scale=1.):
        return (torch.randn(*shape, generator=g) * scale).requires_grad_()

    def heads():
        q, k, v = (rand(2, 3, 40, 8) for _ in range(3))
        return [q, k, v]

    fc1, fc2, proj = _linear(8, 32, 1), _linear(32, 8, 2), _linear(8, 6, 3)
    return {
        'polarity_attention': (
            lambda: heads() + [rand(1, 3, 1, 8, scale=.3),
                               rand(1, 3, 1, 8, scale=.3)],
            lambda q, k, v, s, p: ops.polarity_attention(q, k, v, s, p, 3.),
            lambda q, k, v, s, p: ops.polarity_attention_pytorch(
                q, k, v, s, p, 3.)),
        'pacs_attention': (
            lambda: heads() + [rand(1, 3, 1, 16), rand(1, 3, 1, 16)],
            ops.pacs_attention, ops.pacs_attention_pytorch),
        'softmax_attention': (
            lambda: heads() + [rand(1, 3, 40, 40)],
            lambda q, k, v, b: ops.softmax_attention(q, k, v, .35, b),
            lambda q, k, v, b: ops.softmax_attention_pytorch(q, k, v, .35,
                                                             b)),
        'depthwise_conv2d': (  # a strided view, as the attention passes v
            lambda: [rand(2, 5, 7, 8).permute(0, 3, 1, 2), rand(8, 1, 3, 3),
                     rand(8)],
            lambda x, w, b: ops.depthwise_conv2d(x, w, b, (1, 1)),
            lambda x, w, b: ops.depthwise_conv2d_pytorch(x, w, b, (1, 1))),
        'gate_linear': (
            lambda: [rand(2, 30, 8), rand(2, 30, 8)],
            lambda x, gate: ops.gate_linear(x, gate, proj),
            lambda x, gate: ops.gate_linear_pytorch(x, gate, proj.weight,
                                                    proj.bias)),
        'gelu_linear': (
            lambda: [rand(2, 30, 32)],
            lambda h: ops.gelu_linear(h, fc2),
            lambda h: ops.gelu_linear_pytorch(h, fc2.weight, fc2.bias)),
        'gelu_mlp': (  # 600 tokens: two runs (of MLP_MIN_TOKENS = 512 with
            # the small MLP_RUN_ELEMENTS the test sets)
            lambda: [rand(2, 300, 8)],
            lambda x: ops.gelu_mlp(x, fc1, fc2),
            lambda x: ops.gelu_mlp_pytorch(x, fc1.weight, fc1.bias,
                                           fc2.weight, fc2.bias)),
        'resize_pos_table': (
            lambda: [rand(1, 4 * 5, 8)],
            lambda t: ops.resize_pos_table(t, (4, 5), (6, 3)),
            lambda t: ops.resize_pos_table_pytorch(t, (4, 5), (6, 3))),
    }


#: the fast code each op runs with the switch on (inference, training)
OP_FAST_CODE = {
    'polarity_attention': ({'polarity_cpu'},
                           {'polarity_cpu', 'PolarityAttentionFunction'}),
    'pacs_attention': ({'pacs_cpu'},
                       {'pacs_cpu', 'PaCSAttentionFunction'}),
    'softmax_attention': ({'sdpa'}, set()),  # CPU training: the reference
    'depthwise_conv2d': ({'DepthwiseConv2d'}, {'DepthwiseConv2d'}),
    'gate_linear': (set(), {'GateLinearFunction'}),
    'gelu_linear': (set(), {'GeluLinearFunction'}),
    'gelu_mlp': ({'gelu_mlp_runs'}, {'GeluLinearFunction'}),
    'resize_pos_table': ({'cached_resize', 'separable_resize'},
                         {'separable_resize'}),
}


def test_every_op_has_a_case():
    """The cases below cover every op that :mod:`pola_mm.ops` exports with
    a ``*_pytorch`` reference, and every op has one."""
    refs = {n[:-len('_pytorch')] for n in ops.__all__
            if n.endswith('_pytorch')}
    assert refs == set(_op_cases()) == set(OP_FAST_CODE)


def _run(op, inputs, train: bool):
    """The op's output and, in training, the inputs' gradients."""
    if not train:
        with torch.no_grad():
            return [op(*inputs)]
    out = op(*inputs)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(
        5))
    return [out.detach()] + list(torch.autograd.grad(
        (out * weights).sum(), inputs))


@pytest.mark.parametrize('train', [False, True], ids=['infer', 'train'])
@pytest.mark.parametrize('name', sorted(OP_FAST_CODE))
def test_op_fallback_is_its_reference(monkeypatch, name, train):
    """Every op with the fast paths off (the one switch) gives exactly its
    ``*_pytorch`` reference's outputs and gradients, running no fast code;
    with them on it runs its fast implementation and agrees within float32
    rounding."""
    gelu_module = importlib.import_module('pola_mm.ops.gelu_linear')
    monkeypatch.setattr(gelu_module, 'MLP_RUN_ELEMENTS', 32 * 64)
    build, op, reference = _op_cases()[name]
    inputs = build()
    calls = spy_fast_code(monkeypatch)
    want = _run(reference, inputs, train)
    assert ran(calls) == set()
    with ops.use_implementation('graph'):
        plain = _run(op, inputs, train)
    assert ran(calls) == set()
    for a, b in zip(plain, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    fast = _run(op, inputs, train)
    assert ran(calls) == OP_FAST_CODE[name][train], ran(calls)
    for a, b in zip(fast, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5,
                                   atol=1e-5 * float(b.abs().max()))
