"""pola_mm.compat and tools/train.py, tools/test.py with a real mmengine
Runner.

The tiny model/data/metric live in tests/compat_tiny.py and the config in
tests/compat_tiny_cfg.py; the tools run as subprocesses, exactly as a
user runs them.
"""
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
import torch
from helpers import REPO_PATH as REPO
from helpers import free_port, subprocess_env

import pola_mm  # noqa: F401  (applies pola_mm.compat, as the tools do)

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CFG = REPO / 'tests' / 'compat_tiny_cfg.py'
TORCH_2_6 = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')
                  [:2]) >= (2, 6)


def run(args: List[str], cwd: Path, check: bool = True,
        timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` with tests/ and the repo on PYTHONPATH."""
    proc = subprocess.run([sys.executable] + args, cwd=cwd,
                          env=subprocess_env(), capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f'{args} exited {proc.returncode}\n'
                             f'{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}')
    return proc


def train(work_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return run([str(REPO / 'tools' / 'train.py'), str(CFG), '--work-dir',
                str(work_dir), *extra], cwd=work_dir.parent)


@pytest.fixture(scope='module')
def trained(tmp_path_factory) -> Path:
    """Work dir of an uninterrupted 4-iteration run (iter_2.pth and
    iter_4.pth)."""
    work_dir = tmp_path_factory.mktemp('tiny') / 'full'
    train(work_dir)
    return work_dir


def test_train_saves_runner_checkpoint(trained):
    assert (trained / 'iter_2.pth').is_file()
    assert (trained / 'iter_4.pth').is_file()
    ckpt = torch.load(trained / 'iter_4.pth', map_location='cpu')
    # the parts that make a Runner checkpoint hard to load weights-only
    from mmengine.logging import HistoryBuffer
    assert isinstance(ckpt['message_hub']['log_scalars']['train/loss'],
                      HistoryBuffer)
    assert ckpt['meta']['iter'] == 4


@pytest.mark.parametrize('how', ['path', 'auto'])
def test_resume_reproduces_uninterrupted_run(trained, tmp_path, how):
    work_dir = tmp_path / 'resumed'
    work_dir.mkdir()
    shutil.copy(trained / 'iter_2.pth', work_dir / 'iter_2.pth')
    if how == 'path':
        proc = train(work_dir, '--resume', str(work_dir / 'iter_2.pth'))
    else:  # --resume without a path: latest checkpoint of the work dir
        (work_dir / 'last_checkpoint').write_text(str(work_dir /
                                                      'iter_2.pth'))
        proc = train(work_dir, '--resume')
    assert 'resumed epoch: 0, iter: 2' in proc.stdout + proc.stderr
    full = torch.load(trained / 'iter_4.pth', map_location='cpu')
    resumed = torch.load(work_dir / 'iter_4.pth', map_location='cpu')
    for key, value in full['state_dict'].items():
        assert torch.equal(value, resumed['state_dict'][key]), key
    assert full['param_schedulers'] == resumed['param_schedulers']


def test_test_tool_loads_runner_checkpoint(trained, tmp_path):
    out = tmp_path / 'preds.pkl'
    proc = run([str(REPO / 'tools' / 'test.py'), str(CFG),
                str(trained / 'iter_4.pth'), '--work-dir',
                str(tmp_path / 'test'), '--out', str(out)], cwd=tmp_path)
    assert 'mse:' in proc.stdout + proc.stderr
    with open(out, 'rb') as f:
        preds = pickle.load(f)
    assert len(preds) == 16  # the tiny test set


def test_tools_report_missing_files(tmp_path):
    proc = run([str(REPO / 'tools' / 'test.py'), str(CFG),
                str(tmp_path / 'missing.pth')], cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert 'checkpoint not found' in proc.stderr
    assert 'Traceback' not in proc.stderr
    proc = run([str(REPO / 'tools' / 'train.py'),
                str(tmp_path / 'missing_cfg.py')], cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert 'config file not found' in proc.stderr


def test_runner_checkpoint_needs_compat(trained):
    """Without pola_mm torch's weights-only loader (torch's default from
    2.6) refuses a Runner checkpoint; with pola_mm.compat torch's loader
    reads it where it takes an allow-list (torch >= 2.4), and pola_mm's
    own loader (the tools') reads it on every torch."""
    ckpt = str(trained / 'iter_2.pth')
    load = f'torch.load({ckpt!r})' if TORCH_2_6 else \
        f'torch.load({ckpt!r}, weights_only=True)'
    plain = run(['-c', f'import torch; {load}'], cwd=trained, check=False)
    assert plain.returncode != 0
    assert 'UnpicklingError' in plain.stderr
    with_compat = run([
        '-c', 'import torch, pola_mm.compat\n'
        'from pola_mm.fileio import load_checkpoint_file\n'
        'if pola_mm.compat.allow_runner_checkpoints():\n'
        f'    c = {load}\n'
        'else:\n'
        f'    c = load_checkpoint_file({ckpt!r}, allow_inert=False)\n'
        "print(c['message_hub']['log_scalars']['train/loss'].mean())"
    ], cwd=trained)
    assert float(with_compat.stdout.strip().splitlines()[-1]) > 0


class _RunsCode:
    """Pickles as a call of ``builtins.open(path, 'w')`` (creates a file)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, 'w'))


class _ReachesAttr:
    """Pickles as ``getattr(HistoryBuffer, '__init__')``."""

    def __reduce__(self):
        from mmengine.logging import HistoryBuffer
        return (getattr, (HistoryBuffer, '__init__'))


def _runner_loads() -> list:
    """The loaders that read Runner checkpoints with pola_mm's allow-list on
    this torch: pola_mm's Runner unpickler (every torch; what
    load_checkpoint_file uses below torch 2.4), and torch's weights-only
    loader where it takes an allow-list (torch >= 2.4)."""
    from pola_mm.fileio.allow_list import torch_takes_safe_globals
    from pola_mm.fileio.unpickler import runner_pickle_module
    loads = [lambda f: torch.load(f, map_location='cpu', weights_only=False,
                                  pickle_module=runner_pickle_module())]
    if torch_takes_safe_globals():
        loads.append(lambda f: torch.load(f, map_location='cpu',
                                          weights_only=True))
    return loads


#: how a pickled ``open`` is named (``io.open`` by CPython's pickler)
OPEN = r'\b(io|builtins)\.open\b'


def test_weights_only_still_refuses_pickled_code(tmp_path):
    from mmengine.runner import load_checkpoint

    import pola_mm.compat  # noqa: F401
    from pola_mm.fileio import CheckpointFileError, load_checkpoint_file
    marker = tmp_path / 'pwned'
    evil = tmp_path / 'evil.pth'
    torch.save({'state_dict': {}, 'meta': _RunsCode(str(marker))}, evil)
    for load in _runner_loads():
        with pytest.raises(pickle.UnpicklingError, match=OPEN):
            load(evil)
    # the tools' loader (every torch)
    with pytest.raises(CheckpointFileError, match='pickles ' + OPEN):
        load_checkpoint_file(str(evil), allow_inert=False)
    if TORCH_2_6:  # weights-only is torch's default, mmengine's loads too
        with pytest.raises(pickle.UnpicklingError):
            torch.load(evil)
        with pytest.raises(pickle.UnpicklingError):
            load_checkpoint(torch.nn.Linear(1, 1), str(evil))
    assert not marker.exists()
    # the getattr stand-in only hands out HistoryBuffer statistics methods
    sneaky = tmp_path / 'sneaky.pth'
    torch.save({'x': _ReachesAttr()}, sneaky)
    for load in _runner_loads():
        with pytest.raises(pickle.UnpicklingError, match='refusing getattr'):
            load(sneaky)


def _same(a, b) -> None:
    """Two loaded checkpoints hold the same values (tensors, numpy values,
    HistoryBuffers compared by their contents)."""
    import numpy as np
    from mmengine.logging import HistoryBuffer
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    elif isinstance(a, HistoryBuffer):
        _same(a.__getstate__(), b.__getstate__())
    else:
        assert a == b, (a, b)


def test_runner_unpickler_reads_what_torch_reads(trained):
    """pola_mm's Runner unpickler (pola_mm.fileio.unpickler) reads a real
    Runner checkpoint as torch's own loader does: the same tensors, numpy
    values and HistoryBuffers; on torch >= 2.4 also as the weights-only
    loader with pola_mm's allow-list."""
    from mmengine.logging import HistoryBuffer
    path = trained / 'iter_4.pth'
    plain = torch.load(path, map_location='cpu', weights_only=False)
    for load in _runner_loads():
        got = load(path)
        _same(got, plain)
        buf = got['message_hub']['log_scalars']['train/loss']
        assert isinstance(buf, HistoryBuffer) and buf.mean() > 0


def test_tools_loader_without_torchs_allow_list(trained):
    """Where torch's weights-only allow-list lacks pola_mm's (torch < 2.4
    has none; pola_mm.compat leaves it alone where torch does not load
    weights-only by default), the tools' loader reads Runner checkpoints
    with pola_mm's Runner unpickler. Below torch 2.4 this is the real path;
    on a newer torch it is made so by clearing torch's allow-list for this
    test."""
    from pola_mm.fileio import load_checkpoint_file
    from pola_mm.fileio.allow_list import torch_takes_safe_globals
    serialization = torch.serialization
    assert torch_takes_safe_globals() == hasattr(serialization,
                                                 'add_safe_globals')
    saved = None
    if torch_takes_safe_globals():
        saved = serialization.get_safe_globals()
        serialization.clear_safe_globals()
    try:
        path = str(trained / 'iter_4.pth')
        with pytest.raises(pickle.UnpicklingError):
            torch.load(path, map_location='cpu', weights_only=True)
        ckpt = load_checkpoint_file(path, allow_inert=False)
    finally:
        if saved is not None:
            serialization.clear_safe_globals()
            serialization.add_safe_globals(saved)
    _same(ckpt, torch.load(path, map_location='cpu', weights_only=False))


def test_setup_cpu_distributed_only_without_cuda():
    from mmengine.config import Config

    from pola_mm.cli.distributed import setup_cpu_distributed
    cfg = Config(dict(model=dict(type='X')))
    assert not setup_cpu_distributed(cfg, 'none')
    assert 'model_wrapper_cfg' not in cfg


@pytest.mark.skipif(torch.cuda.is_available(), reason='CPU-only path')
def test_cpu_ddp_wrapper_needs_compat(monkeypatch):
    """mmengine's default wrapper (device_ids=[LOCAL_RANK]) fails on CPU."""
    import torch.distributed as dist
    from mmengine.config import Config
    from mmengine.model import MMDistributedDataParallel
    from mmengine.registry import MODEL_WRAPPERS

    from pola_mm.cli.distributed import setup_cpu_distributed
    if dist.is_initialized():
        pytest.skip('a process group already exists in this process')
    for key, value in _one_rank_env().items():
        monkeypatch.setenv(key, value)
    with pytest.raises((RuntimeError, AssertionError)):
        torch.cuda.set_device(0)  # what mmengine's init_dist('pytorch') does
    cfg = Config(dict(model=dict(type='X')))
    try:
        assert setup_cpu_distributed(cfg, 'pytorch')
        assert dist.get_backend() == 'gloo'
        assert cfg.model_wrapper_cfg['device_ids'] is None
        assert cfg.env_cfg['dist_cfg']['backend'] == 'gloo'
        with pytest.raises(ValueError):  # Runner.wrap_model without compat
            MMDistributedDataParallel(
                module=torch.nn.Linear(2, 2), device_ids=[0])
        wrapped = MODEL_WRAPPERS.build(
            cfg.model_wrapper_cfg,
            default_args=dict(module=torch.nn.Linear(2, 2),
                              device_ids=[0]))
        assert wrapped(torch.ones(1, 2)).shape == (1, 2)
    finally:
        dist.destroy_process_group()


def _one_rank_env() -> dict:
    """The torchrun environment of a 1-process group on a free port."""
    return dict(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0',
                MASTER_ADDR='127.0.0.1', MASTER_PORT=str(free_port()))


@pytest.mark.skipif(torch.cuda.is_available(), reason='CPU-only path')
def test_two_process_cpu_training_with_torchrun(tmp_path):
    work_dir = tmp_path / 'dist'
    proc = run([
        '-m', 'torch.distributed.run', '--nnodes', '1', '--nproc_per_node',
        '2', '--master_addr', '127.0.0.1', '--master_port',
        str(free_port()), str(REPO / 'tools' / 'train.py'), str(CFG),
        '--launcher', 'pytorch', '--work-dir', str(work_dir)
    ], cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert 'distributed on CPU with gloo' in log
    assert (work_dir / 'iter_4.pth').is_file()
    proc = run([
        '-m', 'torch.distributed.run', '--nnodes', '1', '--nproc_per_node',
        '2', '--master_addr', '127.0.0.1', '--master_port',
        str(free_port()), str(REPO / 'tools' / 'test.py'), str(CFG),
        str(work_dir / 'iter_4.pth'), '--launcher', 'pytorch', '--work-dir',
        str(tmp_path / 'dist_test')
    ], cwd=tmp_path)
    assert 'mse:' in proc.stdout + proc.stderr


_FINISH_SCRIPT = """
import sys
import torch.distributed as dist
from pola_mm.cli.distributed import exit_process
from pola_mm.cli.train_test import test_main, train_main
main = train_main if sys.argv[1] == 'train' else test_main
main(sys.argv[2:])
print('process group alive after run:', dist.is_initialized())
exit_process(0)  # as tools/train.py and tools/test.py end
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason='CPU-only path')
@pytest.mark.parametrize('tool', ['train', 'test'])
def test_tools_destroy_process_group_after_run(trained, tmp_path, tool):
    """A live gloo group at interpreter exit can abort a rank (SIGABRT)
    after a successful run; the tools must tear it down themselves."""
    env = subprocess_env(**_one_rank_env())
    if tool == 'train':
        args = [str(CFG), '--work-dir', str(tmp_path / 'w')]
    else:
        args = [str(CFG), str(trained / 'iter_4.pth'), '--work-dir',
                str(tmp_path / 'w')]
    proc = subprocess.run(
        [sys.executable, '-c', _FINISH_SCRIPT, tool, *args, '--launcher',
         'pytorch'], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert 'distributed on CPU with gloo' in log
    assert 'process group alive after run: False' in proc.stdout


_EXIT_SCRIPT = """
import atexit
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from pola_mm.cli.distributed import exit_process, finish_distributed


class Teardown:
    def __del__(self):  # runs only when the interpreter is torn down
        print('teardown ran', flush=True)


KEEP = Teardown()
if sys.argv[1] == 'ddp':
    dist.init_process_group('gloo')
    model = DistributedDataParallel(torch.nn.Linear(4, 4))
    model(torch.randn(2, 4)).sum().backward()
    assert finish_distributed()
atexit.register(lambda: print('atexit ran', flush=True))
print('unflushed output', end='')
exit_process(3)
"""


@pytest.mark.parametrize('mode', ['ddp', 'single'])
def test_exit_process_after_a_gloo_ddp_run(tmp_path, mode):
    """After a DDP run on gloo the process ends without the interpreter's
    teardown (where the group DDP keeps alive can abort a rank), still with
    its exit code, its atexit handlers and its buffered output; without a
    finished gloo group it is ``sys.exit``."""
    env = subprocess_env(**_one_rank_env())
    proc = subprocess.run([sys.executable, '-c', _EXIT_SCRIPT, mode],
                          cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr[-3000:]
    assert 'unflushed output' in proc.stdout
    assert 'atexit ran' in proc.stdout
    assert ('teardown ran' in proc.stdout) == (mode == 'single')


def test_cpu_distributed_turns_syncbn_into_bn():
    """mmseg heads use SyncBN, which only runs on CUDA: the CPU path swaps
    it."""
    from mmengine.config import Config

    from pola_mm.cli.distributed import sync_bn_to_bn
    cfg = Config(dict(model=dict(
        backbone=dict(type='X', norm_cfg=dict(type='LN')),
        decode_head=dict(norm_cfg=dict(type='SyncBN', requires_grad=True)),
        auxiliary_head=[dict(norm_cfg=dict(type='MMSyncBN'))])))
    assert sync_bn_to_bn(cfg.model) == 2
    assert cfg.model.decode_head.norm_cfg == dict(type='BN',
                                                  requires_grad=True)
    assert cfg.model.auxiliary_head[0].norm_cfg.type == 'BN'
    assert cfg.model.backbone.norm_cfg.type == 'LN'
