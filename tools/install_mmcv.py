#!/usr/bin/env python
"""Install mmcv (with compiled ops) into the running Python environment.

PyPI has no mmcv wheels, and the mmcv 2.1.0 sdist does not build against
torch >= 2.10 as shipped (its ``setup.py`` forces ``-std=c++17`` while the
torch headers need C++20). This script:

1. skips everything if a working mmcv (``2.0 <= version < 2.2``, ops included)
   is already importable, unless ``--force`` is given;
2. otherwise installs a cached wheel built earlier for the same mmcv version,
   torch version (CUDA tag included), ops flavour (cpu/cuda) and Python tag;
3. otherwise downloads the sdist from the package index, patches the C++
   standard to the one the installed torch needs, builds a wheel with
   ``--no-build-isolation`` (so it compiles against the installed torch),
   showing one line per compiled file, caches the wheel and installs it.

Usage (with the target environment's interpreter)::

    .venv/bin/python tools/install_mmcv.py [--jobs N] [--force]

Environment variables:
    POLA_MM_WHEEL_CACHE  wheel cache folder
                         (default ``~/.cache/pola_mm/wheels``)
    POLA_MM_MMCV_SDIST   a local ``mmcv-2.1.0.tar.gz`` to build instead of
                         downloading one
    MAX_JOBS             parallel compile jobs (default: number of CPUs)
    FORCE_CUDA=1         build the CUDA ops too (needs nvcc)

Exit status 0 on success; on failure a short message names the cause and
the fix, and points at the full build log.
"""
import argparse
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from typing import List, Optional, Tuple

MMCV_VERSION = '2.1.0'
# what mmdet 3.3.0 / mmseg 1.2.2 accept; a working install in this range is
# kept
ACCEPTED_RANGE = ('2.0.0', '2.2.0')
SETUPTOOLS_SPEC = 'setuptools>=77.0.3,<81'
LOG_DIR_ENV = 'POLA_MM_BUILD_LOG_DIR'

CHECK_SNIPPET = r'''
import sys
import mmcv
from mmcv.ops import nms
import torch
boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.],
                      [20., 20., 30., 30.]])
scores = torch.tensor([0.9, 0.8, 0.7])
dets, keep = nms(boxes, scores, 0.5)
assert keep.tolist() == [0, 2], keep
print(mmcv.__version__)
'''


class InstallError(RuntimeError):
    """A failure with a one-paragraph explanation for the user."""


def say(msg: str) -> None:
    """Print a progress line of this script (stdout, flushed)."""
    print(f'[install_mmcv] {msg}', flush=True)


def version_tuple(version: str) -> Tuple[int, ...]:
    """``'2.14.1+cu130'`` -> ``(2, 14, 1)``."""
    parts = []
    for piece in re.split(r'[.+]', version):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def working_mmcv(python: str) -> Optional[str]:
    """Return the version of a working mmcv with ops, or None."""
    proc = subprocess.run([python, '-c', CHECK_SNIPPET],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    return proc.stdout.strip().splitlines()[-1]


def torch_info() -> Tuple[str, bool]:
    """Return (torch version, whether CUDA ops will be compiled)."""
    try:
        import torch
    except ImportError as exc:
        raise InstallError(
            f'torch is not importable in {sys.executable} ({exc}).\n'
            'mmcv compiles against the installed torch: install torch first, '
            'e.g. `pip install torch torchvision`, or run `make test`, which '
            'does it for you.') from exc
    cuda = bool(torch.cuda.is_available()
                or os.environ.get('FORCE_CUDA', '0') == '1')
    return torch.__version__, cuda


def python_tag() -> str:
    """``cp311`` style tag of the running interpreter."""
    return f'cp{sys.version_info.major}{sys.version_info.minor}'


def cache_dir() -> str:
    """The root of the wheel cache."""
    root = os.environ.get('POLA_MM_WHEEL_CACHE') or osp.join(
        osp.expanduser('~'), '.cache', 'pola_mm', 'wheels')
    return root


def cache_key(torch_version: str, cuda: bool) -> str:
    """Folder name of the cached wheel for this build configuration."""
    flavour = 'cuda' if cuda else 'cpu'
    plat = sysconfig.get_platform().replace('-', '_').replace('.', '_')
    return (f'mmcv-{MMCV_VERSION}_torch-{torch_version}_{flavour}_'
            f'{python_tag()}_{plat}')


def cached_wheel(key: str) -> Optional[str]:
    """The cached wheel for ``key``, if there is one."""
    folder = osp.join(cache_dir(), key)
    if not osp.isdir(folder):
        return None
    wheels = sorted(f for f in os.listdir(folder) if f.endswith('.whl'))
    return osp.join(folder, wheels[0]) if wheels else None


def store_wheel(wheel: str, key: str) -> str:
    """Copy ``wheel`` into the cache atomically and return its new path."""
    folder = osp.join(cache_dir(), key)
    os.makedirs(folder, exist_ok=True)
    dst = osp.join(folder, osp.basename(wheel))
    tmp = dst + f'.tmp{os.getpid()}'
    shutil.copyfile(wheel, tmp)
    os.replace(tmp, dst)
    return dst


def pip(args: List[str], log: Optional[str] = None,
        quiet: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m pip ARGS`` in this environment."""
    cmd = [sys.executable, '-m', 'pip'] + args
    if quiet:
        cmd.append('-q')
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if log:
        with open(log, 'a') as f:
            f.write(f'$ {" ".join(cmd)}\n{proc.stdout}\n{proc.stderr}\n')
    return proc


def check_build_prerequisites(log: str) -> None:
    """Fail early, with the fix, when the build cannot work."""
    cxx = os.environ.get('CXX', 'c++')
    if shutil.which(cxx) is None and shutil.which('g++') is None:
        raise InstallError(
            f'no C++ compiler found (looked for `{cxx}` and `g++`).\n'
            'Install one, e.g. `sudo apt-get install build-essential` '
            '(Debian/Ubuntu) or `conda install gxx_linux-64`, or point CXX at '
            'yours.')
    include = sysconfig.get_paths()['include']
    if not osp.isfile(osp.join(include, 'Python.h')):
        ver = f'{sys.version_info.major}.{sys.version_info.minor}'
        raise InstallError(
            f'Python headers are missing ({include}/Python.h).\n'
            f'Install them, e.g. `sudo apt-get install python{ver}-dev`.')
    needed = []
    try:
        import setuptools
        st = version_tuple(setuptools.__version__)
        if not (77, 0, 3) <= st < (81, ):
            needed.append(SETUPTOOLS_SPEC)
    except ImportError:
        needed.append(SETUPTOOLS_SPEC)
    if shutil.which('ninja') is None and not osp.isfile(
            osp.join(osp.dirname(sys.executable), 'ninja')):
        needed.append('ninja')
    try:
        import wheel  # noqa: F401
    except ImportError:
        needed.append('wheel')
    if needed:
        say(f'installing build tools: {" ".join(needed)}')
        proc = pip(['install'] + needed, log=log)
        if proc.returncode != 0:
            raise InstallError(
                f'could not install the build tools {needed} '
                '(is the package index reachable?).')


def fetch_sdist(workdir: str, log: str) -> str:
    """Return the path of the mmcv sdist (local override or downloaded)."""
    local = os.environ.get('POLA_MM_MMCV_SDIST')
    if local:
        if not osp.isfile(local):
            raise InstallError(f'POLA_MM_MMCV_SDIST={local} does not exist.')
        return local
    say(f'downloading the mmcv {MMCV_VERSION} sdist')
    # the metadata step of mmcv's setup.py imports torch and pkg_resources,
    # so it has to run in this environment (no build isolation)
    proc = pip(['download', f'mmcv=={MMCV_VERSION}', '--no-binary', ':all:',
                '--no-deps', '--no-build-isolation', '-d', workdir], log=log)
    found = [f for f in os.listdir(workdir) if f.endswith('.tar.gz')]
    if proc.returncode != 0 or not found:
        tail = '\n'.join(proc.stderr.strip().splitlines()[-3:])
        raise InstallError(
            f'download of the mmcv {MMCV_VERSION} sdist failed:\n{tail}\n'
            'Check the network / package index, or download '
            f'mmcv-{MMCV_VERSION}.tar.gz yourself and set '
            'POLA_MM_MMCV_SDIST to its path.')
    return osp.join(workdir, found[0])


def patch_cxx_standard(setup_py: str, torch_version: str) -> str:
    """Make mmcv's setup.py compile with the C++ standard torch needs.

    torch >= 2.10 headers require C++20; mmcv 2.1.0 passes ``-std=c++17``.
    Returns the standard used.
    """
    std = 'c++20' if version_tuple(torch_version) >= (2, 10) else 'c++17'
    if std == 'c++17':
        return std
    with open(setup_py) as f:
        text = f.read()
    patched = text.replace('-std=c++17', '-std=c++20').replace(
        '/std:c++17', '/std:c++20')
    with open(setup_py, 'w') as f:
        f.write(patched)
    return std


NINJA_STEP = re.compile(r'^\[(\d+)/(\d+)\]\s')
SOURCE = re.compile(r'(\S+\.(?:cpp|cu|cc|mm))(?:\s|$)')


def build_wheel(src: str, outdir: str, jobs: int, log: str) -> str:
    """Compile mmcv in ``src`` into a wheel in ``outdir``; return its path."""
    env = dict(os.environ, MMCV_WITH_OPS='1', MAX_JOBS=str(jobs))
    # make the venv's ninja visible to torch's extension builder
    env['PATH'] = osp.dirname(sys.executable) + os.pathsep + env.get(
        'PATH', '')
    cmd = [sys.executable, '-m', 'pip', 'wheel', '-v', '--no-deps',
           '--no-build-isolation', '-w', outdir, src]
    say(f'compiling mmcv ops with {jobs} job(s) '
        '(about 8 minutes on 2 cores; full output in the log)')
    start = time.time()
    total = None
    with open(log, 'a') as logf:
        logf.write(f'$ MMCV_WITH_OPS=1 MAX_JOBS={jobs} {" ".join(cmd)}\n')
        logf.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                env=env, cwd=src, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            logf.write(line)
            m = NINJA_STEP.match(line.strip())
            if m:
                done, total = int(m.group(1)), int(m.group(2))
                srcs = SOURCE.findall(line)
                name = osp.basename(srcs[-1]) if srcs else 'linking'
                elapsed = time.time() - start
                say(f'[{done:>3}/{total}] {name}  '
                    f'({int(elapsed // 60)}:{int(elapsed % 60):02d})')
        ret = proc.wait()
    if ret != 0:
        raise InstallError(diagnose(log))
    wheels = [f for f in os.listdir(outdir) if f.endswith('.whl')]
    if not wheels:
        raise InstallError(diagnose(log))
    elapsed = time.time() - start
    say(f'built {wheels[0]} in {int(elapsed // 60)}:{int(elapsed % 60):02d}')
    return osp.join(outdir, wheels[0])


def diagnose(log: str) -> str:
    """Turn a failed build log into a short cause + fix."""
    with open(log, errors='replace') as f:
        text = f.read()
    if 'Python.h: No such file' in text:
        return ('the Python headers are missing; install them (e.g. '
                '`sudo apt-get install python3-dev`).')
    if re.search(r"No such file or directory: '(c\+\+|g\+\+|gcc|cc)'|"
                 r'command .*(c\+\+|g\+\+).* failed: No such file', text):
        return ('no C++ compiler; install one (e.g. '
                '`sudo apt-get install build-essential`).')
    if re.search(r'C\+\+(17|20) or later|requires.*-std=c\+\+', text):
        return ('the compiler rejected the C++ standard torch needs; use a '
                'newer g++ (>= 10) or clang.')
    if "No module named 'torch'" in text:
        return 'torch is not importable in the build environment.'
    if 'nvcc' in text and 'not found' in text:
        return ('CUDA ops were requested but nvcc was not found (unset '
                'FORCE_CUDA).')
    errors = [ln.strip() for ln in text.splitlines()
              if re.search(r'\berror\b', ln) and len(ln) < 300][:3]
    first = '\n  '.join(errors) if errors else '(no error line found)'
    return f'the mmcv build failed; first errors:\n  {first}'


def install_wheel(wheel: str, log: str) -> None:
    """pip install the wheel, then its Python deps (mmengine, addict, ...)."""
    say(f'installing {osp.basename(wheel)}')
    proc = pip(['install', '--force-reinstall', '--no-deps', wheel], log=log)
    if proc.returncode != 0:
        raise InstallError(f'pip could not install {wheel}:\n'
                           + '\n'.join(proc.stderr.splitlines()[-3:]))
    # a second, dependency-resolving pass installs only what is missing
    proc = pip(['install', wheel], log=log)
    if proc.returncode != 0:
        raise InstallError('could not install the Python dependencies of mmcv:'
                           '\n' + '\n'.join(proc.stderr.splitlines()[-3:]))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--jobs', type=int,
                        default=int(os.environ.get('MAX_JOBS', 0))
                        or os.cpu_count() or 2,
                        help='parallel compile jobs (default: MAX_JOBS or '
                        'the number of CPUs)')
    parser.add_argument('--force', action='store_true',
                        help='install even if a working mmcv is present')
    parser.add_argument('--no-cache', action='store_true',
                        help='ignore the wheel cache (still stores the build)')
    args = parser.parse_args(argv)

    log_dir = os.environ.get(LOG_DIR_ENV) or tempfile.gettempdir()
    os.makedirs(log_dir, exist_ok=True)
    log = osp.join(log_dir, f'pola_mm_mmcv_build_{os.getpid()}.log')
    try:
        if not args.force:
            current = working_mmcv(sys.executable)
            if current is not None:
                vt = version_tuple(current)
                lo, hi = (version_tuple(v) for v in ACCEPTED_RANGE)
                if lo <= vt < hi:
                    say(f'mmcv {current} with ops already works here: '
                        'nothing to do')
                    return 0
                say(f'mmcv {current} is installed but outside '
                    f'[{ACCEPTED_RANGE[0]}, {ACCEPTED_RANGE[1]}): '
                    'replacing it')
        torch_version, cuda = torch_info()
        key = cache_key(torch_version, cuda)
        wheel = None if args.no_cache else cached_wheel(key)
        if wheel is not None:
            say(f'using cached wheel {wheel}')
        else:
            check_build_prerequisites(log)
            with tempfile.TemporaryDirectory(prefix='pola_mm_mmcv_') as work:
                sdist = fetch_sdist(work, log)
                with tarfile.open(sdist) as tar:
                    if hasattr(tarfile, 'data_filter'):
                        tar.extractall(work, filter='data')
                    else:  # Python < 3.11.4
                        tar.extractall(work)
                src = osp.join(work, f'mmcv-{MMCV_VERSION}')
                if not osp.isfile(osp.join(src, 'setup.py')):
                    raise InstallError(f'{sdist} is not an mmcv sdist.')
                std = patch_cxx_standard(osp.join(src, 'setup.py'),
                                         torch_version)
                say(f'torch {torch_version} ({"cuda" if cuda else "cpu"} ops)'
                    f', -std={std}')
                outdir = osp.join(work, 'dist')
                os.makedirs(outdir)
                built = build_wheel(src, outdir, args.jobs, log)
                wheel = store_wheel(built, key)
                say(f'cached as {wheel}')
        install_wheel(wheel, log)
        version = working_mmcv(sys.executable)
        if version is None:
            raise InstallError(
                'mmcv installed but `from mmcv.ops import nms` does not work '
                '(a cached wheel built against another torch?). Re-run with '
                '--no-cache --force.')
        say(f'mmcv {version} with ops is ready')
        return 0
    except InstallError as exc:
        print(f'[install_mmcv] ERROR: {exc}\n[install_mmcv] full log: {log}',
              file=sys.stderr, flush=True)
        return 1


if __name__ == '__main__':
    sys.exit(main())
