"""The package metadata states what was tested: ``python_requires`` and the
torch lower bound in setup.cfg, the compatibility stacks' pins and the keep
rule of tools/setup_env.sh agree with docs/install.md's "Tested stacks"
table."""
import configparser
import os.path as osp
import re

import pytest

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _read(rel: str) -> str:
    with open(osp.join(ROOT, rel), encoding='utf-8') as f:
        return f.read()


def _version(text: str) -> tuple:
    return tuple(int(p) for p in re.findall(r'\d+', text)[:3])


def _tested_rows() -> list:
    """The rows of the "Tested stacks" table that ran and passed, as
    dicts keyed by the header."""
    doc = _read('docs/install.md')
    section = doc.split('## Tested stacks', 1)[1].split('\n## ', 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith('|')]
    header = [c.strip() for c in lines[0].strip('|').split('|')]
    rows = []
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip('|').split('|')]
        row = dict(zip(header, cells))
        if re.match(r'\d+ passed, 0 failed', row['result']):
            rows.append(row)
    return rows


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(osp.join(ROOT, 'setup.cfg'))
    return cfg


def test_table_has_passing_rows():
    rows = _tested_rows()
    assert len(rows) >= 2, rows
    assert all({'Python', 'torch, torchvision'} <= set(r) for r in rows)


def test_python_requires_is_the_oldest_tested_python():
    spec = _setup_cfg()['options']['python_requires'].strip()
    assert spec.startswith('>='), spec
    oldest = min(_version(r['Python']) for r in _tested_rows())
    assert _version(spec)[:2] == oldest[:2], (spec, oldest)
    classifiers = _setup_cfg()['metadata']['classifiers']
    for py in {r['Python'] for r in _tested_rows()}:
        assert f'Python :: {py}' in classifiers, py


def test_torch_lower_bound_is_the_oldest_tested_torch():
    requires = _setup_cfg()['options']['install_requires']
    bound = re.search(r'^\s*torch>=([\d.]+)\s*$', requires, re.M)
    assert bound, requires
    oldest = min(_version(r['torch, torchvision'].split(',')[0])
                 for r in _tested_rows())
    assert _version(bound.group(1))[:2] == oldest[:2], (bound.group(1),
                                                         oldest)
    # tools/setup_env.sh keeps an installed torch from the same bound on
    keep = re.search(r'assert \(major, minor\) >= \((\d+), (\d+)\)',
                     _read('tools/setup_env.sh'))
    assert keep and tuple(map(int, keep.groups())) == oldest[:2]


@pytest.mark.parametrize('stack', ['torch2.1', 'torch2.15'])
def test_each_compat_stack_has_a_passing_row(stack):
    pins = dict(re.findall(r'^(torch|torchvision)==([\w.+]+)$',
                           _read(f'requirements/compat-{stack}.txt'), re.M))
    want = f"{pins['torch']}, {pins['torchvision']}"
    rows = [r for r in _tested_rows() if f'`{stack}`' in r['stack']]
    assert rows, f'no passing row for {stack} in docs/install.md'
    assert all(r['torch, torchvision'] == want for r in rows), (rows, want)
