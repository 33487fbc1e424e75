"""One switch for every fast path (``pola_mm.ops``): the backbones compute
the same with and without them, and with them off nothing of ``pola_mm.ops``
but the plain layers runs."""
import os
import subprocess
import sys

import pytest
import torch

import pola_mm.ops as ops
from pola_mm.models import PolaPVT, PolaSwinTransformer
from pola_mm.models.checkpoint import (backbone_state_dict,
                                       convert_official_checkpoint)
from pola_mm.models.layers import PolarityAttention
from pola_mm.ops import cpu_ext as cpu_ext_mod
from pola_mm.ops import dispatch, inference_runs, polarity_kernel, token_runs
from helpers import (PVT_MINI, PVT_TINY, SWIN_MINI, SWIN_TINY_DEPTH2,
                     randomise, reference_file)

BACKBONES = [(PolaSwinTransformer, SWIN_TINY_DEPTH2), (PolaPVT, PVT_TINY)]
IDS = ['swin', 'pvt']


def _small_runs(monkeypatch) -> None:
    """Runs small enough that every fast path is taken at test sizes."""
    for name, value in [('KERNEL_RUN_ELEMENTS', 2000),
                        ('ATTN_RUN_ELEMENTS', 1600),
                        ('FFN_RUN_ELEMENTS', 256), ('FFN_MIN_TOKENS', 7),
                        ('NORM_RUN_ELEMENTS', 256),
                        ('TRAIN_RUN_ELEMENTS', 1 << 12),
                        ('TRAIN_MIN_TOKENS', 8)]:
        monkeypatch.setattr(dispatch, name, value)


def _spy_fast_paths(monkeypatch):
    """Count calls into the fast implementations."""
    calls = []

    def spy(obj, name):
        original = getattr(obj, name)

        def wrapped(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)

        monkeypatch.setattr(obj, name, wrapped)

    spy(polarity_kernel.PolarityAttentionFunction, 'apply')
    spy(inference_runs, 'polarity_attention_in_runs')
    spy(inference_runs, 'mlp_into')
    spy(inference_runs, 'norm_in_place')
    spy(token_runs._MlpRuns, 'apply')
    spy(token_runs._SplitLinearRuns, 'apply')
    spy(cpu_ext_mod, '_build')
    return calls


@pytest.mark.parametrize('cls,arch', BACKBONES, ids=IDS)
def test_backbones_equal_with_and_without_fast_paths(monkeypatch, cls,
                                                     arch):
    """Inference at several sizes and a training step (outputs and every
    parameter's gradient) give the same results both ways; the fast paths
    really ran one way and not the other."""
    _small_runs(monkeypatch)
    torch.manual_seed(0)
    model = cls(arch=arch, drop_path_rate=0.)  # deterministic training
    randomise(model, std=0.3)
    calls = _spy_fast_paths(monkeypatch)

    def run():
        model.eval()
        outs = []
        with torch.no_grad():
            for size in [(224, 224), (97, 161), (250, 333)]:
                outs += model(torch.randn(1, 3, *size,
                                          generator=torch.Generator()
                                          .manual_seed(size[0])))
        model.train()
        model.zero_grad()
        x = torch.randn(2, 3, 128, 160,
                        generator=torch.Generator().manual_seed(1))
        train_outs = model(x)
        sum((o * o).mean() for o in train_outs).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        return outs + [o.detach() for o in train_outs], grads

    fast_outs, fast_grads = run()
    assert {'apply', 'polarity_attention_in_runs', 'mlp_into'} <= set(calls)
    calls.clear()
    with ops.plain_paths():
        assert not ops.fast_paths_enabled()
        plain_outs, plain_grads = run()
    assert ops.fast_paths_enabled()
    assert calls == []
    for a, b in zip(fast_outs, plain_outs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for a, b in zip(fast_grads, plain_grads):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


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
    with torch.no_grad(), ops.plain_paths():
        feats = model(io['input'])[0].flatten(2).mean(-1)  # pooled
    assert (feats - io['features']).abs().max() <= 1e-4


@pytest.mark.parametrize('fused', [True, False])
def test_reference_impl_equals_kernel(fused):
    """``impl='reference'`` (the formula as written) and the kernel give the
    same outputs and gradients (float64)."""
    torch.manual_seed(0)
    a = PolarityAttention(16, 2, (5, 6), fused_qkvg=fused).double()
    randomise(a, std=0.3)
    b = PolarityAttention(16, 2, (5, 6), fused_qkvg=fused,
                          impl='reference').double()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 7 * 9, 16, dtype=torch.float64)
    ya = a(x.clone().requires_grad_(), (7, 9))
    yb = b(x.clone().requires_grad_(), (7, 9))
    torch.testing.assert_close(ya, yb, rtol=1e-10, atol=1e-10)
    ya.square().sum().backward()
    yb.square().sum().backward()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-8, atol=1e-10,
                                   msg=n)
    with pytest.raises(ValueError, match='impl'):
        PolarityAttention(16, 2, (5, 6), impl='fast')


def test_attn_drop_is_refused():
    """The linear attention has no attention matrix to drop: a non-zero
    rate raises instead of being silently ignored."""
    with pytest.raises(ValueError, match='attn_drop'):
        PolarityAttention(16, 2, (5, 6), attn_drop=0.1)
    with pytest.raises(ValueError, match='attn_drop'):
        PolaSwinTransformer(arch=SWIN_TINY_DEPTH2, attn_drop_rate=0.1)


def test_environment_variable_turns_fast_paths_off():
    code = ('import pola_mm.ops as o; import pola_mm.ops.cpu_ext as c; '
            'print(o.fast_paths_enabled(), c.cpu_ext())')
    for value, want in [('0', 'False None'), ('off', 'False None'),
                        ('1', 'True')]:
        env = dict(os.environ, POLA_MM_FAST_PATHS=value, POLA_MM_CPU_EXT='0')
        out = subprocess.run([sys.executable, '-c', code], env=env,
                             capture_output=True, text=True, check=True)
        assert out.stdout.split()[0] == want.split()[0], out.stderr
    assert dispatch.FAST_PATHS_ENV == 'POLA_MM_FAST_PATHS'
