"""Odd image sizes through the Pola backbones (tiny archs): every size from
1x1 up gives maps of the documented shapes (docs/inputs.md), the CPU fast
paths agree with the plain model there, gradients flow, and an empty input
gets one clear error."""

import pytest
import torch
from helpers import (PVT_TINY, SWIN_TINY_DEPTH2, randomise_attention,
                     stage_grids)

from pola_mm.models.backbones.pola_pvt import PolaPVT
from pola_mm.models.backbones.pola_swin import PolaSwinTransformer
from pola_mm.ops import dispatch

pytestmark = pytest.mark.slow

SIZES = [(1, 1), (2, 2), (3, 3), (7, 7), (31, 31), (16, 2000), (2000, 16),
         (5, 33)]
STRIDES = (4, 8, 16, 32)


def _backbone(kind: str) -> torch.nn.Module:
    if kind == 'swin':
        # two blocks a stage: every softmax stage has a shifted block
        model = PolaSwinTransformer(arch=SWIN_TINY_DEPTH2)
    else:
        model = PolaPVT(arch=PVT_TINY)
    model.init_weights()
    randomise_attention(model)
    return model.eval()


@pytest.fixture(scope='module', params=['swin', 'pvt'])
def backbone(request):
    return _backbone(request.param)


def _expected(model, hw):
    family = 'pvt' if isinstance(model, PolaPVT) else 'swin'
    grids = stage_grids(family, *hw)
    return [(1, model.num_features[i], *grids[i]) for i in model.out_indices]


@pytest.mark.parametrize('hw', SIZES, ids=lambda s: f'{s[0]}x{s[1]}')
def test_every_size_gives_documented_shapes_and_the_plain_model(backbone,
                                                                hw):
    """``(1, C_i, H_i, W_i)`` with strides 4..32 (``ceil`` for Swin, the
    authors' ``floor`` for PVT, see ``helpers.stage_grids``), finite,
    and the CPU inference paths equal the plain PyTorch model."""
    x = torch.randn(1, 3, *hw, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fast = backbone(x)
        with dispatch.use_implementation('graph'):
            plain = backbone(x)
    assert [tuple(o.shape) for o in fast] == _expected(backbone, hw)
    for a, b in zip(fast, plain):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('hw', [(1, 1), (3, 7)])
def test_tiny_images_train(backbone, hw):
    """At 1x1 and 3x7 (one token in the late stages) the training forward
    gives finite gradients for the input and the attention parameters."""
    backbone.train()
    try:
        x = torch.randn(2, 3, *hw, requires_grad=True)
        sum(o.square().mean() for o in backbone(x)).backward()
        assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
        for name, p in backbone.named_parameters():
            if p.grad is not None:
                assert torch.isfinite(p.grad).all(), name
    finally:
        backbone.zero_grad(set_to_none=True)
        backbone.eval()


@pytest.mark.parametrize('shape', [(1, 3, 0, 8), (1, 3, 8, 0), (0, 3, 8, 8)])
def test_empty_input_has_one_clear_error(backbone, shape):
    with pytest.raises(ValueError, match='empty input.*at least 1x1'):
        backbone(torch.zeros(shape))


def _full_model(config: str, scope: str) -> torch.nn.Module:
    """The model of a real config with the tiny backbone (and, for
    detection and segmentation, the narrow necks and heads of e2e_data)."""
    from e2e_data import load, shrink_backbone, tiny_det, tiny_seg
    from mmengine.registry import MODELS, init_default_scope
    cfg = load(config)
    data = dict(data_root='unused', ann_file='unused', img_prefix='unused')
    if scope == 'mmdet':
        cfg = tiny_det(cfg, data, 'unused')
    elif scope == 'mmseg':
        cfg = tiny_seg(cfg, data, 'unused')
    else:
        shrink_backbone(cfg)
        cfg.model.head.in_channels = cfg.model.backbone.arch['embed_dims'] * 8
    init_default_scope(scope)
    model = MODELS.build(cfg.model)
    model.init_weights()
    return model.eval()


def _sample(scope: str, hw):
    if scope == 'mmdet':
        from mmdet.structures import DetDataSample
        return DetDataSample(metainfo=dict(img_shape=hw, ori_shape=hw,
                                           scale_factor=(1., 1.)))
    if scope == 'mmseg':
        from mmseg.structures import SegDataSample
        return SegDataSample(metainfo=dict(img_shape=hw, ori_shape=hw))
    from mmpretrain.structures import DataSample
    return DataSample()


@pytest.mark.parametrize('config,scope', [
    ('pola_swin_t_in1k.py', 'mmpretrain'),
    ('mask_rcnn_pola_swin_t.py', 'mmdet'),
    ('sem_fpn_pola_pvt_t_ade20k.py', 'mmseg')])
def test_full_models_at_tiny_and_thin_sizes(config, scope):
    """One model per task family, fed 1x1 and 16x200 images straight (no
    resize in a pipeline): scores for the classifier, masks and a label map
    of the input's size for the detector and the segmentor."""
    model = _full_model(config, scope)
    for hw in [(1, 1), (16, 200)]:
        img = torch.randint(0, 256, (3, ) + hw, dtype=torch.uint8)
        with torch.no_grad():
            out = model.test_step(dict(inputs=[img],
                                       data_samples=[_sample(scope, hw)]))[0]
        if scope == 'mmdet':
            pred = out.pred_instances
            assert len(pred) > 0 and tuple(pred.masks.shape[1:]) == hw
            assert torch.isfinite(pred.bboxes).all()
        elif scope == 'mmseg':
            assert tuple(out.pred_sem_seg.data.shape) == (1, ) + hw
        else:
            assert out.pred_score.shape == (1000, )
            assert torch.isfinite(out.pred_score).all()
