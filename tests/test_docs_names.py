"""Every file, folder and ``pola_mm`` name that the docs name exists.

Read from README.md and docs/*.md (docs/history.md, the record of earlier
versions, names what has since been renamed or retired: only its links are
checked):

- **paths** in code (inline spans and fenced blocks) under the
  repository's folders (``pola_mm/``, ``tools/``, ``tests/``, ...) or at its
  root (``setup.cfg``, ``Makefile``): the file or folder exists; a glob
  (``tests/ops/test_*_triton.py``) or braces (``polapp_b{0..5}_fpn.py``)
  match at least one; ``FILE::name`` names a ``def`` or ``class`` of it;
- **file names** of pola_mm's own in code (``pola`` in the name, e.g.
  ``mask_rcnn_pola_swin_t.py``): a tracked file has that name (the
  authors' and the upstream packages' files the docs cite are not
  checked);
- **links** to files of the repository (``[text](install.md#anchor)``):
  the file exists, and a heading of a markdown file gives the anchor;
- **dotted names** of pola_mm in code: ``pola_mm.x.y`` imports and has the
  attribute; a shorter name that starts with one of pola_mm's modules
  (``compat.allow_runner_checkpoints``, ``launch.device_admits``) resolves
  in one of them, unless it resolves as an installed package's name
  (``timm.create_model``).

Placeholders of the user's side (``work_dirs/...``, ``data/...``,
``checkpoints/...``, ``<stack>``, upper-case words such as ``CONFIG``,
``...``) are not checked: ``USER_PREFIXES``, ``USER_FILES``; nor the
upstream packages' paths of ``UPSTREAM_PATHS``.
"""
import fnmatch
import functools
import glob
import importlib
import itertools
import os.path as osp
import pkgutil
import re
import subprocess
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest
from helpers import REPO

#: the pages checked, relative to the root
PAGES = ['README.md'] + sorted(
    osp.relpath(p, REPO) for p in glob.glob(osp.join(REPO, 'docs', '*.md'))
    if osp.basename(p) != 'history.md')

#: the repository's top-level folders and files a path in the docs starts with
ROOTS = ('pola_mm/', 'pola_mm_startup.py', 'tools/', 'tests/', 'configs/',
         'docs/', 'requirements/', '.ci/', 'setup.cfg', 'setup.py',
         'pyproject.toml', 'Makefile', 'README.md', 'CHANGELOG.md',
         'model-index.yml', 'requirements.txt', '.pre-commit-config.yaml')
#: paths of the user's side: outputs, data, weights, environments
USER_PREFIXES = ('work_dirs/', 'data/', 'checkpoints/', 'deploy/',
                 '.venv', '.venv-compat/', 'path/to/', 'tests/data/')
#: pola_mm file names a user or a tool writes (not in the repository)
USER_FILES = {'my_pola_config.py'}
#: the upstream packages' paths the docs cite (mmdet's, timm's)
UPSTREAM_PATHS = {'tools/analysis_tools', 'tests/test_models.py'}
#: other libraries' short names the docs use, and where they live
OTHER_NAMESPACES = {'aten': 'torch.ops.aten', 'nn': 'torch.nn',
                    'F': 'torch.nn.functional', 'tl': 'triton.language'}
#: the last part of a dotted word that makes it a file name
FILE_SUFFIXES = {'py', 'sh', 'md', 'txt', 'yml', 'yaml', 'cfg', 'toml',
                 'json', 'pth', 'onnx', 'pkl', 'jpg', 'jpeg', 'png', 'log',
                 'xml', 'csv', 'npy', 'whl', 'gz', 'zip'}

_FENCE = re.compile(r'^[ \t]*```[^\n]*\n(.*?)^[ \t]*```[ \t]*$',
                    flags=re.S | re.M)
_SPAN = re.compile(r'`([^`\n]+)`')
_LINK = re.compile(r'\]\(([^)\s]+)\)')
_PATH = re.compile(
    r'(?<![\w./$-])((?:' + '|'.join(re.escape(r) for r in ROOTS) +
    r')[\w./*{},<>-]*(?:::\w+)?)')
_FILE = re.compile(r'(?<![\w./$<{},*-])([\w{},.*-]*pola[\w{},.*-]*\.'
                   r'(?:py|sh|md|txt|yml|yaml))(?![\w/])')
_DOTTED = re.compile(r'(?<![\w./-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)')


def code_texts(page: str) -> Iterator[Tuple[int, str]]:
    """``(line, text)`` of the page's fenced blocks and inline spans."""
    with open(osp.join(REPO, page), encoding='utf-8') as f:
        text = f.read()
    for m in _FENCE.finditer(text):
        yield text.count('\n', 0, m.start(1)) + 1, m.group(1)
    prose = _FENCE.sub(lambda m: '\n' * m.group(0).count('\n'), text)
    for m in _SPAN.finditer(prose):
        yield prose.count('\n', 0, m.start()) + 1, m.group(1)


def expand_braces(word: str) -> List[str]:
    """Shell brace expansion: ``a{b,c}`` and ``a{0..2}``."""
    m = re.search(r'\{([^{}]*)\}', word)
    if not m:
        return [word]
    body = m.group(1)
    r = re.fullmatch(r'(\d+)\.\.(\d+)', body)
    options = ([str(i) for i in range(int(r.group(1)), int(r.group(2)) + 1)]
               if r else body.split(','))
    return [w for o in options
            for w in expand_braces(word[:m.start()] + o + word[m.end():])]


@functools.lru_cache()
def tracked_files() -> Tuple[str, ...]:
    out = subprocess.run(['git', 'ls-files', '-z'], cwd=REPO,
                         capture_output=True, text=True)
    files = [f for f in out.stdout.split('\0') if f]
    if out.returncode != 0 or not files:  # not a git checkout
        files = [osp.relpath(p, REPO) for p in glob.glob(
            osp.join(REPO, '**', '*'), recursive=True) if osp.isfile(p)]
    return tuple(files)


def _names(path: str) -> Set[str]:
    with open(path, encoding='utf-8') as f:
        return set(re.findall(r'^\s*(?:async\s+)?(?:def|class)\s+(\w+)',
                              f.read(), flags=re.M))


def path_problem(word: str) -> Optional[str]:
    """Why the path ``word`` (relative to the root) names nothing, or
    None."""
    word = word.rstrip('.,:;')
    path, _, name = word.partition('::')
    if '...' in path or re.search(r'(^|/)[A-Z][A-Z_]*(/|\.|$)', path):
        return None  # an elided or upper-case placeholder part
    for candidate in expand_braces(path):
        matches = glob.glob(osp.join(REPO, candidate))
        if not matches:
            return f'{candidate} does not exist'
        if name and not any(osp.isfile(m) and name in _names(m)
                            for m in matches):
            return f'{candidate} has no def or class {name}'
    return None


def file_problem(word: str) -> Optional[str]:
    """Why the bare file name ``word`` names no tracked file, or None."""
    basenames = {osp.basename(f) for f in tracked_files()}
    for name in expand_braces(word):
        if name in USER_FILES or name.startswith('.'):
            continue
        if not any(fnmatch.fnmatch(b, name) for b in basenames):
            return f'no file of the repository is named {name}'
    return None


@functools.lru_cache()
def pola_mm_modules() -> Dict[str, List[str]]:
    """dotted suffix of a pola_mm module (``launch``, ``ops.launch``) ->
    the full names (``pola_mm.ops.launch``)."""
    import pola_mm
    found = {'pola_mm': ['pola_mm']}
    for info in pkgutil.walk_packages(pola_mm.__path__, 'pola_mm.',
                                      onerror=lambda name: None):
        found[info.name] = [info.name]
    table: Dict[str, List[str]] = {}
    for full in found:
        parts = full.split('.')
        for i in range(1, len(parts)):
            table.setdefault('.'.join(parts[i:]), []).append(full)
    table['pola_mm'] = ['pola_mm']
    return table


def _resolves(module: str, attrs: List[str]) -> bool:
    """``module`` (dotted; its longest importable prefix imported) has the
    attributes ``attrs`` in turn (submodules imported as needed)."""
    parts = module.split('.')
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module('.'.join(parts[:i]))
        except ImportError:
            continue
        break
    else:
        return False
    for attr in parts[i:] + list(attrs):
        if not hasattr(obj, attr) and hasattr(obj, '__path__'):
            try:
                importlib.import_module(f'{obj.__name__}.{attr}')
            except ImportError:
                return False
        if not hasattr(obj, attr):
            return False
        obj = getattr(obj, attr)
    return True


def _registered(name: str) -> bool:
    from pola_mm.registry import MODELS
    return MODELS.get(name) is not None


def dotted_problem(word: str) -> Optional[str]:
    """Why the dotted name ``word`` does not resolve, or None (also when
    it is no name of pola_mm)."""
    parts = word.split('.')
    if parts[-1] in FILE_SUFFIXES:
        return None  # a file name
    if any(re.fullmatch(r'[ijknN]', p) for p in parts):
        return None  # a pattern of state-dict keys (layers.i.blocks.j)
    if parts[0] in OTHER_NAMESPACES:
        return None if _resolves(OTHER_NAMESPACES[parts[0]], parts[1:]) \
            else f'{word} is no name of {OTHER_NAMESPACES[parts[0]]}'
    if parts[0] == 'pola_mm' and len(parts) == 2 and _registered(parts[1]):
        return None  # a registry name ('pola_mm.PolaPVT')
    table = pola_mm_modules()
    candidates = [(full, parts[i:]) for i in range(len(parts), 0, -1)
                  for full in table.get('.'.join(parts[:i]), [])]
    if not candidates:
        return None  # not pola_mm's
    if parts[0] != 'pola_mm' and _resolves(parts[0], parts[1:]):
        return None  # an installed package's name (timm.create_model)
    if any(_resolves(full, rest) for full, rest in candidates):
        return None
    return f'{word} is no module or attribute of pola_mm'


def _is_user_path(word: str) -> bool:
    return word.startswith(USER_PREFIXES) or '<' in word or \
        word.rstrip('.,:;/') in UPSTREAM_PATHS


def page_problems(page: str) -> List[str]:
    problems = []
    for line, text in code_texts(page):
        for m in _PATH.finditer(text):
            word = m.group(1)
            problem = None if _is_user_path(word) else path_problem(word)
            if problem:
                problems.append(f'{page}:{line}: {problem}')
        for m in _FILE.finditer(text):  # (names inside paths: above)
            problem = file_problem(m.group(1))
            if problem:
                problems.append(f'{page}:{line}: {problem}')
        for m in _DOTTED.finditer(text):
            if text.startswith('...', m.end(1)):
                continue  # elided: pola_mm.configs...
            problem = dotted_problem(m.group(1))
            if problem:
                problems.append(f'{page}:{line}: {problem}')
    return problems


def _anchors(md_file: str) -> Set[str]:
    """GitHub's anchors of the headings of ``md_file``."""
    with open(md_file, encoding='utf-8') as f:
        text = _FENCE.sub('', f.read())
    anchors, seen = set(), {}
    for heading in re.findall(r'^#{1,6}\s+(.*?)\s*#*\s*$', text, re.M):
        slug = re.sub(r'[^\w\- ]', '', heading.lower()).replace(' ', '-')
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f'{slug}-{n}')
    return anchors


def link_problems(page: str) -> List[str]:
    with open(osp.join(REPO, page), encoding='utf-8') as f:
        text = _FENCE.sub(lambda m: '\n' * m.group(0).count('\n'),
                          f.read())
    problems = []
    for m in _LINK.finditer(text):
        target = m.group(1)
        if re.match(r'[a-z]+:', target):
            continue  # https:, mailto:
        line = text.count('\n', 0, m.start()) + 1
        file, _, anchor = target.partition('#')
        path = osp.normpath(osp.join(REPO, osp.dirname(page), file)) \
            if file else osp.join(REPO, page)
        if not osp.exists(path):
            problems.append(f'{page}:{line}: link to {file}: no such file')
        elif anchor and path.endswith('.md') and \
                anchor not in _anchors(path):
            problems.append(f'{page}:{line}: link to {target}: no heading '
                            f'gives #{anchor}')
    return problems


@pytest.mark.parametrize('page', PAGES)
def test_every_name_a_page_gives_exists(page):
    problems = page_problems(page) + link_problems(page)
    assert not problems, '\n'.join(problems)


def test_the_history_links_exist():
    problems = link_problems(osp.join('docs', 'history.md'))
    assert not problems, '\n'.join(problems)


def test_the_check_finds_what_is_missing(tmp_path):
    """Not vacuous: a missing file, test, module attribute, config and
    anchor are each found; placeholders and other packages' names are
    not."""
    page = tmp_path / 'page.md'
    readme = osp.relpath(osp.join(REPO, 'README.md'), str(tmp_path))
    page.write_text(
        'See `tools/analysis/nothing.py`, `tests/test_lint.py::test_nope`,'
        ' `pola_mm.ops.no_such_op`, `launch.no_such_rule`,\n'
        f'`retinanet_pola_pvt_q.py` and [x]({readme}#no-such-heading).\n'
        'Fine: `tools/train.py`, `tests/test_lint.py::python_files`,\n'
        '`configs/_base_/models/pola_swin_{t,s,b}_fpn.py`,'
        ' `work_dirs/x/epoch_1.pth`, `tools/train.py CONFIG`,\n'
        '`pola_mm.ops.polarity_attention`, `launch.device_admits`,'
        f' `torch.nn.Linear`, `main.py`, [y]({readme}#citation).\n')
    found = page_problems(str(page)) + link_problems(
        osp.relpath(str(page), REPO))
    assert [p.split(': ', 1)[1] for p in found] == [
        'tools/analysis/nothing.py does not exist',
        'tests/test_lint.py has no def or class test_nope',
        'pola_mm.ops.no_such_op is no module or attribute of pola_mm',
        'launch.no_such_rule is no module or attribute of pola_mm',
        'no file of the repository is named retinanet_pola_pvt_q.py',
        f'link to {readme}#no-such-heading: no heading gives '
        '#no-such-heading'], found
    assert expand_braces('b{0..2}_{x,y}') == ['b0_x', 'b0_y', 'b1_x',
                                              'b1_y', 'b2_x', 'b2_y']
    assert list(itertools.islice(code_texts(str(page)), 1))[0][0] == 1
