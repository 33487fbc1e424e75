"""``pola_mm::<config>.py`` for every complete config of ``configs/`` in a
user's ``_base_`` list, and the same names in the deploy tool.

mmengine 0.10.7 reads ``<scope>::<path>`` only where ``<path>`` has a
folder, and stamps the scope on the base's unscoped types; the start-up
hook and ``import pola_mm`` complete its reader for the ``pola_mm`` scope
only (:func:`pola_mm_startup.wrap_get_cfg_path`). Here (pola_mm imported,
as the tools do) every complete config inherited by scope reads exactly as
the file itself; the ``_base_/`` snippets and every other scope read as
mmengine reads them. tests/tools/test_upstream_tools.py runs the same in a
fresh interpreter through the start-up hook alone, and trains two of them
with mmdet's and mmseg's own ``tools/train.py``.
"""
import glob
import os.path as osp

import pytest
from helpers import REPO
from mmengine.config import Config

import pola_mm  # noqa: F401  (as tools/train.py: registers the pola_mm scope)
from pola_mm.deployment.deploy import resolve_model_config

pytestmark = pytest.mark.slow

CONFIGS = osp.join(REPO, 'configs')
#: every complete config: all but the _base_/ snippets
COMPLETE = sorted(
    osp.relpath(p, CONFIGS).replace(osp.sep, '/')
    for p in glob.glob(osp.join(CONFIGS, '**', '*.py'), recursive=True)
    if not osp.relpath(p, CONFIGS).startswith('_base_'))


def _no_scope(node):
    """``node`` without mmengine's ``_scope_`` keys (to compare types)."""
    if isinstance(node, dict):
        return {k: _no_scope(v) for k, v in node.items() if k != '_scope_'}
    if isinstance(node, (list, tuple)):
        return type(node)(_no_scope(v) for v in node)
    return node


def _scopes(node, found=None) -> set:
    found = set() if found is None else found
    if isinstance(node, dict):
        if '_scope_' in node:
            found.add(node['_scope_'])
        for value in node.values():
            _scopes(value, found)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _scopes(value, found)
    return found


#: one complete config of each kind: read in full both ways
KINDS = ['mask_rcnn_pola_swin_t.py', 'cascade_mask_rcnn_polapp_b3.py',
         'retinanet_pola_pvt_t.py', 'upernet_pola_swin_t_ade20k.py',
         'sem_fpn_pola_pvt_t_ade20k.py', 'ham_polapp_b1_ade20k.py',
         'pola_swin_t_in1k.py', 'demo/mask_rcnn_pola_swin_shapes.py']


def test_every_complete_config_is_named_by_scope():
    """``pola_mm::<config>`` is the package's file of every complete config
    (the repository's through the ``.mim/configs`` link, or a wheel's
    copy), read without a scope."""
    assert len([c for c in COMPLETE if '/' not in c]) >= 50
    assert set(KINDS) <= set(COMPLETE)
    package = osp.dirname(pola_mm.__file__)
    for name in COMPLETE:
        path, scope = Config._get_cfg_path(f'pola_mm::{name}', 'user.py')
        assert path == osp.join(package, '.mim', 'configs', *name.split('/'))
        with open(path) as got, open(osp.join(CONFIGS, name)) as want:
            assert got.read() == want.read(), name
        assert scope is None, name


def _folder_only(package_path: str, cfg_file: str) -> str:
    """mmengine's metafile look-up of a ``<scope>::`` base, skipped: it
    reads every metafile of the package (about 100 YAML files for mmdet,
    0.3 s a base here) and never matches a name that ends in ``.py`` (it
    strips the extension, the metafiles keep it), after which mmengine
    reads ``.mim/configs/<path>``, as it does with this."""
    raise ValueError(cfg_file)


@pytest.mark.parametrize('name', KINDS)
def test_a_complete_config_inherits_as_the_file_reads(name, tmp_path,
                                                     monkeypatch):
    """``_base_ = ['pola_mm::<config>']`` reads as the file itself: the
    same dict, the same ``_scope_`` keys (those of its ``mmdet::`` /
    ``mmseg::`` / ``mmpretrain::`` bases, never ``'pola_mm'``: its
    pipelines, schedulers and loops are the codebase's)."""
    from mmengine.config import config as config_module
    monkeypatch.setattr(config_module, '_get_external_cfg_path',
                        _folder_only)
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'user.py').write_text(f"_base_ = ['pola_mm::{name}']\n")
    got = Config.fromfile('user.py')._cfg_dict.to_dict()
    want = Config.fromfile(osp.join(CONFIGS, name))._cfg_dict.to_dict()
    assert _no_scope(got) == _no_scope(want)
    assert got == want
    assert 'pola_mm' not in _scopes(got)


def test_snippets_and_other_scopes_read_as_before():
    """The completion answers only ``pola_mm::<complete config>``: a
    snippet, another scope, a path and every name mmengine refuses go to
    mmengine's own reader, with its result or its error."""
    ours = Config._get_cfg_path
    original = ours.__wrapped__
    assert original.__module__ == 'mmengine.config.config'
    for name in ('pola_mm::_base_/models/pola_swin_t_fpn.py',
                 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
                 'mmdet::_base_/default_runtime.py', 'local/x.py'):
        assert ours(name, 'cfg.py') == original(name, 'cfg.py'), name
    assert ours('pola_mm::_base_/models/pola_swin_t_fpn.py',
                'cfg.py')[1] == 'pola_mm'
    for name in ('mmdet::x.py', 'pola_mm::../configs/x.py',
                 'pola_mm::a::b.py', 'pola_mm::./x.py', 'nope::a/b.py'):
        with pytest.raises((ValueError, AssertionError)) as theirs:
            original(name, 'cfg.py')
        with pytest.raises(type(theirs.value)) as got:
            ours(name, 'cfg.py')
        assert str(got.value) == str(theirs.value), name
    with pytest.raises(FileNotFoundError, match='nope.py" does not exist'):
        ours('pola_mm::nope.py', 'cfg.py')
    # wrapping again changes nothing (the hook and import pola_mm both do)
    from pola_mm_startup import register_config_scope
    register_config_scope()
    assert Config._get_cfg_path is ours


@pytest.mark.parametrize('name', [
    'pola_mm::retinanet_pola_pvt_t.py',
    'pola_mm::demo/mask_rcnn_pola_swin_shapes.py',
    'pola_mm::_base_/models/pola_pvt_t_fpn.py',
    'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
])
def test_deploy_takes_the_names_base_takes(name):
    """The deploy tool's model config goes through the reader of
    ``_base_``: the same file for every name it takes."""
    path = resolve_model_config(name)
    assert path == Config._get_cfg_path(name, 'cfg.py')[0]
    assert osp.isfile(path)


@pytest.mark.parametrize('name, reason', [
    ('mmdet::retinanet_r50_fpn_1x_coco.py', 'please specify the package'),
    ('pola_mm::nope.py', 'does not exist'),
    ('nope::a/b.py', 'does not support to load nope config'),
])
def test_deploy_refuses_the_names_base_refuses(name, reason, tmp_path,
                                               capsys):
    """One line and exit code 2, before anything is exported."""
    from pola_mm.deployment.deploy import main
    with pytest.raises(ValueError, match=reason):
        resolve_model_config(name)
    img = tmp_path / 'x.png'
    img.write_bytes(b'')
    code = main(['mmdeploy::mmdet/detection/'
                 'detection_onnxruntime_dynamic.py', name, 'none', str(img),
                 '--work-dir', str(tmp_path / 'out')])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith(f'error: model config {name}:')
    assert reason in err[0]
