"""docs/attention.md: its example runs as written (extracted from the page,
so the page and the test cannot drift), and its cost formula is what
torch's FLOP counter counts."""
import contextlib
import io
import os.path as osp
import re

import torch
from helpers import REPO
from torch.utils.flop_counter import FlopCounterMode

from pola_mm.models.layers import PolarityAttention
from pola_mm.ops import use_implementation

PAGE = osp.join(REPO, 'docs', 'attention.md')


def _example() -> str:
    with open(PAGE) as f:
        blocks = re.findall(r'```python\n(.*?)```', f.read(), flags=re.S)
    assert blocks, f'no python example in {PAGE}'
    return blocks[0]


def test_example_runs_as_documented():
    code = _example()
    assert len(code.strip().splitlines()) <= 10
    scope: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, PAGE, 'exec'), scope)
    attn, y, z = scope['attn'], scope['y'], scope['z']
    assert isinstance(attn, PolarityAttention)
    assert y.shape == (8, 196, 64) and z.shape == (2, 600, 64)
    assert bool(torch.isfinite(y).all()) and bool(torch.isfinite(z).all())
    # backward reached every parameter the output depends on
    assert all(p.grad is not None for p in attn.parameters())
    assert 'torch.Size([8, 196, 64]) torch.Size([2, 600, 64])' in \
        out.getvalue()


def test_cost_formula_matches_flop_counter():
    """The page's formula: 2 * (5 N C^2 + 4 N C d + 4 N C + k^2 N C); the
    plain reference computes the normalisers as matrix products, 2 N C
    multiply-adds more than the formula's 4 N C, which torch's counter
    sees too."""
    B, H, W, C, h, k = 1, 14, 14, 64, 2, 5
    N, d = H * W, C // h
    attn = PolarityAttention(C, h, (H, W), kernel_size=k)
    with use_implementation('graph'), torch.no_grad(), \
            FlopCounterMode(display=False) as counter:
        attn(torch.randn(B, N, C), (H, W))
    formula = 2 * (5 * N * C * C + 4 * N * C * d + 4 * N * C + k * k * N * C)
    assert formula == 11966976
    assert counter.get_total_flops() == formula + 2 * (2 * N * C)
