"""The fixes pola_mm applies for one stack and not another are gated on
what the running torch has, checked (docs/compat.md, "What each stack
needs, and the gates"); these run on every stack (tests/compat/suite.txt).

``import pola_mm`` applies exactly the fixes the stack needs, and on a
stack that needs none it leaves mmengine's ``Runner``, torch's
weights-only allow-list and ``sys.meta_path`` as they were."""
import inspect
import json
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch

import pola_mm  # noqa: F401

pytestmark = pytest.mark.slow

HERE = osp.dirname(osp.abspath(__file__))
SUITE = osp.join(HERE, 'suite.txt')
TESTS = osp.dirname(HERE)


def _fresh(code: str, env: dict = None) -> str:
    """Run ``code`` in a fresh interpreter (with ``env`` added to the
    environment); return its last output line."""
    full_env = dict(os.environ)
    for key in ('TORCH_FORCE_WEIGHTS_ONLY_LOAD',
                'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', 'POLA_MM_STARTUP_HOOK'):
        full_env.pop(key, None)
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=300, env=full_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


#: Runs ``import pola_mm`` between two snapshots of what the fixes may
#: change and prints, as JSON: the applied fixes, the Runner attributes
#: that changed, how many entries torch's allow-list gained (None: torch
#: has none), and the entries sys.meta_path gained or lost. ``{setup}``
#: runs first.
SNAPSHOT = """
import json, sys
import torch
from mmengine.runner import Runner
{setup}
def allow_list():
    get = getattr(torch.serialization, 'get_safe_globals', None)
    return None if get is None else list(get())
runner = dict(vars(Runner))
safe = allow_list()
meta = list(sys.meta_path)
import pola_mm
changed = sorted(k for k in set(runner) | set(vars(Runner))
                 if runner.get(k) is not vars(Runner).get(k))
after = allow_list()
print(json.dumps(dict(
    applied=pola_mm.applied_fixes(),
    runner=changed,
    allow_list=None if safe is None else len(after) - len(safe),
    allow_list_same=safe == after,
    meta_added=[repr(f) for f in sys.meta_path if f not in meta],
    meta_removed=[repr(f) for f in meta if f not in sys.meta_path])))
"""


def _version(text: str) -> tuple:
    return tuple(int(p) for p in text.split('+')[0].split('.')[:2])


def _expected_fixes() -> list:
    """What this stack needs, from the stack's facts (not from pola_mm's
    gates): torch >= 2.6 loads weights-only by default; mmengine up to
    0.10.7 (the newest) compiles the whole train_step; mmpretrain 1.2.0
    imports multimodal models that transformers 5 breaks; MMDeploy's fixes
    wherever it is installed."""
    import importlib.util

    import mmengine
    from mmengine.utils import digit_version
    expected = []
    if _version(torch.__version__) >= (2, 6):
        expected.append('runner_checkpoints')
    if digit_version(mmengine.__version__) <= digit_version('0.10.7'):
        expected.append('runner_compile')
    if (importlib.util.find_spec('mmpretrain') is not None
            and _installed_major('transformers') >= 5):
        expected.append('mmpretrain_multimodal')
    if importlib.util.find_spec('mmdeploy') is not None:
        expected.append('mmdeploy')
    return expected


def _installed_major(package: str) -> int:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return int(version(package).split('.')[0])
    except PackageNotFoundError:
        return 0


@pytest.mark.parametrize('hook', ['on', 'off'])
def test_import_applies_exactly_the_fixes_this_stack_needs(hook):
    """On this stack ``import pola_mm`` applies the fixes it needs and no
    other, and changes only what they change: the Runner's compile methods,
    torch's allow-list (by pola_mm's entries), and ``sys.meta_path`` only
    where the start-up hook is off (``POLA_MM_STARTUP_HOOK=0``) and the
    MMDeploy fixes must wait for MMDeploy's import: then the start-up
    hook's finder, the one post-import mechanism, is added."""
    env = {'POLA_MM_STARTUP_HOOK': '0'} if hook == 'off' else {}
    got = json.loads(_fresh(SNAPSHOT.format(setup=''), env))
    expected = _expected_fixes()
    assert got['applied'] == expected
    assert got['runner'] == (['_maybe_compile', 'test', 'val']
                             if 'runner_compile' in expected else [])
    if 'runner_checkpoints' in expected:
        from pola_mm.fileio import runner_checkpoint_safe_globals
        assert got['allow_list'] == len(runner_checkpoint_safe_globals())
    else:
        assert got['allow_list_same']
    assert got['meta_removed'] == []
    deferred = {'mmdeploy', 'mmpretrain_multimodal'} & set(expected)
    if hook == 'off' and deferred:
        assert got['meta_added'] == ["<class 'pola_mm_startup."
                                     "PostImportFinder'>"]
    else:
        assert got['meta_added'] == []


def test_import_changes_nothing_where_no_fix_is_needed():
    """A stack that needs no fix: torch does not load weights-only by
    default (torch's own switch ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, as
    before torch 2.6), the Runner's compile option is not mmengine 0.10's
    (a stand-in, as a fixed mmengine would have), neither MMDeploy nor
    transformers is installed (both hidden: a stack with transformers 5
    beside mmpretrain needs the mmpretrain fix) and the start-up hook is
    off. ``import pola_mm`` applies nothing and leaves the Runner, torch's
    allow-list and ``sys.meta_path`` as they were."""
    setup = ('def _maybe_compile(self, target):\n'
             '    pass\n'
             'Runner._maybe_compile = _maybe_compile\n'
             "sys.modules['mmdeploy'] = None\n"
             "sys.modules['transformers'] = None\n")
    got = json.loads(_fresh(
        SNAPSHOT.format(setup=setup),
        {'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD': '1',
         'POLA_MM_STARTUP_HOOK': '0'}))
    assert got['applied'] == []
    assert got['runner'] == []
    assert got['allow_list_same']
    assert got['meta_added'] == got['meta_removed'] == []


def test_gates_read_the_running_stack(monkeypatch):
    """Each gate answers for what it checks: torch's default and its
    environment switches, mmengine's compile method, MMDeploy's presence
    (through the one post-import mechanism of the start-up hook)."""
    from mmengine.runner import Runner

    from pola_mm import compat
    from pola_mm.deployment import mmdeploy_fixes
    weights_only = _version(torch.__version__) >= (2, 6)
    monkeypatch.delenv('TORCH_FORCE_WEIGHTS_ONLY_LOAD', raising=False)
    monkeypatch.delenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', raising=False)
    assert compat.torch_loads_weights_only_by_default() == weights_only
    monkeypatch.setenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '1')
    assert not compat.torch_loads_weights_only_by_default()
    monkeypatch.delenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD')
    monkeypatch.setenv('TORCH_FORCE_WEIGHTS_ONLY_LOAD', '1')
    assert compat.torch_loads_weights_only_by_default()
    # mmengine's original method is what the gate reads, patched or not
    assert compat.runner_compiles_train_step()
    assert compat.needed_fixes()['runner_compile']
    if 'runner_compile' in compat.applied:
        assert Runner._maybe_compile is compat._maybe_compile
    assert mmdeploy_fixes.mmdeploy_installed() == (
        'mmdeploy' in _expected_fixes())
    if mmdeploy_fixes.mmdeploy_installed():
        import pola_mm_startup
        assert pola_mm_startup.PATCHES['mmdeploy.core'] is \
            mmdeploy_fixes._apply


def test_unflatten_symbolic_is_added_where_torch_lacks_it():
    """torch has ``aten::unflatten`` from opset 13 only (2.1.2 and 2.14.1
    alike); the opset-11/12 symbolic is registered when MMDeploy is
    imported, on every torch whose registry lacks it, and not before."""
    pytest.importorskip('mmdeploy')
    out = _fresh(
        'import json, pola_mm\n'
        'from pola_mm.deployment import mmdeploy_fixes as f\n'
        'before = [f.unflatten_symbolic_missing(11), '
        'f.unflatten_symbolic_missing(13), list(f.applied["symbolics"])]\n'
        'import mmdeploy.core\n'
        'print(json.dumps([before, f.applied["symbolics"], '
        'f.unflatten_symbolic_missing(11)]))\n')
    (missing_11, missing_13, applied_before), applied, missing_after = \
        json.loads(out)
    assert missing_11 and not missing_13
    assert 'aten::unflatten@11' not in applied_before
    assert 'aten::unflatten@11' in applied
    assert not missing_after


def test_multihead_attention_exports_at_opset_11(tmp_path):
    """``nn.MultiheadAttention`` with one tensor as query, key and value
    (``unflatten`` since torch 2.0) exports at MMDeploy's opset 11 with the
    TorchScript exporter once MMDeploy is imported, and ONNX Runtime computes
    what PyTorch computes."""
    pytest.importorskip('mmdeploy')
    import mmdeploy.core  # noqa: F401  (the import hook applies the fixes)
    import onnxruntime as ort

    class Attn(torch.nn.Module):

        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x):
            # need_weights (the default, as mmdet's PVT calls it): the
            # explicit softmax path, which opset 11 has
            return self.attn(x, x, x)[0]

    torch.manual_seed(0)
    model = Attn().eval()
    x = torch.randn(2, 7, 16)
    kwargs = {}
    if 'dynamo' in inspect.signature(torch.onnx.export).parameters:
        kwargs['dynamo'] = False  # the TorchScript exporter, as MMDeploy's
    path = str(tmp_path / 'mha.onnx')
    # with gradients on, as MMDeploy's export runs (no native fast path)
    torch.onnx.export(model, (x, ), path, opset_version=11,
                      input_names=['x'], **kwargs)
    with torch.no_grad():
        ref = model(x).numpy()
    got = ort.InferenceSession(path, providers=['CPUExecutionProvider']).run(
        None, {'x': x.numpy()})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_suite_names_existing_tests():
    """Every path of tests/compat/suite.txt exists, and pytest collects the
    selection (no typo turns into a silently smaller suite)."""
    sys.path.insert(0, osp.join(osp.dirname(TESTS), 'tools'))
    try:
        from compat_suite import suite_args
    finally:
        sys.path.pop(0)
    args = suite_args(SUITE)
    deselected = [b for a, b in zip(args, args[1:]) if a == '--deselect']
    nodes = [a for a in args
             if not a.startswith('-') and a not in deselected]
    assert nodes
    for node in nodes + deselected:
        assert osp.exists(osp.join(osp.dirname(TESTS), node.split('::')[0])), \
            node
    proc = subprocess.run(
        [sys.executable, '-m', 'pytest', '--collect-only', '-q',
         '-p', 'no:cacheprovider'] + args,
        cwd=osp.dirname(TESTS), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    collected = [ln for ln in proc.stdout.splitlines() if '::' in ln]
    for node in nodes:
        assert any(ln.startswith(node) for ln in collected), node
    for node in deselected:
        assert node not in collected
