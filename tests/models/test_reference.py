"""The published models: the reference minis reproduce the authors' pooled
features and logits (<= 1e-4, float32) through the conversion function, the
converter CLI and the in1k mmpretrain configs."""
import os.path as osp
import subprocess
import sys

import pytest
import torch
from helpers import PVT_MINI, REPO, SWIN_MINI, reference_file, subprocess_env

from pola_mm.models import PolaPVT, PolaSwinTransformer
from pola_mm.models.checkpoint import (backbone_state_dict,
                                       convert_official_checkpoint)

CLI = osp.join(REPO, 'tools', 'model_converters', 'pola_official_to_mm.py')
TOL = 1e-4
MINIS = {
    'swin': (PolaSwinTransformer, SWIN_MINI, 'pola_swin_t_in1k.py', 256),
    'pvt': (PolaPVT, PVT_MINI, 'pola_pvt_t_in1k.py', 256),
}


def _load(reference_dir, name):
    return (reference_file(reference_dir, name),
            reference_file(reference_dir, name, io=True))


def _check(features, logits, io):
    assert features.shape == io['features'].shape
    assert (features - io['features']).abs().max() <= TOL
    assert (logits - io['logits']).abs().max() <= TOL
    assert torch.equal(logits.argmax(1), io['logits'].argmax(1))


@pytest.mark.parametrize('name', sorted(MINIS))
def test_function(reference_dir, name):
    cls, arch, _, _ = MINIS[name]
    official, io = _load(reference_dir, name)
    converted = convert_official_checkpoint(official['model'])
    model = cls(arch=arch, out_indices=(3, )).eval()
    model.load_state_dict(backbone_state_dict(converted), strict=True)
    with torch.no_grad():
        features = model(io['input'])[0].mean(dim=(2, 3))
    logits = features @ converted['head.fc.weight'].t() + \
        converted['head.fc.bias']
    _check(features, logits, io)


@pytest.mark.parametrize('name', sorted(MINIS))
def test_init_cfg_official_file(reference_dir, name):
    cls, arch, _, _ = MINIS[name]
    official, io = _load(reference_dir, name)
    path = osp.join(reference_dir, f'official_pola_{name}_mini.pth')
    model = cls(arch=arch, out_indices=(3, ),
                init_cfg=dict(type='Pretrained', checkpoint=path))
    model.init_weights()
    model.eval()
    with torch.no_grad():
        features = model(io['input'])[0].mean(dim=(2, 3))
    assert (features - io['features']).abs().max() <= TOL


def _build_classifier(config, arch, in_channels):
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    cfg = Config.fromfile(osp.join(REPO, 'configs', config))
    cfg.model.backbone.arch = arch
    cfg.model.head.in_channels = in_channels
    init_default_scope('mmpretrain')
    return MODELS.build(cfg.model)


@pytest.mark.parametrize('name', sorted(MINIS))
def test_cli_and_in1k_config(reference_dir, tmp_path, name):
    """Authors' file -> CLI -> mmpretrain classifier from the in1k config,
    loaded with mmengine's load_checkpoint (strict)."""
    from mmengine.runner import load_checkpoint
    _, arch, config, in_channels = MINIS[name]
    _, io = _load(reference_dir, name)
    dst = str(tmp_path / f'{name}.pth')
    env = subprocess_env()
    res = subprocess.run(
        [sys.executable, CLI,
         osp.join(reference_dir, f'official_pola_{name}_mini.pth'), dst],
        env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    model = _build_classifier(config, arch, in_channels)
    load_checkpoint(model, dst, map_location='cpu', strict=True)
    model.eval()
    with torch.no_grad():
        logits = model(io['input'], mode='tensor')
        features = model.extract_feat(io['input'])[-1]
    _check(features, logits, io)


FULL = [('pola_swin_t_in1k.py', 'pola_swin_tiny'),
        ('pola_swin_s_in1k.py', 'pola_swin_small'),
        ('pola_swin_b_in1k.py', 'pola_swin_base'),
        ('pola_pvt_t_in1k.py', 'pola_pvt_tiny'),
        ('pola_pvt_s_in1k.py', 'pola_pvt_small'),
        ('pola_pvt_m_in1k.py', 'pola_pvt_medium'),
        ('pola_pvt_l_in1k.py', 'pola_pvt_large')]


@pytest.mark.parametrize('config,key', FULL, ids=[k for _, k in FULL])
def test_in1k_config_matches_authors_layout(reference_dir, config, key):
    """Each in1k config builds a classifier whose state dict is exactly the
    converted authors' checkpoint (names and shapes), built on the meta
    device (no memory, no init)."""
    import json

    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    path = osp.join(reference_dir, 'official_state_dict_layouts.json')
    with open(path) as f:
        layout = json.load(f)[key]
    cfg = Config.fromfile(osp.join(REPO, 'configs', config))
    init_default_scope('mmpretrain')
    with torch.device('meta'):
        model = MODELS.build(cfg.model)
    official = {k: torch.empty(s, device='meta')
                for k, s in layout['params'] + layout['buffers']}
    want = {k: list(v.shape)
            for k, v in convert_official_checkpoint(official).items()}
    got = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert got == want
