"""The start-up hook (``pola_mm_startup.pth``, :mod:`pola_mm_startup`) in a
fresh process: a program that never names pola_mm sees mmengine, mim and
mmpretrain as it would without the hook, and the off switch reads as a
boolean setting.

Each probe runs in a fresh interpreter from a temporary folder with a clean
environment, except ``PYTHONPATH``: the repository, so the installed
``.pth`` line imports this checkout's hook module (the same file in an
editable install). The comparison is the same program with the hook
switched off. tests/tools/test_upstream_tools.py shows what the hook does
for a program that reads a ``pola_mm::`` config, and
tests/compat/test_transformers5.py the mmpretrain fix where transformers 5
needs it.
"""
import json
import os
import subprocess
import sys
import sysconfig
import textwrap

import pytest
from helpers import REPO

import pola_mm_startup

pytest.importorskip('mmdet')
pytest.importorskip('mim')
#: the tests need the hook installed (tests/tools/test_upstream_tools.py
#: checks its line)
pytestmark = pytest.mark.skipif(
    not os.path.isfile(os.path.join(sysconfig.get_paths()['purelib'],
                                    'pola_mm_startup.pth')),
    reason='pola_mm is not installed here (no start-up hook)')

#: A program that never names pola_mm: what it sees of mmengine's config
#: reader, of openmim and of mmpretrain, as JSON. An answer that raises is
#: the exception's type and message.
SNAPSHOT = '''
import json, sys
hooked = any(getattr(f, '__name__', '') == 'PostImportFinder'
             for f in sys.meta_path)
import mim.utils
import mmengine.config.config as reader
from mmengine.config import Config
from mmengine.config.utils import MODULE2PACKAGE
from mmpretrain.utils import dependency


def name(fn):
    return f'{fn.__module__}.{fn.__qualname__}'


def answer(fn, *args):
    try:
        return repr(fn(*args))
    except Exception as exc:
        return f'{type(exc).__name__}: {exc}'


ENTRIES = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
           'mmdet::_base_/default_runtime.py',
           'mmseg::_base_/schedules/schedule_20k.py', 'mmdet::x.py',
           'nope::a/b.py', 'local/x.py']
PACKAGES = ['mmdet', 'mmengine', 'mmcv', 'mmpretrain', 'no_such_package']
cfg = Config.fromfile('user_config.py')
print(json.dumps(dict(
    hooked=hooked,
    module2package=MODULE2PACKAGE,
    mmengine_function=name(reader.get_installed_path),
    mmengine_paths={p: answer(reader.get_installed_path, p)
                    for p in PACKAGES},
    cfg_paths={e: answer(Config._get_cfg_path, e, 'cfg.py')
               for e in ENTRIES},
    config=json.dumps(cfg.to_dict(), sort_keys=True, default=repr),
    mim_paths={p: answer(mim.utils.get_installed_path, p)
               for p in PACKAGES},
    mmpretrain=[dependency.WITH_MULTIMODAL,
                name(dependency.register_multimodal_placeholder)],
    pola_mm=sorted(m for m in sys.modules if m.startswith('pola_mm.')
                   or m == 'pola_mm'))))
'''


def fresh(code: str, cwd, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter in ``cwd``: this environment without
    what could make the child import anything other than as installed,
    the repository on ``PYTHONPATH``, ``env`` added."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ('PYTHONPATH', 'PYTHONSTARTUP', 'PYTHONHOME',
                          pola_mm_startup.SWITCH)}
    clean.update(PYTHONPATH=REPO, OMP_NUM_THREADS='1', **env)
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)],
                          cwd=str(cwd), env=clean, capture_output=True,
                          text=True, timeout=300)


def last_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_program_that_never_names_pola_mm_sees_no_change(tmp_path):
    """mmengine's ``MODULE2PACKAGE`` and ``get_installed_path`` are the
    very ones mmengine made, a config with upstream bases reads the same,
    and ``Config._get_cfg_path`` (wrapped, to meet a ``pola_mm::`` entry)
    answers every other entry as mmengine does, its errors included.
    openmim answers every other package as without the hook (its
    ``get_installed_path`` is completed only where it cannot find pola_mm,
    an editable install), and mmpretrain's dependency module is
    mmpretrain's where its import works without the fix (here: no
    transformers 5). Nothing of pola_mm is imported."""
    (tmp_path / 'user_config.py').write_text(
        "_base_ = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py']\n"
        'train_cfg = dict(max_epochs=1)\n')
    on = last_json(fresh(SNAPSHOT, tmp_path))
    off = last_json(fresh(SNAPSHOT, tmp_path,
                          **{pola_mm_startup.SWITCH: '0'}))
    assert on.pop('hooked') is True and off.pop('hooked') is False
    assert 'pola_mm' not in on['module2package']
    assert on['mmengine_function'] == \
        'mmengine.utils.package_utils.get_installed_path'
    assert on['pola_mm'] == []
    assert on == off


@pytest.mark.parametrize('value, hooked', [
    ('0', False), ('false', False), ('OFF', False), (' No ', False),
    ('1', True), ('yes', True), ('', True)])
def test_off_switch_reads_as_a_boolean(tmp_path, value, hooked):
    """``POLA_MM_STARTUP_HOOK`` takes 0/false/off/no (any case) for off."""
    proc = fresh('import sys, pola_mm_startup\n'
                 'print(pola_mm_startup.PostImportFinder in sys.meta_path)',
                 tmp_path, **{pola_mm_startup.SWITCH: value})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [str(hooked)]
    assert proc.stderr == ''


def test_an_unknown_switch_value_warns_and_keeps_the_hook(tmp_path):
    proc = fresh('import sys, pola_mm_startup\n'
                 'print(pola_mm_startup.PostImportFinder in sys.meta_path)',
                 tmp_path, **{pola_mm_startup.SWITCH: 'disable'})
    assert proc.stdout.split() == ['True']
    assert "POLA_MM_STARTUP_HOOK='disable': use one of 0, false, off, " \
        'no, 1, true, on, yes; the hook stays on' in proc.stderr


def test_env_flag(monkeypatch):
    """The parser of pola_mm's boolean settings."""
    from pola_mm_startup import env_flag
    monkeypatch.delenv('POLA_MM_X', raising=False)
    assert env_flag('POLA_MM_X', True) is True
    assert env_flag('POLA_MM_X', False) is False
    for value, expected in [('0', False), ('False', False), ('off', False),
                            ('NO', False), ('1', True), ('True', True),
                            ('on', True), (' yes ', True), (' ', True)]:
        monkeypatch.setenv('POLA_MM_X', value)
        assert env_flag('POLA_MM_X', True) is expected, value
    monkeypatch.setenv('POLA_MM_X', '2')
    with pytest.raises(ValueError, match=r"POLA_MM_X='2': use one of"):
        env_flag('POLA_MM_X', True)
