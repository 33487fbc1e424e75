"""The docs run as written, so they cannot drift from the code.

- docs/attention.md: every ```python block executes on its own, in a fresh
  namespace (a reader may copy any one block).
- README.md: its ```python blocks are mmengine config fragments; each is
  written to a file and loaded with ``Config.fromfile`` (``pola_mm::`` bases
  resolve once pola_mm is imported), and where it defines
  ``model.backbone`` the backbone's type must be registered. Nothing is
  built and no weights are loaded.

The blocks are read from the pages at test time; a page with no python
block fails (the tests could not pass silently on a page that lost them).
"""
import importlib.util
import os
import os.path as osp
import re
import textwrap
from typing import List, Tuple

import pytest
from helpers import REPO

import pola_mm  # noqa: F401  (registers the pola_mm:: config scope)

#: pages whose python blocks are executed as a script, one namespace a page
EXECUTED_PAGES = ['docs/attention.md']
#: pages whose python blocks are mmengine config fragments
CONFIG_PAGES = ['README.md']

_BLOCK = re.compile(r'^([ \t]*)```python[ \t]*\n(.*?)^[ \t]*```[ \t]*$',
                    flags=re.S | re.M)


def python_blocks(page: str) -> List[Tuple[int, str]]:
    """The ```python blocks of ``page`` (relative to the repository root,
    or absolute):
    ``(line of the block's first code line, code)``, in page order."""
    with open(osp.join(REPO, page), encoding='utf-8') as f:
        text = f.read()
    return [(text.count('\n', 0, m.start(2)) + 1,
             textwrap.dedent(m.group(2))) for m in _BLOCK.finditer(text)]


def _config_blocks() -> List[Tuple[str, int, str]]:
    return [(page, line, code) for page in CONFIG_PAGES
            for line, code in python_blocks(page)]


def test_block_extraction(tmp_path):
    """The extractor finds fenced python blocks (also indented ones, in
    lists) and nothing else, with the line of their first code line."""
    page = tmp_path / 'page.md'
    page.write_text('intro\n```python\na = 1\n```\n```bash\nb = 2\n```\n'
                    '- item\n\n  ```python\n  c = a + 1\n  ```\n')
    assert python_blocks(str(page)) == [(3, 'a = 1\n'), (11, 'c = a + 1\n')]


@pytest.mark.parametrize('page', EXECUTED_PAGES + CONFIG_PAGES)
def test_page_has_python_blocks(page):
    assert python_blocks(page), (
        f'{page} has no ```python block: nothing of it would be tested')


@pytest.mark.parametrize('page', EXECUTED_PAGES)
def test_page_blocks_execute_alone(page):
    """Each block runs on its own, in a fresh namespace (a reader copies
    one block); an exception in any block fails the test (its traceback
    names the page and the line of the page)."""
    blocks = python_blocks(page)
    assert blocks
    for line, code in blocks:
        # pad so that traceback line numbers are the page's
        exec(compile('\n' * (line - 1) + code, osp.join(REPO, page), 'exec'),
             {'__name__': '__main__'})


def _missing_scopes(code: str) -> List[str]:
    """The OpenMMLab packages that ``code``'s ``<scope>::`` bases name and
    that are not installed (pola_mm's own scope is always there)."""
    scopes = set(re.findall(r'[\'"](\w+)::', code)) - {'pola_mm'}
    return sorted(s for s in scopes if importlib.util.find_spec(s) is None)


@pytest.mark.parametrize('page,line,code', _config_blocks(),
                         ids=[f'{p}:{n}' for p, n, _ in _config_blocks()])
def test_readme_config_blocks_load(tmp_path, page, line, code):
    """The block is a config mmengine reads (its bases resolved and merged);
    a ``model.backbone`` it defines has a registered type."""
    from mmengine.config import Config

    from pola_mm.registry import MODELS
    missing = _missing_scopes(code)
    if missing:
        msg = (f'{page}:{line} uses bases of {missing}, not installed here')
        if os.environ.get('CI'):
            pytest.fail(msg)
        pytest.skip(msg)
    if "'./my_config.py'" in code:  # on top of Get started's config
        first = next(c for _, _, c in _config_blocks()
                     if "'pola_mm::_base_/models/" in c)
        (tmp_path / 'my_config.py').write_text(first, encoding='utf-8')
    path = tmp_path / f'readme_block_{line}.py'
    path.write_text(code, encoding='utf-8')
    cfg = Config.fromfile(str(path))  # raises on any error of the block
    model = cfg.get('model')
    backbone = model.get('backbone') if hasattr(model, 'get') else None
    if backbone is not None and 'type' in backbone:
        kind = backbone['type']
        assert isinstance(kind, str) and MODELS.get(kind) is not None, (
            f'{page}:{line}: backbone type {kind!r} is not registered')


def test_attention_page_error_message_is_the_code_s():
    """The op's error message quoted in docs/attention.md is the one the
    code raises for the shapes it quotes."""
    import torch

    from pola_mm.ops import polarity_attention
    with open(osp.join(REPO, 'docs', 'attention.md'), encoding='utf-8') as f:
        page = ' '.join(f.read().split())
    with pytest.raises(ValueError) as info:
        polarity_attention(torch.randn(2, 4, 300, 16),
                           torch.randn(2, 4, 75, 16),
                           torch.randn(2, 4, 74, 16),
                           torch.zeros(1, 4, 1, 16),
                           torch.zeros(1, 4, 1, 16), 4.)
    assert f'`{info.value}`' in page
