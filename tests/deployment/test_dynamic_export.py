"""MMDeploy's stock *dynamic* ONNX Runtime configs (a free input height and
width) on every config family: one file, exported on one image, agrees
with PyTorch on images of other sizes (none a multiple of 32, one larger
than the export size), each run at its own size (no resize, no padding to a
multiple of 32)."""
import os.path as osp

import numpy as np
import pytest
import torch

mmdeploy = pytest.importorskip('mmdeploy')

from deploy_helpers import CONFIGS, DATA, stock, upernet_options  # noqa: E402

import pola_mm  # noqa: E402,F401
from pola_mm.deployment.mmdeploy_verify import (  # noqa: E402
    deploy_and_verify, is_dynamic_hw, resolve_deploy_config)

pytestmark = [pytest.mark.slow, pytest.mark.export]

#: (H, W) of the images: the first is the export size; then three other
#: sizes, none a multiple of 32, the last larger than the export size.
SIZES = [(150, 190), (118, 230), (174, 146), (214, 262)]

DETECTION = 'mmdet/detection/detection_onnxruntime_dynamic.py'
INSTANCE_SEG = 'mmdet/instance-seg/instance-seg_onnxruntime_dynamic.py'
SEGMENTATION = 'mmseg/segmentation_onnxruntime_dynamic.py'
#: pola_mm's: the stock instance-seg dynamic config at opset 16
INSTANCE_SEG_16 = ('pola_mm_deploy::mmdet/instance-seg/'
                   'instance-seg_onnxruntime_dynamic-opset16.py')


def _images(src: str, out_dir, sizes=SIZES) -> list:
    """``src`` resized to each ``(H, W)`` of ``sizes``, as files."""
    import mmcv
    img = mmcv.imread(src)
    paths = []
    for h, w in sizes:
        path = str(out_dir / f'{osp.basename(src)}_{h}x{w}.png')
        mmcv.imwrite(mmcv.imresize(img, (w, h)), path)
        paths.append(path)
    return paths


def _at_image_size(cfg, pad_key: str = 'pad_size_divisor'):
    """The model config with the test pipeline run at the image's own size
    (its ``Resize`` by a factor of 1) and no padding to a multiple of 32."""
    pipeline = [dict(type='Resize', scale_factor=1.0, keep_ratio=True)
                if t['type'] == 'Resize' else t
                for t in cfg.test_dataloader.dataset.pipeline]
    cfg.test_dataloader.dataset.pipeline = pipeline
    cfg.test_pipeline = pipeline
    if pad_key in cfg.model.data_preprocessor:
        cfg.model.data_preprocessor[pad_key] = 1
    return cfg


def _config(path: str, options: dict = None):
    from mmengine.config import Config
    cfg = Config.fromfile(path)
    if options:
        cfg.merge_from_dict(options)
    return cfg


def _check_report(report, sizes=SIZES):
    assert report.ok, '\n'.join(str(c) for c in report.checks)
    assert [s[2:] for s in report.input_shapes] == list(sizes)
    assert all(h % 32 and w % 32 for h, w in sizes)
    assert max(h * w for h, w in sizes[1:]) > sizes[0][0] * sizes[0][1]
    import onnx
    dims = onnx.load(report.onnx_file).graph.input[0].type.tensor_type.shape
    assert [d.dim_param != '' for d in dims.dim][2:] == [True, True]


def _confident_counts(report) -> list:
    return [c.data['torch'] for c in report.checks
            if 'without a counterpart' in c.name]


def test_stock_dynamic_configs_free_height_and_width():
    from mmengine.config import Config
    for rel in (DETECTION, INSTANCE_SEG, SEGMENTATION):
        assert is_dynamic_hw(Config.fromfile(stock(rel))), rel


def test_retinanet_pola_pvt_dynamic(tmp_path, shapes_images):
    """The trained RetinaNet (Pola-PVT, tests/deployment/assets) through
    the stock dynamic detection config: at every size ONNX Runtime finds
    PyTorch's confident shapes (same labels, boxes within 1e-3 of the
    image size, scores within 1e-4)."""
    cfg = _at_image_size(
        _config(osp.join(DATA, 'retinanet_pola_pvt_shapes.py')))
    report = deploy_and_verify(
        stock(DETECTION), cfg,
        osp.join(DATA, 'retinanet_pola_pvt_shapes.pth'),
        _images(shapes_images[0], tmp_path), str(tmp_path / 'out'))
    _check_report(report)
    assert min(_confident_counts(report)) > 0


def test_mask_rcnn_pola_pvt_dynamic(tmp_path, shapes_images):
    """The trained Mask R-CNN (Pola-PVT) through the stock dynamic
    instance-seg config: detections and masks (IoU >= 0.99) as PyTorch's
    at every size."""
    cfg = _at_image_size(
        _config(osp.join(DATA, 'mask_rcnn_pola_pvt_shapes.py')))
    report = deploy_and_verify(
        stock(INSTANCE_SEG), cfg,
        osp.join(DATA, 'mask_rcnn_pola_pvt_shapes.pth'),
        _images(shapes_images[1], tmp_path), str(tmp_path / 'out'))
    _check_report(report)
    assert min(_confident_counts(report)) > 0
    assert any('mask IoU' in c.name for c in report.checks)


def test_upernet_pola_swin_dynamic(tmp_path, photo):
    """UperNet Pola-Swin (the real config, a tiny arch) through the stock
    dynamic segmentation config with ``with_argmax=False``: logits within
    1e-4 of their scale at every size (the pyramid pooling exact at every
    size: pola_mm's pooling rewriter computes its matrices in the graph)."""
    deploy = _config(stock(SEGMENTATION))
    deploy.codebase_config.with_argmax = False
    cfg = _at_image_size(
        _config(osp.join(CONFIGS, 'upernet_pola_swin_t_ade20k.py'),
                upernet_options()))
    report = deploy_and_verify(deploy, cfg, _perturbed_weights(
        cfg, deploy, tmp_path), _images(photo, tmp_path),
        str(tmp_path / 'out'))
    _check_report(report)
    assert all('logit max' in c.name for c in report.checks)


# ----------------------------------------------------------------------
# Random weights: the detections are those of random heads, compared on
# their top 20 (PyTorch's own initialisation of the heads: mmdet's gives
# every class its prior score, below the test threshold, and nothing would
# be compared), so the file's FPN outputs are compared too.

def _perturbed_weights(cfg, deploy, tmp_path, init_weights=True) -> str:
    """A checkpoint of the model's initialisation (with ``init_weights``
    mmdet's / mmseg's ``init_weights()``) with its zero-initialised
    position tables, powers, scales and temperatures drawn at random (so
    that resizing the tables matters), saved for both sides."""
    from mmdeploy.apis import build_task_processor
    torch.manual_seed(0)
    model = build_task_processor(cfg, deploy, 'cpu').build_pytorch_model()
    if init_weights:
        model.init_weights()
    names = ('positional_encoding', 'pos_embed', 'power', 'scale', 's1',
             's2', 'relative_position_bias_table')
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.split('.')[-1].startswith(names):
                p.normal_(0, 0.5)
    path = str(tmp_path / 'weights.pth')
    torch.save({'state_dict': model.state_dict()}, path)
    return path


def _fpn_outputs_match(onnx_file: str, cfg, deploy, checkpoint: str,
                       images: list, rtol: float = 1e-4) -> list:
    """The FPN outputs inside the exported file (its ``fpn_convs`` nodes,
    made graph outputs) against PyTorch's ``extract_feat`` on each image;
    returns the relative max difference per image."""
    import onnx
    import onnxruntime as ort
    from mmdeploy.apis import build_task_processor
    model = onnx.load(onnx_file)
    taps = {}
    for node in model.graph.node:
        parts = node.name.split('/')
        if len(parts) > 3 and parts[1] == 'neck' and node.op_type == 'Conv' \
                and parts[2].startswith('fpn_convs.'):
            taps[int(parts[2].split('.')[1])] = node.output[0]
    assert len(taps) >= 3, 'no FPN outputs found in the file'
    for name in taps.values():
        model.graph.output.append(onnx.helper.make_tensor_value_info(
            name, onnx.TensorProto.FLOAT, None))
    tapped = onnx_file[:-5] + '_fpn.onnx'
    onnx.save(model, tapped)
    sess = ort.InferenceSession(tapped, providers=['CPUExecutionProvider'])
    processor = build_task_processor(cfg, deploy, 'cpu')
    torch_model = processor.build_pytorch_model(checkpoint)
    diffs = []
    for img in images:
        _, inputs = processor.create_input(
            img, None, data_preprocessor=torch_model.data_preprocessor)
        with torch.no_grad():
            ref = torch_model.extract_feat(inputs)
        got = sess.run(list(taps.values()),
                       {sess.get_inputs()[0].name: inputs.numpy()})
        worst = 0.0
        for (i, _), g in zip(taps.items(), got):
            r = ref[i].numpy()
            assert g.shape == r.shape
            worst = max(worst, float(np.abs(g - r).max() / np.abs(r).max()))
        diffs.append(worst)
    assert max(diffs) <= rtol, diffs
    return diffs


def _random_detector(tmp_path, photo, deploy_file, config, options):
    deploy = _config(deploy_file)
    cfg = _at_image_size(_config(osp.join(CONFIGS, config), options))
    images = _images(photo, tmp_path)
    ckpt = _perturbed_weights(cfg, deploy, tmp_path, init_weights=False)
    report = deploy_and_verify(deploy, cfg, ckpt, images,
                               str(tmp_path / 'out'))
    _check_report(report)
    compared = [c.data for c in report.checks
                if 'without a counterpart' in c.name]
    # something compared at every size: 20 or more, or all there are
    assert all(d['compared_torch'] > 0 and d['compared_backend'] > 0
               for d in compared), compared
    _fpn_outputs_match(report.onnx_file, cfg, deploy, ckpt, images)
    return report


#: Narrow FPN and heads (32 channels) for the random-weight detectors.
NARROW_RETINANET = {
    'model.neck.out_channels': 32,
    'model.bbox_head.in_channels': 32,
    'model.bbox_head.feat_channels': 32,
}
NARROW_MASK_RCNN = {
    'model.neck.out_channels': 32,
    'model.rpn_head.in_channels': 32,
    'model.rpn_head.feat_channels': 32,
    'model.roi_head.bbox_roi_extractor.out_channels': 32,
    'model.roi_head.bbox_head.in_channels': 32,
    'model.roi_head.bbox_head.fc_out_channels': 64,
    'model.roi_head.mask_roi_extractor.out_channels': 32,
    'model.roi_head.mask_head.in_channels': 32,
    'model.roi_head.mask_head.conv_out_channels': 32,
}


def test_mask_rcnn_pola_swin_dynamic(tmp_path, photo):
    """Mask R-CNN Pola-Swin (the Pola-Swin-T config: global polarity stages
    with tables of its 56x56 and 28x28 grids, two shifted-window softmax
    stages; a tiny arch, narrow heads, random weights) through pola_mm's
    dynamic instance-seg config (the stock one at opset 16, whose RoIAlign
    is mmdet's for the thin RoIs of random heads): the file verifies at
    every size (the top 20 detections and masks) and its FPN outputs are
    PyTorch's within 1e-4 of their scale (the tables resized to the map,
    the softmax stages' padding, shift and masks of that size)."""
    _random_detector(tmp_path, photo, resolve_deploy_config(
        INSTANCE_SEG_16), 'mask_rcnn_pola_swin_t.py',
                     {'model.backbone.init_cfg': None,
                      'model.backbone.arch': dict(
                          _delete_=True, embed_dims=16, depths=(1, 1, 2, 2),
                          num_heads=(1, 1, 2, 2)),
                      'model.neck.in_channels': [16, 32, 64, 128],
                      **NARROW_MASK_RCNN})


def test_polapp_retinanet_dynamic(tmp_path, photo):
    """RetinaNet PolaPP (the b2 config, a tiny arch, narrow heads, random
    weights) through the stock dynamic detection config: verified at every
    size (the top 20 detections), FPN outputs within 1e-4 (rotary tables of
    the map's size)."""
    _random_detector(tmp_path, photo, stock(DETECTION),
                     'retinanet_polapp_b2.py', {
        'model.backbone.init_cfg': None,
        'model.backbone.arch': dict(
            _delete_=True, embed_dims=(16, 32, 64, 64), depths=(1, 1, 1, 1),
            num_heads=(1, 2, 2, 4), layer_scale_init=(1, 1, 1, 1)),
        'model.neck.in_channels': [32, 64, 64],
        **NARROW_RETINANET})
