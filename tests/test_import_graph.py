"""The package's import graph: every module imports, no two modules import
each other through any chain (imports inside functions included: a circle
of lazy imports is still a circle; imports of a package, the root
``pola_mm`` included, count), and the layers only look down (``models/``
and ``ops/`` import nothing from ``analysis/`` or ``deployment/``;
``ops/`` nothing from ``models/``; no module imports a package that holds
it: ``import pola_mm`` has run before any of its modules does)."""
import ast
import importlib
import os
import os.path as osp
from typing import Dict, List, Set

import pytest
from helpers import REPO

PACKAGE = 'pola_mm'
ROOT = osp.join(REPO, PACKAGE)

#: (importer prefix, imported prefixes it must not reach directly).
FORBIDDEN = [
    ('pola_mm.models', ('pola_mm.analysis', 'pola_mm.deployment',
                        'pola_mm.cli')),
    ('pola_mm.ops', ('pola_mm.analysis', 'pola_mm.deployment',
                     'pola_mm.cli', 'pola_mm.models')),
]


def _modules() -> Dict[str, str]:
    """Module name -> file, for every ``.py`` of the package."""
    out = {}
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if not d.startswith(('.', '_')))
        for f in sorted(files):
            if not f.endswith('.py'):
                continue
            rel = osp.relpath(osp.join(folder, f), REPO)[:-3]
            parts = rel.split(os.sep)
            if parts[-1] == '__init__':
                parts = parts[:-1]
            out['.'.join(parts)] = osp.join(folder, f)
    return out


def _from_module(node: ast.ImportFrom, here: List[str]) -> str:
    """The absolute name of the module of ``from ... import``, for a
    module whose package is ``here`` (its name's parts)."""
    if not node.level:
        return node.module or ''
    base = here[:len(here) - node.level + 1]
    return '.'.join(base + ([node.module] if node.module else []))


def _imports(name: str, path: str, known: Set[str]) -> Set[str]:
    """The package's modules that ``name`` imports anywhere in its file
    (``from a import b`` names module ``a.b`` where that is a module),
    with the packages whose ``__init__`` such an import runs."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
    is_pkg = path.endswith('__init__.py')
    here = name.split('.') if is_pkg else name.split('.')[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = _from_module(node, here)
            targets = [f'{mod}.{a.name}' if f'{mod}.{a.name}' in known
                       else mod for a in node.names]
        else:
            continue
        for t in targets:
            # the longest known module the name starts with, and the
            # packages above it that the import runs first; a package that
            # holds ``name`` is already running when ``name`` runs, so it
            # counts only where it is the module imported itself (``import
            # pola_mm`` or ``from .. import obj`` below the root): that
            # import runs back up into its own package
            parts = t.split('.')
            while parts and '.'.join(parts) not in known:
                parts.pop()
            for i in range(1, len(parts) + 1):
                mod = '.'.join(parts[:i])
                if mod not in known or mod == name:
                    continue
                if i == len(parts) or not name.startswith(mod + '.'):
                    found.add(mod)
    return found


def _graph() -> Dict[str, Set[str]]:
    mods = _modules()
    known = set(mods)
    return {m: _imports(m, p, known) for m, p in mods.items()}


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_graph_reader_sees_relative_and_lazy_imports():
    graph = _graph()
    assert 'pola_mm.models' in graph['pola_mm']
    assert 'pola_mm.registry' in graph['pola_mm.models.from_config']


def _graph_of(files: Dict[str, str], tmp_path) -> Dict[str, Set[str]]:
    """The graph of a made-up package ``pola_mm`` of ``files``
    (module name -> source)."""
    mods = {}
    for name, text in files.items():
        parts = name.split('.')
        is_pkg = any(m.startswith(name + '.') for m in files)
        rel = osp.join(*parts, '__init__.py') if is_pkg else \
            osp.join(*parts[:-1], parts[-1] + '.py')
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        mods[name] = str(path)
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def test_graph_reader_sees_package_root_imports(tmp_path):
    """An import of the package root (or of any package holding the
    importer) from below is an edge: the circle ``pola_mm ->
    pola_mm.deployment.verify -> pola_mm`` (what ``mmdeploy_verify`` had)
    is found, while the packages an import passes through on its way down
    are not."""
    graph = _graph_of({
        'pola_mm': 'from .deployment import verify\n',
        'pola_mm.deployment': 'from .verify import f\n',
        'pola_mm.deployment.verify': 'def f():\n    import pola_mm\n',
        'pola_mm.deployment.other': 'from .. import deployment\n'
                                    'from ..deployment.verify import f\n'
                                    'from .. import __version__\n',
    }, tmp_path)
    assert graph['pola_mm.deployment.verify'] == {'pola_mm'}
    assert graph['pola_mm.deployment.other'] == {
        'pola_mm', 'pola_mm.deployment', 'pola_mm.deployment.verify'}
    assert _cycles(graph) == [['pola_mm', 'pola_mm.deployment',
                               'pola_mm.deployment.verify']]
    assert _imports_up(graph) == [
        'pola_mm.deployment.other imports pola_mm',
        'pola_mm.deployment.other imports pola_mm.deployment',
        'pola_mm.deployment.verify imports pola_mm']


def _imports_up(graph: Dict[str, Set[str]]) -> List[str]:
    """Imports of a package that holds the importer."""
    return [f'{m} imports {t}' for m, targets in sorted(graph.items())
            for t in sorted(targets) if m.startswith(t + '.')]


def test_no_import_circle():
    cycles = _cycles(_graph())
    assert not cycles, 'modules that import each other: ' + '; '.join(
        ' <-> '.join(c) for c in cycles)


def test_layers_only_look_down():
    graph = _graph()
    bad = [f'{m} imports {t}' for m, targets in graph.items()
           for low, high in FORBIDDEN if m == low or m.startswith(low + '.')
           for t in sorted(targets) if t.startswith(high)]
    bad += _imports_up(graph)
    assert not bad, bad


@pytest.mark.parametrize('name', sorted(_modules()))
def test_every_module_imports(name):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as err:  # an optional third-party package
        if err.name and not err.name.startswith(PACKAGE):
            pytest.skip(f'{name} needs {err.name}')
        raise


LIGHT_IMPORT = """
import json, sys
{setup}
import pola_mm
print(json.dumps(sorted(m for m in sys.modules
                        if m.startswith(('pola_mm.deployment',
                                         'pola_mm.analysis')))))
"""


@pytest.mark.parametrize('mmdeploy', ['installed', 'hidden'])
def test_import_pola_mm_loads_no_export_or_analysis_code(mmdeploy):
    """``import pola_mm`` registers the models and applies the needed fixes
    without loading the export, verification or analysis code: nothing of
    pola_mm.analysis, and of pola_mm.deployment only the MMDeploy fixes'
    module, where MMDeploy is installed (its fixes wait for its import)."""
    import importlib.util
    import json
    import subprocess
    import sys
    setup = ("sys.modules['mmdeploy'] = None" if mmdeploy == 'hidden'
             else '')
    proc = subprocess.run(
        [sys.executable, '-c', LIGHT_IMPORT.format(setup=setup)],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    if mmdeploy == 'installed' and importlib.util.find_spec('mmdeploy'):
        assert loaded == ['pola_mm.deployment',
                          'pola_mm.deployment.mmdeploy_fixes']
    else:
        assert loaded == []


def test_ops_and_layers_share_no_file_name():
    """ops name the operation, layers the module: a file name in both
    folders (``ops/polarity_attention.py`` beside a layer of that name)
    makes a reader guess which one holds the arithmetic."""
    def names(folder):
        return {f for f in os.listdir(osp.join(ROOT, *folder.split('/')))
                if f.endswith('.py') and f != '__init__.py'}
    assert not names('ops') & names('models/layers')


def _private_uses(name: str, path: str, known: Set[str]) -> List[str]:
    """Where module ``name`` (file ``path``) takes a private name
    (``_x``, not ``__x__``) of another module of the package: ``from m
    import _x``, or ``m._x`` on a name bound to a package module by an
    import."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
    is_pkg = path.endswith('__init__.py')
    here = name.split('.') if is_pkg else name.split('.')[:-1]

    def private(n: str) -> bool:
        return n.startswith('_') and not n.startswith('__')

    out, bound = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = _from_module(node, here)
            if mod not in known:
                continue
            for a in node.names:
                if f'{mod}.{a.name}' in known:  # a module, bound by name
                    bound[a.asname or a.name] = f'{mod}.{a.name}'
                elif private(a.name) and mod != name:
                    out.append(f'{name}:{node.lineno} imports {mod}.{a.name}')
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known and a.asname:
                    bound[a.asname] = a.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and private(node.attr)
                and isinstance(node.value, ast.Name)
                and bound.get(node.value.id, name) != name):
            out.append(f'{name}:{node.lineno} uses '
                       f'{bound[node.value.id]}.{node.attr}')
    return out


def test_private_name_reader_finds_both_forms(tmp_path):
    pkg = tmp_path / 'pkg'
    pkg.mkdir()
    (pkg / '__init__.py').write_text('')
    (pkg / 'a.py').write_text('_x = 1\ndef _y(): pass\n')
    (pkg / 'b.py').write_text('from .a import _x\nfrom . import a\n'
                              'def f():\n    return a._y()\n')
    known = {'pkg', 'pkg.a', 'pkg.b'}
    assert _private_uses('pkg.b', str(pkg / 'b.py'), known) == [
        'pkg.b:1 imports pkg.a._x', 'pkg.b:4 uses pkg.a._y']
    assert _private_uses('pkg.a', str(pkg / 'a.py'), known) == []


def test_no_module_takes_a_private_name_of_another():
    """What one module keeps private (``_x``) no other module reaches
    into: a name two modules share is public, named and documented
    where it lives."""
    mods = _modules()
    known = set(mods)
    bad = [use for m, p in sorted(mods.items())
           for use in _private_uses(m, p, known)]
    assert not bad, bad
