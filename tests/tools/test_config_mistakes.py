"""Config mistakes that mmengine meets while building: one line on stderr
with the closest names, no traceback (pola_mm.config_errors).

A misspelled ``type`` and a key its class does not take, given with
``--cfg-options`` to the demo config (its shapes data made here, a few
images), under pola_mm's ``tools/train.py`` and ``tools/test.py`` (exit
code 2) and under mmdet's own ``tools/train.py`` (exit code 1: the
excepthook that ``import pola_mm``, the config's ``custom_imports``,
chains). The Runner logs the config on stdout before it builds the model,
as in any run. The boundary of ``run_tool`` and the excepthook also run in
process: any other ``KeyError`` or ``TypeError`` keeps its traceback.
"""
import functools
import importlib.util
import os.path as osp
import subprocess
import sys
from typing import List

import pytest
from helpers import REPO, subprocess_env

pytest.importorskip('mmdet')

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CONFIGS = osp.join(REPO, 'configs')
DEMO = osp.join(CONFIGS, 'demo', 'mask_rcnn_pola_swin_shapes.py')

#: (option, the line's start, the suggestion)
MISTAKES = {
    'type': ('model.backbone.type=PolaSwinTransformr',
             "error: unknown type 'PolaSwinTransformr' (the backbone of "
             "MaskRCNN): not in the mmdet::model registry or its parents",
             "did you mean 'PolaSwinTransformer'"),
    'key': ('model.backbone.windo_size=8',
            'error: PolaSwinTransformer (the backbone of MaskRCNN) takes '
            "no argument 'windo_size'", "did you mean 'window_size'?"),
}


@pytest.fixture(scope='module')
def project(tmp_path_factory):
    """A folder with the demo's data (``data/shapes``, 2 + 2 images) and an
    (unreadable) checkpoint file for tools/test.py."""
    from pola_mm.demo.shapes import make_shapes_dataset
    root = tmp_path_factory.mktemp('project')
    make_shapes_dataset(str(root / 'data' / 'shapes'), num_train=2,
                        num_val=2, seed=1)
    (root / 'model.pth').write_bytes(b'')
    return root


def mmdet_train_py() -> str:
    """mmdet's own ``tools/train.py`` as installed (``.mim/tools``)."""
    root = list(importlib.util.find_spec('mmdet')
                .submodule_search_locations)[0]
    return osp.join(root, '.mim', 'tools', 'train.py')


def run(args: List[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=str(cwd),
                          env=subprocess_env(), capture_output=True,
                          text=True, timeout=300)


def error_line(proc: subprocess.CompletedProcess, code: int) -> str:
    """The last line on stderr, which is the only ``error:`` line, with no
    traceback before it."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == code, proc.stderr[-3000:]
    assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    assert [line for line in lines if line.startswith('error:')] == \
        lines[-1:], proc.stderr[-3000:]
    return lines[-1]


@pytest.mark.parametrize('mistake', sorted(MISTAKES))
@pytest.mark.parametrize('tool', ['train.py', 'test.py', 'mmdet train.py'])
def test_a_mistake_is_one_line_with_a_suggestion(project, tool, mistake):
    option, start, hint = MISTAKES[mistake]
    if tool == 'mmdet train.py':
        args, code = [mmdet_train_py(), DEMO], 1
    else:
        args, code = [osp.join(REPO, 'tools', tool), DEMO], 2
        if tool == 'test.py':
            args.append(str(project / 'model.pth'))
    proc = run(args + ['--work-dir', f'work_{mistake}', '--cfg-options',
                       option], project)
    line = error_line(proc, code)
    assert line.startswith(start), line
    assert hint in line, line
    if tool != 'mmdet train.py':  # the tools' warnings are quiet
        assert proc.stderr.strip() == line


@pytest.mark.parametrize('tool', ['train.py', 'mmdet train.py'])
def test_a_missing_pretrained_checkpoint_is_one_line(project, tool):
    """A backbone's ImageNet checkpoint that is not there (every shipped
    config names one): one line saying where to get the weights and how to
    point the config at them, under pola_mm's and mmdet's ``train.py``."""
    cfg = project / 'pretrained.py'
    cfg.write_text(f'_base_ = [{DEMO!r}]\n'
                   'model = dict(backbone=dict(init_cfg=dict(\n'
                   "    _delete_=True, type='Pretrained',\n"
                   "    checkpoint='ckpts/in1k.pth')))\n")
    if tool == 'mmdet train.py':
        args, code = [mmdet_train_py(), str(cfg)], 1
    else:
        args, code = [osp.join(REPO, 'tools', 'train.py'), str(cfg)], 2
    proc = run(args + ['--work-dir', 'work_pretrained'], project)
    line = error_line(proc, code)
    assert 'ckpts/in1k.pth' in line and 'not found' in line, line
    assert 'POLA_PRETRAINED' in line and 'init_cfg=None' in line, line


def test_run_tool_turns_build_errors_into_one_line(capsys):
    """The boundary in process: any other KeyError or TypeError keeps its
    traceback."""
    from mmengine.registry import MODELS

    from pola_mm.cli.train_test import run_tool

    def misspelled(argv):
        MODELS.build(dict(type='PolaPVTT'))

    def mistyped(argv):
        MODELS.build(dict(type='PolaPVT', arch='tiny', sr_ratio=(8, 4)))

    def key_bug(argv):
        raise KeyError('not in a config')

    def type_bug(argv):
        len(1)

    assert run_tool(misspelled) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    # (the registry is the current default scope's: mmengine's, or one an
    # earlier test left)
    assert err[0].startswith("error: unknown type 'PolaPVTT': not in "), err
    assert "did you mean 'PolaPVT'?" in err[0], err
    assert run_tool(mistyped) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: PolaPVT takes no argument 'sr_ratio'; "
                             "did you mean 'sr_ratios'"), err
    with pytest.raises(KeyError, match='not in a config'):
        run_tool(key_bug)
    with pytest.raises(TypeError, match='has no len'):
        run_tool(type_bug)


def test_install_chains_one_excepthook(capsys, monkeypatch):
    """:func:`install_excepthook` (which ``import pola_mm`` calls) chains
    :func:`excepthook` once; it prints a build mistake as one line and
    hands anything else to the previous hook. (Whatever a test before
    chained, e.g. torch.distributed's hook, is set aside here.)"""
    from mmengine.registry import MODELS

    from pola_mm.config_errors import excepthook, install_excepthook
    monkeypatch.setattr(sys, 'excepthook', sys.__excepthook__)
    install_excepthook()
    assert isinstance(sys.excepthook, functools.partial)
    assert sys.excepthook.func is excepthook
    hook = sys.excepthook
    install_excepthook()
    assert sys.excepthook is hook
    seen = []

    def previous(*args):
        seen.append(args)

    try:
        MODELS.build(dict(type='PolaSwinTransformer', arch='tiny',
                          windo_size=7))
    except TypeError as exc:
        excepthook(type(exc), exc, exc.__traceback__, previous=previous)
    assert capsys.readouterr().err == (
        "error: PolaSwinTransformer takes no argument 'windo_size'; did you "
        "mean 'window_size'?\n")
    error = KeyError('a bug')
    excepthook(KeyError, error, None, previous=previous)
    assert seen == [(KeyError, error, None)]
    assert capsys.readouterr().err == ''


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
