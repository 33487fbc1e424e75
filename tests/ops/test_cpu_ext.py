"""The fused CPU loop (pola_mm/ops/csrc/polarity_cpu.cpp: the polarity
features of the kernel's forward) against the pure-torch kernel, through
the op :func:`pola_mm.ops.polarity_attention`: same outputs and gradients,
the switch, the fallback."""
import logging

import pytest
import torch

import pola_mm.ops.cpu_ext as cpu_ext_mod
import pola_mm.ops.polarity_kernel as pk
from pola_mm.ops import polarity_attention
from pola_mm.ops.cpu_ext import CPU_EXT_ENV, cpu_ext


def _close(a, b, name=''):
    """float32 agreement up to rounding: relative, plus an absolute slack
    of the same size relative to the largest entry (sums of many terms)."""
    torch.testing.assert_close(a, b, rtol=2e-5,
                               atol=2e-5 * (b.abs().max().item() + 1e-6),
                               msg=name or None)


def test_extension_builds_here():
    """The test environment has a compiler and ninja (setup_env.sh), so the
    fused loops must build and load; otherwise the tests below would only
    compare the torch path with itself."""
    mod = cpu_ext()
    assert mod is not None
    assert callable(mod.features)


def _inputs(B, h, N, d, seed=1, token_major=True):
    g = torch.Generator().manual_seed(seed)

    def t(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s)

    if token_major:  # (B, N, h, d) memory, like the model's projections
        q, k, v = (t(B, N, h, d).transpose(1, 2) for _ in range(3))
    else:
        q, k, v = (t(B, h, N, d) for _ in range(3))
    scale = t(1, h, 1, d, s=0.3)
    power = t(1, h, 1, d)
    k_bias = t(1, h, N, d, s=0.2)
    return q, k, v, scale, power, k_bias


def _count_ext_calls(monkeypatch, module, ext, calls):
    """Make ``module.cpu_ext()`` return ``ext`` with every function it hands
    out recorded (by name) in ``calls``."""

    class Counting:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(ext, name)

    monkeypatch.setattr(module, 'cpu_ext', lambda: Counting())


def _run(args, fused, monkeypatch, grad=True):
    monkeypatch.setenv(CPU_EXT_ENV, '1' if fused else '0')
    q, k, v, scale, power, k_bias = (
        None if a is None else a.clone().requires_grad_(grad and
                                                        a.is_floating_point())
        for a in args)
    calls = []
    ext = cpu_ext()
    if fused:
        assert ext is not None
        _count_ext_calls(monkeypatch, pk, ext, calls)
    else:
        monkeypatch.setattr(pk, 'cpu_ext', cpu_ext)
    x = polarity_attention(q, k, v, scale, power, 4.0, k_bias=k_bias)
    if not grad:
        return [x], calls
    x.backward(torch.randn(x.shape, generator=torch.Generator()
                           .manual_seed(7)))
    return [x.detach()] + [None if a is None else a.grad
                           for a in (q, k, v, scale, power, k_bias)], calls


@pytest.mark.parametrize('shape', [(2, 3, 200, 32), (3, 1, 77, 16),
                                   (1, 2, 9, 64)])
@pytest.mark.parametrize('chunk', [1 << 18, 1000])
def test_fused_loops_match_the_torch_kernel(monkeypatch, shape, chunk):
    """Outputs and every gradient (q, k, v, scale, power, key bias), in one
    piece and in many pieces (``chunk``): the forward's features come from
    the loop, the backward (pure torch) gives the same gradients."""
    monkeypatch.setattr(pk, 'KERNEL_RUN_ELEMENTS', chunk)
    args = _inputs(*shape)
    fused, calls = _run(args, True, monkeypatch)
    plain, no_calls = _run(args, False, monkeypatch)
    # forward: the features of keys and queries, run by run
    assert set(calls) == {'features'} and len(calls) >= 2
    assert not no_calls
    names = ['out', 'dq', 'dk', 'dv', 'dscale', 'dpower', 'dbias']
    for name, a, b in zip(names, fused, plain):
        _close(a, b, name)


def test_fused_loops_with_contiguous_inputs_and_without_bias(monkeypatch):
    q, k, v, scale, power, _ = _inputs(2, 2, 50, 8, token_major=False)
    args = (q, k, v, scale, power, None)
    fused, _ = _run(args, True, monkeypatch)
    plain, _ = _run(args, False, monkeypatch)
    for a, b in zip(fused[:6], plain[:6]):
        _close(a, b)


def test_fused_features_at_zero_tiny_and_large_inputs(monkeypatch):
    """|x| = 0, subnormal, tiny and large inputs: finite and equal to the
    torch path (0 features at 0, no NaN in any gradient)."""
    q, k, v, scale, power, k_bias = _inputs(1, 1, 64, 16)
    special = torch.tensor([0.0, -0.0, 1e-40, -1e-40, 1e-30, -1e-20, 30.0,
                            -30.0, 1e-3, -1e-3, 5.0, -5.0, 0.5, -0.5, 2.0,
                            -2.0])
    q[0, 0, :16] = special
    k[0, 0, :16] = special
    k_bias = torch.zeros_like(k_bias)
    args = (q, k, v, scale, power, k_bias)
    fused, _ = _run(args, True, monkeypatch)
    plain, _ = _run(args, False, monkeypatch)
    for a, b in zip(fused, plain):
        assert torch.isfinite(a).all()
        _close(a, b)


def test_float64_and_the_switch_keep_the_torch_path(monkeypatch):
    """float64 (gradcheck) never takes the float32 loops, and
    POLA_MM_CPU_EXT=0 turns them off."""
    args = _inputs(1, 1, 20, 8)
    double = tuple(None if a is None else a.double() for a in args)
    _, calls = _run(double, True, monkeypatch)
    assert calls == []
    monkeypatch.setenv(CPU_EXT_ENV, '0')
    assert cpu_ext() is None


def test_failed_build_falls_back_with_one_message(monkeypatch):
    """A machine that cannot build gets the torch kernel (same results)
    and one warning that names the fix."""
    monkeypatch.setattr(cpu_ext_mod, '_state', {})
    monkeypatch.setenv(CPU_EXT_ENV, '1')

    def no_compiler():
        raise RuntimeError('no C++ compiler found')

    logged = []
    monkeypatch.setattr(cpu_ext_mod, '_build', no_compiler)
    monkeypatch.setattr(cpu_ext_mod, 'print_log',
                        lambda msg, logger=None, level=logging.INFO:
                        logged.append((level, msg)))
    assert cpu_ext() is None
    assert cpu_ext() is None
    warnings = [m for lv, m in logged if lv >= logging.WARNING]
    assert len(warnings) == 1
    assert 'no C++ compiler found' in warnings[0]
    assert 'ninja' in warnings[0] and CPU_EXT_ENV in warnings[0]
    q, k, v, scale, power, k_bias = _inputs(1, 1, 30, 8)
    out = polarity_attention(q, k, v, scale, power, 4.0, k_bias=k_bias)
    assert torch.isfinite(out).all()


def test_tracing_records_the_plain_reference(monkeypatch):
    """torch.jit.trace (the route of ONNX export) cannot see the compiled
    loops: a traced attention runs its plain reference (no loop is called
    while tracing) and reproduces the eager outputs on new inputs."""
    from pola_mm.models.layers import PolarityAttention

    class Grid(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = PolarityAttention(16, 2, (5, 8))

        def forward(self, t):
            return self.attn(t, (5, 8))

    monkeypatch.setenv(CPU_EXT_ENV, '1')
    model = Grid().eval()
    x = torch.randn(1, 40, 16)
    calls = []
    _count_ext_calls(monkeypatch, pk, cpu_ext(), calls)
    with torch.no_grad():
        traced = torch.jit.trace(model, (x, ), check_trace=False)
        assert calls == []
        x2 = x * 1.5 + 0.1
        eager = model(x2)
        assert calls  # eager CPU inference does use the loops
        _close(traced(x2), eager)


def test_a_build_is_reported(monkeypatch):
    """A load that had to compile (slow) says so once, at INFO; a load from
    the cache is silent above DEBUG."""
    monkeypatch.setenv(CPU_EXT_ENV, '1')
    logged = []
    monkeypatch.setattr(cpu_ext_mod, 'print_log',
                        lambda msg, logger=None, level=logging.INFO:
                        logged.append((level, msg)))
    sentinel = object()
    monkeypatch.setattr(cpu_ext_mod, '_build', lambda: sentinel)
    for took, expect in ((23.0, 1), (0.01, 0)):
        clock = iter([100.0, 100.0 + took])

        class Clock:
            @staticmethod
            def perf_counter():
                return next(clock)

        monkeypatch.setattr(cpu_ext_mod, '_state', {})
        monkeypatch.setattr(cpu_ext_mod, 'time', Clock)
        logged.clear()
        assert cpu_ext() is sentinel
        infos = [m for lv, m in logged if lv >= logging.INFO]
        assert len(infos) == expect
        if expect:
            assert 'built the fused CPU polarity loops in 23 s' in infos[0]
