"""Checkpoint conversion, the converter CLI and pretrained loading errors."""
import importlib.util
import os.path as osp
import pickle
import re
import shutil
import subprocess
import sys

import pytest
import torch
from helpers import PVT_MINI, REPO, SWIN_MINI, reference_file, subprocess_env

import pola_mm.models.checkpoint as ckpt_mod
from pola_mm.fileio import (CheckpointFileError, InertObject,
                            load_checkpoint_file)
from pola_mm.models import PolaPVT, PolaSwinTransformer
from pola_mm.models.checkpoint import (backbone_state_dict,
                                       convert_official_checkpoint,
                                       extract_state_dict, official_family)

pytestmark = pytest.mark.slow

CLI = osp.join(REPO, 'tools', 'model_converters', 'pola_official_to_mm.py')


def test_convert_swin(reference_dir):
    sd = reference_file(reference_dir, 'swin')['model']
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
    sd = reference_file(reference_dir, 'pvt')['model']
    assert official_family(sd) == 'pvt'
    out = convert_official_checkpoint(sd)
    assert not any(k.startswith(('backbone.norm', 'norm')) for k in out)
    assert 'backbone.pos_embed1' in out and 'head.fc.bias' in out
    assert len(out) == len(sd) - 2


def test_cli(reference_dir, tmp_path, capsys):
    dst = tmp_path / 'sub' / 'swin.pth'
    env = subprocess_env()
    src = osp.join(reference_dir, 'official_pola_swin_mini.pth')
    res = subprocess.run([sys.executable, CLI, src, str(dst)], env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    saved = torch.load(dst, map_location='cpu', weights_only=True)
    assert set(saved) == {'state_dict', 'meta'}
    assert saved['meta']['family'] == 'pola_swin'
    ref = convert_official_checkpoint(
        reference_file(reference_dir, 'swin')['model'])
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
    official = reference_file(reference_dir, 'swin')
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
    official = reference_file(reference_dir, 'swin')['model']
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
        official = reference_file(reference_dir, name)['model']
        if name == 'swin':
            pe = m.layers[1].blocks[0].attn.positional_encoding
            assert pe.shape == (1, 24 * 24, 64)
            from pola_mm.ops import resize_pos_table
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


# ---------------------------------------------------------------------------
# The authors' training checkpoints (utils.save_checkpoint of their code),
# loaded without running anything from the file
# ---------------------------------------------------------------------------
MINIS = {'swin': (PolaSwinTransformer, SWIN_MINI, 'pola_swin_t_in1k.py'),
         'pvt': (PolaPVT, PVT_MINI, 'pola_pvt_t_in1k.py')}
TOL = 1e-4


def _authors_config(name):
    """A frozen yacs config shaped like the authors' ``config.py``."""
    from yacs.config import CfgNode as CN
    cfg = CN()
    cfg.BASE = ['']
    cfg.DATA = CN()
    cfg.DATA.BATCH_SIZE = 128
    cfg.DATA.IMG_SIZE = 224
    cfg.MODEL = CN()
    cfg.MODEL.TYPE = f'pola_{name}'
    cfg.MODEL.NAME = f'pola_{name}_mini'
    cfg.MODEL.NUM_CLASSES = 1000
    cfg.MODEL.DROP_PATH_RATE = 0.1
    cfg.TRAIN = CN()
    cfg.TRAIN.EPOCHS = 300
    cfg.TRAIN.BASE_LR = 1e-3
    cfg.TRAIN.LR_SCHEDULER = CN()
    cfg.TRAIN.LR_SCHEDULER.NAME = 'cosine'
    cfg.TRAIN.OPTIMIZER = CN()
    cfg.TRAIN.OPTIMIZER.NAME = 'adamw'
    cfg.TRAIN.OPTIMIZER.EPS = 1e-8
    cfg.TRAIN.OPTIMIZER.BETAS = (0.9, 0.999)
    cfg.AMP_OPT_LEVEL = ''
    cfg.freeze()
    return cfg


def _save_authors_checkpoint(state_dict, path, name, **extra):
    """Write ``state_dict`` as the authors' ``save_checkpoint`` does:
    ``{'model', 'optimizer', 'lr_scheduler', 'max_accuracy', 'epoch',
    'config'}`` with their AdamW (decay / no-decay groups), timm's
    ``CosineLRScheduler`` (stepped per iteration) and a yacs ``CfgNode``."""
    from timm.scheduler.cosine_lr import CosineLRScheduler
    config = _authors_config(name)
    torch.manual_seed(0)
    params = [torch.nn.Parameter(v.detach().clone())
              for k, v in state_dict.items()
              if v.is_floating_point() and not k.endswith('attn_mask')]
    decay = [p for p in params if p.dim() > 1]
    no_decay = [p for p in params if p.dim() <= 1]
    optimizer = torch.optim.AdamW(
        [{'params': decay}, {'params': no_decay, 'weight_decay': 0.}],
        eps=1e-8, betas=(0.9, 0.999), lr=1e-3, weight_decay=0.05)
    scheduler = CosineLRScheduler(
        optimizer, t_initial=3000, lr_min=1e-5, warmup_lr_init=1e-6,
        warmup_t=200, cycle_limit=1, t_in_epochs=False)
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer.step()
    scheduler.step_update(10)
    save_state = {'model': state_dict,
                  'optimizer': optimizer.state_dict(),
                  'lr_scheduler': scheduler.state_dict(),
                  'max_accuracy': 78.8,
                  'epoch': 300,
                  'config': config}
    save_state.update(extra)
    torch.save(save_state, path)
    return save_state


@pytest.fixture(scope='module')
def authors_files(reference_dir, tmp_path_factory):
    """``{name: path}`` of training checkpoints for the Swin and PVT minis,
    plus ``'<name>_io'`` (reference inputs and outputs)."""
    pytest.importorskip('yacs.config')
    folder = tmp_path_factory.mktemp('authors')
    files = {}
    for name in MINIS:
        files[name] = str(folder / f'pola_{name}_ckpt_epoch_300.pth')
        _save_authors_checkpoint(reference_file(reference_dir, name)['model'],
                                 files[name], name)
        files[f'{name}_io'] = torch.load(
            osp.join(reference_dir, f'official_pola_{name}_mini_io.pth'),
            map_location='cpu', weights_only=True)
    return files


def _assert_matches(features, logits, io):
    assert (features - io['features']).abs().max() <= TOL
    if logits is not None:
        assert (logits - io['logits']).abs().max() <= TOL


def _backbone_features(model, x):
    model.eval()
    with torch.no_grad():
        return model(x)[-1].mean(dim=(2, 3))


def _run_cli(src, dst):
    env = subprocess_env()
    return subprocess.run([sys.executable, CLI, str(src), str(dst)], env=env,
                          capture_output=True, text=True)


def _in_process_cli():
    spec = importlib.util.spec_from_file_location('pola_cli', CLI)
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    return cli


def test_weights_only_refuses_authors_training_checkpoint(authors_files):
    """The premise: torch's weights-only loader rejects the authors' files
    (their ``config`` is a yacs CfgNode)."""
    with pytest.raises(pickle.UnpicklingError, match='CfgNode'):
        torch.load(authors_files['swin'], map_location='cpu',
                   weights_only=True)


@pytest.mark.parametrize('name', sorted(MINIS))
def test_load_authors_training_checkpoint(reference_dir, authors_files,
                                          name, monkeypatch):
    from pola_mm.fileio import safe_load
    logs = []
    monkeypatch.setattr(safe_load, 'print_log',
                        lambda msg, **kw: logs.append((msg, kw)))
    ckpt = load_checkpoint_file(authors_files[name])
    assert set(ckpt) == {'model', 'optimizer', 'lr_scheduler',
                         'max_accuracy', 'epoch', 'config'}
    official = reference_file(reference_dir, name)['model']
    assert list(ckpt['model']) == list(official)
    assert all(type(v) is torch.Tensor and torch.equal(v, official[k])
               for k, v in ckpt['model'].items())
    # the config: inert data, readable, nothing of yacs ran
    config = ckpt['config']
    assert isinstance(config, InertObject)
    assert config.inert_global == 'yacs.config.CfgNode'
    items = dict(config.inert_items)
    assert dict(items['MODEL'].inert_items)['TYPE'] == f'pola_{name}'
    assert dict(dict(items['TRAIN'].inert_items)['OPTIMIZER'].inert_items)[
        'BETAS'] == (0.9, 0.999)
    assert config.inert_state['__immutable__'] is True
    # optimizer / scheduler state: plain data, as saved
    opt = ckpt['optimizer']
    assert [len(g['params']) for g in opt['param_groups']] == [
        sum(v.dim() > 1 for k, v in official.items()
            if v.is_floating_point() and not k.endswith('attn_mask')),
        sum(v.dim() <= 1 for k, v in official.items()
            if v.is_floating_point() and not k.endswith('attn_mask'))]
    assert set(opt['state'][0]) == {'step', 'exp_avg', 'exp_avg_sq'}
    assert ckpt['lr_scheduler']['t_initial'] == 3000
    assert ckpt['max_accuracy'] == 78.8 and ckpt['epoch'] == 300
    # one log line naming what was loaded inertly
    assert len(logs) == 1 and logs[0][1] == {'logger': 'current'}
    assert authors_files[name] in logs[0][0]
    assert "'config' (yacs.config.CfgNode)" in logs[0][0]
    assert "weights taken from 'model'" in logs[0][0]


def test_loading_imports_nothing_from_the_file(authors_files):
    """In a fresh interpreter, loading does not even import yacs."""
    code = ('import sys; from pola_mm.fileio import load_checkpoint_file; '
            f'ckpt = load_checkpoint_file({authors_files["swin"]!r}); '
            "assert 'yacs' not in sys.modules, 'yacs imported'; "
            "print(ckpt['config'].inert_global)")
    env = subprocess_env()
    res = subprocess.run([sys.executable, '-c', code], env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith('yacs.config.CfgNode')


@pytest.mark.parametrize('name', sorted(MINIS))
def test_authors_training_checkpoint_function_and_init_cfg(
        authors_files, name):
    """convert_official_checkpoint on what the loader returns, and the
    backbone's init_cfg, reproduce the published features and logits."""
    cls, arch, _ = MINIS[name]
    io = authors_files[f'{name}_io']
    converted = convert_official_checkpoint(
        extract_state_dict(load_checkpoint_file(authors_files[name])))
    model = cls(arch=arch, out_indices=(3, ))
    model.load_state_dict(backbone_state_dict(converted), strict=True)
    features = _backbone_features(model, io['input'])
    logits = features @ converted['head.fc.weight'].t() + \
        converted['head.fc.bias']
    _assert_matches(features, logits, io)

    model = cls(arch=arch, out_indices=(3, ),
                init_cfg=dict(type='Pretrained',
                              checkpoint=authors_files[name]))
    model.init_weights()
    _assert_matches(_backbone_features(model, io['input']), None, io)


@pytest.mark.parametrize('name', sorted(MINIS))
def test_authors_training_checkpoint_cli_and_in1k_config(
        reference_dir, authors_files, tmp_path, name):
    """Converter CLI on the training checkpoint, then the mmpretrain
    classifier of the in1k config (loaded by mmengine, strictly)."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.runner import load_checkpoint
    from mmpretrain.registry import MODELS
    _, arch, config = MINIS[name]
    io = authors_files[f'{name}_io']
    dst = tmp_path / f'{name}.pth'
    res = _run_cli(authors_files[name], dst)
    assert res.returncode == 0, res.stderr
    assert 'yacs.config.CfgNode' in res.stdout + res.stderr  # the log line
    saved = torch.load(dst, map_location='cpu', weights_only=True)
    ref = convert_official_checkpoint(
        reference_file(reference_dir, name)['model'])
    assert list(saved['state_dict']) == list(ref)
    assert all(torch.equal(saved['state_dict'][k], v) for k, v in ref.items())
    cfg = Config.fromfile(osp.join(REPO, 'configs', config))
    cfg.model.backbone.arch = arch
    cfg.model.head.in_channels = 256
    init_default_scope('mmpretrain')
    model = MODELS.build(cfg.model)
    load_checkpoint(model, str(dst), map_location='cpu', strict=True)
    model.eval()
    with torch.no_grad():
        logits = model(io['input'], mode='tensor')
        features = model.extract_feat(io['input'])[-1]
    _assert_matches(features, logits, io)


def test_legacy_format_training_checkpoint(reference_dir, tmp_path):
    """The pre-1.6 (non-zip) torch format goes through the same loader."""
    pytest.importorskip('yacs.config')
    path = str(tmp_path / 'legacy.pth')
    official = reference_file(reference_dir, 'swin')['model']
    state = {'model': official, 'config': _authors_config('swin'),
             'epoch': 300}
    torch.save(state, path, _use_new_zipfile_serialization=False)
    ckpt = load_checkpoint_file(path)
    assert isinstance(ckpt['config'], InertObject) and ckpt['epoch'] == 300
    assert all(torch.equal(ckpt['model'][k], v) for k, v in official.items())


def test_http_checkpoint_downloaded_once(reference_dir, tmp_path,
                                         monkeypatch):
    """URLs are cached in torch's hub folder and read by the same loader."""
    src = osp.join(reference_dir, 'official_pola_pvt_mini.pth')
    calls = []

    def fake_download(url, dst, progress=True):
        calls.append(url)
        shutil.copy(src, dst)

    monkeypatch.setattr(torch.hub, 'get_dir', lambda: str(tmp_path / 'hub'))
    monkeypatch.setattr(torch.hub, 'download_url_to_file', fake_download)
    url = 'https://example.invalid/weights/pola_pvt_mini.pth'
    for _ in range(2):
        ckpt = load_checkpoint_file(url)
        assert official_family(extract_state_dict(ckpt)) == 'pvt'
    assert calls == [url]
    assert (tmp_path / 'hub' / 'checkpoints' / 'pola_pvt_mini.pth').is_file()


# payloads whose unpickling runs code with the ordinary (non weights-only)
# unpickler; each one creates the file it is given
class _OpenPayload:
    """``__reduce__`` -> ``open(path, 'w')``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, 'w'))


class _SetStatePayload:
    """A class whose ``__setstate__`` (pickle's BUILD) writes a file."""

    def __init__(self, path):
        self.path = str(path)

    def __setstate__(self, state):
        with open(state['path'], 'w') as f:
            f.write('ran')


class _RebuildPayload:
    """Abuses torch's own tensor rebuild: ``_rebuild_from_type_v2(eval,
    Tensor, (source, ), {})`` evaluates ``source``, which writes a file."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        source = (f'open({self.path!r}, "w").close() or '
                  '__import__("torch").zeros(1)')
        return (torch._tensor._rebuild_from_type_v2,
                (eval, torch.Tensor, (source, ), {}))


PAYLOADS = {'open': _OpenPayload, 'setstate': _SetStatePayload,
            'rebuild': _RebuildPayload}


def _evil_file(reference_dir, folder, kind, marker, where='beside'):
    """An authors'-style checkpoint with a payload beside ``model`` (or
    inside it)."""
    model = dict(reference_file(reference_dir, 'swin')['model'])
    state = {'model': model, 'epoch': 300}
    if where == 'beside':
        state['config'] = PAYLOADS[kind](marker)
    else:
        model['layers.0.blocks.0.attn.evil'] = PAYLOADS[kind](marker)
    path = folder / f'{kind}_{where}.pth'
    torch.save(state, path)
    return str(path)


@pytest.mark.parametrize('kind', sorted(PAYLOADS))
def test_payloads_are_live_with_plain_torch_load(reference_dir, tmp_path,
                                                 kind):
    """Control: the payloads do run under ``torch.load(weights_only=False)``,
    so the tests below prove something."""
    marker = tmp_path / 'ran.txt'
    path = _evil_file(reference_dir, tmp_path, kind, marker)
    torch.load(path, map_location='cpu', weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize('kind', sorted(PAYLOADS))
def test_payloads_never_run(reference_dir, tmp_path, kind, capsys):
    """Through every route, a payload beside ``model`` is inert (the weights
    load) or refused (a foreign tensor rebuild), and one inside ``model`` is
    refused; the file it would create never appears."""
    marker = tmp_path / 'ran.txt'
    beside = _evil_file(reference_dir, tmp_path, kind, marker)
    inside = _evil_file(reference_dir, tmp_path, kind, marker, 'inside')
    official = reference_file(reference_dir, 'swin')['model']
    cli = _in_process_cli()
    refused = kind == 'rebuild'
    # loader + conversion
    if refused:
        with pytest.raises(CheckpointFileError, match='refused'):
            load_checkpoint_file(beside)
    else:
        ckpt = load_checkpoint_file(beside)
        assert isinstance(ckpt['config'], InertObject)
        conv = convert_official_checkpoint(extract_state_dict(ckpt))
        assert torch.equal(conv['backbone.patch_embed.proj.weight'],
                           official['patch_embed.proj.weight'])
    inside_error = 'refused' if refused else (
        "'model' entry 'layers.0.blocks.0.attn.evil' is not a tensor")
    with pytest.raises(CheckpointFileError, match=inside_error):
        load_checkpoint_file(inside)
    # converter CLI
    dst = tmp_path / 'converted.pth'
    assert cli.main([beside, str(dst)]) == (1 if refused else 0)
    assert dst.exists() != refused
    assert cli.main([inside, str(tmp_path / 'x.pth')]) == 1
    err = capsys.readouterr().err
    assert inside in err and inside_error in err
    assert not (tmp_path / 'x.pth').exists()
    # init_cfg
    for path in (beside, inside):
        model = PolaSwinTransformer(
            arch=SWIN_MINI, init_cfg=dict(type='Pretrained', checkpoint=path))
        if path == inside or refused:
            with pytest.raises(CheckpointFileError, match=re.escape(path)):
                model.init_weights()
        else:
            model.init_weights()
            assert torch.equal(model.patch_embed.proj.weight,
                               official['patch_embed.proj.weight'])
    assert not marker.exists()


def test_unreadable_files_name_the_file(authors_files, tmp_path, capsys):
    """Truncated, corrupt or foreign files: one error naming the file and
    what is wrong, through the loader, the CLI and init_cfg."""
    data = open(authors_files['swin'], 'rb').read()
    truncated = tmp_path / 'pola_swin_truncated.pth'
    truncated.write_bytes(data[:len(data) // 2])
    text = tmp_path / 'notes.pth'
    text.write_text('not a checkpoint\n')
    empty = tmp_path / 'empty.pth'
    empty.write_bytes(b'')
    corrupt = tmp_path / 'corrupt.pth'  # the pickle's start zeroed
    blob = bytearray(data)
    pkl = data.index(b'\x80\x02', data.index(b'data.pkl'))
    blob[pkl:pkl + 64] = bytes(64)
    corrupt.write_bytes(bytes(blob))
    legacy = tmp_path / 'legacy_truncated.pth'
    torch.save({'model': {'w': torch.zeros(3)}}, legacy,
               _use_new_zipfile_serialization=False)
    legacy.write_bytes(legacy.read_bytes()[:40])
    expected = {truncated: 'truncated or corrupt', text: 'not a PyTorch',
                empty: 'empty', corrupt: 'cannot be read',
                legacy: 'cannot be read'}
    cli = _in_process_cli()
    for path, what in expected.items():
        with pytest.raises(CheckpointFileError) as err:
            load_checkpoint_file(str(path))
        msg = str(err.value)
        assert str(path) in msg and what in msg, msg
        assert '\n' not in msg and err.value.__cause__ is None
        assert err.value.__context__ is None or \
            err.value.__suppress_context__  # no chained traceback
        assert cli.main([str(path), str(tmp_path / 'out.pth')]) == 1
        assert str(path) in capsys.readouterr().err
        model = PolaPVT(arch=PVT_MINI, init_cfg=dict(type='Pretrained',
                                                     checkpoint=str(path)))
        with pytest.raises(CheckpointFileError, match=what):
            model.init_weights()
    assert not (tmp_path / 'out.pth').exists()
