"""Checkpoint conversion, the converter CLI and pretrained loading errors."""
import importlib.util
import os
import os.path as osp
import subprocess
import sys

import pytest
from conftest import reference_root
import torch

import pola_mm.models.checkpoint as ckpt_mod
from pola_mm.models import PolaPVT, PolaSwinTransformer
from pola_mm.models.checkpoint import (backbone_state_dict,
                                       convert_official_checkpoint,
                                       official_family)

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
CLI = osp.join(REPO, 'tools', 'model_converters', 'pola_official_to_mm.py')
SWIN_MINI = dict(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))
PVT_MINI = dict(embed_dims=(32, 64, 160, 256), depths=(1, 1, 1, 1),
                num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4))


@pytest.fixture(scope='module')
def reference_dir():
    return reference_root('official_pola_swin_mini.pth')


def _official(reference_dir, name):
    path = osp.join(reference_dir, f'official_pola_{name}_mini.pth')
    return torch.load(path, map_location='cpu', weights_only=True)


def test_convert_swin(reference_dir):
    sd = _official(reference_dir, 'swin')['model']
    assert official_family(sd) == 'swin'
    out = convert_official_checkpoint(sd)
    assert 'backbone.norm3.weight' in out and 'head.fc.weight' in out
    assert not any('relative_position_index' in k or 'attn_mask' in k
                   for k in out)
    assert all(k.startswith(('backbone.', 'head.fc.')) for k in out)
    assert torch.equal(out['backbone.norm3.weight'], sd['norm.weight'])
    # idempotent
    again = convert_official_checkpoint(out)
    assert list(again) == list(out)
    assert all(again[k] is out[k] for k in out)
    assert official_family(out) is None
    back = backbone_state_dict(sd)
    assert 'norm3.bias' in back and 'head.fc.weight' not in back


def test_convert_pvt(reference_dir):
    sd = _official(reference_dir, 'pvt')['model']
    assert official_family(sd) == 'pvt'
    out = convert_official_checkpoint(sd)
    assert not any(k.startswith(('backbone.norm', 'norm')) for k in out)
    assert 'backbone.pos_embed1' in out and 'head.fc.bias' in out
    assert len(out) == len(sd) - 2


def test_cli(reference_dir, tmp_path, capsys):
    dst = tmp_path / 'sub' / 'swin.pth'
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep +
               os.environ.get('PYTHONPATH', ''))
    src = osp.join(reference_dir, 'official_pola_swin_mini.pth')
    res = subprocess.run([sys.executable, CLI, src, str(dst)], env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    saved = torch.load(dst, map_location='cpu', weights_only=True)
    assert set(saved) == {'state_dict', 'meta'}
    assert saved['meta']['family'] == 'pola_swin'
    ref = convert_official_checkpoint(
        _official(reference_dir, 'swin')['model'])
    assert list(saved['state_dict']) == list(ref)
    # errors (in-process: same code path, no interpreter start-up)
    spec = importlib.util.spec_from_file_location('pola_cli', CLI)
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert cli.main([str(tmp_path / 'nope.pth'), str(tmp_path / 'x.pth')]) == 2
    assert 'no such file' in capsys.readouterr().err
    assert cli.main([str(dst), str(tmp_path / 'x.pth')]) == 1
    assert "not an authors'" in capsys.readouterr().err
    assert not (tmp_path / 'x.pth').exists()


def _features(model, x):
    model.eval()
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize('kind', ['official', 'converted', 'backbone',
                                  'detector', 'prefixed'])
def test_init_cfg_accepts_layouts(reference_dir, tmp_path, kind):
    official = _official(reference_dir, 'swin')
    conv = convert_official_checkpoint(official['model'])
    back = backbone_state_dict(official['model'])
    path = str(tmp_path / 'ckpt.pth')
    if kind == 'official':
        path = osp.join(reference_dir, 'official_pola_swin_mini.pth')
    elif kind == 'converted':
        torch.save({'state_dict': conv}, path)
    elif kind == 'backbone':
        torch.save(back, path)
    elif kind == 'detector':
        sd = dict(conv)
        sd['neck.lateral.weight'] = torch.zeros(3)
        torch.save({'state_dict': sd, 'meta': {}}, path)
    else:
        torch.save({'state_dict': {'model.' + k: v for k, v in back.items()}},
                   path)
    init_cfg = dict(type='Pretrained', checkpoint=path)
    if kind == 'prefixed':
        init_cfg['prefix'] = 'model.'
    model = PolaSwinTransformer(arch=SWIN_MINI, init_cfg=init_cfg)
    model.init_weights()
    sd = model.state_dict()
    for k, v in back.items():
        if k in sd:
            assert torch.equal(sd[k], v), k
    assert model.is_init


def test_partial_build_logs_expected_misses(reference_dir, monkeypatch):
    logs = []
    monkeypatch.setattr(ckpt_mod, 'print_log',
                        lambda msg, **kw: logs.append(msg))
    path = osp.join(reference_dir, 'official_pola_swin_mini.pth')
    model = PolaSwinTransformer(arch=SWIN_MINI, out_indices=(0, 1),
                                init_cfg=dict(type='Pretrained',
                                              checkpoint=path))
    model.init_weights()
    assert len(logs) == 1
    assert 'norm0' in logs[0] and 'layers.2' in logs[0] and 'head' in logs[0]
    logs.clear()
    path = osp.join(reference_dir, 'official_pola_pvt_mini.pth')
    PolaPVT(arch=PVT_MINI, init_cfg=dict(type='Pretrained',
                                         checkpoint=path)).init_weights()
    assert len(logs) == 1 and 'norm' in logs[0]


def test_wrong_checkpoints_raise(reference_dir, tmp_path):
    swin = osp.join(reference_dir, 'official_pola_swin_mini.pth')
    pvt = osp.join(reference_dir, 'official_pola_pvt_mini.pth')
    # another family
    m = PolaSwinTransformer(arch=SWIN_MINI,
                            init_cfg=dict(type='Pretrained', checkpoint=pvt))
    with pytest.raises(ValueError, match=r'0 of \d+ keys matched'):
        m.init_weights()
    m = PolaPVT(arch=PVT_MINI, init_cfg=dict(type='Pretrained',
                                             checkpoint=swin))
    with pytest.raises(ValueError, match='Pola-PVT checkpoint'):
        m.init_weights()
    # another size: shape mismatches; the model is left untouched
    m = PolaSwinTransformer(arch='tiny', out_indices=(1, ),
                            init_cfg=dict(type='Pretrained', checkpoint=swin))
    with pytest.raises(ValueError, match='another shape') as err:
        m.init_weights()
    assert 'patch_embed.proj.weight' in str(err.value)
    official = _official(reference_dir, 'swin')['model']
    key = 'layers.0.blocks.0.attn.dwc.weight'  # same shape in both archs
    assert official[key].shape == m.state_dict()[key].shape
    assert not torch.equal(m.state_dict()[key], official[key])
    # a classifier of something else
    other = str(tmp_path / 'resnet.pth')
    torch.save({'state_dict': {
        'backbone.conv1.weight': torch.zeros(8, 3, 7, 7),
        'backbone.bn1.weight': torch.zeros(8),
        'head.fc.weight': torch.zeros(10, 8)}}, other)
    m = PolaSwinTransformer(arch=SWIN_MINI,
                            init_cfg=dict(type='Pretrained', checkpoint=other))
    with pytest.raises(ValueError, match=r'0 of \d+ keys matched.*'
                       'unexpected conv1'):
        m.init_weights()
    # no backbone weights at all
    empty = str(tmp_path / 'empty.pth')
    torch.save({'state_dict': {'head.fc.weight': torch.zeros(2, 2)}}, empty)
    m = PolaPVT(arch=PVT_MINI, init_cfg=dict(type='Pretrained',
                                             checkpoint=empty))
    with pytest.raises(ValueError):
        m.init_weights()


def test_pos_tables_resized_for_other_pretrain_size(reference_dir):
    """A 224 checkpoint initialises a model pre-trained at another size: the
    learned token tables are bicubic-resized (other weights unchanged)."""
    for cls, arch, name in ((PolaSwinTransformer, SWIN_MINI, 'swin'),
                            (PolaPVT, PVT_MINI, 'pvt')):
        path = osp.join(reference_dir, f'official_pola_{name}_mini.pth')
        m = cls(arch=arch, pretrain_img_size=192,
                init_cfg=dict(type='Pretrained', checkpoint=path))
        m.init_weights()
        official = _official(reference_dir, name)['model']
        if name == 'swin':
            pe = m.layers[1].blocks[0].attn.positional_encoding
            assert pe.shape == (1, 24 * 24, 64)
            from pola_mm.models.layers import resize_pos_table
            torch.testing.assert_close(
                m.layers[0].blocks[0].attn.positional_encoding.data,
                resize_pos_table(official['layers.0.blocks.0.attn.'
                                          'positional_encoding'],
                                 (56, 56), (48, 48)))
            assert torch.equal(m.layers[0].blocks[0].attn.qkvg.weight,
                               official['layers.0.blocks.0.attn.qkvg.weight'])
            # stage 3: window 6 < 7, the exact sub-table of offsets
            key = 'layers.3.blocks.0.attn.relative_position_bias_table'
            sub = official[key].t().reshape(8, 13, 13)[:, 1:12, 1:12]
            assert torch.equal(m.state_dict()[key],
                               sub.reshape(8, -1).t())
        else:
            assert m.pos_embed1.shape == (1, 48 * 48, 32)
        assert torch.isfinite(m(torch.randn(1, 3, 64, 64))[-1]).all()


def test_missing_pretrained_file_names_path_and_fix(tmp_path):
    from pola_mm.registry import MODELS
    path = str(tmp_path / 'missing_in1k.pth')
    model = MODELS.build(dict(
        type='PolaSwinTransformer',
        arch=dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2)),
        init_cfg=dict(type='Pretrained', checkpoint=path)))
    with pytest.raises(FileNotFoundError) as err:
        model.init_weights()
    msg = str(err.value)
    assert path in msg and 'init_cfg=None' in msg
    assert 'pola_official_to_mm.py' in msg
