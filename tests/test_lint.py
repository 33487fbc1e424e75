"""The linter, as CI runs it: ``ruff check`` with the configuration of
pyproject.toml (``[tool.ruff]``: 79 columns, pycodestyle, pyflakes, mutable
default arguments, closures over loop variables) finds nothing, and isort
finds every import in order, over the Python files git tracks. Files a user
saves in the checkout (e.g. the small-data configs of docs/small_data.md)
are not the project's and are not linted; outside a git checkout (an
sdist) the package, the tests and the tools are. No test module imports
another test module or a conftest.py: shared code lives in helper modules
(tests/helpers.py, tests/deployment/deploy_helpers.py). No tracked file
names an issue tracker's number: a comment says what a thing is, not which
ticket asked for it."""
import ast
import os
import os.path as osp
import re
import subprocess
import sys
from typing import List

from helpers import REPO

#: What is linted outside a git checkout (relative to the root).
UNTRACKED_FALLBACK = ('pola_mm', 'tests', 'tools', 'setup.py',
                      'pola_mm_startup.py')


def python_files(root: str = REPO) -> List[str]:
    """The ``.py`` files that git tracks under ``root`` (relative paths, the
    ones still on disk); where ``root`` is no git checkout, or git tracks
    none there, those of ``UNTRACKED_FALLBACK``."""
    try:
        proc = subprocess.run(['git', 'ls-files', '-z', '--', '*.py'],
                              cwd=root, capture_output=True, text=True,
                              timeout=60)
        tracked = proc.stdout.split('\0') if proc.returncode == 0 else []
    except OSError:  # no git
        tracked = []
    files = sorted(f for f in tracked if f and osp.isfile(osp.join(root, f)))
    if files:
        return files
    found = []
    for name in UNTRACKED_FALLBACK:
        path = osp.join(root, name)
        if osp.isfile(path):
            found.append(name)
        for folder, _, names in os.walk(path):
            found += [osp.relpath(osp.join(folder, n), root)
                      for n in names if n.endswith('.py')]
    return sorted(found)


def _tool(name: str) -> list:
    """``name``'s command next to this interpreter (make setup installs
    it)."""
    exe = osp.join(osp.dirname(sys.executable), name)
    assert osp.isfile(exe), (f'{name} is not installed next to '
                             f'{sys.executable}: requirements/tests.txt '
                             'lists it (make setup installs it)')
    return [exe]


def test_ruff_finds_nothing():
    # --force-exclude: the configuration's excludes (configs/) hold for
    # files named on the command line too
    proc = subprocess.run(
        _tool('ruff') + ['check', '--no-cache', '--force-exclude',
                         '--output-format', 'concise', *python_files()],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (
        'ruff check (pyproject.toml [tool.ruff]) found:\n' +
        proc.stdout[-6000:] + proc.stderr[-2000:])


def test_ruff_reads_the_project_configuration():
    """A finding the configuration selects is reported (the check is not
    vacuous): a mutable default argument, in a file outside the tree."""
    proc = subprocess.run(
        _tool('ruff') + ['check', '--no-cache', '--stdin-filename',
                         'pola_mm/_probe.py', '-'],
        cwd=REPO, input='def f(x=[]):\n    return x\n',
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and 'B006' in proc.stdout, proc.stdout


def test_isort_finds_nothing():
    """Import order as OpenMMLab's repositories keep it (pyproject.toml
    ``[tool.isort]``); ``# isort: split`` marks where a side effect must
    come first (the tools' warning filter)."""
    # --filter-files: the configuration's skips hold for named files too
    proc = subprocess.run(
        [sys.executable, '-m', 'isort', '--check-only', '--diff',
         '--filter-files', *python_files()],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (
        'isort (pyproject.toml [tool.isort]) would change:\n' +
        proc.stdout[-6000:] + proc.stderr[-2000:])


def test_only_tracked_files_are_linted(tmp_path):
    """In a git checkout, an untracked file (a user's config saved in the
    root) is not linted; outside one, the package, tests and tools are."""
    (tmp_path / 'pola_mm').mkdir()
    (tmp_path / 'pola_mm' / 'a.py').write_text('x = 1\n')
    (tmp_path / 'notes.txt').write_text('')
    assert python_files(str(tmp_path)) == [osp.join('pola_mm', 'a.py')]
    env = dict(os.environ, GIT_AUTHOR_NAME='t', GIT_AUTHOR_EMAIL='t@t',
               GIT_COMMITTER_NAME='t', GIT_COMMITTER_EMAIL='t@t')
    for command in (['git', 'init', '-q'], ['git', 'add', 'pola_mm/a.py']):
        subprocess.run(command, cwd=tmp_path, env=env, check=True)
    (tmp_path / 'my_shapes.py').write_text('import os,sys\n')
    assert python_files(str(tmp_path)) == ['pola_mm/a.py']
    assert 'tests/test_lint.py' in python_files()


def test_no_test_module_imports_another():
    """A test module imports helpers, never a test module (``test_*``) or
    a ``conftest``: importing one runs its module-level code and collects
    its fixtures twice."""
    found = []
    for rel in python_files():
        if not rel.startswith('tests/'):
            continue
        with open(osp.join(REPO, rel), encoding='utf-8') as f:
            tree = ast.parse(f.read(), rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            found += [f'{rel}:{node.lineno}: {name}' for name in names
                      if name.split('.')[-1].startswith(('test_',
                                                         'conftest'))]
    assert not found, 'test modules imported:\n' + '\n'.join(found)


#: the word issue or ticket followed by a number (``#`` allowed), also
#: across a line break
TRACKER_NUMBER = re.compile(r'\b(?:issues?|tickets?)[\s(#]*\d+',
                            flags=re.I)


def test_no_tracker_numbers():
    proc = subprocess.run(['git', 'ls-files', '-z'], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        import pytest
        pytest.skip('not a git checkout')
    found = []
    for rel in filter(None, proc.stdout.split('\0')):
        path = osp.join(REPO, rel)
        if not osp.isfile(path):
            continue
        with open(path, 'rb') as f:
            data = f.read()
        if b'\0' in data[:8192]:
            continue  # binary (checkpoints, images)
        text = data.decode('utf-8', errors='replace')
        found += [f'{rel}:{text.count(chr(10), 0, m.start()) + 1}: '
                  f'{" ".join(m.group(0).split())}'
                  for m in TRACKER_NUMBER.finditer(text)]
    assert not found, 'tracker numbers:\n' + '\n'.join(found)
