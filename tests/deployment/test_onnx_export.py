"""ONNX export of the backbones (pola_mm.deployment, the pytorch2onnx tool):
both exporters give files that onnxruntime runs to PyTorch's outputs, the
fast paths step aside while a graph is captured, a file that disagrees is
refused, the files written carry their final names (``FILE.onnx`` and its
weights ``FILE.onnx.data``) and run from wherever they are copied, nothing
is left behind by a failure, and the tool's exit codes and messages follow
its contract."""
import importlib
import os
import os.path as osp
import shutil
import subprocess
import sys
from typing import Callable, List, Optional, Tuple

import numpy as np
import pytest
import torch
from helpers import (PVT_TINY, REPO, SWIN_TINY_DEPTH1, SWIN_TINY_DEPTH2,
                     randomise, stage_grids, subprocess_env)

import pola_mm.ops
from pola_mm.deployment import (ExportError, ExportInputError,
                                available_runtimes, build_backbone,
                                example_inputs, export_and_verify, export_onnx,
                                external_data_files)
from pola_mm.deployment import onnx_export as onnx_mod
from pola_mm.deployment import verify_onnx
from pola_mm.deployment.onnx_files import gather_external_data
from pola_mm.models import PolaPVT, PolaSwinTransformer
from pola_mm.ops import dispatch
from pola_mm.ops.polarity import cpu as polarity_fast

pytest.importorskip('onnxruntime')

pytestmark = [pytest.mark.slow, pytest.mark.export]

#: The module of the polarity attention op (``pola_mm.ops`` exports the op
#: function under the same name).
polarity_op_module = importlib.import_module('pola_mm.ops.polarity.op')

BACKBONES = {'swin': (PolaSwinTransformer, SWIN_TINY_DEPTH2),
             'swin1': (PolaSwinTransformer, SWIN_TINY_DEPTH1),
             'pvt': (PolaPVT, PVT_TINY)}


def _small_runs(monkeypatch) -> None:
    """Runs small enough that eager CPU inference takes the kernel's runs,
    so the test shows they stay out of the graph."""
    monkeypatch.setattr(polarity_fast, 'RUN_ELEMENTS', 1 << 14)


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
    for obj, attr in [(polarity_op_module, 'polarity_attention_cpu'),
                      (polarity_fast, '_features')]:
        _spy(monkeypatch, calls, obj, attr)
    with torch.no_grad():
        model(example_inputs(model, shape))
    assert {'polarity_attention_cpu', '_features'} <= set(calls)
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
    # the file and its weights, under their final names, nothing else
    assert sorted(os.listdir(tmp_path)) == ['m.onnx', 'm.onnx.data']
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


@pytest.mark.parametrize('exporter', ['torchscript', 'dynamo'])
def test_disagreeing_file_is_refused(tmp_path, monkeypatch, exporter):
    """Nothing is left: neither the graph nor (dynamo) its weights file,
    nor the private folder they were verified in."""
    model = _model('pvt')
    other = _model('pvt', seed=5)
    real_export = onnx_mod.export_onnx
    written = []

    def export_other(m, shape, path, *args, **kwargs):  # a wrong model
        real_export(other, shape, path, *args, **kwargs)
        written.extend(os.listdir(osp.dirname(path)))
        return path

    monkeypatch.setattr(onnx_mod, 'export_onnx', export_other)
    out = str(tmp_path / 'm.onnx')
    with pytest.raises(ExportError, match='differs from PyTorch'):
        export_and_verify(model, (64, 64), out, exporter=exporter)
    # the exporter did write (the weights too, with dynamo) ...
    assert 'm.onnx' in written
    assert ('m.onnx.data' in written) == (exporter == 'dynamo')
    # ... into a private folder that is gone
    assert os.listdir(tmp_path) == []


def _tiny_onnx(path: str, location: Optional[str] = None,
               per_tensor: bool = False) -> np.ndarray:
    """A hand-made ONNX file ``y = x + a + b`` (``a``, ``b``: 256 floats)
    at ``path``; with ``location`` (or ``per_tensor``, one file per tensor,
    as the TorchScript exporter writes above 2 GB) its weights outside it.
    Returns ``a + b``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    a = np.linspace(-1, 1, 256, dtype=np.float32)
    b = np.linspace(2, 3, 256, dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node('Add', ['x', 'a'], ['t']),
         helper.make_node('Add', ['t', 'b'], ['y'])], 'tiny',
        [helper.make_tensor_value_info('x', TensorProto.FLOAT, [256])],
        [helper.make_tensor_value_info('y', TensorProto.FLOAT, [256])],
        [numpy_helper.from_array(a, 'a'), numpy_helper.from_array(b, 'b')])
    model = helper.make_model(graph,
                              opset_imports=[helper.make_opsetid('', 17)])
    model.ir_version = 8
    if location or per_tensor:
        onnx.save_model(model, path, save_as_external_data=True,
                        all_tensors_to_one_file=not per_tensor,
                        location=location, size_threshold=0)
    else:
        onnx.save_model(model, path)
    return a + b


def _run_tiny(path: str) -> np.ndarray:
    """``y`` of the file of :func:`_tiny_onnx` at ``x = 0``."""
    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    return sess.run(None, {'x': np.zeros(256, np.float32)})[0]


@pytest.mark.parametrize('kind', ['other_name', 'per_tensor'])
def test_weights_go_to_one_data_file(tmp_path, kind):
    """Weights an exporter put elsewhere (another name, one file per
    tensor) end up in ``<file>.data``, referred to by that relative name."""
    path = str(tmp_path / 'm.onnx')
    expected = _tiny_onnx(path, location='weights.bin'
                          if kind == 'other_name' else None,
                          per_tensor=kind == 'per_tensor')
    before = external_data_files(path)
    assert before and before != ['m.onnx.data']
    assert gather_external_data(path) == ['m.onnx.data']
    assert external_data_files(path) == ['m.onnx.data']
    assert sorted(os.listdir(tmp_path)) == ['m.onnx', 'm.onnx.data']
    np.testing.assert_array_equal(_run_tiny(path), expected)
    # a file without external weights is left as it is
    inside = str(tmp_path / 'in' / 'n.onnx')
    os.makedirs(osp.dirname(inside))
    _tiny_onnx(inside)
    assert gather_external_data(inside) == []
    assert os.listdir(osp.dirname(inside)) == ['n.onnx']


def test_exported_files_carry_final_names(tmp_path):
    """The dynamo exporter's file and its weights carry their final names,
    load from their final place (onnx with its external data,
    onnxruntime) and still run when copied together elsewhere; a later
    export without external weights to the same name removes the old
    weights file."""
    import onnx
    from onnx import numpy_helper
    model = _model('pvt', seed=4)
    dest = tmp_path / 'dest'
    out = str(dest / 'pvt.onnx')
    export_and_verify(model, (64, 64), out, exporter='dynamo')
    assert sorted(os.listdir(dest)) == ['pvt.onnx', 'pvt.onnx.data']
    assert os.listdir(tmp_path) == ['dest']  # no private folder left
    assert external_data_files(out) == ['pvt.onnx.data']  # relative
    with open(out, 'rb') as f:
        assert b'unverified' not in f.read()
    assert osp.getsize(str(dest / 'pvt.onnx.data')) > osp.getsize(out)
    # onnx loads the weights from the final data file
    proto = onnx.load(out, load_external_data=True)
    onnx.checker.check_model(proto)
    own = model.state_dict()
    kept = {t.name: numpy_helper.to_array(t)
            for t in proto.graph.initializer if t.name in own}
    assert len(kept) >= len(own) // 4  # the rest folded into other tensors
    for name, value in kept.items():
        np.testing.assert_array_equal(value, own[name].numpy(), err_msg=name)
    # onnxruntime runs it there, to PyTorch's outputs
    x = example_inputs(model, (64, 64), seed=7)
    assert all(c.ok for c in verify_onnx(model, out, [x]))
    # copied together (the graph under another name) to another folder,
    # with the original gone: still runs
    other = tmp_path / 'copy'
    other.mkdir()
    shutil.copy(str(dest / 'pvt.onnx.data'), str(other / 'pvt.onnx.data'))
    shutil.copy(out, str(other / 'renamed.onnx'))
    shutil.rmtree(str(dest))
    assert all(c.ok for c in verify_onnx(model, str(other / 'renamed.onnx'),
                                         [x]))
    # the graph alone does not carry the weights
    alone = tmp_path / 'alone'
    alone.mkdir()
    shutil.copy(str(other / 'renamed.onnx'), str(alone / 'renamed.onnx'))
    with pytest.raises(ExportError, match='cannot load'):
        verify_onnx(model, str(alone / 'renamed.onnx'), [x])
    # re-exported in place by the TorchScript exporter (weights inside the
    # file): the stale weights file goes
    again = str(other / 'pvt.onnx')
    shutil.copy(str(other / 'renamed.onnx'), again)
    export_and_verify(model, (64, 64), again, exporter='torchscript')
    assert external_data_files(again) == []
    assert sorted(os.listdir(other)) == ['pvt.onnx', 'renamed.onnx']


def _fake_export(data: bool) -> Callable[..., str]:
    """An exporter that writes a (wrong, tiny) file, with its weights
    outside it when ``data``."""
    def export(m, shape, path, *args, **kwargs):
        _tiny_onnx(path, location=osp.basename(path) + '.data'
                   if data else None)
        return path
    return export


@pytest.mark.parametrize('failure', ['export', 'verify', 'interrupt',
                                     'move'])
def test_failure_leaves_nothing(tmp_path, monkeypatch, failure):
    """A failed export, a failed check, a Ctrl-C or a failed move leaves no
    new file, no weights file and no private folder; the file already at
    the destination is untouched."""
    model = _model('pvt')
    out = tmp_path / 'm.onnx'
    out.write_bytes(b'an earlier export')
    seen = []

    def ok_checks(m, path, inputs, rtol=1e-4, runtimes=()):
        seen.extend(sorted(os.listdir(osp.dirname(path))))
        return [onnx_mod.OutputCheck('out0', 1, (1, ), 0.0, 1.0, 1e-4)]

    if failure == 'export':
        def broken(m, shape, path, *args, **kwargs):
            _tiny_onnx(path, location=osp.basename(path) + '.data')
            seen.extend(sorted(os.listdir(osp.dirname(path))))
            raise ExportError('the exporter gave up half-way')
        monkeypatch.setattr(onnx_mod, 'export_onnx', broken)
        expected = ExportError
    elif failure == 'verify':  # an output differs
        monkeypatch.setattr(onnx_mod, 'export_onnx', _fake_export(True))

        def mismatch(m, path, inputs, rtol=1e-4, runtimes=()):
            seen.extend(sorted(os.listdir(osp.dirname(path))))
            return [onnx_mod.OutputCheck('out0', 1, (1, ), 1.0, 1.0, 1e-4)]
        monkeypatch.setattr(onnx_mod, 'verify_onnx', mismatch)
        expected = ExportError
    elif failure == 'interrupt':
        monkeypatch.setattr(onnx_mod, 'export_onnx', _fake_export(True))

        def interrupted(m, path, inputs, rtol=1e-4, runtimes=()):
            seen.extend(sorted(os.listdir(osp.dirname(path))))
            raise KeyboardInterrupt
        monkeypatch.setattr(onnx_mod, 'verify_onnx', interrupted)
        expected = KeyboardInterrupt
    else:  # the weights moved into place, then the graph cannot follow
        monkeypatch.setattr(onnx_mod, 'export_onnx', _fake_export(True))
        monkeypatch.setattr(onnx_mod, 'verify_onnx', ok_checks)
        real_replace = os.replace

        def replace(src, dst):
            if dst.endswith('.onnx'):
                assert osp.isfile(str(out) + '.data')  # data went first
                raise PermissionError(13, 'Permission denied', dst)
            real_replace(src, dst)
        monkeypatch.setattr(onnx_mod.os, 'replace', replace)
        expected = PermissionError
    with pytest.raises(expected):
        export_and_verify(model, (64, 64), str(out))
    assert seen == ['m.onnx', 'm.onnx.data']  # both were written
    assert os.listdir(tmp_path) == ['m.onnx']
    assert out.read_bytes() == b'an earlier export'


def test_unwritable_destination(tmp_path):
    model = _model('pvt')
    with pytest.raises(ExportInputError, match='is a folder'):
        export_and_verify(model, (64, 64), str(tmp_path))
    blocker = tmp_path / 'file'
    blocker.write_text('not a folder')
    with pytest.raises(ExportInputError, match='cannot write next to'):
        export_and_verify(model, (64, 64), str(blocker / 'm.onnx'))
    assert os.listdir(tmp_path) == ['file']


def test_clear_errors(tmp_path):
    model = _model('pvt')
    with pytest.raises(ExportError, match='opsets 18 to 21, not 13; .*'
                       '--exporter torchscript'):
        export_onnx(model, (64, 64), str(tmp_path / 'a.onnx'),
                    exporter='dynamo', opset=13)
    with pytest.raises(ExportError, match='opsets 11 to 21, not 10'):
        export_onnx(model, (64, 64), str(tmp_path / 'a.onnx'),
                    exporter='torchscript', opset=10)
    assert os.listdir(tmp_path) == []
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


CONFIG = osp.join(REPO, 'configs', 'mask_rcnn_pola_swin_t.py')
#: ``--cfg-options`` of a tiny Pola-Swin in CONFIG
TINY_SWIN = [
    'model.backbone.arch._delete_=True',
    f'model.backbone.arch.embed_dims={SWIN_TINY_DEPTH1["embed_dims"]}',
    'model.backbone.arch.depths=[1,1,1,1]',
    'model.backbone.arch.num_heads=[1,1,2,2]']


#: A tiny RetinaNet (tests/deployment/assets) and ``--cfg-options`` that
#: give it a tiny Pola-Swin backbone (two blocks a stage: shifted windows).
RETINANET = osp.join(REPO, 'tests', 'deployment', 'assets',
                     'retinanet_pola_pvt_shapes.py')
RETINANET_SWIN = [
    'model.backbone.type=PolaSwinTransformer',
    'model.backbone.arch._delete_=True', 'model.backbone.arch.embed_dims=16',
    'model.backbone.arch.depths=[2,2,2,2]',
    'model.backbone.arch.num_heads=[1,1,2,2]',
    'model.neck.in_channels=[16,32,64,128]']


@pytest.fixture(scope='module')
def tool():
    """The export tool, ``python -m pola_mm.deployment.pytorch2onnx`` (in
    a checkout also tools/deployment/pytorch2onnx.py)."""
    from pola_mm.deployment import pytorch2onnx
    return pytorch2onnx


def test_cli_writes_final_names(tmp_path, capsys, tool):
    """Exit 0: the dynamo exporter's file and its weights under their final
    names; the TorchScript one: the file alone. Exit 1 (a tolerance nothing
    meets): refused, nothing new left."""
    out = str(tmp_path / 'swin.onnx')
    rc = tool.main([CONFIG, '--shape', '64', '96', '--out', out,
                    '--cfg-options', *TINY_SWIN])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert sorted(os.listdir(tmp_path)) == ['swin.onnx', 'swin.onnx.data']
    assert external_data_files(out) == ['swin.onnx.data']
    # 4 outputs, checked in every runtime installed here
    assert printed.count(' ok') == 4 * len(available_runtimes())
    assert 'agrees with PyTorch' in printed
    assert 'swin.onnx.data: its weights' in printed
    out2 = str(tmp_path / 'ts.onnx')
    rc = tool.main([CONFIG, '--shape', '96', '160', '--out', out2,
                    '--exporter', 'torchscript', '--cfg-options', *TINY_SWIN])
    printed = capsys.readouterr().out
    assert rc == 0 and 'its weights' not in printed
    assert sorted(os.listdir(tmp_path)) == ['swin.onnx', 'swin.onnx.data',
                                            'ts.onnx']
    # a tolerance nothing meets: refused, exit 1, nothing new
    for exporter in ['dynamo', 'torchscript']:
        rc = tool.main([CONFIG, '--shape', '64', '96', '--out',
                        str(tmp_path / 'refused.onnx'), '--exporter',
                        exporter, '--rtol', '1e-12', '--cfg-options',
                        *TINY_SWIN])
        out, err = capsys.readouterr()
        assert rc == 1 and 'TOO LARGE' in err and 'Traceback' not in err
        # a refused run says what its weights were, as a verified one does
        assert out.splitlines()[-1] == 'weights: random, seeded (--seed 0)'
        assert sorted(os.listdir(tmp_path)) == ['swin.onnx',
                                                'swin.onnx.data', 'ts.onnx']


def _bad_inputs(case: str, tmp_path) -> Tuple[List[str], List[str]]:
    """The arguments of one bad-input case and the fragments its message
    must hold (the problem and the fix)."""
    ckpt = str(tmp_path / 'ckpt.pth')
    out = ['--out', str(tmp_path / 'out' / 'm.onnx')]
    tiny = ['--cfg-options', *TINY_SWIN]
    if case == 'missing config':
        return ([str(tmp_path / 'none.py'), '--shape', '64', '64', *out],
                ['config file not found', 'none.py', 'check the path'])
    if case == 'missing checkpoint':
        return ([CONFIG, ckpt, '--shape', '64', '64', *out, *tiny],
                ['checkpoint not found', 'ckpt.pth', 'leave out CKPT'])
    if case == 'truncated checkpoint':
        source = _model('swin1')
        torch.save({'state_dict': source.state_dict()}, ckpt)
        with open(ckpt, 'rb') as f:
            head = f.read()
        with open(ckpt, 'wb') as f:  # an interrupted download
            f.write(head[:len(head) // 2])
        return ([CONFIG, ckpt, '--shape', '64', '64', *out, *tiny],
                ['ckpt.pth', 'truncated or corrupt',
                 'pass an intact checkpoint'])
    if case == 'garbage checkpoint':
        with open(ckpt, 'wb') as f:
            f.write(bytes(range(256)) * 4)
        return ([CONFIG, ckpt, '--shape', '64', '64', *out, *tiny],
                ['ckpt.pth', 'not a PyTorch checkpoint',
                 'pass an intact checkpoint'])
    if case == 'empty checkpoint':
        open(ckpt, 'wb').close()
        return ([CONFIG, ckpt, '--shape', '64', '64', *out, *tiny],
                ['ckpt.pth', 'empty', 'pass an intact checkpoint'])
    if case == 'checkpoint of another arch':
        torch.save(_model('pvt').state_dict(), ckpt)
        return ([CONFIG, ckpt, '--shape', '64', '64', *out, *tiny],
                ['ckpt.pth', 'does not fit', 'same arch'])
    if case == 'not a pola_mm backbone':
        cfg = tmp_path / 'resnet.py'
        cfg.write_text("model = dict(type='RetinaNet', "
                       "backbone=dict(type='ResNet', depth=18))\n")
        return ([str(cfg), '--shape', '64', '64', *out],
                ["'ResNet', not a pola_mm backbone", 'PolaSwinTransformer',
                 'configs/*.py'])
    if case == 'no backbone':
        cfg = tmp_path / 'nobackbone.py'
        cfg.write_text("model = dict(type='ImageClassifier')\n")
        return ([str(cfg), '--shape', '64', '64', *out],
                ['nobackbone.py has no model.backbone', 'configs/*.py'])
    if case == 'bad arch':
        return ([CONFIG, '--shape', '64', '64', *out, '--cfg-options',
                 'model.backbone.arch=huge'],
                ["unknown arch 'huge'", 'check model.backbone'])
    if case == 'out is a folder':
        return ([CONFIG, '--shape', '64', '64', '--out', str(tmp_path),
                 *tiny], ['is a folder', 'pass the path of the .onnx'])
    assert case == 'opset out of range'
    return ([CONFIG, '--shape', '64', '64', *out, '--exporter', 'dynamo',
             '--opset', '13', *tiny],
            ['--opset 13', 'opsets 18 to 21', '--exporter torchscript'])


BAD_INPUTS = ['missing config', 'missing checkpoint', 'truncated checkpoint',
              'garbage checkpoint', 'empty checkpoint',
              'checkpoint of another arch', 'not a pola_mm backbone',
              'no backbone', 'bad arch', 'out is a folder',
              'opset out of range']


@pytest.mark.parametrize('case', BAD_INPUTS)
def test_cli_bad_inputs_exit_2(tmp_path, capsys, tool, case):
    """Exit 2 with one line naming the problem and the fix, no traceback,
    no file written."""
    argv, fragments = _bad_inputs(case, tmp_path)
    before = sorted(os.listdir(tmp_path))
    rc = tool.main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith('error: '), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    if 'checkpoint' in case:  # the backbone is fine: not mentioned
        assert 'pola_mm backbones only' not in err
    assert sorted(os.listdir(tmp_path)) == before


def test_cli_dynamic_torchscript_checks_other_sizes(tmp_path, capsys,
                                                    tool):
    """``--dynamic`` with the TorchScript exporter: one file, free batch,
    height and width, equal to PyTorch at the export size, at three other
    sizes (none a multiple of 32, two larger) and at batch 3, in ONNX
    Runtime and OpenVINO."""
    pytest.importorskip('openvino')
    out = str(tmp_path / 'swin.onnx')
    rc = tool.main([CONFIG, '--shape', '64', '96', '--out', out,
                    '--exporter', 'torchscript', '--dynamic',
                    '--cfg-options', *TINY_SWIN])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert os.listdir(tmp_path) == ['swin.onnx']
    lines = [ln for ln in printed.splitlines() if ' out0 ' in ln]
    # 5 inputs (64x96, 3 other sizes, batch 3) x 2 runtimes
    assert len(lines) == 10 and all(ln.endswith(' ok') for ln in lines)
    assert sum(ln.startswith('openvino ') for ln in lines) == 5
    assert '(batch 3)' in printed
    sizes = onnx_mod.check_sizes((64, 96))
    assert all(h % 32 and w % 32 for h, w in sizes)
    assert sum(h > 64 and w > 96 for h, w in sizes) == 2
    for h, w in sizes:  # stage 0 of Pola-Swin: stride 4, padded up
        assert f'(1, 16, {-(-h // 4)}, {-(-w // 4)})' in printed
    assert 'dynamic batch, height and width' in printed
    assert 'onnxruntime and openvino' in printed


def test_cli_dynamic_swin_whole_model_with_the_default_exporter(
        tmp_path, capsys, tool):
    """``--whole --dynamic`` on a Pola-Swin detector with the default
    exporter (dynamo, ``torch.export``): the tool exports it with a free
    batch, height and width, no switch of exporter, and the file is
    verified at the other sizes as every dynamic export."""
    if not pola_mm.ops.dynamic_export_supported():
        pytest.skip('this torch lacks backed_size_oblivious: the next '
                    'test covers it')
    out = str(tmp_path / 'det.onnx')
    rc = tool.main([RETINANET, '--whole', '--shape', '64', '96', '--out',
                    out, '--dynamic', '--cfg-options', *RETINANET_SWIN])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert 'note: torch.export' not in captured.err
    assert '(dynamo exporter, dynamic batch, height and width)' in (
        captured.out)
    assert osp.isfile(out)


@pytest.mark.parametrize('exporter', [None, 'dynamo'])
def test_cli_dynamic_swin_with_an_older_torch(tmp_path, capsys, tool,
                                              monkeypatch, exporter):
    """Where torch lacks the size reasoning that a dynamic dynamo export of
    Pola-Swin needs (simulated): without ``--exporter`` the tool says so
    in one line and exports with the TorchScript exporter (verified as
    every dynamic export); with ``--exporter dynamo`` exit 1, one error
    naming the exporter that works, nothing written."""
    sizes = importlib.import_module('pola_mm.ops.symbolic_sizes')
    monkeypatch.setattr(sizes, 'fx_config', lambda: None)
    out = str(tmp_path / 'det.onnx')
    chosen = ['--exporter', exporter] if exporter else []
    rc = tool.main([RETINANET, '--whole', '--shape', '64', '96', '--out',
                    out, *chosen, '--dynamic', '--cfg-options',
                    *RETINANET_SWIN])
    captured = capsys.readouterr()
    if exporter is None:
        assert rc == 0, captured.err
        notes = [line for line in captured.err.splitlines()
                 if line.startswith('note: torch.export of this torch '
                                    'cannot free')]
        assert len(notes) == 1 and '--exporter torchscript' in notes[0]
        assert '(torchscript exporter, dynamic batch, height and width)' \
            in captured.out
        assert osp.isfile(out)
        return
    assert rc == 1, captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), captured.err
    assert 'height/width' in lines[0]
    assert '--exporter torchscript' in lines[0]
    assert os.listdir(tmp_path) == []


def test_cli_malformed_arguments_exit_2(tool, capsys):
    with pytest.raises(SystemExit) as exc:  # argparse: --shape needs H W
        tool.main([CONFIG, '--shape', '64', '--out', 'm.onnx'])
    assert exc.value.code == 2
    assert '--shape' in capsys.readouterr().err


def test_cli_interrupted_leaves_nothing(tmp_path, capsys, tool, monkeypatch):
    """Ctrl-C while the file is checked: exit 130, nothing written."""
    monkeypatch.setattr(onnx_mod, 'export_onnx', _fake_export(True))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(onnx_mod, 'verify_onnx', interrupted)
    rc = tool.main([CONFIG, '--shape', '64', '64', '--out',
                    str(tmp_path / 'm.onnx'), '--cfg-options', *TINY_SWIN])
    assert rc == 130 and 'nothing was written' in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_cli_corrupt_checkpoint_as_a_subprocess(tmp_path):
    """The tool as a user runs it: a corrupt checkpoint exits 2 with one
    line on stderr (warnings of other packages silenced), no traceback."""
    ckpt = tmp_path / 'corrupt.pth'
    ckpt.write_bytes(b'PK\x03\x04' + bytes(200))  # a zip cut short
    proc = subprocess.run(
        [sys.executable, osp.join(REPO, 'tools', 'deployment',
                                  'pytorch2onnx.py'), CONFIG, str(ckpt),
         '--shape', '64', '64', '--out', str(tmp_path / 'm.onnx')],
        env=subprocess_env(PYTHONWARNINGS='ignore'), capture_output=True,
        text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert 'corrupt.pth' in lines[0] and 'truncated or corrupt' in lines[0]
    assert 'pola_mm backbones only' not in proc.stderr
    assert os.listdir(tmp_path) == ['corrupt.pth']


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
    # 4 outputs, checked in every runtime installed here
    assert {c.runtime for c in checks} == set(available_runtimes())
    assert len(checks) == 4 * len(available_runtimes())
    assert all(c.ok for c in checks)
    assert checks[0].shape[-2:] == (16, 24)


def test_polapp_export_under_grad_without_tool(tmp_path, monkeypatch):
    """A user's plain TorchScript ``torch.onnx.export`` of PolaPP with
    autograd on: the PaCS kernel's autograd function steps aside."""
    from pola_mm.ops.pacs import cpu as pacs_fast
    model = _polapp(seed=1)
    calls = []
    _spy(monkeypatch, calls, pacs_fast.PaCSAttentionFunction, 'apply')
    x = example_inputs(model, (64, 96))
    out = str(tmp_path / 'm.onnx')
    assert torch.is_grad_enabled()
    torch.onnx.export(model, (x, ), out, dynamo=False)
    assert calls == []
    assert all(c.ok for c in verify_onnx(model, out, [x]))
