"""Images without annotations and empty or degenerate boxes and polygons
in a COCO file, through a real config (Mask R-CNN, Pola-Swin, tiny arch):
what mmdet does with each (docs/inputs.md), and that training on them runs
with finite losses."""
import json
import math
import os.path as osp

import pytest
from e2e_data import load, make_coco, tiny_det
from mmengine.runner import Runner

pytestmark = pytest.mark.slow

#: image ids of the edited set (make_coco numbers images from 1)
EMPTY, ZERO_BOX, DEGENERATE, NORMAL = 1, 2, 3, 4


def _edit(ann_file: str, empty_list: bool = False) -> None:
    """Image 1 loses its annotations; image 2 gets a zero-width box with a
    2-point polygon; image 3 a 2-point polygon, a collinear 3-point one
    and an empty one (``[[]]``, or ``[]`` with ``empty_list``)."""
    with open(ann_file) as f:
        coco = json.load(f)
    anns = [a for a in coco['annotations'] if a['image_id'] != EMPTY]
    extra = [
        (ZERO_BOX, [5., 5., 0., 10.], 0., [[5., 5., 5., 15.]]),
        (DEGENERATE, [10., 10., 10., 10.], 50., [[10., 10., 20., 10.]]),
        (DEGENERATE, [10., 10., 10., 10.], 50.,
         [[10., 10., 15., 15., 20., 20.]]),
        (DEGENERATE, [30., 30., 10., 10.], 100., [] if empty_list else [[]]),
    ]
    for image_id, bbox, area, segm in extra:
        anns.append(dict(id=len(anns) + 100, image_id=image_id,
                         category_id=1, bbox=bbox, area=area, iscrowd=0,
                         segmentation=segm))
    coco['annotations'] = anns
    with open(ann_file, 'w') as f:
        json.dump(coco, f)


def _config(tmp_path, empty_list: bool = False, filter_empty: bool = False):
    data = make_coco(str(tmp_path / 'coco'), num_images=4, size=64)
    _edit(data['ann_file'], empty_list)
    cfg = tiny_det(load('mask_rcnn_pola_swin_t.py'), data,
                   str(tmp_path / 'work'), epochs=1, size=64)
    cfg.train_dataloader.dataset.filter_cfg = dict(
        filter_empty_gt=filter_empty, min_size=0)
    cfg.val_dataloader = cfg.val_cfg = cfg.val_evaluator = None
    return cfg


def _dataset(cfg):
    from mmdet.registry import DATASETS
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    return DATASETS.build(cfg.train_dataloader.dataset)


def test_what_mmdet_keeps(tmp_path):
    """Zero-size boxes (w or h < 1, area 0) are dropped when the file is
    read; polygons with fewer than 3 points or none make their instance
    ignored; a collinear polygon is kept with an empty mask; an image left
    without annotations has no instances, and ``filter_empty_gt=True`` (the
    configs' setting) removes it from training."""
    cfg = _config(tmp_path)
    ds = _dataset(cfg)
    infos = {ds.get_data_info(i)['img_id']: i for i in range(len(ds))}
    assert sorted(infos) == [EMPTY, ZERO_BOX, DEGENERATE, NORMAL]
    assert ds.get_data_info(infos[EMPTY])['instances'] == []
    zero = ds.get_data_info(infos[ZERO_BOX])['instances']
    assert all(b['bbox'][2] > b['bbox'][0] for b in zero)
    assert len(zero) == 2  # the two shapes of make_coco only
    sample = ds[infos[DEGENERATE]]['data_samples']
    # 2 shapes + the collinear polygon; the 2-point and empty ones ignored
    assert len(sample.gt_instances) == 3
    assert len(sample.ignored_instances) == 2
    assert sample.gt_instances.masks.masks[-1].sum() == 0
    assert len(ds[infos[EMPTY]]['data_samples'].gt_instances) == 0

    cfg.train_dataloader.dataset.filter_cfg.filter_empty_gt = True
    ds = _dataset(cfg)
    ids = {ds.get_data_info(i)['img_id'] for i in range(len(ds))}
    assert ids == {ZERO_BOX, DEGENERATE, NORMAL}


def test_empty_segmentation_list_is_mmdets_key_error(tmp_path):
    """``"segmentation": []`` (instead of ``[[]]`` or a polygon) on a box
    with an area: mmdet 3.3 stores no mask for it and its LoadAnnotations
    fails with ``KeyError: 'mask'`` (documented in docs/inputs.md: drop
    such annotations or give them a polygon)."""
    ds = _dataset(_config(tmp_path, empty_list=True))
    index = next(i for i in range(len(ds))
                 if ds.get_data_info(i)['img_id'] == DEGENERATE)
    with pytest.raises(KeyError, match='mask'):
        ds[index]


def test_training_on_them_has_finite_losses(tmp_path):
    """One iteration on all four images in one batch (the image without
    annotations included): the logged losses are finite."""
    cfg = _config(tmp_path)
    cfg.train_dataloader.batch_size = 4
    runner = Runner.from_cfg(cfg)
    runner.train()
    losses = runner.message_hub.get_scalar('train/loss').data[0]
    assert len(losses) == 1
    assert all(math.isfinite(v) for v in losses)
    assert osp.isfile(osp.join(cfg.work_dir, 'epoch_1.pth'))
