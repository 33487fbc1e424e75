"""The linter, as CI runs it: ``ruff check`` with the configuration of
pyproject.toml (``[tool.ruff]``: 79 columns, pycodestyle, pyflakes, mutable
default arguments, closures over loop variables) over the whole repository
finds nothing, and isort finds every import in order."""
import os.path as osp
import subprocess
import sys

from helpers import REPO


def _tool(name: str) -> list:
    """``name``'s command next to this interpreter (make setup installs
    it)."""
    exe = osp.join(osp.dirname(sys.executable), name)
    assert osp.isfile(exe), (f'{name} is not installed next to '
                             f'{sys.executable}: requirements/tests.txt '
                             'lists it (make setup installs it)')
    return [exe]


def test_ruff_finds_nothing():
    proc = subprocess.run(
        _tool('ruff') + ['check', '--no-cache', '--output-format', 'concise',
                         '.'],
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
    proc = subprocess.run(
        [sys.executable, '-m', 'isort', '--check-only', '--diff', '.'],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (
        'isort (pyproject.toml [tool.isort]) would change:\n' +
        proc.stdout[-6000:] + proc.stderr[-2000:])
