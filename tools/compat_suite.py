#!/usr/bin/env python
"""Run the compatibility suite in a compatibility environment.

    python tools/compat_suite.py STACK [PYTEST_ARGS ...]

(``make test-compat`` runs it after ``tools/setup_compat_env.sh STACK``.)

1. copies the checkout's files (tracked, and untracked ones git does not
   ignore) into a fresh temporary folder, builds a pola_mm wheel there and
   installs it with ``pip install --no-deps --force-reinstall`` into
   ``.venv-compat/STACK`` (a regular, non-editable install: the package,
   its configs and its start-up hook come from site-packages);
2. lays out a run folder outside the checkout with ``tests/``, ``tools/``,
   ``configs/`` and ``setup.cfg`` (pytest's configuration) only (no
   ``pola_mm/``, no ``pola_mm_startup.py``), and checks that ``import
   pola_mm`` there is the installed wheel;
3. runs pytest with that environment's interpreter on the selection of
   ``tests/compat/suite.txt`` (plus ``PYTEST_ARGS``), with ``CI=1`` so that
   a missing reference folder fails instead of skipping, and prints one
   summary line: passed, failed, errors, skipped and the time.

The authors' reference files are taken from ``$POLA_MM_REFERENCE``, else
from ``../shared/reference`` beside the checkout (as the tests do).
MMDeploy's stock configs are the installed package's copy.

Exit status: pytest's (0 when everything selected passed), 2 for a usage
error or a failed install. Standard library only: it runs with any Python.
"""
import os
import os.path as osp
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from typing import Dict, List, Optional

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
SUITE = osp.join(REPO, 'tests', 'compat', 'suite.txt')
#: what the run folder holds: the tests and what they run or read
RUN_FOLDERS = ('tests', 'tools', 'configs')
#: pytest's configuration (the markers of the tiers, --strict-markers)
RUN_FILES = ('setup.cfg',)


def say(msg: str) -> None:
    print(f'[compat {time.strftime("%H:%M:%S")}] {msg}', flush=True)


def suite_args(path: str = SUITE) -> List[str]:
    """The pytest arguments of ``suite.txt`` (one or more a line, shell
    quoting, ``#`` comments)."""
    args: List[str] = []
    with open(path) as f:
        for line in f:
            args.extend(shlex.split(line, comments=True))
    return args


def checkout_files(repo: str) -> List[str]:
    """Tracked files and untracked, not ignored ones, that exist now."""
    out = subprocess.run(
        ['git', 'ls-files', '-z', '--cached', '--others',
         '--exclude-standard'],
        cwd=repo, capture_output=True, check=True).stdout
    names = sorted({n for n in out.decode().split('\0') if n})
    return [n for n in names
            if osp.lexists(osp.join(repo, n))]  # minus deleted ones


def copy_checkout(repo: str, dst: str) -> None:
    """Copy the checkout's files into ``dst`` (symlinks stay links)."""
    for name in checkout_files(repo):
        target = osp.join(dst, name)
        os.makedirs(osp.dirname(target), exist_ok=True)
        shutil.copy2(osp.join(repo, name), target, follow_symlinks=False)


def run(cmd: List[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, text=True, **kwargs)


def install_wheel(python: str, src: str, work: str) -> str:
    """Build pola_mm's wheel from ``src`` and install it without deps;
    return the wheel's path."""
    dist = osp.join(work, 'dist')
    proc = run([python, '-m', 'pip', 'wheel', '-q', '--no-deps',
                '--no-build-isolation', '-w', dist, src],
               capture_output=True)
    wheels = [f for f in os.listdir(dist)] if osp.isdir(dist) else []
    if proc.returncode != 0 or len(wheels) != 1:
        raise SystemExit(f'[compat] ERROR: building the pola_mm wheel failed:'
                         f'\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}')
    wheel = osp.join(dist, wheels[0])
    proc = run([python, '-m', 'pip', 'install', '-q', '--no-deps',
                '--force-reinstall', wheel], capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f'[compat] ERROR: installing {wheel} failed:\n'
                         f'{proc.stderr[-3000:]}')
    return wheel


def installed_package_dir(python: str, cwd: str, env: Dict[str, str]) -> str:
    """Where ``import pola_mm`` resolves in the run folder; it must be
    site-packages, with the start-up hook having run."""
    code = ('import sys, os, pola_mm; '
            "assert 'pola_mm_startup' in sys.modules, 'start-up hook'; "
            'print(os.path.dirname(os.path.realpath(pola_mm.__file__)))')
    proc = run([python, '-c', code], cwd=cwd, env=env, capture_output=True)
    if proc.returncode != 0:
        raise SystemExit('[compat] ERROR: the installed pola_mm does not '
                         f'import in the run folder:\n{proc.stderr[-2000:]}')
    where = proc.stdout.strip().splitlines()[-1]
    if 'site-packages' not in where.split(os.sep):
        raise SystemExit(f'[compat] ERROR: pola_mm imports from {where}, '
                         'not from the installed wheel')
    return where


def summarise(junit: str) -> Dict[str, float]:
    """Counts and time of a pytest JUnit XML report."""
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == 'testsuite' else list(root)
    total = dict(tests=0, failures=0, errors=0, skipped=0, time=0.0)
    for suite in suites:
        for key in total:
            total[key] += float(suite.get(key, 0))
    total['passed'] = (total['tests'] - total['failures'] -
                       total['errors'] - total['skipped'])
    return total


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith('-'):
        print(__doc__.split('\n\n')[1], file=sys.stderr)
        return 2
    stack, extra = argv[0], argv[1:]
    venv = osp.join(REPO, '.venv-compat', stack)
    python = osp.join(venv, 'bin', 'python')
    if not osp.isfile(python):
        print(f'[compat] ERROR: {venv} does not exist; build it with '
              f'`bash tools/setup_compat_env.sh {stack}`', file=sys.stderr)
        return 2
    start = time.time()
    work = tempfile.mkdtemp(prefix=f'pola_mm_compat_{stack}_')
    keep = os.environ.get('POLA_MM_KEEP_COMPAT_RUN') == '1'
    try:
        src = osp.join(work, 'src')
        copy_checkout(REPO, src)
        wheel = install_wheel(python, src, work)
        say(f'{stack}: installed {osp.basename(wheel)} (--no-deps) in '
            f'{time.time() - start:.0f} s')
        rundir = osp.join(work, 'run')
        os.makedirs(rundir)
        for name in RUN_FOLDERS + RUN_FILES:
            os.rename(osp.join(src, name), osp.join(rundir, name))
        env = dict(os.environ)
        for name in ('PYTHONPATH', 'PYTHONHOME', 'VIRTUAL_ENV'):
            env.pop(name, None)
        env['PATH'] = osp.join(venv, 'bin') + os.pathsep + env.get('PATH', '')
        env['CI'] = '1'  # a missing reference folder fails, never skips
        env.setdefault('MPLBACKEND', 'Agg')
        env.setdefault('POLA_MM_REFERENCE', osp.normpath(
            osp.join(REPO, '..', 'shared', 'reference')))
        package = installed_package_dir(python, rundir, env)
        env['POLA_MM_MMDEPLOY_ROOT'] = osp.join(package, '.mim',
                                                'mmdeploy_configs')
        junit = osp.join(venv, 'compat-suite-junit.xml')
        cmd = [python, '-m', 'pytest', '-p', 'no:cacheprovider', '-ra',
               f'--junitxml={junit}'] + suite_args() + extra
        say(f'{stack}: pytest in {rundir} (pola_mm from {package})')
        proc = run(cmd, cwd=rundir, env=env)
        if osp.isfile(junit):
            s = summarise(junit)
            say(f'{stack}: {s["passed"]:.0f} passed, {s["failures"]:.0f} '
                f'failed, {s["errors"]:.0f} errors, {s["skipped"]:.0f} '
                f'skipped; pytest {s["time"]:.0f} s, all '
                f'{time.time() - start:.0f} s (report: {junit})')
        return proc.returncode
    finally:
        if keep:
            say(f'run folder kept: {work}')
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
