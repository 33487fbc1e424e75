"""The models need torch, mmengine (and timm for pola_mm.timm), not mmcv:
pola_mm's own norm / activation / drop-path builders match mmcv's, and
pola_mm.timm imports and runs with the OpenMMLab codebases blocked."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
from helpers import REPO

from pola_mm.models.layers.bricks import (DropPath, build_activation_layer,
                                          build_norm_layer)

pytestmark = pytest.mark.slow

NORM_CFGS = [dict(type='LN'), dict(type='LN', eps=1e-6),
             dict(type='GN', num_groups=4), dict(type='BN'),
             dict(type='BN1d'), dict(type='LN', requires_grad=False)]
ACT_CFGS = [dict(type='GELU'), dict(type='GELU', approximate='tanh'),
            dict(type='ReLU', inplace=True), dict(type='LeakyReLU',
                                                  negative_slope=0.2),
            dict(type='SiLU'), dict(type='Sigmoid')]


@pytest.mark.parametrize('cfg', NORM_CFGS, ids=str)
def test_norm_like_mmcv(cfg):
    """Same name, class, arguments and parameter names as mmcv's builder
    (so checkpoints load unchanged)."""
    mmcv_cnn = pytest.importorskip('mmcv.cnn')
    name, layer = build_norm_layer(dict(cfg), 16, postfix=2)
    ref_name, ref = mmcv_cnn.build_norm_layer(dict(cfg), 16, postfix=2)
    assert name == ref_name
    assert type(layer) is type(ref)
    assert repr(layer) == repr(ref)
    assert list(layer.state_dict()) == list(ref.state_dict())
    assert [p.requires_grad for p in layer.parameters()] == \
        [p.requires_grad for p in ref.parameters()]


@pytest.mark.parametrize('cfg', ACT_CFGS, ids=str)
def test_activation_like_mmcv(cfg):
    mmcv_cnn = pytest.importorskip('mmcv.cnn')
    layer = build_activation_layer(dict(cfg))
    ref = mmcv_cnn.build_activation_layer(dict(cfg))
    assert type(layer) is type(ref) and repr(layer) == repr(ref)
    x = torch.randn(4, 8)
    torch.testing.assert_close(layer(x.clone()), ref(x.clone()))


def test_unsupported_types_raise_clearly():
    with pytest.raises(ValueError, match="unsupported norm type 'LNX'.*'LN'"):
        build_norm_layer(dict(type='LNX'), 8)
    with pytest.raises(ValueError, match="unsupported activation type 'Gelu'"):
        build_activation_layer(dict(type='Gelu'))
    with pytest.raises(TypeError, match='"type" key'):
        build_norm_layer('LN', 8)
    with pytest.raises(KeyError, match='num_groups'):
        build_norm_layer(dict(type='GN'), 8)
    # a class works as the type, as with mmcv
    assert isinstance(build_activation_layer(dict(type=nn.Hardtanh)),
                      nn.Hardtanh)


def test_drop_path():
    torch.manual_seed(0)
    layer = DropPath(0.25)
    x = torch.ones(4000, 3, 2)
    assert torch.equal(layer.eval()(x), x)
    y = layer.train()(x)
    per_sample = y.flatten(1)
    # every sample is dropped whole or scaled by 1 / (1 - p)
    kept = (per_sample == 1 / 0.75).all(1)
    dropped = (per_sample == 0).all(1)
    assert bool((kept | dropped).all())
    assert 0.22 < dropped.float().mean().item() < 0.28
    with pytest.raises(ValueError, match='drop_prob'):
        DropPath(1.0)
    bricks = pytest.importorskip('mmcv.cnn.bricks')
    x = torch.randn(64, 5, 3)
    torch.manual_seed(1)
    y = layer(x)
    torch.manual_seed(1)
    assert torch.equal(y, bricks.DropPath(0.25).train()(x))  # as mmcv's


SCRIPT = textwrap.dedent('''
    import sys

    BLOCKED = ('mmcv', 'mmdet', 'mmseg', 'mmpretrain')

    class Blocker:
        """Refuse the OpenMMLab codebases, as if they were not installed."""

        def find_spec(self, name, path=None, target=None):
            if name.split('.')[0] in BLOCKED:
                raise ModuleNotFoundError(f'No module named {name!r}')
            return None

    sys.meta_path.insert(0, Blocker())
    import timm
    import torch
    import pola_mm.timm  # noqa: F401

    x = torch.randn(1, 3, 70, 90)
    swin = timm.create_model('pola_swin_t', features_only=True, arch=dict(
        embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 1, 2, 2))).eval()
    pvt = timm.create_model('pola_pvt_t', num_classes=3, arch=dict(
        embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1),
        num_heads=(1, 1, 2, 2), mlp_ratios=(2, 2, 2, 2)), drop_path_rate=0.1)
    with torch.no_grad():
        shapes = [tuple(o.shape) for o in swin(x)]
    pvt(x).sum().backward()
    loaded = sorted({m.split('.')[0] for m in sys.modules} & set(BLOCKED))
    print('shapes', shapes)
    print('loaded', loaded)
''')


def test_timm_models_without_mmcv():
    """pola_mm.timm imports, builds, runs forward and backward with mmcv,
    mmdet, mmseg and mmpretrain unimportable."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep +
               os.environ.get('PYTHONPATH', ''))
    res = subprocess.run([sys.executable, '-c', SCRIPT], env=env,
                         capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'loaded []' in res.stdout
    assert ("shapes [(1, 16, 18, 23), (1, 32, 9, 12), (1, 64, 5, 6), "
            "(1, 128, 3, 3)]") in res.stdout
