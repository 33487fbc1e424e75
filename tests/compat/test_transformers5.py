"""transformers 5 beside mmpretrain 1.2.0 (pola_mm.compat_mmpretrain).

A fake transformers 5 (its metadata and the modules mmpretrain's
multimodal models import, without the names transformers 5 removed) is
written into a temporary folder; no network. Without the fix (the start-up
hook off, no ``import pola_mm``) mmpretrain's BLIP fails exactly as with
the real package (the control). With the start-up hook and no ``import
pola_mm``, the upstream inference snippets (``MMSegInferencer``,
``DetInferencer``, ``import mmdet.models``) import; beside a transformers
4 the hook leaves mmpretrain alone. With ``import pola_mm``,
``mmdet.models``, ``mmseg.models`` and ``mmpretrain.models`` import, every
shipped detection and segmentation config builds its model, and building a
BLIP model says why it is unavailable."""
import json
import os
import os.path as osp
import subprocess
import sys
import textwrap

import pytest

from pola_mm.compat_mmpretrain import MULTIMODAL_IMPORTS

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
#: what transformers 5 removed from transformers.modeling_utils
REMOVED = {'apply_chunking_to_forward', 'find_pruneable_heads_and_indices',
           'prune_linear_layer'}


def _fake_transformers(root: str, version: str = '5.0.0') -> None:
    """A package ``transformers`` at ``version`` providing every name of
    MULTIMODAL_IMPORTS except REMOVED: classes (with the class methods
    mmpretrain's registry reads; the auto classes derive from
    ``_BaseAutoModelClass``), decorator factories and a logger."""
    for module, names in MULTIMODAL_IMPORTS.items():
        path = osp.join(root, *module.split('.'))
        os.makedirs(path, exist_ok=True)
        lines = ['import logging as _logging', f'__version__ = {version!r}',
                 'class _Fake:',
                 '    from_config = from_pretrained = classmethod(',
                 '        lambda cls, *a, **k: cls)']
        for n in names:
            if n in REMOVED and module == 'transformers.modeling_utils':
                continue
            if n == 'logging':
                lines.append('logging = _logging')
            elif n.startswith('Auto') and n.endswith('LM'):
                lines.append('from transformers.models.auto.auto_factory '
                             'import _BaseAutoModelClass\n'
                             f'class {n}(_BaseAutoModelClass):\n    pass')
            elif n.lstrip('_')[0].isupper():
                lines.append(f'class {n}(_Fake):\n    pass')
            else:
                lines.append(f'def {n}(*args, **kwargs):\n'
                             '    return lambda f: f')
        with open(osp.join(path, '__init__.py'), 'a') as f:
            f.write('\n'.join(lines) + '\n')
    # torch < 2.2's dynamo patches transformers.configuration_utils
    # whenever transformers imports (a real package has it)
    path = osp.join(root, 'transformers', 'configuration_utils')
    os.makedirs(path, exist_ok=True)
    with open(osp.join(path, '__init__.py'), 'w') as f:
        f.write('class PretrainedConfig:\n    pass\n')
    with open(osp.join(root, 'transformers', '__init__.py'), 'a') as f:
        f.write('from . import configuration_utils\n')
    dist = osp.join(root, f'transformers-{version}.dist-info')
    os.makedirs(dist)
    with open(osp.join(dist, 'METADATA'), 'w') as f:
        f.write(f'Metadata-Version: 2.1\nName: transformers\n'
                f'Version: {version}\n')


def _run(code: str, root: str, **extra: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that finds the fake transformers
    in ``root`` first, with the start-up hook on unless ``extra`` (more
    environment variables) turns it off."""
    env = {k: v for k, v in os.environ.items()
           if k != 'POLA_MM_STARTUP_HOOK'}
    env['PYTHONPATH'] = os.pathsep.join(
        [root, REPO] + [p for p in env.get('PYTHONPATH', '').split(
            os.pathsep) if p])
    env.update(OMP_NUM_THREADS='1', **extra)
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=600,
                          env=env, cwd=REPO)


CONTROL = """
import transformers
assert transformers.__version__.startswith('5')
import mmpretrain.models
"""

#: An upstream snippet ({snippet}) as the first import of a program, then
#: what the start-up hook did; then ``import pola_mm`` reports the fix.
SNIPPET = """
import json, sys
{snippet}
import pola_mm_startup
before = 'pola_mm' in sys.modules
from mmpretrain.utils import dependency
report = dict(pola_mm_before=before, patched=pola_mm_startup.state,
              multimodal=dependency.WITH_MULTIMODAL)
import pola_mm
report['applied'] = pola_mm.applied_fixes()
print(json.dumps(report))
"""

#: mmpretrain's dependency module beside another transformers: untouched
UNTOUCHED = """
import json, sys
import transformers
from mmpretrain.utils import dependency
import pola_mm_startup
print(json.dumps(dict(
    version=transformers.__version__, patched=pola_mm_startup.state,
    multimodal=dependency.WITH_MULTIMODAL,
    placeholder=dependency.register_multimodal_placeholder.__module__,
    pola_mm='pola_mm' in sys.modules)))
"""

FIXED = """
import glob, json, os.path as osp
import torch
import pola_mm
from pola_mm.compat_mmpretrain import state
import mmdet.models, mmseg.models, mmpretrain.models
from mmengine.config import Config
from mmengine.registry import init_default_scope
built = []
for path in sorted(glob.glob('configs/*.py')):
    cfg = Config.fromfile(path)
    if cfg.get('default_scope') not in ('mmdet', 'mmseg'):
        continue
    init_default_scope(cfg.default_scope)
    registry = __import__(cfg.default_scope + '.registry',
                          fromlist=['MODELS'])
    cfg.model.backbone.init_cfg = None
    with torch.device('meta'):
        model = registry.MODELS.build(cfg.model)
    built.append(osp.basename(path))
from mmpretrain.registry import MODELS
init_default_scope('mmpretrain')
try:
    MODELS.build(dict(type='BlipCaption'))
    blip = 'built'
except ImportError as exc:
    blip = str(exc)
print(json.dumps(dict(applied=pola_mm.applied_fixes(), patched=state,
                      built=built, blip=blip)))
"""


@pytest.fixture(scope='module')
def fake_root(tmp_path_factory):
    pytest.importorskip('mmpretrain')
    root = str(tmp_path_factory.mktemp('transformers5'))
    _fake_transformers(root)
    return root


def test_without_the_fix_mmpretrain_fails_as_upstream(fake_root):
    proc = _run(CONTROL, fake_root, POLA_MM_STARTUP_HOOK='0')
    assert proc.returncode != 0
    assert 'NoneType takes no arguments' in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize('snippet', [
    'from mmseg.apis import MMSegInferencer',
    'from mmdet.apis import DetInferencer',
    'import mmdet.models',
])
def test_upstream_snippets_need_no_import_pola_mm(fake_root, snippet):
    """The upstream inference snippet is the program's first import: the
    start-up hook applies the fix when mmpretrain loads, without importing
    pola_mm; a later ``import pola_mm`` names the fix as applied."""
    proc = _run(SNIPPET.format(snippet=snippet), fake_root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got['pola_mm_before'] is False
    assert sorted(got['patched']['patched']) == sorted(
        f'transformers.modeling_utils.{n}' for n in REMOVED)
    assert got['multimodal'] is False
    assert 'mmpretrain_multimodal' in got['applied']


@pytest.fixture(scope='module')
def fake_root_4(tmp_path_factory):
    pytest.importorskip('mmpretrain')
    root = str(tmp_path_factory.mktemp('transformers4'))
    _fake_transformers(root, version='4.40.0')
    return root


def test_start_up_hook_leaves_mmpretrain_alone_before_transformers_5(
        fake_root_4):
    """As narrow as the fix at ``import pola_mm``: beside a transformers 4
    (the same fake, lacking the same names) the gate, the installed
    version, does not hold, and mmpretrain's dependency module stays as
    mmpretrain made it."""
    proc = _run(UNTOUCHED, fake_root_4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == dict(version='4.40.0', patched={}, multimodal=True,
                       placeholder='mmpretrain.utils.dependency',
                       pola_mm=False)


def test_with_the_fix_every_detector_and_segmentor_builds(fake_root):
    proc = _run(FIXED, fake_root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert 'mmpretrain_multimodal' in got['applied']
    assert sorted(got['patched']['patched']) == sorted(
        f'transformers.modeling_utils.{n}' for n in REMOVED)
    shipped = [n for n in sorted(os.listdir(osp.join(REPO, 'configs')))
               if n.startswith(('retinanet', 'mask_rcnn', 'cascade',
                                'sem_fpn', 'upernet', 'ham'))]
    assert got['built'] == shipped
    assert 'transformers<5' in got['blip'] and 'BlipCaption' in got['blip']
    assert 'apply_chunking_to_forward' in got['blip']
