"""The environment `make test` builds, and tools/install_mmcv.py."""
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import REPO_PATH as REPO

pytestmark = pytest.mark.slow


def _load_install_mmcv():
    spec = importlib.util.spec_from_file_location(
        'install_mmcv', REPO / 'tools' / 'install_mmcv.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


install_mmcv = _load_install_mmcv()


def test_stack_imports():
    import mmcv
    import mmcv.ops  # noqa: F401
    import mmdet.models  # noqa: F401
    import mmpretrain.models  # noqa: F401
    import mmseg.models  # noqa: F401
    import timm  # noqa: F401

    import pola_mm  # noqa: F401
    assert (2, 0) <= install_mmcv.version_tuple(mmcv.__version__) < (2, 2)


def test_mmcv_nms_runs():
    from mmcv.ops import nms
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.],
                          [20., 20., 30., 30.]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    dets, keep = nms(boxes, scores, iou_threshold=0.5)
    assert keep.tolist() == [0, 2]
    assert dets.shape == (2, 5)


def test_pola_mm_core_imports_no_downstream_codebase():
    code = ('import sys, pola_mm; '
            "print([m for m in ('mmdet', 'mmseg', 'mmpretrain') "
            'if m in sys.modules])')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == '[]'


def test_version_tuple():
    assert install_mmcv.version_tuple('2.14.1+cu130') == (2, 14, 1)
    assert install_mmcv.version_tuple('2.1.0') == (2, 1, 0)
    assert install_mmcv.version_tuple('2.10.0a0+git123') == (2, 10)


def test_cache_key_names_mmcv_torch_python(monkeypatch, tmp_path):
    key = install_mmcv.cache_key('2.14.1+cu130', cuda=False)
    assert 'mmcv-2.1.0' in key and 'torch-2.14.1+cu130' in key
    assert f'cp{sys.version_info.major}{sys.version_info.minor}' in key
    assert key != install_mmcv.cache_key('2.14.1+cu130', cuda=True)
    assert key != install_mmcv.cache_key('2.5.1+cu121', cuda=False)
    monkeypatch.setenv('POLA_MM_WHEEL_CACHE', str(tmp_path))
    assert install_mmcv.cached_wheel(key) is None
    wheel = tmp_path / 'mmcv-2.1.0-cp311-cp311-linux_x86_64.whl'
    wheel.write_bytes(b'not really a wheel')
    stored = install_mmcv.store_wheel(str(wheel), key)
    assert install_mmcv.cached_wheel(key) == stored
    assert Path(stored).parent == tmp_path / key


def test_patch_cxx_standard(tmp_path):
    setup_py = tmp_path / 'setup.py'
    original = "extra_compile_args = {'cxx': ['-std=c++17']}\n"
    setup_py.write_text(original)
    assert install_mmcv.patch_cxx_standard(str(setup_py), '2.9.1') == 'c++17'
    assert setup_py.read_text() == original
    assert install_mmcv.patch_cxx_standard(str(setup_py),
                                           '2.14.1+cu130') == 'c++20'
    assert '-std=c++20' in setup_py.read_text()
    assert '-std=c++17' not in setup_py.read_text()


@pytest.mark.parametrize('log_text, cause', [
    ('x.cpp:1:10: fatal error: Python.h: No such file or directory',
     'Python headers'),
    ("error: [Errno 2] No such file or directory: 'c++'", 'no C++ compiler'),
    ('#error C++20 or later compatible compiler is required',
     'C++ standard'),
    ('foo.cpp:3: error: expected ;', 'first errors'),
])
def test_build_failures_name_their_cause(tmp_path, log_text, cause):
    log = tmp_path / 'build.log'
    log.write_text('lots of output\n' + log_text + '\nmore output\n')
    assert cause in install_mmcv.diagnose(str(log))


def test_missing_compiler_is_reported(monkeypatch, tmp_path):
    monkeypatch.setattr(install_mmcv.shutil, 'which', lambda name: None)
    with pytest.raises(install_mmcv.InstallError, match='no C\\+\\+ compiler'):
        install_mmcv.check_build_prerequisites(str(tmp_path / 'log'))


def test_missing_torch_is_reported(tmp_path):
    code = ('import runpy, sys; sys.modules["torch"] = None; '
            f'sys.argv = ["install_mmcv.py", "--force"]; '
            f'runpy.run_path({str(REPO / "tools" / "install_mmcv.py")!r}, '
            'run_name="__main__")')
    env = dict(os.environ, POLA_MM_BUILD_LOG_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 1
    assert 'torch is not importable' in proc.stderr
    assert 'full log:' in proc.stderr
    assert 'Traceback' not in proc.stderr


def test_install_mmcv_skips_working_mmcv(tmp_path):
    env = dict(os.environ, POLA_MM_BUILD_LOG_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, str(REPO / 'tools' / 'install_mmcv.py')],
        capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert 'nothing to do' in proc.stdout


@pytest.mark.skipif(
    not (REPO / '.venv' / '.pola_mm_setup_stamp').is_file()
    or Path(sys.prefix).resolve() != (REPO / '.venv').resolve(),
    reason='only inside the .venv that tools/setup_env.sh built')
def test_setup_env_second_run_is_quick():
    start = time.time()
    proc = subprocess.run(['bash', str(REPO / 'tools' / 'setup_env.sh')],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert 'up to date' in proc.stdout
    assert time.time() - start < 60
