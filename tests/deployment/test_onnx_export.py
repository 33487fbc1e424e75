"""ONNX export of the backbones (pola_mm.deployment, the pytorch2onnx tool):
both exporters give files that onnxruntime runs to PyTorch's outputs, the
fast paths step aside while a graph is captured, and a file that disagrees
is refused."""
import importlib
import os.path as osp

import pytest
import torch

from pola_mm.deployment import (ExportError, build_backbone,
                                example_inputs, export_and_verify,
                                export_onnx, verify_onnx)
from pola_mm.deployment import onnx as onnx_mod
from pola_mm.models import PolaPVT, PolaSwinTransformer
from pola_mm.ops import dispatch, polarity_kernel
from helpers import (PVT_TINY, REPO, SWIN_TINY_DEPTH1, SWIN_TINY_DEPTH2,
                     randomise, stage_grids)

pytest.importorskip('onnxruntime')

#: The module of the polarity attention op (``pola_mm.ops`` exports the op
#: function under the same name).
polarity_op_module = importlib.import_module('pola_mm.ops.polarity_attention')

BACKBONES = {'swin': (PolaSwinTransformer, SWIN_TINY_DEPTH2),
             'swin1': (PolaSwinTransformer, SWIN_TINY_DEPTH1),
             'pvt': (PolaPVT, PVT_TINY)}


def _small_runs(monkeypatch) -> None:
    """Runs small enough that eager CPU inference takes the kernel's runs,
    so the test shows they stay out of the graph."""
    monkeypatch.setattr(polarity_kernel, 'KERNEL_RUN_ELEMENTS', 1 << 14)


def _model(name: str, seed: int = 0) -> torch.nn.Module:
    cls, arch = BACKBONES[name]
    model = cls(arch=arch, drop_path_rate=0.)
    randomise(model, seed=seed, std=0.3)  # power, scale, tables non-zero
    return model.eval()


def _spy(monkeypatch, calls, obj, attr):
    original = getattr(obj, attr)

    def wrapped(*args, **kwargs):
        calls.append(attr)
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, attr, wrapped)


@pytest.mark.parametrize('name,shape', [('swin1', (224, 224)),
                                        ('swin', (97, 131)),
                                        ('pvt', (224, 224)),
                                        ('pvt', (160, 248))])
def test_torchscript_export_matches_pytorch(tmp_path, monkeypatch, name,
                                            shape):
    _small_runs(monkeypatch)
    model = _model(name)
    calls = []
    # the op's fast implementation, looked up where the op calls it, and
    # the features of one of the kernel's runs
    for obj, attr in [(polarity_op_module, 'polarity_attention_kernel'),
                      (polarity_kernel, '_features')]:
        _spy(monkeypatch, calls, obj, attr)
    with torch.no_grad():
        model(example_inputs(model, shape))
    assert {'polarity_attention_kernel', '_features'} <= set(calls)
    calls.clear()
    out = str(tmp_path / 'm.onnx')
    export_onnx(model, shape, out, exporter='torchscript')
    assert calls == []  # no fast path, no run in the graph
    checks = verify_onnx(model, out, [example_inputs(model, shape, seed=3)])
    assert len(checks) == 4
    grids = stage_grids('pvt' if name == 'pvt' else 'swin', *shape)
    for c, grid in zip(checks, grids):
        assert tuple(c.shape[-2:]) == grid
        assert c.ok, str(c)
        assert c.max_abs_diff < 1e-4 * c.scale


@pytest.mark.parametrize('name,shape,dynamic', [('swin1', (160, 248), False),
                                                ('pvt', (224, 224), True)])
def test_dynamo_export_matches_pytorch(tmp_path, name, shape, dynamic):
    model = _model(name, seed=1)
    out = str(tmp_path / 'm.onnx')
    checks = export_and_verify(model, shape, out, exporter='dynamo',
                               dynamic_batch=dynamic)
    assert osp.isfile(out) and not osp.exists(out + '.unverified')
    assert all(c.ok for c in checks)
    assert {c.batch for c in checks} == ({1, 3} if dynamic else {1})


def test_export_under_grad_without_tool(tmp_path):
    """A user's plain ``torch.onnx.export`` (parameters requiring grad,
    autograd on): the kernel's and the conv's autograd functions step aside
    instead of breaking the trace."""
    model = _model('swin', seed=2)
    x = example_inputs(model, (64, 96))
    out = str(tmp_path / 'm.onnx')
    assert torch.is_grad_enabled()
    torch.onnx.export(model, (x, ), out, dynamo=False)
    assert all(c.ok for c in verify_onnx(model, out, [x]))


def test_exporting_predicate():
    seen = []

    def f(x):
        seen.append((dispatch.exporting(), dispatch.capturing()))
        return x * 2

    f(torch.ones(2))
    torch.jit.trace(f, torch.ones(2), check_trace=False)
    assert seen == [(False, False), (True, True)]


def test_disagreeing_file_is_refused(tmp_path, monkeypatch):
    model = _model('pvt')
    other = _model('pvt', seed=5)
    real_export = onnx_mod.export_onnx

    def export_other(m, *args, **kwargs):  # a wrong model in the file
        return real_export(other, *args, **kwargs)

    monkeypatch.setattr(onnx_mod, 'export_onnx', export_other)
    out = str(tmp_path / 'm.onnx')
    with pytest.raises(ExportError, match='differs from PyTorch'):
        export_and_verify(model, (64, 64), out, exporter='torchscript')
    assert not osp.exists(out) and not osp.exists(out + '.unverified')


def test_clear_errors(tmp_path):
    model = _model('pvt')
    with pytest.raises(ExportError, match='dynamo exporter'):
        export_onnx(model, (64, 64), str(tmp_path / 'a.onnx'),
                    exporter='torchscript', dynamic_batch=True)
    with pytest.raises(ExportError, match='unknown exporter'):
        export_onnx(model, (64, 64), str(tmp_path / 'a.onnx'),
                    exporter='tf')
    out = str(tmp_path / 'b.onnx')
    export_onnx(model, (64, 64), out, exporter='torchscript')
    with pytest.raises(ExportError, match='shape'):  # spatial size fixed
        verify_onnx(model, out, [example_inputs(model, (96, 64))])


def test_build_backbone_from_config_with_checkpoint(tmp_path):
    cfg = osp.join(REPO, 'configs', 'retinanet_pola_pvt_t.py')
    opts = {'model.backbone.arch._delete_': True,
            'model.backbone.arch.embed_dims': [16, 32, 32, 64],
            'model.backbone.arch.depths': [1, 1, 1, 1],
            'model.backbone.arch.num_heads': [1, 1, 2, 2],
            'model.backbone.arch.mlp_ratios': [2, 2, 2, 2]}
    source = _model('pvt', seed=7)
    ckpt = str(tmp_path / 'det.pth')  # a detector-style checkpoint
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in
                               source.state_dict().items()}}, ckpt)
    model = build_backbone(cfg, ckpt, opts)
    assert isinstance(model, PolaPVT) and not model.training
    for k, v in source.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    with pytest.raises(ExportError, match='not a pola_mm backbone'):
        build_backbone(cfg, None, {'model.backbone.type': 'ResNet'})


def test_cli_on_a_real_config(tmp_path, capsys):
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        'pytorch2onnx', osp.join(REPO, 'tools', 'deployment',
                                 'pytorch2onnx.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    cfg = osp.join(REPO, 'configs', 'mask_rcnn_pola_swin_t.py')
    out = str(tmp_path / 'swin.onnx')
    tiny = ['model.backbone.arch._delete_=True',
            f'model.backbone.arch.embed_dims={SWIN_TINY_DEPTH1["embed_dims"]}',
            'model.backbone.arch.depths=[1,1,1,1]',
            'model.backbone.arch.num_heads=[1,1,2,2]']
    rc = tool.main([cfg, '--shape', '96', '160', '--out', out,
                    '--exporter', 'torchscript', '--cfg-options', *tiny])
    printed = capsys.readouterr().out
    assert rc == 0 and osp.isfile(out)
    assert printed.count(' ok') == 4 and 'agrees with PyTorch' in printed
    # a tolerance nothing meets: refused, exit 1, no file
    out2 = str(tmp_path / 'refused.onnx')
    rc = tool.main([cfg, '--shape', '96', '160', '--out', out2,
                    '--exporter', 'torchscript', '--rtol', '1e-12',
                    '--cfg-options', *tiny])
    assert rc == 1 and not osp.exists(out2)
    assert 'TOO LARGE' in capsys.readouterr().err
    assert tool.main([str(tmp_path / 'none.py'), '--shape', '8', '8',
                      '--out', out2]) == 2


POLAPP_TINY = dict(embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1),
                   num_heads=(1, 2, 2, 4))


def _polapp(seed: int = 0) -> torch.nn.Module:
    from pola_mm.models import PolaPP
    model = PolaPP(arch=POLAPP_TINY, drop_path_rate=0.)
    randomise(model, seed=seed, std=0.3)  # temperatures s1, s2 non-zero
    return model.eval()


@pytest.mark.parametrize('exporter', ['torchscript', 'dynamo'])
def test_polapp_export_matches_pytorch(tmp_path, exporter):
    """PaCS (``exp(t x) - 1``) and rotary attention export with both
    exporters (``exp(x) - 1`` for the TorchScript one, which has no
    ``expm1``)."""
    model = _polapp()
    checks = export_and_verify(model, (64, 96), str(tmp_path / 'm.onnx'),
                               exporter=exporter)
    assert len(checks) == 4 and all(c.ok for c in checks)
    assert checks[0].shape[-2:] == (16, 24)


def test_polapp_export_under_grad_without_tool(tmp_path, monkeypatch):
    """A user's plain TorchScript ``torch.onnx.export`` of PolaPP with
    autograd on: the PaCS kernel's autograd function steps aside."""
    from pola_mm.ops import pacs_kernel
    model = _polapp(seed=1)
    calls = []
    _spy(monkeypatch, calls, pacs_kernel.PaCSAttentionFunction, 'apply')
    x = example_inputs(model, (64, 96))
    out = str(tmp_path / 'm.onnx')
    assert torch.is_grad_enabled()
    torch.onnx.export(model, (x, ), out, dynamo=False)
    assert calls == []
    assert all(c.ok for c in verify_onnx(model, out, [x]))
