"""Option handling of tools/train.py and tools/test.py
(pola_mm.cli.train_test).

In-process and cheap: the configs are built, not run
(tests/test_compat.py runs the tools for real).
"""
from pathlib import Path

import pytest

from pola_mm.cli import train_test as runner
from pola_mm.cli.train_test import ToolError

BASE = """
default_scope = {scope!r}
model = dict(type='Whatever')
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1))
test_evaluator = dict(type='SomeMetric')
default_hooks = dict(visualization=dict(type='VisHook'))
visualizer = dict(type='Vis')
"""


@pytest.fixture(autouse=True)
def _keep_env(monkeypatch):
    monkeypatch.setenv('LOCAL_RANK', '0')


def write_cfg(tmp_path: Path, scope: str = 'mmdet', extra: str = '') -> str:
    path = tmp_path / f'my_{scope}_cfg.py'
    path.write_text(BASE.format(scope=scope) + extra)
    return str(path)


def make_train_cfg(*argv):
    parser = runner.train_parser()
    return runner.prepare_train_config(parser.parse_args(list(argv)))


def make_test_cfg(*argv):
    parser = runner.test_parser()
    return runner.prepare_test_config(parser.parse_args(list(argv)))


def test_default_work_dir_is_named_after_config(tmp_path):
    cfg = make_train_cfg(write_cfg(tmp_path))
    assert cfg.work_dir == './work_dirs/my_mmdet_cfg'
    cfg = make_train_cfg(write_cfg(tmp_path), '--work-dir', 'elsewhere')
    assert cfg.work_dir == 'elsewhere'


def test_amp_switches_wrapper_and_refuses_double_amp(tmp_path):
    cfg = make_train_cfg(write_cfg(tmp_path), '--amp')
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    assert cfg.optim_wrapper.loss_scale == 'dynamic'
    amp_cfg = write_cfg(
        tmp_path, extra="optim_wrapper = dict(type='AmpOptimWrapper')\n")
    with pytest.raises(ToolError, match='already uses AmpOptimWrapper'):
        make_train_cfg(amp_cfg, '--amp')


def test_auto_scale_lr(tmp_path):
    with pytest.raises(ToolError, match='base_batch_size'):
        make_train_cfg(write_cfg(tmp_path), '--auto-scale-lr')
    path = write_cfg(tmp_path,
                     extra='auto_scale_lr = dict(base_batch_size=16)\n')
    assert make_train_cfg(path, '--auto-scale-lr').auto_scale_lr.enable is True


def test_resume_forms(tmp_path):
    cfg = make_train_cfg(write_cfg(tmp_path), '--resume')
    assert cfg.resume is True and cfg.load_from is None
    ckpt = tmp_path / 'iter_2.pth'
    ckpt.write_bytes(b'')
    cfg = make_train_cfg(write_cfg(tmp_path), '--resume', str(ckpt))
    assert cfg.resume is True and cfg.load_from == str(ckpt)
    with pytest.raises(ToolError, match='not found'):
        make_train_cfg(write_cfg(tmp_path), '--resume',
                       str(tmp_path / 'no.pth'))


def test_cfg_options_are_applied(tmp_path):
    cfg = make_train_cfg(write_cfg(tmp_path), '--cfg-options',
                         'optim_wrapper.optimizer.lr=0.5', 'model.depth=3')
    assert cfg.optim_wrapper.optimizer.lr == 0.5
    assert cfg.model.depth == 3


@pytest.mark.parametrize('scope, dump', [('mmdet', 'DumpDetResults'),
                                         ('mmseg', 'DumpResults'),
                                         ('mmpretrain', 'DumpResults')])
def test_out_adds_the_scope_dump_metric(tmp_path, scope, dump):
    ckpt = tmp_path / 'model.pth'
    ckpt.write_bytes(b'')
    cfg = make_test_cfg(write_cfg(tmp_path, scope), str(ckpt), '--out',
                        str(tmp_path / 'r.pkl'))
    assert cfg.load_from == str(ckpt)
    assert [m['type'] for m in cfg.test_evaluator] == ['SomeMetric', dump]
    assert cfg.test_evaluator[1]['out_file_path'] == str(tmp_path / 'r.pkl')
    with pytest.raises(ToolError, match='.pkl'):
        make_test_cfg(write_cfg(tmp_path, scope), str(ckpt), '--out', 'r.json')


def test_show_dir_per_scope(tmp_path):
    ckpt = tmp_path / 'model.pth'
    ckpt.write_bytes(b'')
    det = make_test_cfg(write_cfg(tmp_path, 'mmdet'), str(ckpt), '--show-dir',
                        'vis')
    assert det.default_hooks.visualization.draw is True
    assert det.default_hooks.visualization.test_out_dir == 'vis'
    seg = make_test_cfg(write_cfg(tmp_path, 'mmseg'), str(ckpt), '--show-dir',
                        'vis')
    assert seg.default_hooks.visualization.draw is True
    assert seg.visualizer.save_dir == 'vis'
    cls = make_test_cfg(write_cfg(tmp_path, 'mmpretrain'), str(ckpt),
                        '--show-dir', 'vis')
    assert cls.default_hooks.visualization.enable is True
    assert cls.default_hooks.visualization.out_dir == 'vis'
    with pytest.raises(ToolError, match='not supported'):
        make_test_cfg(write_cfg(tmp_path, 'mmengine'), str(ckpt),
                      '--show-dir', 'vis')


def test_missing_files_are_tool_errors(tmp_path):
    with pytest.raises(ToolError, match='config file not found'):
        make_train_cfg(str(tmp_path / 'nope.py'))
    with pytest.raises(ToolError, match='checkpoint not found'):
        make_test_cfg(write_cfg(tmp_path), str(tmp_path / 'nope.pth'))
    broken = tmp_path / 'broken.py'
    broken.write_text('model = dict(\n')
    with pytest.raises(ToolError, match='cannot read config'):
        make_train_cfg(str(broken))
