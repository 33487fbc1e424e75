"""Whole models through MMDeploy 1.3.1 on torch 2.14, with MMDeploy's stock
ONNX Runtime deploy configs, unchanged (the copy that ships with pola_mm,
pola_mm/.mim/mmdeploy_configs, or a checkout named by
$POLA_MM_MMDEPLOY_ROOT), compared with PyTorch on a shapes image and a real
photo."""
import hashlib
import inspect
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch

mmdeploy = pytest.importorskip('mmdeploy')
# ruff: noqa: E402  (the imports below need MMDeploy)

from deploy_helpers import CONFIGS, DATA, HERE, SHIPPED, stock, upernet_options

import pola_mm  # noqa: F401
from pola_mm.deployment import mmdeploy_fixes, mmdeploy_rewriters
from pola_mm.deployment.mmdeploy_verify import (DeployError, DeployInputError,
                                                deploy_and_verify,
                                                load_deploy_configs,
                                                resolve_deploy_config,
                                                stock_configs_dir,
                                                stock_deploy_configs)

pytestmark = [pytest.mark.slow, pytest.mark.export]

ROOT = osp.dirname(osp.dirname(HERE))

PVT_TINY = dict(_delete_=True, embed_dims=[16, 32, 64, 64],
                depths=[1, 1, 1, 1],
                num_heads=[1, 2, 2, 4], mlp_ratios=[2, 2, 2, 2],
                sr_ratios=[8, 4, 2, 1])


@pytest.fixture(scope='module')
def shapes_image(shapes_images) -> str:
    return shapes_images[0]


def _git_blob_id(path: str) -> str:
    data = open(path, 'rb').read()
    return hashlib.sha1(b'blob %d\0' % len(data) + data).hexdigest()


#: git blob id of MMDeploy's LICENSE at v1.3.1 (commit bc75c9d6)
MMDEPLOY_LICENSE_BLOB = '261eeb9e9f8b2b4b0d119366dda99c6fd7d35c64'


def _blobs() -> list:
    with open(osp.join(SHIPPED, 'BLOBS.txt')) as f:
        return [line.split() for line in f if line.strip()]


def test_stock_configs_are_mmdeploy_v131_files():
    """Each shipped deploy config is byte for byte the file of MMDeploy's
    v1.3.1 tag (git blob ids recorded in BLOBS.txt), the folder holds those
    files and nothing else, with MMDeploy's LICENSE of the same tag."""
    entries = _blobs()
    assert len(entries) == 18
    for blob, rel in entries:
        path = osp.join(SHIPPED, 'configs', rel)
        assert _git_blob_id(path) == blob, rel
    found = sorted(
        osp.relpath(osp.join(d, f), osp.join(SHIPPED, 'configs'))
        for d, _, files in os.walk(osp.join(SHIPPED, 'configs'))
        for f in files if '__pycache__' not in d)
    assert found == sorted(rel for _, rel in entries)
    assert sorted(os.listdir(SHIPPED)) == ['BLOBS.txt', 'LICENSE',
                                           'README.md', 'configs']
    assert _git_blob_id(osp.join(SHIPPED, 'LICENSE')) == MMDEPLOY_LICENSE_BLOB


def test_mmdeploy_names_resolve_to_the_shipped_copy():
    """``mmdeploy::<path>`` is the shipped stock file (its relative
    ``_base_`` chain read), a plain path is used as given, an unknown name
    or one outside the tree is refused in one line listing the names."""
    from mmengine.config import Config
    assert stock_configs_dir() == osp.join(SHIPPED, 'configs')
    rel = 'mmdet/detection/detection_onnxruntime_dynamic.py'
    path = resolve_deploy_config('mmdeploy::' + rel)
    assert path == osp.join(SHIPPED, 'configs', rel)
    assert resolve_deploy_config(stock(rel)) == stock(rel)
    deploy, _ = load_deploy_configs(
        'mmdeploy::' + rel, osp.join(CONFIGS, 'retinanet_pola_pvt_t.py'))
    # the three bases: base_dynamic -> base_static -> onnx_config, backend
    assert deploy.backend_config.type == 'onnxruntime'
    assert deploy.onnx_config.opset_version == 11
    assert deploy.onnx_config.dynamic_axes['input'] == {
        0: 'batch', 2: 'height', 3: 'width'}
    assert deploy.codebase_config.post_processing.pre_top_k == 5000
    assert Config.fromfile(path).to_dict() == deploy.to_dict()
    # the names users can deploy with: every ONNX Runtime config shipped
    names = stock_deploy_configs()
    assert names == sorted(rel for _, rel in _blobs()
                           if 'onnxruntime' in rel and '_base_' not in rel)
    assert len(names) == 8 and rel in names
    for bad in ('mmdeploy::mmdet/detection/detection_tensorrt.py',
                'mmdeploy::../README.md', 'mmdeploy::'):
        with pytest.raises(DeployInputError) as info:
            resolve_deploy_config(bad)
        msg = str(info.value)
        assert '\n' not in msg
        assert msg.startswith(f'unknown MMDeploy deploy config {bad} ')
        assert all('mmdeploy::' + n in msg for n in names)


def test_cli_refuses_an_unknown_mmdeploy_name(tmp_path, capsys):
    """The tool (``python -m pola_mm.deployment.deploy``, which
    tools/deployment/deploy.py runs) exits 2 with one line naming the
    shipped configs, before any export."""
    from pola_mm.deployment.deploy import main
    img = tmp_path / 'x.png'
    img.write_bytes(b'')
    code = main(['mmdeploy::mmdet/detection/nope.py',
                 osp.join(CONFIGS, 'retinanet_pola_pvt_t.py'), 'none',
                 str(img), '--work-dir', str(tmp_path / 'out')])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith('error: unknown MMDeploy deploy config '
                             'mmdeploy::mmdet/detection/nope.py (shipped '
                             'with pola_mm: mmdeploy::')
    assert 'mmdeploy::mmdet/detection/detection_onnxruntime_dynamic.py' \
        in err[0]
    assert not osp.exists(tmp_path / 'out')
    # a model config by scope: pola_mm's own, found in the package
    from pola_mm.deployment.deploy import resolve_model_config
    assert resolve_model_config('pola_mm::retinanet_pola_pvt_t.py') == \
        osp.join(osp.dirname(pola_mm.__file__), '.mim', 'configs',
                 'retinanet_pola_pvt_t.py')
    assert resolve_model_config('configs/x.py') == 'configs/x.py'


def test_compat_fixes_are_in_place_and_narrow():
    import mmdeploy.core  # noqa: F401  (the import hook applies the fixes)
    import torch.onnx.symbolic_opset9 as opset9
    from mmdeploy.core import FUNCTION_REWRITER
    assert mmdeploy_fixes.needs_torchscript_exporter()
    assert opset9._cast_Long is mmdeploy_fixes._cast_long
    assert mmdeploy_fixes.applied['rewriters'] is True
    records = FUNCTION_REWRITER._registry._rewrite_records
    assert 'torch.onnx.export' in records
    # the exact head / pooling rewriters: registered for ONNX Runtime only
    for name, fn in mmdeploy_rewriters.ONNXRUNTIME_REWRITERS.items():
        ours = [r for r in records[name] if fn in r.values()]
        assert len(ours) == 1
        assert [type(c).__name__ for c in ours[0]['_checkers']] == \
            ['BackendChecker']
    # outside MMDeploy's export torch's default exporter is untouched
    param = inspect.signature(torch.onnx.export).parameters['dynamo']
    assert param.default is True
    assert mmdeploy_fixes.provide_removed_symbolics() == []  # idempotent


def test_unflatten_below_opset13_is_pytorchs_and_narrow(tmp_path):
    """The opset-11/12 ``aten::unflatten`` (nn.MultiheadAttention calls it:
    mmdet's PVT through MMDeploy's stock opset-11 configs) computes what
    PyTorch computes at every dim; opset 13 on keeps torch's own."""
    import mmdeploy.core  # noqa: F401  (the import hook applies the fixes)
    import onnx
    import onnxruntime as ort
    assert 'aten::unflatten@11' in mmdeploy_fixes.applied['symbolics']
    assert not mmdeploy_fixes.provide_unflatten_below_opset13()

    class Unflatten(torch.nn.Module):

        def forward(self, x):
            return (x.unflatten(-1, (3, 4)), x.unflatten(0, (1, 2)),
                    x.unflatten(1, (-1, 5)))

    x = torch.randn(2, 10, 12)
    kinds = {}
    for opset in (11, 12, 13):
        path = str(tmp_path / f'u{opset}.onnx')
        torch.onnx.export(Unflatten(), (x, ), path, dynamo=False,
                          opset_version=opset, input_names=['x'])
        outs = ort.InferenceSession(
            path, providers=['CPUExecutionProvider']).run(
                None, {'x': x.numpy()})
        for got, ref in zip(outs, Unflatten()(x)):
            np.testing.assert_array_equal(got, ref.numpy())
        kinds[opset] = [n.op_type for n in onnx.load(path).graph.node]
    assert kinds[11] == kinds[12] and 'Concat' in kinds[11]
    assert kinds[13] != kinds[11]  # torch's own symbolic from opset 13


def test_cast_long_symbolic_exports_a_cast(tmp_path):
    """The restored helper builds a real INT64 Cast in a traced graph."""
    import onnx
    import onnxruntime as ort
    from torch.onnx import register_custom_op_symbolic

    def trunc_symbolic(g, x):  # aten::trunc -> Cast(x, INT64) -> Float
        import torch.onnx.symbolic_opset9 as opset9
        as_long = opset9._cast_Long(g, x, False)
        return g.op('Cast', as_long,
                    to_i=torch._C._onnx.TensorProtoDataType.FLOAT)

    register_custom_op_symbolic('aten::trunc', trunc_symbolic, 11)
    try:
        path = str(tmp_path / 'cast.onnx')
        torch.onnx.export(_Trunc(), (torch.randn(3, 4) * 5, ), path,
                          dynamo=False, opset_version=11,
                          input_names=['x'])
    finally:
        torch.onnx.unregister_custom_op_symbolic('aten::trunc', 11)
    kinds = [n.op_type for n in onnx.load(path).graph.node]
    assert kinds.count('Cast') == 2
    x = np.array([[-2.7, 2.7, 0.4, -0.4]] * 3, dtype=np.float32)
    sess = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    out = sess.run(None, {'x': x})[0]
    np.testing.assert_array_equal(out, np.trunc(x))


class _Trunc(torch.nn.Module):

    def forward(self, x):
        return torch.trunc(x)


def _retinanet_cfg():
    from mmengine.config import Config
    return Config.fromfile(osp.join(DATA, 'retinanet_pola_pvt_shapes.py'))


def test_retinanet_static_matches_pytorch(tmp_path, shapes_image, photo):
    """A trained RetinaNet (Pola-PVT) through the stock static detection
    config: ONNX Runtime finds PyTorch's confident shapes, same labels,
    boxes within 1e-3 of the image size, scores within 1e-4."""
    report = deploy_and_verify(
        stock('mmdet/detection/detection_onnxruntime_static.py'),
        _retinanet_cfg(), osp.join(DATA, 'retinanet_pola_pvt_shapes.pth'),
        [shapes_image, photo], str(tmp_path / 'ret'))
    assert report.ok and osp.isfile(report.onnx_file)
    assert report.input_shapes == [(1, 3, 128, 128)] * 2
    counted = [c for c in report.checks if 'without a counterpart' in c.name]
    # the shapes image: the trained detector finds shapes with confidence
    assert 'PyTorch 0,' not in counted[0].detail, counted[0].detail
    assert not any(f.startswith('.unverified')
                   for f in os.listdir(tmp_path / 'ret'))
    # MMDeploy's context is left: torch's own export (dynamo default) again
    assert torch.onnx.export.__module__.startswith('torch.onnx')
    assert not hasattr(torch.onnx.export, 'origin_func')


def _sem_fpn_options() -> dict:
    return {
        'model.backbone.init_cfg': None,
        'model.backbone.arch': PVT_TINY,
        'model.neck.in_channels': PVT_TINY['embed_dims'],
    }


def _segmentation_report(config: str, options: dict, with_argmax: bool,
                         photo, tmp_path):
    """``deploy_and_verify`` of a pola_mm segmentation config (random
    weights, ``options``) through the stock static 512x512 config, its
    ``with_argmax`` set in memory."""
    from mmengine.config import Config
    deploy = Config.fromfile(
        stock('mmseg/segmentation_onnxruntime_static-512x512.py'))
    deploy.codebase_config.with_argmax = with_argmax
    return deploy_and_verify(deploy, osp.join(CONFIGS, config), None, photo,
                             str(tmp_path), cfg_options=options)


@pytest.mark.parametrize('with_argmax', [True, False])
def test_semantic_fpn_static_matches_pytorch(tmp_path, photo, with_argmax):
    """Semantic FPN (Pola-PVT) through the stock static 512x512 config on a
    photo: labels equal PyTorch's argmax (except near-ties), and with
    ``with_argmax=False`` (the same stock file, one key changed in memory)
    the logits are within 1e-4 of their scale."""
    report = _segmentation_report('sem_fpn_pola_pvt_t_ade20k.py',
                                  _sem_fpn_options(), with_argmax, photo,
                                  tmp_path)
    assert report.ok
    assert report.input_shapes == [(1, 3, 512, 512)]
    names = [c.name for c in report.checks]
    key = 'pixels whose label differs' if with_argmax else 'logit max'
    assert any(key in n for n in names), names


def test_exact_adaptive_pooling_matrices():
    """The ONNX Runtime rewriter's averaging matrices are PyTorch's
    adaptive bins, also where the map is not divisible (16 -> 3, 6)."""
    import torch.nn.functional as F
    x = torch.randn(2, 3, 16, 23, dtype=torch.float64)
    for out in ((3, 6), (6, 6), (2, 5), (16, 23)):
        ph = mmdeploy_rewriters.adaptive_pool_matrix(16, out[0], x.dtype)
        pw = mmdeploy_rewriters.adaptive_pool_matrix(23, out[1], x.dtype)
        torch.testing.assert_close(ph @ x @ pw.t(),
                                   F.adaptive_avg_pool2d(x, out),
                                   rtol=1e-12, atol=1e-12)


def test_upernet_static_matches_pytorch(tmp_path, photo):
    """UperNet (Pola-Swin) through the stock static 512x512 config with
    ``with_argmax=False``: its pyramid pooling pools the 16x16 map to 3x3
    and 6x6, which MMDeploy's own ``avg_pool2d`` rewrite gets wrong; with
    pola_mm's exact rewriter for ONNX Runtime the logits are within 1e-4
    of their scale."""
    report = _segmentation_report('upernet_pola_swin_t_ade20k.py',
                                  upernet_options(), False, photo, tmp_path)
    assert report.ok, report
    assert report.input_shapes == [(1, 3, 512, 512)]
    assert any('logit max' in c.name for c in report.checks)
    assert osp.exists(tmp_path / 'end2end.onnx')


def test_classifier_cli_writes_only_a_verified_file(tmp_path, photo):
    """tools/deployment/deploy.py with the stock static classification
    config by name (``mmdeploy::``, the shipped copy): the file is written,
    the class scores printed."""
    out = tmp_path / 'cls'
    opts = [
        'model.backbone.arch._delete_=True',
        'model.backbone.arch.embed_dims=[16,32,64,64]',
        'model.backbone.arch.depths=[1,1,1,1]',
        'model.backbone.arch.num_heads=[1,2,2,4]',
        'model.backbone.arch.mlp_ratios=[2,2,2,2]',
        'model.backbone.arch.sr_ratios=[8,4,2,1]',
        'model.head.in_channels=64'
    ]
    cmd = [
        sys.executable,
        osp.join(ROOT, 'tools', 'deployment', 'deploy.py'),
        'mmdeploy::mmpretrain/classification_onnxruntime_static.py',
        osp.join(CONFIGS, 'pola_pvt_t_in1k.py'), 'none', photo,
        '--work-dir', str(out), '--cfg-options'
    ] + opts
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'class score max abs diff' in res.stdout
    assert f"deploy config: {osp.join(SHIPPED, 'configs', 'mmpretrain')}" \
        in res.stdout
    assert 'verified: ' in res.stdout
    assert (out / 'end2end.onnx').is_file()
    # a missing image: exit 2, one line, nothing written
    bad = subprocess.run(cmd[:5] + [str(tmp_path / 'no.png')] + cmd[6:],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith(
        'error: image not found')
    # an override the config cannot take: exit 2, one line, no traceback
    clash = subprocess.run(cmd[:-len(opts)] + ['model.backbone.arch.x=1'],
                           capture_output=True, text=True, cwd=ROOT)
    assert clash.returncode == 2, clash.stderr[-2000:]
    assert 'Traceback' not in clash.stderr
    assert clash.stderr.strip().splitlines()[-1].startswith(
        'error: --cfg-options')


def test_mask_rcnn_exports_with_roi_align_at_opset_11(tmp_path, shapes_image):
    """Mask R-CNN (demo Pola-Swin) through the stock static instance-seg
    config: MMDeploy's RoIAlign symbolic needs the restored _cast_Long; the
    file has ONNX RoiAlign with INT64 batch indices and runs in ONNX
    Runtime. (Its detections are not compared one to one: see
    docs/deployment.md.)"""
    import onnx
    import onnxruntime as ort
    from mmdeploy.apis import torch2onnx
    torch2onnx(shapes_image, str(tmp_path), 'end2end.onnx',
               stock('mmdet/instance-seg/instance-seg_onnxruntime_static.py'),
               osp.join(CONFIGS, 'demo', 'mask_rcnn_pola_swin_shapes.py'),
               None, 'cpu')
    model = onnx.load(str(tmp_path / 'end2end.onnx'))
    assert model.opset_import[0].version == 11
    nodes = {n.output[0]: n for n in model.graph.node}
    rois = [n for n in model.graph.node if n.op_type == 'RoiAlign']
    assert rois
    batch_index = nodes[rois[0].input[2]]
    assert batch_index.op_type == 'Cast'
    assert batch_index.attribute[0].i == onnx.TensorProto.INT64
    sess = ort.InferenceSession(str(tmp_path / 'end2end.onnx'),
                                providers=['CPUExecutionProvider'])
    outs = sess.run(None, {'input': np.zeros((1, 3, 128, 128), np.float32)})
    assert [o.name for o in sess.get_outputs()] == ['dets', 'labels', 'masks']
    assert outs[0].shape[-1] == 5 and outs[2].shape[-2:] == (28, 28)


MASK_RCNN = osp.join(DATA, 'mask_rcnn_pola_pvt_shapes.py')
MASK_RCNN_PTH = osp.join(DATA, 'mask_rcnn_pola_pvt_shapes.pth')


def _without_ours(monkeypatch, *names):
    """MMDeploy's rewriter registry without pola_mm's rewriters of
    ``names`` (MMDeploy's own default rewriters then apply)."""
    from mmdeploy.core import FUNCTION_REWRITER
    records = FUNCTION_REWRITER._registry._rewrite_records
    ours = set(mmdeploy_rewriters.ONNXRUNTIME_REWRITERS.values())
    for name in names:
        kept = [r for r in records[name]
                if not any(v is f for v in r.values() for f in ours)]
        assert len(kept) < len(records[name])
        monkeypatch.setitem(records, name, kept)


def test_mask_rcnn_static_matches_pytorch(tmp_path, shapes_image, photo):
    """A trained Mask R-CNN (Pola-PVT) through the stock static instance-seg
    config: ONNX Runtime finds PyTorch's confident shapes, same labels,
    boxes within 1e-3 of the image size, scores within 1e-4, masks IoU >=
    0.99 (pola_mm's level-wise RPN and class-wise box rewriters)."""
    report = deploy_and_verify(
        stock('mmdet/instance-seg/instance-seg_onnxruntime_static.py'),
        MASK_RCNN, MASK_RCNN_PTH, [shapes_image, photo],
        str(tmp_path / 'mask'))
    assert report.ok and osp.isfile(report.onnx_file)
    counted = [c for c in report.checks if 'without a counterpart' in c.name]
    assert 'PyTorch 0,' not in counted[0].detail, counted[0].detail
    assert any('mask IoU' in c.name for c in report.checks)


def test_untrained_retinanet_on_a_photo_verifies(tmp_path, photo):
    """Untrained weights on a real photo: 20 confident
    detections with near-equal scores at the per-image cap, and boxes
    clipped flat at the border, which mmdet drops (``min_bbox_size=0``) and
    MMDeploy's own dense-head rewrite kept (pola_mm's ONNX Runtime rewriter
    scores them 0). The verification matches by label and box and passes.
    """
    report = deploy_and_verify(
        stock('mmdet/detection/detection_onnxruntime_static.py'),
        _retinanet_cfg(), None, photo, str(tmp_path / 'untrained'))
    assert report.ok and osp.isfile(report.onnx_file), report
    counted = [c for c in report.checks if 'without a counterpart' in c.name]
    assert counted[0].data['torch'] >= 10, counted[0].detail


def test_cascade_mask_rcnn_static_matches_pytorch(tmp_path, shapes_images):
    """A trained Cascade Mask R-CNN (Pola-PVT; class-agnostic boxes in its
    three stages) through the same stock config on three shapes images:
    verified as Mask R-CNN. (On the astronaut photo, outside its training
    domain, its soft masks reach IoU 0.987: docs/deployment.md.)"""
    report = deploy_and_verify(
        stock('mmdet/instance-seg/instance-seg_onnxruntime_static.py'),
        osp.join(DATA, 'cascade_mask_rcnn_pola_pvt_shapes.py'),
        osp.join(DATA, 'cascade_mask_rcnn_pola_pvt_shapes.pth'),
        shapes_images[:3], str(tmp_path / 'cascade'))
    assert report.ok and osp.isfile(report.onnx_file)
    counted = [c for c in report.checks if 'without a counterpart' in c.name]
    assert 'PyTorch 0,' not in counted[0].detail, counted[0].detail


def test_mask_rcnn_differs_with_mmdeploys_own_rpn(tmp_path, monkeypatch,
                                                  shapes_image):
    """The same model with MMDeploy's own RPN and box rewrites (one NMS
    over all levels, a score threshold on proposals, each RoI's best-class
    box for every class) is refused: the comparison can fail, and
    pola_mm's rewriters are what make it pass."""
    _without_ours(monkeypatch,
                  'mmdet.models.dense_heads.rpn_head.RPNHead.predict_by_feat',
                  'mmdet.models.roi_heads.bbox_heads.bbox_head.BBoxHead.'
                  'predict_by_feat')
    with pytest.raises(DeployError, match='differs from PyTorch'):
        deploy_and_verify(
            stock('mmdet/instance-seg/instance-seg_onnxruntime_static.py'),
            MASK_RCNN, MASK_RCNN_PTH, shapes_image, str(tmp_path / 'm'))
    assert not osp.exists(tmp_path / 'm' / 'end2end.onnx')


def test_polapp_backbone_exports_at_opset_11(tmp_path):
    """PolaPP (rotary softmax and PaCS stages) through MMDeploy's export at
    its default opset 11 (no aten::unflatten), equal to PyTorch."""
    import onnxruntime as ort
    from mmdeploy.apis.onnx import export
    from mmengine.config import Config

    from pola_mm.registry import MODELS
    torch.manual_seed(0)
    model = MODELS.build(
        dict(type='PolaPP',
             arch=dict(embed_dims=(16, 32, 64, 64), depths=(1, 1, 1, 1),
                       num_heads=(1, 2, 2, 4),
                       layer_scale_init=(1, 1, 1, 1)),
             out_indices=(1, 2, 3), init_cfg=None)).eval()
    x = torch.randn(1, 3, 128, 160)
    deploy = Config.fromfile(
        stock('mmdet/detection/detection_onnxruntime_static.py'))
    export(model, x, output_path_prefix=str(tmp_path / 'pp'),
           backend='onnxruntime', input_names=['input'],
           output_names=['o1', 'o2', 'o3'],
           context_info={'deploy_cfg': deploy}, opset_version=11)
    sess = ort.InferenceSession(str(tmp_path / 'pp.onnx'),
                                providers=['CPUExecutionProvider'])
    got = sess.run(None, {'input': x.numpy()})
    with torch.no_grad():
        ref = model(x)
    for r, g in zip(ref, got):
        scale = float(r.abs().max())
        assert float(np.abs(r.numpy() - g).max()) <= 1e-4 * scale


def test_fx_wraps_made_inside_mmdeploys_context_survive_its_exit(tmp_path,
                                                                 monkeypatch):
    """A module imported for the first time while MMDeploy's rewriter
    context is open that calls ``torch.fx.wrap`` (as mmpretrain's metrics
    and torchvision's ops do, imported lazily by an export) no longer ends
    the export with ``KeyError: -1``; its wrap is kept."""
    from mmdeploy.core import RewriterContext
    from torch.fx import _symbolic_trace

    from pola_mm.deployment import mmdeploy_fixes
    assert mmdeploy_fixes.applied['fx_wraps'] == isinstance(
        _symbolic_trace._wrapped_fns_to_patch, dict)
    (tmp_path / 'wraps_on_import.py').write_text(
        'import torch.fx\n\n\ndef helper(x):\n    return x\n\n\n'
        "torch.fx.wrap('helper')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with RewriterContext(cfg={}, backend='onnxruntime'):
        import wraps_on_import
    sys.modules.pop('wraps_on_import', None)
    wrapped = _symbolic_trace._wrapped_fns_to_patch
    if isinstance(wrapped, dict):
        assert (id(wraps_on_import.__dict__), 'helper') in wrapped
        del wrapped[(id(wraps_on_import.__dict__), 'helper')]
