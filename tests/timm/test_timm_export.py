"""The graph paths pola_mm supports in place of TorchScript
(``torch.jit.script`` is deprecated in torch 2.14 and no longer supported):
``torch.export.export`` and ``torch.compile(fullgraph=True)`` of one timm
model per family equal the eager model (whose fast paths run), at a size
where the position tables are resized and the softmax windows padded and
shifted, and the exported graph holds standard ATen operations only (the
ops ran their plain references while it was captured)."""
import pytest
import timm
import torch
from helpers import PVT_TINY, SWIN_TINY_DEPTH2, randomise

import pola_mm.ops
import pola_mm.timm  # noqa: F401  (registers the models)

pytestmark = [pytest.mark.slow, pytest.mark.export]

#: One model a family, tiny widths (PolaPP: PaCS stages 1-2, rotary
#: softmax 3-4, layer scale in the last two).
CASES = {
    'pola_swin_tiny': SWIN_TINY_DEPTH2,
    'pola_pvt_tiny': PVT_TINY,
    'polapp_b0': dict(embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1),
                      num_heads=(1, 1, 2, 2),
                      layer_scale_init=(None, None, 1., 1.)),
}


#: ``torch.compile``'s backend here: dynamo's whole-graph capture and
#: AOTAutograd run as with the default, inductor; its code generation takes
#: about two minutes a model on two cores (measured: the three models pass
#: with inductor too, docs/timm.md).
BACKEND = 'aot_eager'


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model(name, arch=CASES[name], num_classes=7).eval()
    randomise(model, std=0.1)
    return model


def _assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    scale = float(want.abs().max())
    assert scale > 0
    assert float((got - want).abs().max()) <= 1e-5 * scale


@pytest.mark.parametrize('name', sorted(CASES))
def test_torch_export_equals_eager(name):
    model = _model(name)
    x = torch.randn(2, 3, 100, 140)
    with torch.no_grad():
        want = model(x)
    program = torch.export.export(model, (x, ))
    targets = {n.target for n in program.graph.nodes
               if n.op == 'call_function'}
    custom = [t for t in targets if not (
        isinstance(t, torch._ops.OpOverload) and t.namespace == 'aten')
        and t.__module__ != '_operator']
    assert not custom, custom
    with torch.no_grad():
        got = program.module()(x)
    _assert_close(got, want)


@pytest.mark.parametrize('name', sorted(CASES))
def test_torch_compile_fullgraph_equals_eager(name):
    torch._dynamo.reset()
    model = _model(name)
    x = torch.randn(2, 3, 100, 140)
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, fullgraph=True, backend=BACKEND)(x)
    _assert_close(got, want)


#: (model, exporter) pairs of the ONNX test; True: the export is refused
#: (Pola-Swin's shifted windows under the dynamo exporter of a torch
#: without ``backed_size_oblivious``).
ONNX_CASES = [('pola_pvt_tiny', 'torchscript', False),
              ('pola_pvt_tiny', 'dynamo', False),
              ('pola_swin_tiny', 'torchscript', False),
              ('pola_swin_tiny', 'dynamo',
               not pola_mm.ops.dynamic_export_supported()),
              ('polapp_b0', 'torchscript', False),
              ('polapp_b0', 'dynamo', False)]


@pytest.mark.parametrize('name,exporter,refused', ONNX_CASES)
def test_onnx_dynamic_batch_and_hw(tmp_path, name, exporter, refused):
    """ONNX, one file with a free batch, height and width: each timm
    model's logits equal PyTorch at the export size, three other sizes
    (none a multiple of 32, two larger) and batch 3, in ONNX Runtime and
    OpenVINO; the file passes the ONNX checker's full check and stays
    equal after onnxslim. Pola-Swin under the dynamo exporter of an older
    torch is refused with one ExportError naming the TorchScript
    exporter, and nothing is written."""
    pytest.importorskip('onnxruntime')
    pytest.importorskip('openvino')
    from pola_mm.deployment import (ExportError, check_sizes, example_inputs,
                                    export_and_verify, verify_onnx)
    model = _model(name)
    out = str(tmp_path / 'm.onnx')
    kwargs = dict(dynamic_batch=True, dynamic_hw=True,
                  runtimes=('onnxruntime', 'openvino'))
    if refused:
        with pytest.raises(ExportError) as info:
            export_and_verify(model, (96, 128), out, exporter, **kwargs)
        msg = str(info.value)
        assert msg.startswith('the dynamo exporter cannot export PolaSwin '
                              'with a dynamic height/width')
        assert '--exporter torchscript' in msg
        assert list(tmp_path.iterdir()) == []
        return
    checks = export_and_verify(model, (96, 128), out, exporter, **kwargs)
    assert len(checks) == 2 * 5  # runtimes x inputs, one output
    assert all(c.ok for c in checks)
    assert max(c.max_abs_diff / c.scale for c in checks) < 1e-4
    assert sorted({c.shape for c in checks}) == [(1, 7), (3, 7)]
    assert all(h % 32 and w % 32 for h, w in check_sizes((96, 128)))
    onnx = pytest.importorskip('onnx')
    onnx.checker.check_model(out, full_check=True)
    onnxslim = pytest.importorskip('onnxslim')
    slim = str(tmp_path / 'slim.onnx')
    onnx.save(onnxslim.slim(onnx.load(out)), slim)
    sizes = check_sizes((96, 128))
    inputs = [example_inputs(model, hw, seed=3) for hw in sizes]
    inputs.append(example_inputs(model, sizes[-1], batch=3, seed=4))
    checks = verify_onnx(model, slim, inputs)
    assert len(checks) == 4 and all(c.ok for c in checks)
