"""Grayscale, RGBA and 16-bit image files through the train and test
pipelines of each task family's configs (built from the config, run on
files written to ``tmp_path`` from skimage's real photos): every one becomes
the 3-channel 8-bit image the model expects, the same image as its 8-bit
RGB version."""
import random

import cv2
import numpy as np
import pytest
import skimage.data
from e2e_data import load
from mmengine.dataset import Compose
from mmengine.registry import init_default_scope

pytestmark = pytest.mark.slow

#: config -> the OpenMMLab scope of its pipeline
CONFIGS = {
    'pola_swin_t_in1k.py': 'mmpretrain',
    'mask_rcnn_pola_swin_t.py': 'mmdet',  # pola_mm's multi-scale crop
    'retinanet_pola_pvt_t.py': 'mmdet',
    'sem_fpn_pola_pvt_t_ade20k.py': 'mmseg',  # as UperNet's (mmseg's)
}
FORMATS = ('rgb', 'gray', 'rgba', 'rgb16', 'gray16')
SIZE = 96


@pytest.fixture(scope='module')
def images(tmp_path_factory):
    """``{format: path}`` (PNG) of the astronaut and camera photos, and a
    label map for segmentation."""
    root = tmp_path_factory.mktemp('formats')
    step = 512 // SIZE + 1
    rgb = np.ascontiguousarray(skimage.data.astronaut()[::step, ::step])
    gray = np.ascontiguousarray(skimage.data.camera()[::step, ::step])
    bgr = rgb[..., ::-1]
    arrays = dict(
        rgb=bgr, gray=gray,
        rgba=np.dstack([bgr, np.full(bgr.shape[:2], 77, np.uint8)]),
        rgb16=bgr.astype(np.uint16) * 257, gray16=gray.astype(np.uint16) * 257,
        gray3=np.dstack([gray] * 3))
    paths = {}
    for name, a in arrays.items():
        paths[name] = str(root / f'{name}.png')
        assert cv2.imwrite(paths[name], a)
        assert cv2.imread(paths[name], cv2.IMREAD_UNCHANGED).shape == a.shape
    paths['seg'] = str(root / 'seg.png')
    cv2.imwrite(paths['seg'], ((gray > 100) * 3 + 1).astype(np.uint8))
    return paths


def _sample(scope: str, path: str, seg: str) -> dict:
    h, w = cv2.imread(path, cv2.IMREAD_UNCHANGED).shape[:2]
    if scope == 'mmpretrain':
        return dict(img_path=path, gt_label=1)
    if scope == 'mmdet':
        return dict(img_path=path, img_id=0, height=h, width=w, instances=[
            dict(bbox=[10., 12., 60., 70.], bbox_label=0, ignore_flag=0,
                 mask=[[10., 12., 60., 12., 60., 70., 10., 70.]])])
    return dict(img_path=path, seg_map_path=seg, reduce_zero_label=True,
                seg_fields=[])


def _run(pipeline: Compose, scope: str, path: str, seg: str, seed: int = 0):
    random.seed(seed)
    np.random.seed(seed)
    out = pipeline(_sample(scope, path, seg))
    return out['inputs'].numpy(), out['data_samples']


@pytest.mark.parametrize('config', sorted(CONFIGS))
def test_pipelines_give_3_channel_8_bit_images(config, images):
    scope = CONFIGS[config]
    cfg = load(config)
    init_default_scope(scope)
    test = Compose(cfg.test_dataloader.dataset.pipeline)
    train = Compose(cfg.train_dataloader.dataset.pipeline)
    seg = images['seg']
    ref = {name: _run(test, scope, images[name], seg)[0]
           for name in ('rgb', 'gray3')}
    for name in FORMATS:
        x, _ = _run(test, scope, images[name], seg)
        assert x.dtype == np.uint8 and x.shape[0] == 3, (name, x.shape)
        # the alpha channel is dropped, 16 bits become the top 8 bits,
        # grayscale is repeated over three channels
        want = ref['gray3' if name.startswith('gray') else 'rgb']
        np.testing.assert_array_equal(x, want, err_msg=name)
        x, sample = _run(train, scope, images[name], seg, seed=1)
        assert x.dtype == np.uint8 and x.shape[0] == 3, (name, x.shape)
        if scope == 'mmdet':
            assert len(sample.gt_instances) == 1
        elif scope == 'mmseg':
            assert tuple(sample.gt_sem_seg.shape) == x.shape[1:]
        else:
            assert sample.gt_label.tolist() == [1]
