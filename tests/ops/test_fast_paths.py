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
from pola_mm.models.layers import Mlp, PolarityAttention
from pola_mm.ops import cpu_ext as cpu_ext_mod
from pola_mm.ops import dispatch, inference_runs, polarity_kernel, token_runs
from helpers import (PVT_MINI, PVT_TINY, SWIN_MINI, SWIN_TINY_DEPTH2,
                     count_calls, randomise, reference_file)

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
    spy(PolarityAttention, 'forward_in_runs')
    spy(Mlp, 'forward_into')
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
    assert {'apply', 'forward_in_runs', 'forward_into'} <= set(calls)
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
def test_plain_reference_equals_kernel(fused, monkeypatch):
    """The module's plain reference (fast paths off) and the kernel give
    the same outputs and gradients (float64); each side runs only its
    own."""
    import pola_mm.models.layers.polarity_attention as module
    torch.manual_seed(0)
    a = PolarityAttention(16, 2, (5, 6), fused_qkvg=fused).double()
    randomise(a, std=0.3)
    x = torch.randn(2, 7 * 9, 16, dtype=torch.float64)
    kernel = count_calls(monkeypatch, module, 'polarity_attention_kernel')
    plain = count_calls(monkeypatch, module, 'polarity_attention_pytorch')
    ya = a(x.clone().requires_grad_(), (7, 9))
    assert (len(kernel), len(plain)) == (1, 0)
    b = PolarityAttention(16, 2, (5, 6), fused_qkvg=fused).double()
    b.load_state_dict(a.state_dict())
    with ops.plain_paths():
        yb = b(x.clone().requires_grad_(), (7, 9))
    assert (len(kernel), len(plain)) == (1, 1)
    torch.testing.assert_close(ya, yb, rtol=1e-10, atol=1e-10)
    ya.square().sum().backward()
    yb.square().sum().backward()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-8, atol=1e-10,
                                   msg=n)


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


# -- PolaPP and PaCS (feature_map='pacs') ----------------------------------
from typing import Dict, List, Tuple  # noqa: E402

from pola_mm.models import PolaPP  # noqa: E402
from pola_mm.ops import depthwise_conv, pacs_kernel  # noqa: E402
import helpers  # noqa: E402

POLAPP_TINY = dict(embed_dims=(16, 32, 32, 64), depths=(2, 1, 1, 1),
                   num_heads=(2, 2, 2, 4),
                   layer_scale_init=(None, None, 1., 1.))
PACS_MODELS = [(PolaPP, POLAPP_TINY, {}),
               (PolaSwinTransformer, SWIN_TINY_DEPTH2,
                dict(feature_map='pacs')),
               (PolaPVT, PVT_TINY, dict(feature_map='pacs'))]
PACS_IDS = ['polapp', 'swin_pacs', 'pvt_pacs']


def _spy_pacs_paths(monkeypatch) -> Dict[str, List[int]]:
    """Count calls of the PaCS kernel and its formula, of PolaPP's softmax
    product (SDPA or its written-out reference) and of the depth-wise conv's
    training function, where the layers look them up."""
    from pola_mm.models.layers import pacs_attention, rotary_attention
    spies = dict(
        kernel=(pacs_attention, 'pacs_attention_kernel'),
        kernel_fn=(pacs_kernel.PaCSAttentionFunction, 'apply'),
        formula=(pacs_attention, 'pacs_linear_attention'),
        sdpa=(torch.nn.functional, 'scaled_dot_product_attention'),
        softmax=(rotary_attention, 'softmax_attention'),
        dwconv_fn=(depthwise_conv._DepthwiseConv2d, 'apply'))
    return {key: helpers.count_calls(monkeypatch, obj, name)
            for key, (obj, name) in spies.items()}


def _pacs_outputs_and_grads(model: torch.nn.Module
                            ) -> Tuple[List[torch.Tensor],
                                       List[torch.Tensor]]:
    """Eval outputs at two sizes, then one training step's outputs and every
    parameter's gradient."""
    model.eval()
    outs: List[torch.Tensor] = []
    with torch.no_grad():
        for size in [(96, 96), (57, 83)]:
            outs += model(torch.randn(1, 3, *size, generator=torch.Generator()
                                      .manual_seed(size[0])))
    model.train()
    model.zero_grad()
    x = torch.randn(2, 3, 64, 80, generator=torch.Generator().manual_seed(1))
    train_outs = model(x)
    sum((o * o).mean() for o in train_outs).backward()
    grads = [p.grad.clone() for p in model.parameters()]
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


@pytest.mark.parametrize('cls,arch,kwargs', PACS_MODELS, ids=PACS_IDS)
def test_pacs_models_equal_with_and_without_fast_paths(monkeypatch, cls,
                                                       arch, kwargs):
    """PolaPP and feature_map='pacs' backbones: inference and a training
    step give the same outputs (1e-4 of their scale) and gradients with the
    fast paths on and off; the PaCS kernel (and its autograd function),
    PolaPP's SDPA (in inference) and the depth-wise conv's training
    function ran with them on and not with them off, where the formula and
    the written-out softmax ran instead."""
    _small_runs(monkeypatch)
    torch.manual_seed(0)
    model = cls(arch=arch, drop_path_rate=0., **kwargs)
    randomise(model, std=0.3)
    calls = _spy_pacs_paths(monkeypatch)
    others = _spy_fast_paths(monkeypatch)
    # (the training step moves PolaPP's BatchNorm statistics: both sides
    # start from the same ones)
    start = {k: v.clone() for k, v in model.state_dict().items()}

    fast_outs, fast_grads = _pacs_outputs_and_grads(model)
    model.load_state_dict(start)
    fast = {k: len(v) for k, v in calls.items()}
    for v in calls.values():
        v.clear()
    others.clear()
    with ops.plain_paths():
        plain_outs, plain_grads = _pacs_outputs_and_grads(model)
    plain = {k: len(v) for k, v in calls.items()}
    assert ops.fast_paths_enabled()

    polapp = cls is PolaPP
    assert fast['kernel'] > 0 and fast['kernel_fn'] > 0, fast
    assert fast['formula'] == 0, fast
    if polapp:  # (the others' softmax stages are WindowMSA's)
        # SDPA in inference; CPU training writes the softmax out (faster
        # there for forward + backward), as WindowMSA does
        assert fast['sdpa'] > 0 and fast['softmax'] > 0, fast
    else:  # PolarityAttention's depth-wise conv
        assert fast['dwconv_fn'] > 0, fast
    assert plain['kernel'] == plain['kernel_fn'] == plain['sdpa'] == 0, plain
    assert plain['dwconv_fn'] == 0 and plain['formula'] > 0, plain
    assert (plain['softmax'] > 0) == polapp, plain
    assert others == []  # nor any other fast path
    _assert_close_to_scale(fast_outs, plain_outs, 1e-4)
    _assert_close_to_scale(fast_grads, plain_grads, 1e-3, floor=1e-3)


def test_polapp_environment_switch_runs_the_plain_model(tmp_path):
    """``POLA_MM_FAST_PATHS=0`` in a fresh process: PolaPP runs neither the
    PaCS kernel nor SDPA, and gives the in-process plain outputs."""
    torch.manual_seed(0)
    model = PolaPP(arch=POLAPP_TINY, drop_path_rate=0.)
    randomise(model, std=0.3)
    model.eval()
    x = torch.randn(1, 3, 72, 88)
    with torch.no_grad(), ops.plain_paths():
        want = model(x)
    torch.save(dict(state=model.state_dict(), x=x), tmp_path / 'in.pth')
    code = f'''
import torch
import torch.nn.functional as F
from pola_mm.models import PolaPP
from pola_mm.models.layers import pacs_attention
import pola_mm.ops as ops
calls = []
def spy(obj, name):
    f = getattr(obj, name)
    def wrapped(*a, **k):
        calls.append(name)
        return f(*a, **k)
    setattr(obj, name, wrapped)
spy(pacs_attention, 'pacs_attention_kernel')
spy(F, 'scaled_dot_product_attention')
spy(pacs_attention, 'pacs_linear_attention')
d = torch.load({str(tmp_path / 'in.pth')!r}, weights_only=True)
m = PolaPP(arch={POLAPP_TINY!r}, drop_path_rate=0.)
m.load_state_dict(d['state'])
with torch.no_grad():
    outs = m.eval()(d['x'])
torch.save(list(outs), {str(tmp_path / 'out.pth')!r})
print(ops.fast_paths_enabled(), sorted(set(calls)))
'''
    env = dict(os.environ, POLA_MM_FAST_PATHS='0')
    out = subprocess.run([sys.executable, '-c', code], env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout.split('\n')[-2] == \
        "False ['pacs_linear_attention']", out.stderr
    got = torch.load(tmp_path / 'out.pth', weights_only=True)
    _assert_close_to_scale(got, list(want), 1e-6)
