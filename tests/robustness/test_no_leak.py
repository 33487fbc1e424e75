"""No slow leak: 500 inference calls over changing input sizes (what
multi-scale testing and the inferencers do, at its harshest: a new size
every call) keep memory bounded, and pola_mm's resized-table cache holds
at most ``CACHED_GRIDS`` tables per positional table, not one per size
seen.

Measured in a fresh subprocess (peak RSS of the pytest process says
nothing): after a warm-up at the largest size, the peak RSS may still grow
a little, by PyTorch's own shape-keyed caches (oneDNN primitives, bounded
by their capacity), but no Python object may accumulate."""
import json
import subprocess
import sys
import textwrap

import pytest
from helpers import REPO, stage_grids

from pola_mm.ops.position import CACHED_GRIDS

pytestmark = pytest.mark.slow

CHILD = textwrap.dedent('''
    import gc, json, random, resource, sys
    import torch
    sys.path.insert(0, 'tests')
    from helpers import PVT_TINY, SWIN_TINY_DEPTH2, randomise_attention
    from pola_mm.models.backbones.pola_pvt import PolaPVT
    from pola_mm.models.backbones.pola_swin import PolaSwinTransformer
    from pola_mm.models.layers import PolarityAttention

    torch.set_num_threads(1)
    kind, calls, largest = sys.argv[1], int(sys.argv[2]), 96
    model = (PolaSwinTransformer(arch=SWIN_TINY_DEPTH2) if kind == 'swin'
             else PolaPVT(arch=PVT_TINY))
    model.init_weights()
    randomise_attention(model)
    model.eval()

    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    rng = random.Random(0)
    with torch.no_grad():
        for _ in range(20):
            model(torch.randn(1, 3, largest, largest))
        gc.collect()
        rss0, objects0 = peak_mb(), len(gc.get_objects())
        for _ in range(calls):
            hw = rng.randint(8, largest), rng.randint(8, largest)
            outs = model(torch.randn(1, 3, *hw))
        gc.collect()
        rss1, objects1 = peak_mb(), len(gc.get_objects())
    tables = [m.positional_encoding for m in model.modules()
              if isinstance(m, PolarityAttention)]
    tables += [p for n, p in model.named_parameters()
               if n.startswith('pos_embed')]
    cached = [getattr(t, '_pola_resized', None) for t in tables]
    print('RESULT', json.dumps(dict(
        rss_growth_mb=rss1 - rss0, object_growth=objects1 - objects0,
        tables=len(tables),
        cached_sizes=[None if c is None else [list(k) for k in c[1]]
                      for c in cached],
        cached_numel=[0 if c is None else [t.numel() for t in c[1].values()]
                      for c in cached],
        last_hw=list(hw))))
''')


@pytest.mark.parametrize('kind', ['swin', 'pvt'])
def test_500_calls_over_changing_sizes(kind):
    """500 calls, sizes drawn from 8..96 per side: peak RSS grows by less
    than 96 MB after the warm-up (measured: about 54 MB for both tiny
    backbones, the same with the fast paths off; about half of it is
    oneDNN's primitive cache, ``ONEDNN_PRIMITIVE_CACHE_CAPACITY=0`` leaves
    24 MB), Python objects do not accumulate, and every positional table
    caches at most CACHED_GRIDS resized copies, the newest for the last
    size."""
    proc = subprocess.run([sys.executable, '-c', CHILD, kind, '500'],
                          cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines()
                if x.startswith('RESULT'))
    r = json.loads(line.split(None, 1)[1])
    print(kind, r['rss_growth_mb'], 'MB', r['object_growth'], 'objects')
    assert r['rss_growth_mb'] < 96, r
    # Python objects do not accumulate beyond the bounded table cache (at
    # most CACHED_GRIDS grids a table, a tensor and its key each)
    assert r['object_growth'] < 50 + 4 * CACHED_GRIDS * r['tables'], r
    assert r['tables'] >= 4
    # a table at its own grid is used as is (no copy); otherwise it holds
    # at most CACHED_GRIDS copies, one of them resized to a stage grid of
    # the last input
    H, W = r['last_hw']
    grids = [list(g) for g in stage_grids(kind, H, W)]
    cached = [sizes for sizes in r['cached_sizes'] if sizes]
    assert cached and all(any(s in grids for s in sizes)
                          for sizes in cached), r
    assert max(len(sizes) for sizes in cached) <= CACHED_GRIDS, r
    channels = {numel // (size[0] * size[1])
                for sizes, numels in zip(r['cached_sizes'],
                                         r['cached_numel']) if sizes
                for size, numel in zip(sizes, numels)}
    assert max(channels) <= 512, r
