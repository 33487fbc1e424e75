"""The fixes pola_mm applies for one stack and not another are gated on
what the running torch has, checked (docs/compat.md, "Compatibility
stacks"); these run on every stack (tests/compat/suite.txt)."""
import inspect
import json
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch

import pola_mm  # noqa: F401

HERE = osp.dirname(osp.abspath(__file__))
SUITE = osp.join(HERE, 'suite.txt')
TESTS = osp.dirname(HERE)


def _fresh(code: str) -> str:
    """Run ``code`` in a fresh interpreter; return its last output line."""
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


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
