"""``deploy.py mmdeploy::...`` right after ``pip install``: MMDeploy's stock
deploy configs (and pola_mm's own, the stock ones at opset 16) ship in
pola_mm's wheel and sdist (the ``mmdeploy`` wheel ships none), and the
installed tool, ``python -m pola_mm.deployment.deploy``, finds them by name
from the installed copy; the installed export tool, ``python -m
pola_mm.deployment.pytorch2onnx pola_mm::CONFIG --dynamic``, runs too.

The wheel is built from a copy of this checkout's files and installed into
a fresh venv that sees this environment's packages after its own (as
tests/tools/test_upstream_tools.py does); the tool then runs from a fresh
folder with a clean environment, so the checkout is not importable there.
"""
import hashlib
import os
import os.path as osp
import re
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from typing import List

import pytest
from helpers import REPO, copy_source_tree

pytest.importorskip('mmdeploy')

pytestmark = [pytest.mark.slow, pytest.mark.export]

SHIPPED = 'pola_mm/.mim/mmdeploy_configs'
DETECTION = 'mmdet/detection/detection_onnxruntime_dynamic.py'
ASSETS = osp.join(REPO, 'tests', 'deployment', 'assets')


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ('PYTHONPATH', 'PYTHONSTARTUP', 'PYTHONHOME',
                        'POLA_MM_STARTUP_HOOK', 'POLA_MM_MMDEPLOY_ROOT')}
    env.update(OMP_NUM_THREADS='2', MKL_NUM_THREADS='2')
    return env


def _run(args: List[str], cwd, timeout: int = 300,
         check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=str(cwd), env=_clean_env(),
                          capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, f'{args} failed ({proc.returncode}):' \
            '\n' + (proc.stdout + proc.stderr)[-4000:]
    return proc


def _blobs() -> List[List[str]]:
    with open(osp.join(REPO, SHIPPED, 'BLOBS.txt')) as f:
        return [line.split() for line in f if line.strip()]


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b'blob %d\0' % len(data) + data).hexdigest()


#: pola_mm's own deploy configs (the stock ones at opset 16)
OURS = 'pola_mm/.mim/deploy_configs'


def _shipped_files() -> List[str]:
    ours = sorted(
        osp.relpath(osp.join(d, f), REPO).replace(os.sep, '/')
        for d, _, files in os.walk(osp.join(REPO, OURS)) for f in files
        if f.endswith('.py'))
    assert len(ours) == 4, ours
    return ([f'{SHIPPED}/{name}'
             for name in ('BLOBS.txt', 'LICENSE', 'README.md')] +
            [f'{SHIPPED}/configs/{rel}' for _, rel in _blobs()] + ours)


@pytest.fixture(scope='module')
def source(tmp_path_factory):
    """This checkout's files (tracked and new, not ignored) without tests/
    and docs/, so that building writes nothing into the checkout."""
    return copy_source_tree(tmp_path_factory.mktemp('src'))


def test_sdist_carries_the_stock_deploy_configs(source, tmp_path):
    """The sdist holds the shipped folder, byte for byte."""
    _run([sys.executable, '-c',
          'import setuptools.build_meta as b, sys; '
          'b.build_sdist(sys.argv[1])', str(tmp_path)], source)
    sdist = next(tmp_path.glob('pola_mm-*.tar.gz'))
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split('/')[0]
        for rel in _shipped_files():
            member = tar.extractfile(f'{top}/{rel}')
            assert member is not None, rel
            with open(osp.join(REPO, rel), 'rb') as f:
                assert member.read() == f.read(), rel


def test_installed_wheel_deploys_with_a_shipped_config(source, tmp_path):
    """``pip wheel`` of the checkout holds the stock configs with their
    LICENSE; installed into a fresh venv, ``python -m
    pola_mm.deployment.deploy mmdeploy::mmdet/detection/
    detection_onnxruntime_dynamic.py ...`` run from a fresh folder resolves
    the name to the installed copy and exports and verifies the tiny
    trained RetinaNet (Pola-PVT) on a 128x128 shapes image; ``python -m
    pola_mm.deployment.pytorch2onnx pola_mm::demo/... --dynamic`` exports
    and verifies the installed demo config's backbone."""
    start = time.perf_counter()
    _run([sys.executable, '-m', 'pip', 'wheel', '--no-deps',
          '--no-build-isolation', '-q', '-w', str(tmp_path / 'dist'),
          str(source)], tmp_path)
    wheel = next((tmp_path / 'dist').glob('pola_mm-*.whl'))
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for rel in _shipped_files():
            assert rel in names, rel
        for blob, rel in _blobs():
            data = zf.read(f'{SHIPPED}/configs/{rel}')
            assert _git_blob_id(data) == blob, rel
    built = time.perf_counter()

    venv = tmp_path / 'venv'
    _run([sys.executable, '-m', 'venv', '--without-pip', str(venv)],
         tmp_path)
    python = str(venv / 'bin' / 'python')
    site = _run([python, '-c', 'import sysconfig; '
                 "print(sysconfig.get_paths()['purelib'])"],
                tmp_path).stdout.strip()
    # this environment's packages (mmdet, mmdeploy, ...), after the venv's
    # own; its .pth files (the checkout's editable finder) are not run
    with open(osp.join(site, '_stack.pth'), 'w') as f:
        f.write(sysconfig.get_paths()['purelib'] + '\n')
    _run([sys.executable, '-m', 'pip', '--python', python, 'install',
          '--no-deps', '--no-index', '-q', str(wheel)], tmp_path)
    installed = osp.join(site, SHIPPED)
    assert sorted(os.listdir(installed)) == ['BLOBS.txt', 'LICENSE',
                                             'README.md', 'configs']

    from pola_mm.demo.shapes import make_shapes_dataset
    work = tmp_path / 'fresh'
    make_shapes_dataset(str(work / 'shapes'), num_train=1, num_val=1,
                        img_size=128, seed=0)
    img = str(next((work / 'shapes' / 'val').glob('*.png')))
    installed_at = time.perf_counter()

    # the child imports the installed pola_mm, whose pola_mm:: configs are
    # the installed ones too
    probe = _run([python, '-c', 'import pola_mm; print(pola_mm.__file__); '
                  'from pola_mm.deployment.deploy import '
                  'resolve_model_config as r; '
                  "print(r('pola_mm::retinanet_pola_pvt_t.py'))"],
                 work).stdout.strip().splitlines()
    assert probe[-2] == osp.join(site, 'pola_mm', '__init__.py')
    assert probe[-1] == osp.join(site, 'pola_mm', '.mim', 'configs',
                                 'retinanet_pola_pvt_t.py')
    assert osp.isfile(probe[-1])
    # pola_mm's own deploy configs read their stock bases from the install
    ours = _run([python, '-c', 'import pola_mm; from mmengine.config import '
                 'Config; from pola_mm.deployment.mmdeploy_export import '
                 'resolve_deploy_config as r; '
                 "c = Config.fromfile(r('pola_mm_deploy::mmdet/instance-seg/"
                 "instance-seg_onnxruntime_dynamic-opset16.py')); "
                 'print(c.filename); print(c.onnx_config.opset_version, '
                 'c.onnx_config.output_names)'],
                work).stdout.strip().splitlines()
    assert ours[-2].startswith(osp.join(site, OURS)), ours
    assert ours[-1] == "16 ['dets', 'labels', 'masks']", ours

    cmd = [python, '-m', 'pola_mm.deployment.deploy',
           'mmdeploy::' + DETECTION,
           osp.join(ASSETS, 'retinanet_pola_pvt_shapes.py'),
           osp.join(ASSETS, 'retinanet_pola_pvt_shapes.pth'), img,
           '--work-dir', 'deploy']
    res = _run(cmd, work)
    deployed = time.perf_counter()
    out = res.stdout
    assert f'deploy config: {osp.join(installed, "configs", DETECTION)}' \
        in out.splitlines(), out
    assert 'verified: ' in out and '(ObjectDetection, input 128x128)' in out
    # the trained detector's shapes are compared one to one, all matched
    counted = re.search(r'^image 0 128x128: compared detections without a '
                        r"counterpart: 0 \(needs <= 0\) \(compared PyTorch's "
                        r"top (\d+) of \d+ and the backend's top (\d+) of "
                        r'\d+ \(those with score >= 0.3: (\d+) and (\d+), and '
                        r'at least the top 20\); 0 swapped between tied '
                        r'scores, 0 at the per-image cap with a tie\) ok$',
                        out, re.M)
    assert counted and int(counted[1]) == int(counted[2]) >= 20, out
    assert int(counted[3]) == int(counted[4]) > 0, out
    assert (work / 'deploy' / 'end2end.onnx').is_file()

    # an unknown name: exit 2, one line listing the shipped names
    bad = _run(cmd[:3] + ['mmdeploy::mmdet/detection/nope.py'] + cmd[4:],
               work, check=False)
    assert bad.returncode == 2, bad.stderr[-2000:]
    last = bad.stderr.strip().splitlines()[-1]
    assert last.startswith('error: unknown MMDeploy deploy config '
                           'mmdeploy::mmdet/detection/nope.py')
    assert 'mmdeploy::' + DETECTION in last

    # torch's exporters: the documented complete command, on the installed
    # package's own demo config, nothing of the checkout reachable
    exported = _run([python, '-m', 'pola_mm.deployment.pytorch2onnx',
                     'pola_mm::demo/mask_rcnn_pola_swin_shapes.py',
                     '--dynamic'], work).stdout
    name = 'mask_rcnn_pola_swin_shapes'
    path = osp.join('work_dirs', name, f'{name}_backbone.onnx')
    assert (f'{path}: PolaSwinTransformer exported at 128x128 (dynamo '
            'exporter, dynamic batch, height and width) agrees with '
            'PyTorch' in exported), exported[-3000:]
    assert (work / path).is_file()
    done = time.perf_counter()
    print(f'wheel built {built - start:.1f} s, installed '
          f'{installed_at - built:.1f} s, probe + deploy '
          f'{deployed - installed_at:.1f} s, pytorch2onnx '
          f'{done - deployed:.1f} s, total {done - start:.1f} s')
