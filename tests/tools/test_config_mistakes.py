"""Config mistakes under pola_mm's tools: one line on stderr, exit code 2,
no traceback, no config dump (pola_mm.cli.config_check).

A misspelled ``type`` names the registry it was looked up in and the
closest registered names; a removed option of a backbone names the fix.
The tools run as subprocesses on shipped configs with ``--cfg-options``
(the mistakes are found before the data is looked for); the boundary of
``run_tool`` (a mistake met while mmengine builds) runs in process.
"""
import os.path as osp
import subprocess
import sys
from typing import List

import pytest
from helpers import REPO, subprocess_env

pytest.importorskip('mmdet')

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CONFIGS = osp.join(REPO, 'configs')


def run_tool(tool: str, args: List[str], cwd) -> subprocess.CompletedProcess:
    """``python tools/<tool> ARGS`` as a user runs it."""
    return subprocess.run([sys.executable, osp.join(REPO, 'tools', tool),
                           *args], cwd=str(cwd), env=subprocess_env(),
                          capture_output=True, text=True, timeout=300)


def one_line(proc: subprocess.CompletedProcess) -> str:
    """The only line on stderr; nothing on stdout (no config dump)."""
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert proc.stdout == '', proc.stdout[-3000:]
    assert lines[0].startswith('error: ')
    return lines[0]


def test_misspelled_type_is_one_line_with_suggestions(tmp_path):
    """tools/train.py on a Mask R-CNN config (mmdet:: bases: the config
    read imports pkg_resources, whose warning the tools silence)."""
    proc = run_tool('train.py', [
        osp.join(CONFIGS, 'mask_rcnn_pola_swin_t.py'), '--work-dir',
        str(tmp_path / 'work'), '--cfg-options',
        'model.backbone.type=PolaSwinTransformr'], tmp_path)
    line = one_line(proc)
    assert line.startswith("error: model.backbone: unknown type "
                           "'PolaSwinTransformr': not in the mmdet::model "
                           "registry"), line
    assert "did you mean 'PolaSwinTransformer'" in line
    assert 'pkg_resources' not in proc.stderr
    assert not (tmp_path / 'work').exists()


def test_removed_option_is_one_line_naming_the_fix(tmp_path):
    """tools/test.py on an mmseg config: the option is refused before the
    checkpoint is read."""
    ckpt = tmp_path / 'model.pth'
    ckpt.write_bytes(b'')
    proc = run_tool('test.py', [
        osp.join(CONFIGS, 'upernet_pola_swin_t_ade20k.py'), str(ckpt),
        '--cfg-options', 'model.backbone.mask_padding=True'], tmp_path)
    line = one_line(proc)
    assert line.startswith("error: model.backbone: PolaSwinTransformer: the "
                           "option 'mask_padding' was removed in pola_mm "
                           "0.1.0; delete mask_padding=... from the config"), \
        line
    assert 'pkg_resources' not in proc.stderr


@pytest.mark.parametrize('name', [
    'mask_rcnn_pola_swin_t.py', 'cascade_mask_rcnn_polapp_b3.py',
    'upernet_pola_swin_t_ade20k.py', 'pola_swin_t_in1k.py'])
def test_shipped_configs_have_no_mistake(name):
    """Every type of the shipped models resolves (assigners, initialisers,
    RoI layers, NMS, mmpretrain's batch augments), in its scope."""
    from pola_mm.cli.config_check import first_config_mistake
    from pola_mm.models.from_config import load_config
    assert first_config_mistake(load_config(osp.join(CONFIGS, name))) is None


def test_scoped_types_and_removed_options_in_process():
    """``_scope_`` and ``scope.Name`` are looked up as mmengine builds them;
    a removed option is found without building."""
    from mmengine.config import Config

    from pola_mm.cli.config_check import first_config_mistake
    model = dict(type='mmdet.RetinaNet',
                 backbone=dict(type='PolaPVT', arch='tiny'),
                 bbox_head=dict(_scope_='mmdet', type='RetinaHead'))

    def config():  # (a scope of its own: none left over by other tests)
        return Config(dict(model=model, default_scope='mmdet'))

    assert first_config_mistake(config()) is None
    model['backbone']['pad_input'] = True
    line = first_config_mistake(config())
    assert line.startswith("model.backbone: PolaPVT: the option 'pad_input' "
                           'was removed'), line
    model['backbone'] = dict(type='PolaPVT', arch='tiny')
    model['bbox_head']['type'] = 'RetinaHed'
    line = first_config_mistake(config())
    assert line.startswith("model.bbox_head: unknown type 'RetinaHed': not "
                           'in the mmdet::model registry'), line
    assert "'RetinaHead'" in line


def test_run_tool_turns_build_errors_into_one_line(capsys):
    """A mistake met inside mmengine's build (past the check) is one line
    too; any other KeyError keeps its traceback."""
    from mmengine.registry import MODELS

    from pola_mm.cli.train_test import run_tool as run

    def misspelled(argv):
        MODELS.build(dict(type='PolaPVTT'))

    def removed(argv):
        MODELS.build(dict(type='PolaSwinTransformer', arch='tiny',
                          mask_padding=False))

    def bug(argv):
        raise KeyError('not in a config')

    assert run(misspelled) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    # (the registry named is the current default scope's: mmengine's, or
    # one an earlier test left)
    assert err[0].startswith("error: unknown type 'PolaPVTT': not in "), err
    assert '::model registry or its parents; ' in err[0], err
    assert "did you mean 'PolaPVT'" in err[0], err
    assert run(removed) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert "'mask_padding' was removed" in err[0]
    with pytest.raises(KeyError, match='not in a config'):
        run(bug)


def test_cfg_options_that_do_not_fit_are_one_line(capsys):
    """A dict given over a value of another type (``arch`` is a name in the
    shipped config) is one line, not mmengine's merge traceback."""
    from pola_mm.cli.train_test import run_tool as run
    from pola_mm.cli.train_test import train_main
    assert run(train_main, [osp.join(CONFIGS, 'pola_swin_t_in1k.py'),
                            '--cfg-options',
                            'model.backbone.arch.embed_dims=16']) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        'error: --cfg-options do not fit config '), err
    assert '_delete_=True' in err[0]
