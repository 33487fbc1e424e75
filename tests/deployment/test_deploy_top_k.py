"""Checks that compare something (``python -m pola_mm.deployment.deploy``):
an untrained detector, confident of nothing, is compared on its top 20
detections (boxes, scores, labels, masks); a check of no detection at all
is refused; two-stage detectors verify through pola_mm's opset-16 deploy
configs, whose RoIAlign is mmdet's for every RoI, where MMDeploy's stock
opset-11 RoIAlign clamps RoIs thinner than a feature cell."""
import os.path as osp

import numpy as np
import pytest
import torch

mmdeploy = pytest.importorskip('mmdeploy')
# ruff: noqa: E402  (the imports below need MMDeploy)

from deploy_helpers import CONFIGS, DATA, stock

import pola_mm  # noqa: F401
from pola_mm.deployment.mmdeploy_export import (pola_mm_deploy_configs,
                                                resolve_deploy_config,
                                                stock_deploy_configs)
from pola_mm.deployment.mmdeploy_verify import DeployError, deploy_and_verify

pytestmark = [pytest.mark.slow, pytest.mark.export]

INSTANCE_SEG_16 = ('pola_mm_deploy::mmdet/instance-seg/'
                   'instance-seg_onnxruntime_dynamic-opset16.py')
FLAGSHIP = osp.join(CONFIGS, 'mask_rcnn_pola_swin_t.py')
#: The flagship Mask R-CNN shrunk as the dynamic-shape tests shrink it: a
#: tiny Pola-Swin, 32-wide FPN and heads. Untrained, it proposes RoIs
#: thinner than one feature cell.
SMALL_FLAGSHIP = [
    'model.backbone.init_cfg=None', 'model.backbone.arch._delete_=True',
    'model.backbone.arch.embed_dims=16',
    'model.backbone.arch.depths=[1,1,2,2]',
    'model.backbone.arch.num_heads=[1,1,2,2]',
    'model.neck.in_channels=[16,32,64,128]', 'model.neck.out_channels=32',
    'model.rpn_head.in_channels=32', 'model.rpn_head.feat_channels=32',
    'model.roi_head.bbox_roi_extractor.out_channels=32',
    'model.roi_head.bbox_head.in_channels=32',
    'model.roi_head.bbox_head.fc_out_channels=64',
    'model.roi_head.mask_roi_extractor.out_channels=32',
    'model.roi_head.mask_head.in_channels=32',
    'model.roi_head.mask_head.conv_out_channels=32'
]


def _options(pairs: list) -> dict:
    """``--cfg-options`` as the tools parse them."""
    import argparse

    from mmengine.config import DictAction
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(['--cfg-options', *pairs]).cfg_options


def test_pola_mm_deploy_configs_are_the_stock_ones_at_opset_16():
    """Each of pola_mm's deploy configs is the stock file of the same name
    (without ``-opset16``) with ``opset_version=16`` and nothing else."""
    from mmengine.config import Config
    names = pola_mm_deploy_configs()
    assert len(names) == 4
    for name in names:
        ours = Config.fromfile(resolve_deploy_config(
            'pola_mm_deploy::' + name)).to_dict()
        rel = name.replace('-opset16', '')
        assert rel in stock_deploy_configs()
        theirs = Config.fromfile(stock(rel)).to_dict()
        assert ours['onnx_config'].pop('opset_version') == 16
        assert theirs['onnx_config'].pop('opset_version') == 11
        assert ours == theirs, name


class _RoIAlign(torch.nn.Module):
    """mmdet's RoIAlign (mmcv's, ``aligned=True``) of one 7x7 map."""

    def __init__(self) -> None:
        super().__init__()
        from mmcv.ops import RoIAlign
        self.op = RoIAlign((7, 7), spatial_scale=0.25, sampling_ratio=0,
                           aligned=True)

    def forward(self, feat: torch.Tensor, rois: torch.Tensor):
        return self.op(feat, rois)


#: RoIs (image coordinates, stride 4): two wide, three thinner than a cell
ROIS = torch.tensor([[0, 10, 10, 60, 50], [0, 20, 20, 22.5, 70],
                     [0, 30, 5, 80, 6.5], [0, 5, 5, 7, 7],
                     [0, 0, 0, 90, 70]])


@pytest.mark.parametrize('opset', [11, 16])
def test_mmdeploys_roi_align_symbolic(tmp_path, opset):
    """MMDeploy 1.3.1's RoIAlign symbolic at opset 16 writes ONNX RoiAlign
    with ``half_pixel``: ONNX Runtime then equals mmcv's ``aligned=True``
    on every RoI. At opset 11 it writes the shifted plain RoiAlign: equal
    on wide RoIs, different on those thinner than a cell."""
    import onnx
    import onnxruntime as ort
    from mmdeploy.apis.onnx import export
    from mmengine.config import Config
    deploy = Config.fromfile(stock(
        'mmdet/instance-seg/instance-seg_onnxruntime_static.py'))
    deploy.onnx_config.opset_version = opset
    feat = torch.randn(1, 4, 20, 24,
                       generator=torch.Generator().manual_seed(0))
    model = _RoIAlign()
    export(model, (feat, ROIS), output_path_prefix=str(tmp_path / 'roi'),
           backend='onnxruntime', input_names=['feat', 'rois'],
           output_names=['out'], context_info={'deploy_cfg': deploy},
           opset_version=opset)
    path = str(tmp_path / 'roi.onnx')
    [node] = [n for n in onnx.load(path).graph.node
              if n.op_type == 'RoiAlign']
    modes = [a.s.decode() for a in node.attribute
             if a.name == 'coordinate_transformation_mode']
    assert modes == (['half_pixel'] if opset == 16 else [])
    got = ort.InferenceSession(path, providers=['CPUExecutionProvider']).run(
        None, {'feat': feat.numpy(), 'rois': ROIS.numpy()})[0]
    with torch.no_grad():
        ref = model(feat, ROIS).numpy()
    diff = np.abs(got - ref).reshape(len(ROIS), -1).max(1)
    if opset == 16:
        assert diff.max() <= 1e-5, diff
    else:
        wide = np.array([True, False, False, False, True])
        assert diff[wide].max() <= 1e-5 and diff[~wide].min() > 0.1, diff


def test_untrained_flagship_verifies_its_top_20_at_opset_16(tmp_path, photo,
                                                            capsys):
    """``deploy.py`` on the untrained flagship Mask R-CNN (shrunk) and the
    astronaut, through the deploy config the docs suggest: nothing scores
    0.3, so the 20 best of each side are compared (boxes, scores, labels,
    masks) and all match; the tool says how many, and that the weights are
    random and seeded; --save-weights keeps them."""
    from pola_mm.deployment.deploy import main
    out = tmp_path / 'deploy'
    rc = main([INSTANCE_SEG_16, FLAGSHIP, 'none', photo, '--work-dir',
               str(out), '--save-weights', '--cfg-options', *SMALL_FLAGSHIP])
    printed, err = capsys.readouterr()
    assert rc == 0, err[-3000:]
    lines = printed.splitlines()
    [counted] = [ln for ln in lines if 'without a counterpart' in ln]
    assert counted.endswith(' ok'), counted
    assert ("compared PyTorch's top 20 of 100 and the backend's top 20 of "
            "100 (those with score >= 0.3: 0 and 0" in counted), counted
    assert any(ln.startswith('image 0 800x800: mask IoU') for ln in lines)
    assert lines[-1] == (f'verified: {out / "end2end.onnx"} '
                         '(InstanceSegmentation, input 800x800); 20 PyTorch '
                         'and 20 ONNX Runtime detections compared')
    assert lines[-2] == ('weights: random, seeded (--seed 0); saved to '
                         f'{out / "end2end.pth"}')
    assert 'note:' not in printed + err  # opset 16: nothing to advise
    assert sorted(p.name for p in out.iterdir()) == ['end2end.onnx',
                                                     'end2end.pth']
    # the saved weights are the model of seed 0: the same every run
    from mmdeploy.apis import build_task_processor

    from pola_mm.deployment.mmdeploy_export import load_deploy_configs
    deploy, model_cfg = load_deploy_configs(
        resolve_deploy_config(INSTANCE_SEG_16), FLAGSHIP,
        _options(SMALL_FLAGSHIP))
    torch.manual_seed(0)
    again = build_task_processor(model_cfg, deploy,
                                 'cpu').build_pytorch_model().state_dict()
    saved = torch.load(out / 'end2end.pth', map_location='cpu',
                       weights_only=True)['state_dict']
    assert saved.keys() == again.keys()
    assert all(torch.equal(saved[k], again[k]) for k in saved)


def test_untrained_flagship_differs_at_stock_opset_11(tmp_path, photo):
    """The same model and weights through MMDeploy's stock opset-11 config:
    RoIs thinner than a feature cell pool other features, the top 20
    differ, and the refusal names the opset-16 config."""
    with pytest.raises(DeployError) as info:
        deploy_and_verify(
            'mmdeploy::mmdet/instance-seg/instance-seg_onnxruntime_dynamic.py',
            FLAGSHIP, None, photo, str(tmp_path / 'd'),
            cfg_options=_options(SMALL_FLAGSHIP))
    msg = str(info.value)
    assert 'differs from PyTorch' in msg and 'FAILED' in msg
    assert f'use {INSTANCE_SEG_16}' in msg
    assert not (tmp_path / 'd' / 'end2end.onnx').exists()


def test_a_check_of_nothing_is_refused(tmp_path, photo, capsys):
    """No detection on either side (a threshold no score reaches): the
    check could not fail, so nothing is verified or written (exit 1); the
    refused run says what its weights were, as a verified one does."""
    from pola_mm.deployment.deploy import main
    ckpt = osp.join(DATA, 'retinanet_pola_pvt_shapes.pth')
    rc = main([stock('mmdet/detection/detection_onnxruntime_static.py'),
               osp.join(DATA, 'retinanet_pola_pvt_shapes.py'), ckpt, photo,
               '--work-dir', str(tmp_path / 'n'), '--cfg-options',
               'model.test_cfg.score_thr=1.01'])
    printed, err = capsys.readouterr()
    assert rc == 1 and err.startswith('error: nothing to compare'), err
    assert printed.splitlines()[-1] == f'weights: checkpoint {ckpt}'
    assert not (tmp_path / 'n' / 'end2end.onnx').exists()
