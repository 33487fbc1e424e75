"""The shape of ``pola_mm/models`` a researcher reads: one
``forward`` per attention module, block and backbone, a short
``PolarityAttention``, and in the model files no TorchScript, no
``hasattr(self, ...)`` as configuration and no fast-path selection (the
ops decide)."""
import inspect
import io
import re
import tokenize
from pathlib import Path

import pytest

import pola_mm.models as models_pkg
from pola_mm.models import PolaPP, PolaPVT, PolaSwinTransformer
from pola_mm.models.backbones.base import PolaBackbone, PreNormBlock
from pola_mm.models.backbones.pola_pvt import PolaPVTBlock
from pola_mm.models.backbones.pola_swin import PolaSwinBlock
from pola_mm.models.layers import (Mlp, PaCSAttention, PolaPPBlock,
                                   PolarityAttention, RotarySelfAttention,
                                   SpatialReductionAttention, WindowMSA)

MODELS_DIR = Path(models_pkg.__file__).parent
SOURCES = sorted(MODELS_DIR.rglob('*.py'))

ATTENTIONS = [PolarityAttention, PaCSAttention, WindowMSA,
              RotarySelfAttention, SpatialReductionAttention]
BLOCKS = [PreNormBlock, PolaSwinBlock, PolaPVTBlock, PolaPPBlock, Mlp]
BACKBONES = [PolaSwinTransformer, PolaPVT, PolaPP]


def _forwards(cls: type) -> list:
    """Methods of ``cls`` and its pola_mm bases whose name starts with
    ``forward``."""
    names = set()
    for klass in cls.__mro__:
        if klass.__module__.startswith('pola_mm.'):
            names |= {n for n, v in vars(klass).items()
                      if n.startswith('forward') and callable(v)}
    return sorted(names)


@pytest.mark.parametrize('cls', ATTENTIONS + BLOCKS,
                         ids=lambda c: c.__name__)
def test_attention_modules_and_blocks_have_one_forward(cls):
    assert _forwards(cls) == ['forward']


@pytest.mark.parametrize('cls', BACKBONES, ids=lambda c: c.__name__)
def test_backbones_share_one_forward(cls):
    """The stage loop is ``PolaBackbone.forward``; the families implement
    the stage contract (``stem``, ``stage``, ``out_norm``) only."""
    assert _forwards(cls) == ['forward']
    assert cls.forward is PolaBackbone.forward


def test_polarity_attention_is_short():
    """About a screen of code a researcher reads: at most ~200 lines with
    its docstring, and ``forward`` the one method besides the
    constructor, ``extra_repr`` and the init of its own parameters."""
    lines = inspect.getsource(PolarityAttention).splitlines()
    assert len(lines) <= 200, len(lines)
    methods = {n for n, v in vars(PolarityAttention).items()
               if inspect.isfunction(v)}
    assert methods == {'__init__', 'extra_repr', 'forward',
                       'reset_own_parameters'}, methods


def _code(path: Path) -> str:
    """The source of ``path`` without comments and string literals
    (docstrings may name what the code no longer does)."""
    out = []
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    for tok in tokens:
        if tok.type not in (tokenize.COMMENT, tokenize.STRING):
            out.append(tok.string)
    return ' '.join(out)


#: pattern -> what it stands for (none may appear in the model files)
FORBIDDEN = {
    r'\btorch \. jit\b|\bjit \.': 'TorchScript',
    r'\bhasattr \( self\b': 'hasattr(self, ...) as configuration',
    r'\bselect(_path)? \(': 'a fast-path selection call',
    r'\bPath\b': 'a fast-path Path',
    r'\bdispatch\b': 'the dispatch module',
}


@pytest.mark.parametrize('pattern', sorted(FORBIDDEN))
def test_models_hold_no_graph_or_path_machinery(pattern):
    assert SOURCES, MODELS_DIR
    hits = [str(p.relative_to(MODELS_DIR)) for p in SOURCES
            if re.search(pattern, _code(p))]
    assert hits == [], f'{FORBIDDEN[pattern]} in {hits}'


def test_the_checks_see_what_they_look_for(tmp_path):
    """Each pattern finds its construct in code (not in a comment or a
    docstring)."""
    snippets = {
        r'\btorch \. jit\b|\bjit \.':
            'if torch.jit.is_scripting():\n    pass\n',
        r'\bhasattr \( self\b': 'x = hasattr(self, "sr")\n',
        r'\bselect(_path)? \(': 'path = dispatch.select(x, self)\n',
        r'\bPath\b': 'p: Path = PLAIN\n',
        r'\bdispatch\b': 'from ...ops import dispatch\n',
    }
    for pattern, code in snippets.items():
        path = tmp_path / 'snippet.py'
        path.write_text('"""select(x) torch.jit hasattr(self"""\n# Path\n'
                        + code)
        assert re.search(pattern, _code(path)), pattern
        path.write_text('"""select(x) torch.jit hasattr(self dispatch"""\n'
                        '# Path dispatch\n')
        assert not re.search(pattern, _code(path)), pattern
