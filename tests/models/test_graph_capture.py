"""The supported graph paths: ``torch.export.export`` and
``torch.compile(fullgraph=True)`` of every family equal eager, at a
non-square size that is not a multiple of 32 (padded patches, resized
tables, shifted and padded softmax windows). While a graph is captured the
ops run their plain references (``pola_mm.ops.dispatch.use_fast``).

``torch.compile`` with its default backend (Inductor) compiles C++ on the
CPU, a few seconds per kernel: one small model per family, with the
stages that hold each kind of block."""
import pytest
import torch
from helpers import (POLAPP_TINY, PVT_TINY, SWIN_TINY_DEPTH1, SWIN_TINY_DEPTH2,
                     randomise)

from pola_mm.models import PolaPP, PolaPVT, PolaSwinTransformer

pytestmark = [pytest.mark.slow, pytest.mark.export]

#: name -> (class, constructor arguments). Swin with softmax windows of 3:
#: its 'S' stages shift and pad at this size.
EXPORTED = {
    'swin': (PolaSwinTransformer,
             dict(arch=SWIN_TINY_DEPTH2, softmax_window_size=3)),
    'swin_pacs': (PolaSwinTransformer,
                  dict(arch=SWIN_TINY_DEPTH1, feature_map='pacs')),
    'pvt': (PolaPVT, dict(arch=PVT_TINY, attn_layout='LLLS')),
    'pvt_la_sr': (PolaPVT, dict(arch=PVT_TINY, la_sr_ratios='8421')),
    'pvt_pacs': (PolaPVT, dict(arch=PVT_TINY, feature_map='pacs')),
    'polapp': (PolaPP, dict(arch=POLAPP_TINY)),
}
#: one small model per family: Swin's polarity stage and a shifted, padded
#: softmax stage; PVT's polarity stage and a spatial-reduction stage;
#: PolaPP's PaCS stage, its downsampling and a rotary softmax stage.
COMPILED = {
    'swin': (PolaSwinTransformer,
             dict(arch=dict(embed_dims=16, depths=(1, 2), num_heads=(1, 2)),
                  attn_layout='LS', softmax_window_size=3,
                  out_indices=(0, 1))),
    'pvt': (PolaPVT, dict(arch=PVT_TINY, attn_layout='LSLL',
                          out_indices=(0, 1))),
    'polapp': (PolaPP, dict(arch=dict(embed_dims=(16, 32), depths=(1, 1),
                                      num_heads=(2, 2), attn_layout='LS'),
                            out_indices=(0, 1))),
}
SIZE = (72, 100)  # non-square, not a multiple of 32


def _model(cls: type, kwargs: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    model = cls(drop_path_rate=0., **kwargs)
    randomise(model, std=0.3)
    return model.eval()


def _inputs(n: int = 2):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 3, *SIZE, generator=g) for _ in range(n)]


def _assert_equal_to_eager(got, want) -> None:
    """Within float32 rounding of the eager (fast path) maps."""
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-4,
                                   atol=1e-5 * float(b.abs().max()))


@pytest.mark.parametrize('name', sorted(EXPORTED))
def test_torch_export_equals_eager(name):
    """The exported program reproduces eager on the input it was exported
    with and on another of the same shape (nothing of the first is baked
    in)."""
    model = _model(*EXPORTED[name])
    xs = _inputs()
    with torch.no_grad():
        want = [model(x) for x in xs]
    program = torch.export.export(model, (xs[0], ))
    exported = program.module()
    with torch.no_grad():
        for x, w in zip(xs, want):
            _assert_equal_to_eager(exported(x), w)


@pytest.mark.parametrize('name', sorted(COMPILED))
def test_torch_compile_fullgraph_equals_eager(name):
    """``torch.compile(fullgraph=True)``: one graph (a graph break raises)
    that reproduces eager."""
    model = _model(*COMPILED[name])
    (x, ) = _inputs(1)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, fullgraph=True)
        with torch.no_grad():
            want = model(x)
            got = compiled(x)
    finally:
        torch._dynamo.reset()
    _assert_equal_to_eager(got, want)
