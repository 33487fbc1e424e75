"""Helpers shared by the tests: the repository root, tiny architectures,
the reference minis, a free port, the environment of a subprocess, the
tools as modules, randomisers and call counters, the upstream tools' runs
(import as ``helpers``; the ``reference_dir`` fixture lives in
conftest.py)."""
import os
import os.path as osp
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List

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
#: PolaPP: two PaCS blocks in stage 1, layer scale in the softmax stages.
POLAPP_TINY = dict(embed_dims=(16, 32, 32, 64), depths=(2, 1, 1, 1),
                   num_heads=(2, 2, 2, 4),
                   layer_scale_init=(None, None, 1., 1.))

#: The archs of the authors' reference minis (``official_pola_*_mini.pth``).
SWIN_MINI = dict(embed_dims=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))
PVT_MINI = dict(embed_dims=(32, 64, 160, 256), depths=(1, 1, 1, 1),
                num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4))


def reference_root(required_file: str) -> str:
    """The authors' reference folder (``../shared/reference`` or
    ``$POLA_MM_REFERENCE``) if it holds ``required_file``.

    Outside CI a missing folder skips the test with the reason; under CI
    (``CI`` set, where the folder is always laid beside the clone) it fails,
    so the equivalence tests can never be silently skipped there.
    """
    import pytest
    root = os.environ.get('POLA_MM_REFERENCE') or osp.join(
        REPO, '..', 'shared', 'reference')
    path = osp.join(root, required_file)
    if not osp.isfile(path):
        msg = (f'reference file {path} not found (set POLA_MM_REFERENCE to '
               'the folder holding the authors\' reference files)')
        if os.environ.get('CI'):
            pytest.fail(msg)
        pytest.skip(msg)
    return root


def reference_file(root: str, name: str, io: bool = False) -> dict:
    """``official_pola_{name}_mini.pth`` (``..._io.pth`` with ``io``) of the
    reference folder ``root``, loaded weights-only on the CPU."""
    suffix = '_io' if io else ''
    path = osp.join(root, f'official_pola_{name}_mini{suffix}.pth')
    return torch.load(path, map_location='cpu', weights_only=True)


def subprocess_env(launcher: bool = False, **overrides: str) -> Dict[str, str]:
    """The environment of a tool or script the tests run as a subprocess.

    This process's environment with ``tests/`` and the repository first on
    ``PYTHONPATH`` (the child imports pola_mm from this checkout, and the
    tests' modules such as ``compat_tiny`` and ``fault_injection``) and one
    OpenMP thread (the machine's cores are shared by the processes of a
    run). With ``launcher``, also what ``tools/dist_train.sh`` and
    ``tools/dist_test.sh`` read: ``PYTHON`` (this interpreter) and a free
    ``PORT``; a ``LOCAL_RANK`` inherited from an outer launcher is dropped.

    Args:
        launcher: set the launch scripts' variables.
        **overrides: variables set last.

    Returns:
        A new environment dict for ``subprocess``.
    """
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(
        p for p in (osp.join(REPO, 'tests'), REPO, env.get('PYTHONPATH'))
        if p)
    env['OMP_NUM_THREADS'] = '1'
    if launcher:
        env.update(PYTHON=sys.executable, PORT=str(free_port()))
        env.pop('LOCAL_RANK', None)
    env.update(overrides)
    return env


def copy_source_tree(dst: Path) -> Path:
    """This checkout's files (tracked and new, not ignored) without tests/
    and docs/, copied to ``dst`` (links kept as links), so that building a
    wheel or an sdist from ``dst`` writes nothing into the checkout."""
    files = subprocess.run(
        ['git', 'ls-files', '-z', '--cached', '--others',
         '--exclude-standard'],
        cwd=REPO, capture_output=True, text=True, check=True).stdout
    for rel in filter(None, files.split('\0')):
        if rel.startswith(('tests/', 'docs/')) or not osp.lexists(
                osp.join(REPO, rel)):
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(osp.join(REPO, rel), dst / rel, follow_symlinks=False)
    return dst


def load_tool(*path: str) -> ModuleType:
    """The module of a command-line tool, ``tools/<path>``, loaded in this
    process (its ``main`` is not run), e.g.
    ``load_tool('analysis', 'benchmark.py')``."""
    import importlib.util
    file = osp.join(REPO, 'tools', *path)
    name = '_tool_' + '_'.join(path).replace('.py', '').replace('-', '_')
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def saved_storages(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` and what autograd saved for its backward: a list of
    ``(untyped_storage()._cdata, dtype)`` per saved tensor."""
    saved = []

    def pack(t):
        saved.append((t.untyped_storage()._cdata, t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, saved


def count_calls(monkeypatch, obj: Any, name: str) -> List[int]:
    """Wrap ``obj.name`` so that each call appends to the returned list."""
    calls: List[int] = []
    original = getattr(obj, name)

    def wrapped(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, name, wrapped)
    return calls


def spy_fast_code(monkeypatch) -> Dict[str, List[int]]:
    """Count calls into every fast implementation of :mod:`pola_mm.ops`
    (where the ops look them up), by name: the polarity and PaCS kernels
    (with and without autograd), the lean training functions (gate, GELU,
    depth-wise conv), PyTorch's SDPA, the fused CPU loops, the cached
    table resize and the separable one. None of them may run with the fast
    paths off or while a graph is captured."""
    import importlib

    import torch.nn.functional as F

    from pola_mm.ops.gate_linear import GateLinearFunction
    from pola_mm.ops.gelu_linear import GeluLinearFunction

    (depthwise_conv, gelu_linear, pacs_op, pacs_cpu, polarity_op,
     polarity_cpu, position) = (
        importlib.import_module(f'pola_mm.ops.{name}') for name in (
            'depthwise_conv', 'gelu_linear', 'pacs.op', 'pacs.cpu',
            'polarity.op', 'polarity.cpu', 'position'))
    spies = {
        'polarity_cpu': [(polarity_op, 'polarity_attention_cpu')],
        'PolarityAttentionFunction': [
            (polarity_cpu.PolarityAttentionFunction, 'apply')],
        'polarity_triton': [(polarity_op.kernels,
                             'polarity_attention_triton')],
        'pacs_cpu': [(pacs_cpu, 'pacs_attention_cpu')],
        'pacs_triton': [(pacs_op.kernels, 'pacs_attention_triton')],
        'PaCSAttentionFunction': [(pacs_cpu.PaCSAttentionFunction,
                                   'apply')],
        'GateLinearFunction': [(GateLinearFunction, 'apply')],
        'GeluLinearFunction': [(GeluLinearFunction, 'apply')],
        'gelu_mlp_runs': [(gelu_linear, '_gelu_mlp_runs')],
        'DepthwiseConv2d': [(depthwise_conv._DepthwiseConv2d, 'apply')],
        'sdpa': [(F, 'scaled_dot_product_attention')],
        'cached_resize': [(position, '_cached_resize')],
        'separable_resize': [(position, '_separable_resize')],
    }
    calls: Dict[str, List[int]] = {}
    for key, places in spies.items():
        calls[key] = []
        for obj, name in places:
            original = getattr(obj, name)

            def wrapped(*args, _orig=original, _key=key, **kwargs):
                calls[_key].append(1)
                return _orig(*args, **kwargs)

            monkeypatch.setattr(obj, name, wrapped)
    return calls


def ran(calls: Dict[str, List[int]]) -> set:
    """The names in ``calls`` (:func:`spy_fast_code`) that were called."""
    return {k for k, v in calls.items() if v}


def reset(calls: Dict[str, List[int]]) -> None:
    """Clear the counts of :func:`spy_fast_code`."""
    for v in calls.values():
        v.clear()


#: Leaves of the learned tables, sharpness and scale parameters, seeded
#: with a wide spread so that every one of them shows in the outputs.
_WIDE = ('power', 'scale', 's1', 's2', 'positional_encoding',
         'relative_position_bias_table')


def seeded_state_dict(layout, seed: int) -> dict:
    """Deterministic, non-trivial weights for a parameter layout.

    Used for the variant references of ``tests/reference_variants``: the
    authors' classes and pola_mm's models get the same weights from the
    committed ``(name, shape)`` layout, so no weight file is stored. Every
    entry draws from one generator in layout order: linear and conv
    weights ``N(0, 1 / fan_in)``, norm and layer-scale weights ``1 +
    N(0, 0.04)``, biases and BatchNorm means ``N(0, 0.01)``, BatchNorm
    variances in ``[0.5, ...)``, position tables, powers, scales and PaCS
    temperatures ``N(0, 0.25)``.

    Args:
        layout: ``[(name, shape), ...]`` in the authors' names.
        seed: generator seed.

    Returns:
        ``{name: tensor}`` (float32; ``num_batches_tracked`` a long 0).
    """
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in layout:
        leaf = name.rsplit('.', 1)[-1]
        if leaf == 'num_batches_tracked':
            out[name] = torch.tensor(0)
            continue
        t = torch.randn(tuple(shape), generator=g)
        if leaf == 'running_var':
            t = 0.5 + 0.5 * t.abs()
        elif leaf in ('running_mean', 'bias'):
            t = 0.1 * t
        elif leaf in _WIDE or leaf.startswith('pos_embed'):
            t = 0.5 * t
        elif leaf.startswith('gamma') or (leaf == 'weight'
                                          and len(shape) == 1):
            t = 1 + 0.2 * t
        else:
            fan_in = 1
            for s in shape[1:]:
                fan_in *= s
            t = t / fan_in ** 0.5
        out[name] = t
    return out


def stage_grids(family: str, H: int, W: int) -> list:
    """The four stage maps ``[(H_i, W_i)]`` of a backbone at ``H x W``.

    ``'swin'`` and ``'polapp'``: ``ceil(H / s_i)`` (padded to the patch,
    merges padded); ``'pvt'``: the authors' plain strided patch embeddings,
    ``H_1 = floor(H / 4)``, ``H_{i+1} = floor(H_i / 2)``, each at least 1.
    """
    if family != 'pvt':
        return [(-(-H // s), -(-W // s)) for s in (4, 8, 16, 32)]
    grids = [(max(1, H // 4), max(1, W // 4))]
    for _ in range(3):
        h, w = grids[-1]
        grids.append((max(1, h // 2), max(1, w // 2)))
    return grids


class FailingKernel:
    """Stands for a ``@triton.jit`` kernel whose launch fails: ``kernel[
    grid](...)`` raises ``error`` and counts the attempts."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    def __getitem__(self, grid):

        def launch_(*args, **kwargs):
            self.calls += 1
            raise self.error

        return launch_


def attention_training_losses(layer: torch.nn.Module, run=None,
                              steps: int = 3) -> list:
    """Losses of ``steps`` SGD steps (lr 0.5) of one attention ``layer``
    (64 channels, a 5 x 6 grid, batch 2) fitting a fixed random target,
    calling ``run`` (default: the layer itself, e.g. its compiled form)."""
    run = layer if run is None else run
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 30, 64, generator=g)
    target = torch.randn(2, 30, 64, generator=g)
    losses = []
    for _ in range(steps):
        loss = (run(x, (5, 6)) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def fast_path_families() -> Dict[str, tuple]:
    """name -> (backbone class, constructor arguments, the fast code that
    must run with the switch on in float64, forward and a training step).
    Swin's 'LLSS' has polarity and (with windows of 3) shifted, padded
    softmax windows; PVT's 'LLLS' polarity and spatial-reduction softmax;
    PolaPP PaCS and rotary softmax (tests/ops/test_fast_paths.py, also in
    the fresh process of its environment-switch test)."""
    from pola_mm.models import PolaPP, PolaPVT, PolaSwinTransformer
    kernels = {'GateLinearFunction', 'GeluLinearFunction'}
    polarity = {'polarity_cpu', 'PolarityAttentionFunction'} | kernels
    pacs = {'pacs_cpu', 'PaCSAttentionFunction'} | kernels
    return {
        'swin': (PolaSwinTransformer,
                 dict(arch=SWIN_TINY_DEPTH2, softmax_window_size=3),
                 polarity | {'sdpa'}),
        'swin_pacs': (PolaSwinTransformer,
                      dict(arch=SWIN_TINY_DEPTH2, softmax_window_size=3,
                           feature_map='pacs'), pacs | {'sdpa'}),
        'pvt': (PolaPVT, dict(arch=PVT_TINY, attn_layout='LLLS'),
                polarity | {'sdpa'}),
        'pvt_la_sr': (PolaPVT, dict(arch=PVT_TINY, la_sr_ratios='8421'),
                      polarity),
        'pvt_pacs': (PolaPVT, dict(arch=PVT_TINY, feature_map='pacs'), pacs),
        'polapp': (PolaPP, dict(arch=POLAPP_TINY),
                   {'pacs_cpu', 'PaCSAttentionFunction', 'sdpa',
                    'GateLinearFunction'}),
    }


# -- the upstream packages' tools in a fresh process -------------------------

def clean_env(**extra: str) -> Dict[str, str]:
    """This process's environment without the variables that could make
    the child import pola_mm (or anything) other than as installed, with
    one OpenMP thread; ``extra`` set last."""
    env = {k: v for k, v in os.environ.items()
           if k not in ('PYTHONPATH', 'PYTHONSTARTUP', 'PYTHONHOME',
                        'POLA_MM_STARTUP_HOOK')}
    env.update(OMP_NUM_THREADS='1', MKL_NUM_THREADS='1', **extra)
    return env


def upstream_tool(module: str, *path: str) -> str:
    """``<installed module>/.mim/tools/<path>``: the package's own tool,
    e.g. ``upstream_tool('mmdet', 'train.py')``."""
    import importlib.util
    spec = importlib.util.find_spec(module)
    root = list(spec.submodule_search_locations)[0]
    tool = osp.join(root, '.mim', 'tools', *path)
    assert osp.isfile(tool), tool
    return tool


def get_started_config() -> str:
    """The README's block of "Get started" that starts from a snippet (a
    user's ``my_config.py``)."""
    import re
    with open(osp.join(REPO, 'README.md'), encoding='utf-8') as f:
        readme = f.read()
    section = readme.split('### Get started', 1)[1].split('\n### ', 1)[0]
    blocks = re.findall(r'```python\n(.*?)```', section, re.S)
    snippet_blocks = [b for b in blocks if "'pola_mm::_base_/models/" in b
                      and "'mmdet::" in b]
    assert len(snippet_blocks) == 1, blocks
    return snippet_blocks[0]
