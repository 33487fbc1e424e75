"""One exported file, any input size: each backbone
exported by torch's own exporters (no MMDeploy) with a dynamic height and
width either computes what PyTorch computes at three other sizes (not
multiples of 32, one larger than the export size) in ONNX Runtime and
OpenVINO, also after a standard simplifier, or is refused at export with
one clear error. No file may run and differ.

Before the fix (torch 2.14.1, these tiny archs exported at 96x128): the
TorchScript exporter wrote Pola-Swin and Pola-PVT files that ONNX Runtime
refused at other sizes (a ``Reshape`` holding the export size's token
count) and a PolaPP file that ran and differed by up to 0.28 of the
output scale: ``unflatten``'s ONNX form has an output shape that the
exporter cannot infer, so it took the traced tensor's static shape and
folded every later size read from it into constants. The dynamo exporter
failed on Pola-Swin with "Could not infer dtype of SymBool".
"""

import importlib
import os
import os.path as osp

import numpy as np
import pytest
import torch
from helpers import PVT_TINY, REPO, SWIN_TINY_DEPTH2, randomise

import pola_mm.deployment as onnx_mod
import pola_mm.ops
from pola_mm.deployment import ExportError, export_onnx, verify_onnx
from pola_mm.models import PolaPP, PolaPVT, PolaSwinTransformer

onnx = pytest.importorskip('onnx')
pytest.importorskip('onnxruntime')

pytestmark = [pytest.mark.slow, pytest.mark.export]

#: PolaPP with one block a stage (PaCS stages 1-2, rotary softmax 3-4).
POLAPP_TINY1 = dict(embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1),
                    num_heads=(1, 2, 2, 4))
BACKBONES = {'swin': (PolaSwinTransformer, SWIN_TINY_DEPTH2),
             'pvt': (PolaPVT, PVT_TINY),
             'polapp': (PolaPP, POLAPP_TINY1)}
EXPORT_HW = (96, 128)
#: not multiples of 32; the last two larger than the export size
SIZES = [(77, 101), (150, 190), (118, 230)]


def _model(name: str) -> torch.nn.Module:
    cls, arch = BACKBONES[name]
    model = cls(arch=arch, drop_path_rate=0.)
    randomise(model, seed=0, std=0.3)  # tables, powers, scales non-zero
    return model.eval()


def _inputs():
    g = torch.Generator().manual_seed(5)
    return [torch.randn(1, 3, h, w, generator=g) for h, w in SIZES]


def _assert_equal_everywhere(model, path, inputs):
    checks = verify_onnx(model, path, inputs)  # ONNX Runtime, rtol 1e-4
    assert len(checks) == 4 * len(inputs)
    bad = [str(c) for c in checks if not c.ok]
    assert not bad, bad
    assert max(c.max_abs_diff / c.scale for c in checks) < 1e-4


def _run_openvino(path, inputs):
    ov = pytest.importorskip('openvino')
    # float32 as PyTorch (OpenVINO's CPU default may compute in bf16)
    compiled = ov.Core().compile_model(path, 'CPU',
                                       {'INFERENCE_PRECISION_HINT': 'f32'})
    return [[np.asarray(o) for o in compiled(x.numpy()).values()]
            for x in inputs]


def _assert_openvino_equal(model, path, inputs):
    for x, got in zip(inputs, _run_openvino(path, inputs)):
        with torch.no_grad():
            ref = [r.numpy() for r in model(x)]
        assert [g.shape for g in got] == [r.shape for r in ref]
        for r, g in zip(ref, got):
            assert np.abs(r - g).max() <= 1e-4 * np.abs(r).max()


@pytest.mark.parametrize('name', sorted(BACKBONES))
def test_torchscript_dynamic_hw_equals_pytorch_at_other_sizes(tmp_path,
                                                              name):
    model = _model(name)
    path = export_onnx(model, EXPORT_HW, str(tmp_path / 'm.onnx'),
                       exporter='torchscript', dynamic_hw=True)
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param for d in dims[2:]] == ['height', 'width']
    inputs = _inputs()
    _assert_equal_everywhere(model, path, inputs)
    _assert_openvino_equal(model, path, inputs)
    # a standard simplifier keeps it dynamic and equal
    onnxslim = pytest.importorskip('onnxslim')
    slim = str(tmp_path / 'slim.onnx')
    onnx.save(onnxslim.slim(proto), slim)
    _assert_equal_everywhere(model, slim, inputs)


#: a size where Pola-Swin's stages 3 and 4 are one window high and its
#: last map one token high (the cases torch.export special-cases)
THIN = (20, 300)


@pytest.mark.parametrize('name', sorted(BACKBONES))
def test_dynamo_dynamic_hw_equals_pytorch_at_other_sizes(tmp_path, name):
    """The default exporter with a free height and width, Pola-Swin's
    shifted windows included (inside ``pola_mm.ops.dynamic_export``, which
    ``export_onnx`` uses): equal to PyTorch at the other sizes in ONNX
    Runtime and OpenVINO, after onnxslim too; Pola-Swin also at a size
    where its last stages are one window and one token high."""
    if name == 'swin' and not pola_mm.ops.dynamic_export_supported():
        pytest.skip('this torch lacks backed_size_oblivious: the refusal '
                    'test below covers it')
    model = _model(name)
    path = export_onnx(model, EXPORT_HW, str(tmp_path / 'm.onnx'),
                       exporter='dynamo', dynamic_hw=True)
    proto = onnx.load(path)
    onnx.checker.check_model(path, full_check=True)
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    assert [d.HasField('dim_param') for d in dims[2:]] == [True, True]
    inputs = _inputs()
    if name == 'swin':
        inputs.append(torch.randn(1, 3, *THIN))
    _assert_equal_everywhere(model, path, inputs)
    _assert_openvino_equal(model, path, inputs)
    onnxslim = pytest.importorskip('onnxslim')
    slim = str(tmp_path / 'slim.onnx')
    onnx.save(onnxslim.slim(proto), slim)
    _assert_equal_everywhere(model, slim, inputs)


def test_dynamo_dynamic_hw_swin_is_refused_clearly_by_an_older_torch(
        tmp_path, monkeypatch):
    """Where torch lacks the size reasoning that ``dynamic_export`` sets
    (simulated here), torch.export would turn the shifted windows' counts
    into guards and torch.onnx would export at the example's size only:
    the window layer refuses with one message naming what works (the
    TorchScript exporter), and nothing is written."""
    sizes = importlib.import_module('pola_mm.ops.symbolic_sizes')
    monkeypatch.setattr(sizes, 'fx_config', lambda: None)
    assert not pola_mm.ops.dynamic_export_supported()
    model = _model('swin')
    out = tmp_path / 'm.onnx'
    with pytest.raises(ExportError) as info:
        export_onnx(model, EXPORT_HW, str(out), exporter='dynamo',
                    dynamic_hw=True)
    msg = str(info.value)
    assert 'height/width' in msg and '--exporter torchscript' in msg
    assert 'backed_size_oblivious' in msg
    assert 'PolaSwinTransformer' in msg
    assert list(tmp_path.iterdir()) == []


def test_torch_export_without_dynamic_export_is_refused_in_one_message():
    """A user's own ``torch.export`` of Pola-Swin with a free height and
    width, without ``pola_mm.ops.dynamic_export()``: one
    DynamicShapeExportError naming it (not a list of guards); inside it
    the same call exports, and the program equals eager at another
    size."""
    if not pola_mm.ops.dynamic_export_supported():
        pytest.skip('this torch lacks backed_size_oblivious')
    model = _model('swin')
    x = torch.randn(1, 3, *EXPORT_HW)
    dims = ({2: torch.export.Dim('h', min=16, max=4096),
             3: torch.export.Dim('w', min=16, max=4096)}, )
    with pytest.raises(Exception) as info:
        torch.export.export(model, (x, ), dynamic_shapes=dims, strict=False)
    chain, exc = [], info.value
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    refusal = [e for e in chain
               if isinstance(e, pola_mm.ops.DynamicShapeExportError)]
    assert refusal and 'pola_mm.ops.dynamic_export()' in str(refusal[0])
    with pola_mm.ops.dynamic_export(), torch.no_grad():
        program = torch.export.export(model, (x, ), dynamic_shapes=dims,
                                      strict=False)
        y = torch.randn(1, 3, *THIN)
        for got, want in zip(program.module()(y), model(y)):
            assert got.shape == want.shape
            assert (got - want).abs().max() <= 1e-5 * want.abs().max()


ASSETS = osp.join(REPO, 'tests', 'deployment', 'assets')


#: The whole-model detectors: a trained RetinaNet with a tiny Pola-PVT
#: (its weights beside the config), and the same RetinaNet with a tiny
#: PolaPP (PaCS and rotary softmax stages), randomised (seeded); the size
#: of level 0 of the outputs (backbone stage 2, stride 8) at an input size:
#: PVT's patch embeddings round down, PolaPP's padded convolutions up.
DETECTORS = {
    'pvt': ('retinanet_pola_pvt_shapes', True,
            lambda h, w: (h // 4 // 2, w // 4 // 2)),
    'polapp': ('retinanet_polapp_shapes', False,
               lambda h, w: (-(-h // 8), -(-w // 8))),
}


@pytest.mark.parametrize('exporter', ['torchscript', 'dynamo'])
@pytest.mark.parametrize('backbone', sorted(DETECTORS))
def test_whole_detector_dynamic_batch_and_hw(tmp_path, backbone, exporter):
    """A whole RetinaNet (tiny Pola-PVT or PolaPP, FPN, head; tensor mode),
    one file with a free batch, height and width from either exporter:
    its 10 outputs (5 levels of class scores and box regressions) equal
    PyTorch at the export size, three other sizes and batch 3, in ONNX
    Runtime and OpenVINO; the file passes the ONNX checker's full check
    and stays equal in ONNX Runtime after onnxslim. (The Pola-Swin
    RetinaNet: test_onnx_export.py, the tool's --whole.)"""
    pytest.importorskip('mmdet')
    pytest.importorskip('openvino')
    name, trained, level0 = DETECTORS[backbone]
    model = onnx_mod.build_model(
        osp.join(ASSETS, f'{name}.py'),
        osp.join(ASSETS, f'{name}.pth') if trained else None)
    assert type(model.model).__name__ == 'RetinaNet'
    if not trained:
        randomise(model, seed=0, std=0.1)
    out = str(tmp_path / 'det.onnx')
    checks = onnx_mod.export_and_verify(
        model, EXPORT_HW, out, exporter, dynamic_batch=True,
        dynamic_hw=True, runtimes=('onnxruntime', 'openvino'))
    assert os.path.isfile(out)
    assert len(checks) == 2 * 5 * 10  # runtimes x inputs x outputs
    assert all(c.ok for c in checks)
    assert max(c.max_abs_diff / c.scale for c in checks) < 1e-4
    # level 0 of the class scores (9 anchors x 3 classes)
    shapes = {c.shape for c in checks if c.name == checks[0].name}
    sizes = [EXPORT_HW] + onnx_mod.check_sizes(EXPORT_HW)
    assert shapes == ({(1, 27, *level0(h, w)) for h, w in sizes}
                      | {(3, 27, *level0(*sizes[-1]))})
    # the outputs vary (measured std/max: PVT >= 0.03, PolaPP >= 0.2; a
    # near-constant map would hide a wrong graph)
    x = onnx_mod.example_inputs(model, sizes[-1], seed=2)
    with torch.no_grad():
        assert all(float(t.std()) > 0.02 * float(t.abs().max())
                   for t in model(x))
    # checker and a standard simplifier
    onnx.checker.check_model(out, full_check=True)
    onnxslim = pytest.importorskip('onnxslim')
    slim = str(tmp_path / 'slim.onnx')
    onnx.save(onnxslim.slim(onnx.load(out)), slim)
    inputs = [onnx_mod.example_inputs(model, hw, seed=3) for hw in sizes]
    inputs.append(onnx_mod.example_inputs(model, sizes[-1], batch=3, seed=4))
    checks = verify_onnx(model, slim, inputs)
    assert len(checks) == 5 * 10 and all(c.ok for c in checks)
    assert max(c.max_abs_diff / c.scale for c in checks) < 1e-4


class _Unflatten(torch.nn.Module):
    """A map through ``unflatten`` with sizes read from the input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return (y.flatten(2).unflatten(2, (y.shape[2], y.shape[3])) * 2, )


def _unflatten_registered(opset: int) -> bool:
    from pola_mm.deployment.mmdeploy_fixes import unflatten_symbolic_missing
    return not unflatten_symbolic_missing(opset)


def test_opset11_export_without_mmdeploy(tmp_path):
    """Opset 11 through pola_mm's own export (no MMDeploy import needed):
    ``aten::unflatten``, which torch serves from opset 13 only, gets a
    symbolic for the call and loses it afterwards; the file has a free
    height and width and equals PyTorch at three sizes in ONNX Runtime."""
    model = _Unflatten().eval()
    before = _unflatten_registered(11)
    if not before:  # torch has none: a plain export stops at unflatten
        with pytest.raises(Exception, match='unflatten'):
            torch.onnx.export(model, (torch.randn(1, 3, 20, 24), ),
                              str(tmp_path / 'plain.onnx'), dynamo=False,
                              opset_version=11)
    path = export_onnx(model, (20, 24), str(tmp_path / 'u.onnx'),
                       exporter='torchscript', opset=11, dynamic_hw=True)
    assert _unflatten_registered(11) == before  # scoped to the call
    proto = onnx.load(path)
    assert [o.version for o in proto.opset_import if o.domain == ''] == [11]
    onnx.checker.check_model(proto, full_check=True)
    inputs = [torch.randn(1, 3, h, w) for h, w in SIZES]
    checks = verify_onnx(model, path, inputs)
    assert len(checks) == 3 and all(c.ok for c in checks)
    assert [c.shape for c in checks] == [(1, 4, h, w) for h, w in SIZES]


def test_opset11_backbone_dynamic_hw(tmp_path):
    """PolaPP (PaCS and rotary softmax stages) at opset 11, dynamic
    height and width, in ONNX Runtime and OpenVINO."""
    model = _model('polapp')
    path = export_onnx(model, EXPORT_HW, str(tmp_path / 'm.onnx'),
                       exporter='torchscript', opset=11, dynamic_hw=True)
    proto = onnx.load(path)
    assert [o.version for o in proto.opset_import if o.domain == ''] == [11]
    inputs = _inputs()
    _assert_equal_everywhere(model, path, inputs)
    _assert_openvino_equal(model, path, inputs)
