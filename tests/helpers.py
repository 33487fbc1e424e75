"""Helpers shared by the tests: the repository root, tiny architectures,
the reference minis, a free port, randomisers and call counters (import as
``helpers``; the ``reference_dir`` fixture lives in conftest.py)."""
import os.path as osp
import socket
from pathlib import Path
from typing import Any, List

import torch

#: The repository root (a string, and as a Path).
REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
REPO_PATH = Path(REPO)

#: Tiny archs (fast on a CPU). ``..._DEPTH2`` has two blocks a stage, so
#: every stage has a shifted softmax block; ``..._DEPTH1`` one block a stage
#: (end-to-end runs).
SWIN_TINY_DEPTH2 = dict(embed_dims=16, depths=(2, 2, 2, 2),
                        num_heads=(1, 1, 2, 2))
SWIN_TINY_DEPTH1 = dict(embed_dims=16, depths=(1, 1, 1, 1),
                        num_heads=(1, 1, 2, 2))
PVT_TINY = dict(embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1),
                num_heads=(1, 1, 2, 2), mlp_ratios=(2, 2, 2, 2))

#: The archs of the authors' reference minis (``official_pola_*_mini.pth``).
SWIN_MINI = dict(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))
PVT_MINI = dict(embed_dims=(32, 64, 160, 256), depths=(1, 1, 1, 1),
                num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4))


def reference_file(root: str, name: str, io: bool = False) -> dict:
    """``official_pola_{name}_mini.pth`` (``..._io.pth`` with ``io``) of the
    reference folder ``root``, loaded weights-only on the CPU."""
    suffix = '_io' if io else ''
    path = osp.join(root, f'official_pola_{name}_mini{suffix}.pth')
    return torch.load(path, map_location='cpu', weights_only=True)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def randomise(module: torch.nn.Module, seed: int = 0,
              std: float = 0.5) -> None:
    """Every parameter of ``module`` set to ``N(0, std^2)`` values (the
    polarity tables, powers and scales start at zero, which hides bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)


def randomise_attention(model: torch.nn.Module, seed: int = 1) -> None:
    """Non-zero positional tables, powers (or PaCS temperatures), scales
    and conv kernels of every polarity attention in ``model`` (the rest keeps
    its init)."""
    from pola_mm.models.layers import PolarityAttention
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, PolarityAttention):
                sharpness = ((m.power, ) if hasattr(m, 'power') else
                             (m.s1, m.s2))
                for t in (m.positional_encoding, *sharpness, m.scale,
                          m.dwc.weight):
                    t.copy_(torch.randn(t.shape, generator=g) * 0.5)


def count_calls(monkeypatch, obj: Any, name: str) -> List[int]:
    """Wrap ``obj.name`` so that each call appends to the returned list."""
    calls: List[int] = []
    original = getattr(obj, name)

    def wrapped(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, name, wrapped)
    return calls
