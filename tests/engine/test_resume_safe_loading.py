"""Bad checkpoint files given to the tools: one clear line naming the file
and what is wrong, exit code 2, no traceback; a pickle that would run code
runs nothing (``tools/test.py``, ``tools/train.py --resume PATH`` and
``--resume`` through ``last_checkpoint``, a backbone ``init_cfg``).

The converter and ``init_cfg`` through ``load_pretrained`` are covered in
``tests/models/test_checkpoint.py``; here the tools' own path, which
mmengine's ``CheckpointLoader`` takes, is checked.
"""
import subprocess
import sys

import pytest
import torch
from helpers import REPO_PATH as REPO
from helpers import subprocess_env
from mmengine.runner.checkpoint import CheckpointLoader

import pola_mm  # noqa: F401
from pola_mm.cli import train_test as runner
from pola_mm.cli.train_test import run_tool

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CFG = str(REPO / 'tests' / 'compat_tiny_cfg.py')


class RunsCode:
    """Pickles as ``builtins.open(path, 'w')``: loading it would create
    ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, 'w'))


@pytest.fixture
def checkpoint_loader():
    """Restore mmengine's local loader after a tool replaced it."""
    schemes = dict(CheckpointLoader._schemes)
    yield
    CheckpointLoader._schemes.clear()
    CheckpointLoader._schemes.update(schemes)


@pytest.fixture(scope='module')
def bad_files(tmp_path_factory):
    """A real Runner checkpoint, and three broken versions of it."""
    root = tmp_path_factory.mktemp('bad')
    good = root / 'good.pth'
    model = torch.nn.Linear(4, 2)
    torch.save(dict(meta=dict(iter=2, epoch=0),
                    state_dict={'fc.' + k: v
                                for k, v in model.state_dict().items()}),
               good)
    data = good.read_bytes()
    files = dict(good=good)
    files['truncated'] = root / 'truncated.pth'
    files['truncated'].write_bytes(data[:len(data) // 2])
    files['corrupt'] = root / 'corrupt.pth'
    files['corrupt'].write_bytes(b'\x00garbage' * 8 + data[72:])
    files['code'] = root / 'code.pth'
    torch.save(dict(meta=RunsCode(str(root / 'pwned')),
                    state_dict=torch.load(good)['state_dict']),
               files['code'])
    files['marker'] = root / 'pwned'
    return files


EXPECTED = dict(
    truncated='truncated or corrupt',
    corrupt='not a PyTorch checkpoint',
    code='refused',
)


def _one_error_line(capsys, path) -> str:
    """The tool's one error line (in this process, loggers of earlier
    Runners may also complain about closed capture streams; the subprocess
    test below checks the whole output)."""
    err = [ln for ln in capsys.readouterr().err.splitlines()
           if ln.startswith('error: ')]
    assert len(err) == 1 and err[0].startswith('error: checkpoint '), err
    assert str(path) in err[0]
    return err[0]


@pytest.mark.parametrize('kind', ['truncated', 'corrupt', 'code'])
def test_test_tool_reports_bad_checkpoint(kind, bad_files, tmp_path, capsys,
                                          checkpoint_loader):
    code = run_tool(runner.test_main,
                    [CFG, str(bad_files[kind]), '--work-dir', str(tmp_path)])
    assert code == 2
    line = _one_error_line(capsys, bad_files[kind])
    assert EXPECTED[kind] in line, line
    assert not bad_files['marker'].exists()


@pytest.mark.parametrize('kind', ['truncated', 'corrupt', 'code'])
@pytest.mark.parametrize('how', ['path', 'auto'])
def test_resume_reports_bad_checkpoint(kind, how, bad_files, tmp_path,
                                       capsys, checkpoint_loader):
    argv = [CFG, '--work-dir', str(tmp_path)]
    if how == 'path':
        argv += ['--resume', str(bad_files[kind])]
    else:  # the latest checkpoint, through last_checkpoint
        (tmp_path / 'last_checkpoint').write_text(str(bad_files[kind]))
        argv += ['--resume']
    assert run_tool(runner.train_main, argv) == 2
    line = _one_error_line(capsys, bad_files[kind])
    assert EXPECTED[kind] in line, line
    if kind == 'code':
        assert 'pickles io.open' in line, line  # builtins.open
        assert 'nothing in the file was run' in line, line
    assert not bad_files['marker'].exists()


def test_good_file_still_loads(bad_files, tmp_path, checkpoint_loader):
    """The checked loader reads what the bad files were made from (so the
    errors above come from the damage, not from the loader)."""
    from mmengine.runner.checkpoint import _load_checkpoint

    from pola_mm.fileio import install_checked_loader
    install_checked_loader(allow_inert=False)
    ckpt = _load_checkpoint(str(bad_files['good']), map_location='cpu')
    assert ckpt['meta']['iter'] == 2


def test_test_tool_subprocess_prints_no_traceback(bad_files, tmp_path):
    env = subprocess_env()
    proc = subprocess.run(
        [sys.executable, str(REPO / 'tools' / 'test.py'), CFG,
         str(bad_files['code']), '--work-dir', str(tmp_path)],
        cwd=str(tmp_path), env=env, capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert 'Traceback' not in proc.stderr
    assert f'error: checkpoint {bad_files["code"]}: refused' in proc.stderr
    assert not bad_files['marker'].exists()


def test_init_cfg_with_truncated_file_through_train_tool(
        bad_files, tmp_path, capsys, checkpoint_loader):
    """A backbone's pretrained file is read while the Runner builds the
    model: same one-line error from tools/train.py."""
    pytest.importorskip('mmpretrain.models')
    import e2e_data
    data = e2e_data.make_image_folder(str(tmp_path / 'data'), per_class=1)
    cfg = e2e_data.tiny_cls(e2e_data.load('pola_pvt_t_in1k.py'), data,
                            str(tmp_path / 'work'))
    cfg.train_dataloader.batch_size = 3  # the 3 images: one batch
    cfg.model.backbone.init_cfg = dict(
        type='Pretrained', checkpoint=str(bad_files['truncated']))
    path = tmp_path / 'cfg.py'
    cfg.dump(str(path))
    assert run_tool(runner.train_main, [str(path)]) == 2
    line = _one_error_line(capsys, bad_files['truncated'])
    assert 'truncated or corrupt' in line
