"""The cache of the fused CPU loops under stress: several processes using
them for the first time at once (one build, everyone loads it), and a cache
folder that cannot be written (the pure-torch kernel, one warning).

``test_four_processes_build_once`` compiles the extension into an empty
folder: about 60-90 s on 2 cores, the one slow test of tests/robustness."""
import errno
import logging
import os
import os.path as osp
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import REPO

import pola_mm.ops.cpu_ext as cpu_ext_mod
from pola_mm.ops.cpu_ext import CPU_EXT_ENV, cpu_ext
from pola_mm.ops import polarity_attention

#: Loads the loops, checks one feature computation against its formula and
#: prints the file it loaded.
CHILD = textwrap.dedent('''
    import torch
    from pola_mm.ops.cpu_ext import cpu_ext
    mod = cpu_ext()
    assert mod is not None, 'the fused loops did not load'
    x = torch.linspace(-2, 2, 64).reshape(1, 1, 8, 8).contiguous()
    f = torch.empty(1, 1, 8, 16)
    none = torch.empty(0)
    mod.features(x, torch.ones(1, 8), torch.full((1, 8), 2.0), none, f,
                 none)
    want = torch.cat([x.clamp_min(0) ** 2, (-x).clamp_min(0) ** 2], -1)
    torch.testing.assert_close(f, want, rtol=1e-5, atol=1e-6)
    print('LOADED', mod.__file__)
''')


def test_four_processes_build_once(tmp_path):
    """Four processes started together on an empty TORCH_EXTENSIONS_DIR
    (like the ranks of one job): one compilation (ninja's log records each
    command it runs), no error, all four load the same working module.
    Slow: one build of the extension (about 60-90 s on 2 cores)."""
    cache = tmp_path / 'torch_extensions'
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(cache), MAX_JOBS='1',
               OMP_NUM_THREADS='1', PYTHONPATH=REPO)
    env.pop(CPU_EXT_ENV, None)
    procs = [subprocess.Popen([sys.executable, '-c', CHILD], cwd=REPO,
                              env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    loaded = {line.split(None, 1)[1] for out in outs
              for line in out.splitlines() if line.startswith('LOADED')}
    assert len(loaded) == 1, outs
    build = osp.dirname(loaded.pop())
    assert osp.dirname(build) == str(cache)
    with open(osp.join(build, '.ninja_log')) as f:
        runs = [line.split('\t')[3] for line in f
                if not line.startswith('#')]
    assert runs.count('polarity_cpu.o') == 1, runs
    assert sum(r.endswith('.so') for r in runs) == 1, runs


@pytest.fixture
def fresh(monkeypatch):
    """``cpu_ext()`` as in a new process, its messages recorded."""
    monkeypatch.setattr(cpu_ext_mod, '_state', {})
    monkeypatch.setenv(CPU_EXT_ENV, '1')
    logged = []
    monkeypatch.setattr(cpu_ext_mod, 'print_log',
                        lambda msg, logger=None, level=logging.INFO:
                        logged.append((level, msg)))
    return logged


def _read_only(tmp_path, monkeypatch) -> str:
    folder = tmp_path / 'read_only'
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
    else:  # root writes anywhere: the file system refuses instead
        def refuse(*args, **kwargs):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))

        monkeypatch.setattr(cpu_ext_mod.tempfile, 'mkstemp', refuse)
    return str(folder)


@pytest.mark.parametrize('kind', ['read-only', 'not-a-folder'])
def test_unwritable_cache_falls_back_with_one_warning(tmp_path, monkeypatch,
                                                      fresh, kind):
    """A cache folder that cannot be written: no build attempt, the
    pure-torch kernel (finite, same formula), one warning naming the folder
    and the fix, however often the loops are asked for."""
    if kind == 'read-only':
        root = _read_only(tmp_path, monkeypatch)
    else:  # a path below a regular file
        (tmp_path / 'file').write_text('')
        root = str(tmp_path / 'file' / 'cache')
    monkeypatch.setenv('TORCH_EXTENSIONS_DIR', root)
    try:
        assert cpu_ext() is None
        assert cpu_ext() is None
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 40, 8, generator=g) for _ in range(3))
        out = polarity_attention(q, k, v, torch.zeros(1, 2, 1, 8),
                                 torch.zeros(1, 2, 1, 8), 4.0)
        assert torch.isfinite(out).all()
    finally:
        if kind == 'read-only' and os.geteuid() != 0:
            os.chmod(root, 0o755)
    warnings = [m for lv, m in fresh if lv >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert root in warnings[0] and 'cannot be written' in warnings[0]
    assert 'TORCH_EXTENSIONS_DIR' in warnings[0]
    assert 'pure-torch kernel' in warnings[0]
    assert not any('compiler' in m for _, m in fresh)
