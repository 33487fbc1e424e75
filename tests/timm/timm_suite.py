"""timm's own model tests (``tests/test_models.py`` of the installed timm
release), taken from that release's source distribution on PyPI.

The timm wheel ships no tests; its sdist does. :func:`suite_path` finds the
file for ``timm.__version__``:

1. ``$POLA_MM_TIMM_TESTS``: a ``test_models.py``, a folder holding it (or
   ``tests/test_models.py``), or the sdist ``timm-X.tar.gz`` itself;
2. the cache ``$XDG_CACHE_HOME/pola_mm/timm-tests/<version>/test_models.py``
   (default ``~/.cache``);
3. else ``pip download --no-deps --no-binary :all: timm==<version>`` (the
   ordinary client, from the configured index) into a temporary folder, and
   the file is extracted into the cache.

:func:`load_suite` imports it (after ``pola_mm.timm``, so timm's model lists
include pola_mm's models) as the module ``timm_test_models``, with
pola_mm's models added to the suite's ``EXCLUDE_JIT_FILTERS`` (where timm
lists its own families that TorchScript does not compile): pola_mm does
not support TorchScript (``torch.jit.script`` is deprecated in torch 2.14),
so timm's TorchScript tests select none of its models.
"""
import ast
import importlib.util
import os
import os.path as osp
import subprocess
import sys
import tarfile
import tempfile
import types
import warnings
from typing import Optional

import pytest
import timm

MODULE_NAME = 'timm_test_models'
MEMBER = 'tests/test_models.py'
#: pola_mm's models, added to the suite's ``EXCLUDE_JIT_FILTERS``.
EXCLUDE_JIT = ['pola_*', 'polapp_*']


def cache_dir(version: str) -> str:
    """Where the suite of timm ``version`` is cached."""
    root = os.environ.get('XDG_CACHE_HOME') or osp.join(
        osp.expanduser('~'), '.cache')
    return osp.join(root, 'pola_mm', 'timm-tests', version)


def _from_sdist(sdist: str, dst: str) -> str:
    """Extract ``tests/test_models.py`` of an sdist into ``dst``."""
    with tarfile.open(sdist) as tar:
        member = next((m for m in tar.getmembers()
                       if m.name.endswith('/' + MEMBER)), None)
        if member is None:
            raise FileNotFoundError(f'{sdist} has no {MEMBER}')
        data = tar.extractfile(member).read()
    os.makedirs(dst, exist_ok=True)
    path = osp.join(dst, 'test_models.py')
    tmp = path + '.part'
    with open(tmp, 'wb') as f:
        f.write(data)
    os.replace(tmp, path)
    return path


def _from_env(value: str, version: str) -> str:
    if osp.isdir(value):
        for rel in ('test_models.py', MEMBER):
            if osp.isfile(osp.join(value, rel)):
                return osp.join(value, rel)
        raise FileNotFoundError(f'POLA_MM_TIMM_TESTS={value}: no '
                                f'test_models.py or {MEMBER} in it')
    if value.endswith(('.tar.gz', '.tgz')):
        return _from_sdist(value, cache_dir(version))
    if osp.isfile(value):
        return value
    raise FileNotFoundError(f'POLA_MM_TIMM_TESTS={value} does not exist')


def suite_path(version: Optional[str] = None) -> str:
    """Path of ``test_models.py`` of timm ``version`` (default: the
    installed one), fetched and cached as the module docstring says.

    Raises:
        RuntimeError: the sdist cannot be had (no index reachable, no such
            version), with pip's last lines.
    """
    version = version or timm.__version__
    env = os.environ.get('POLA_MM_TIMM_TESTS')
    if env:
        return _from_env(env, version)
    cached = osp.join(cache_dir(version), 'test_models.py')
    if osp.isfile(cached):
        return cached
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, '-m', 'pip', 'download', '--no-deps',
               '--no-binary', ':all:', '--disable-pip-version-check', '-q',
               '-d', tmp, f'timm=={version}']
        res = subprocess.run(cmd, capture_output=True, text=True,
                             timeout=600)
        sdists = [f for f in os.listdir(tmp) if f.endswith('.tar.gz')]
        if res.returncode != 0 or not sdists:
            raise RuntimeError(
                f"cannot get timm {version}'s source distribution (for its "
                f'tests/test_models.py) with {" ".join(cmd)}: '
                f'{(res.stderr or res.stdout).strip()[-800:]}. Set '
                'POLA_MM_TIMM_TESTS to a local copy (the sdist, or '
                'test_models.py) to run offline.')
        return _from_sdist(osp.join(tmp, sdists[0]), cache_dir(version))


def load_suite(path: Optional[str] = None) -> types.ModuleType:
    """Import timm's ``test_models.py`` (once per process) after
    ``pola_mm.timm`` has registered pola_mm's models."""
    import pola_mm.timm  # noqa: F401  (registers the models first)
    if MODULE_NAME in sys.modules:
        return sys.modules[MODULE_NAME]
    path = path or suite_path()
    code = _with_jit_exclusions(path)
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    jit = _jit_settings()
    try:
        with warnings.catch_warnings():
            # its marks (base, cfg, features, ...) are registered in timm's
            # own pytest configuration; tests/timm/conftest.py registers
            # them here (a run without that conftest only warns)
            warnings.simplefilter('ignore', pytest.PytestUnknownMarkWarning)
            exec(code, module.__dict__)
    except BaseException:
        del sys.modules[MODULE_NAME]
        raise
    finally:
        _jit_settings(jit)  # the module sets TorchScript executor flags
    return module


def _with_jit_exclusions(path: str):
    """The suite compiled with ``EXCLUDE_JIT_FILTERS += EXCLUDE_JIT`` right
    after the suite defines the list (before its TorchScript tests take
    their model lists from it).

    Raises:
        RuntimeError: the suite defines no ``EXCLUDE_JIT_FILTERS`` (a timm
            release that changed how it excludes families from TorchScript).
    """
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    for i, node in enumerate(tree.body):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == 'EXCLUDE_JIT_FILTERS'
                for t in node.targets):
            extend = ast.parse(f'EXCLUDE_JIT_FILTERS += {EXCLUDE_JIT!r}')
            tree.body[i + 1:i + 1] = extend.body
            break
    else:
        raise RuntimeError(
            f'{path} defines no EXCLUDE_JIT_FILTERS: timm changed how its '
            'suite leaves families out of the TorchScript tests; update '
            'tests/timm/timm_suite.py')
    return compile(ast.fix_missing_locations(tree), path, 'exec')


def _jit_settings(values: Optional[tuple] = None) -> Optional[tuple]:
    """Read (no argument) or restore TorchScript's profiling executor and
    mode flags, which timm's module sets globally on import."""
    import torch
    c = torch._C
    if not hasattr(c, '_jit_set_profiling_executor'):
        return None
    if values is None:
        executor = c._jit_set_profiling_executor(True)
        c._jit_set_profiling_executor(executor)
        mode = c._jit_set_profiling_mode(True)
        c._jit_set_profiling_mode(mode)
        return executor, mode
    c._jit_set_profiling_executor(values[0])
    c._jit_set_profiling_mode(values[1])
    return None
