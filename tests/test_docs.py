"""The docs run as written, so they cannot drift from the code.

- docs/attention.md: every ```python block executes on its own, in a fresh
  namespace (a reader may copy any one block).
- README.md and docs/small_data.md: their ```python blocks are mmengine
  config fragments; each is written to a file and loaded with
  ``Config.fromfile`` (``pola_mm::`` bases resolve once pola_mm is
  imported), and where it defines
  ``model.backbone`` the backbone's type must be registered. Nothing is
  built and no weights are loaded.
- docs/analysis.md: every command of its tools (```bash blocks and inline
  spans) runs as the page writes it, with small sizes: only the options of
  ``SMALL_OPTIONS`` are replaced (sizes, output files). Synopses (with
  ``[...]`` or placeholders such as ``CONFIG``) are not run; a GPU command
  (``--device cuda``) is not run here and must be introduced by a
  ``# GPU: <time>`` comment.

The blocks are read from the pages at test time; a page with no python
block fails (the tests could not pass silently on a page that lost them).
"""
import importlib.util
import os
import os.path as osp
import re
import shlex
import sys
import textwrap
from typing import Dict, List, Tuple

import pytest
from helpers import REPO, load_tool

import pola_mm  # noqa: F401  (registers the pola_mm:: config scope)

#: pages whose python blocks are executed as a script, one namespace a page
EXECUTED_PAGES = ['docs/attention.md']
#: pages whose python blocks are mmengine config fragments
CONFIG_PAGES = ['README.md', 'docs/small_data.md']

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


#: The page whose tool commands run with small sizes.
COMMAND_PAGE = 'docs/analysis.md'
#: Per tool, the options the test gives its commands (replacing the page's
#: values, or added): small sizes, and outputs in the test's folder
#: (``{tmp}``; each such file must exist afterwards). Nothing else changes.
SMALL_OPTIONS: Dict[str, Dict[str, List[str]]] = {
    'tools/analysis/attention_maps.py': {
        '--size': ['64'], '--out': ['{tmp}/maps']},
    'tools/analysis/attention_stats.py': {
        '--size': ['64'], '--rows': ['16'], '--json': ['{tmp}/stats.json'],
        '--plot': ['{tmp}/stats.png']},
    'tools/analysis/benchmark.py': {
        '--seqlen': ['256'], '--json': ['{tmp}/seqlen.json'],
        '--plot': ['{tmp}/seqlen.png']},
}

_SHELL_BLOCK = re.compile(
    r'^[ \t]*```(?:bash|sh|shell)[ \t]*\n(.*?)^[ \t]*```[ \t]*$',
    flags=re.S | re.M)
_ANY_BLOCK = re.compile(r'^[ \t]*```.*?^[ \t]*```[ \t]*$', flags=re.S | re.M)
_INLINE_COMMAND = re.compile(r'`((?:[A-Z_]+=\S+\s+)*python\s+tools/[^`]*)`')


def shell_commands(page: str) -> List[Tuple[str, str]]:
    """The tool commands of ``page``: ``(comment, command)`` for each
    command of its ```bash blocks (continuation lines joined; ``comment``
    the ``#`` line right above it, or '') and of its inline code spans that
    run a tool (``python tools/...``, after ``VAR=value`` settings; comment
    '')."""
    with open(osp.join(REPO, page), encoding='utf-8') as f:
        text = f.read()
    found = []
    for m in _SHELL_BLOCK.finditer(text):
        comment = ''
        for line in re.sub(r'\\\n\s*', ' ', m.group(1)).splitlines():
            line = line.strip()
            if line.startswith('#'):
                comment = line
            elif line:
                found.append((comment, ' '.join(line.split())))
                comment = ''
    prose = _ANY_BLOCK.sub('', text)
    found += [('', ' '.join(m.group(1).split()))
              for m in _INLINE_COMMAND.finditer(prose)]
    return found


def _split(command: str) -> Tuple[Dict[str, str], str, List[str]]:
    """``(environment settings, script, arguments)`` of ``python SCRIPT
    ARGS...`` with leading ``VAR=value`` settings."""
    words = shlex.split(command)
    env = {}
    while '=' in words[0] and words[0].split('=')[0].isupper():
        key, value = words.pop(0).split('=', 1)
        env[key] = value
    assert words[0] == 'python', command
    return env, words[1], words[2:]


def _is_synopsis(command: str) -> bool:
    """A usage line, not a command: optional parts or placeholders."""
    return '[' in command or any(
        re.fullmatch(r'[A-Z][A-Z_.]*', w) for w in _split(command)[2])


def with_options(args: List[str], options: Dict[str, List[str]]
                 ) -> List[str]:
    """``args`` with each option of ``options`` given those values: an
    option already there loses its values, a missing one is added."""
    out = list(args)
    for opt, values in options.items():
        if opt in out:
            i = out.index(opt)
            j = i + 1
            while j < len(out) and not out[j].startswith('--'):
                j += 1
            out[i + 1:j] = values
        else:
            out += [opt, *values]
    return out


def _option_groups(args: List[str]) -> Tuple[Tuple[str, ...], ...]:
    """``args`` as its leading positionals, then each option with its
    values, the options sorted (the same command, whatever their order)."""
    starts = [i for i, a in enumerate(args) if a.startswith('--')]
    groups = [tuple(args[i:j]) for i, j in zip(starts,
                                                starts[1:] + [len(args)])]
    return (tuple(args[:starts[0] if starts else len(args)]),
            *sorted(groups))


def _small_commands() -> List[Tuple[str, str]]:
    """``(id, command)`` of the page's CPU commands whose tools have small
    options, one per distinct small command."""
    seen, out = set(), []
    for _, command in shell_commands(COMMAND_PAGE):
        if _is_synopsis(command) or '--device cuda' in command:
            continue
        env, script, args = _split(command)
        small = (tuple(sorted(env.items())), script, _option_groups(
            with_options(args, SMALL_OPTIONS.get(script, {}))))
        if small not in seen:
            seen.add(small)
            out.append((f'{osp.basename(script)}-{len(out)}', command))
    return out


def test_shell_command_extraction(tmp_path):
    page = tmp_path / 'page.md'
    page.write_text(
        'Run `A=1 python tools/x.py --n\n 3` or:\n'
        '```bash\n# CPU: 1 s\npython tools/y.py a \\\n    --size 8\n'
        '\npython tools/z.py\n```\n```\npython tools/w.py\n```\n')
    assert shell_commands(str(page)) == [
        ('# CPU: 1 s', 'python tools/y.py a --size 8'),
        ('', 'python tools/z.py'), ('', 'A=1 python tools/x.py --n 3')]
    assert with_options(['c', '--size', '224', '--rows', '8'],
                        {'--size': ['64', '32'], '--out': ['o']}) == [
        'c', '--size', '64', '32', '--rows', '8', '--out', 'o']
    assert _is_synopsis('python tools/y.py CONFIG IMAGE --size 8')
    assert not _is_synopsis('OMP_NUM_THREADS=1 python tools/y.py c.py')


def test_page_commands_are_covered():
    """Each command of the page is a synopsis, a GPU command introduced by
    its ``# GPU: <time>`` comment, or a CPU command of a tool that
    ``SMALL_OPTIONS`` makes small (so the next test runs it)."""
    commands = shell_commands(COMMAND_PAGE)
    assert commands, f'{COMMAND_PAGE} has no tool command'
    for comment, command in commands:
        if _is_synopsis(command):
            continue
        if '--device cuda' in command:
            assert comment.startswith('# GPU:') and re.search(
                r'\d', comment), (
                f'{COMMAND_PAGE}: the GPU command {command!r} needs a '
                '"# GPU: <expected time>" comment above it')
            continue
        script = _split(command)[1]
        assert script in SMALL_OPTIONS, (
            f'{COMMAND_PAGE}: {command!r} runs {script}, which has no '
            'small options in SMALL_OPTIONS: add them so that it is run')


@pytest.mark.slow
@pytest.mark.parametrize('command', [c for _, c in _small_commands()],
                         ids=[i for i, _ in _small_commands()])
def test_page_command_runs_with_small_sizes(tmp_path, monkeypatch, command):
    """The command, from the repository root, with its tool's small
    options, in this process; every output file it was given is written.
    The environment settings apply to it and to the processes it starts;
    as in the suite's subprocesses, one thread unless the page says
    otherwise (the machine's cores are shared)."""
    import torch
    env, script, args = _split(command)
    options = {opt: [v.format(tmp=tmp_path) for v in values]
               for opt, values in SMALL_OPTIONS[script].items()}
    monkeypatch.chdir(REPO)
    for key, value in dict(dict(OMP_NUM_THREADS='1'), **env).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, 'argv', [script] + with_options(args, options))
    tool = load_tool(*script.split('/')[1:])
    threads = torch.get_num_threads()
    torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))
    try:
        tool.main()
    finally:
        torch.set_num_threads(threads)
    for opt, values in options.items():
        for value in values:
            if str(tmp_path) in value:
                assert osp.exists(value), (command, opt, value)
