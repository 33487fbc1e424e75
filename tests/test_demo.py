"""The embedded demo: its config, a few training iterations, evaluation and
the prediction picture, on a tiny shapes set (the learning run is
``make demo``)."""
import os.path as osp
import runpy
import sys

import pytest

pytest.importorskip('mmdet.models')

from mmengine.config import Config  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402

from pola_mm.utils.shapes import SHAPES_CLASSES, make_shapes_dataset  # noqa

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIG = osp.join(REPO, 'configs', 'demo', 'mask_rcnn_pola_swin_shapes.py')


def _tiny_cfg(data_root: str, work_dir: str, iters: int = 2) -> Config:
    cfg = Config.fromfile(CONFIG)
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.data_root = data_root
        cfg[loader].batch_size = 2
    for evaluator in ('val_evaluator', 'test_evaluator'):
        cfg[evaluator].ann_file = osp.join(data_root, 'annotations',
                                           'instances_val.json')
    cfg.train_cfg.max_iters = iters
    cfg.train_cfg.val_interval = iters
    cfg.param_scheduler[0].end = 1
    cfg.param_scheduler[1].begin = 1
    cfg.param_scheduler[1].end = iters
    cfg.default_hooks.checkpoint.interval = iters
    cfg.default_hooks.logger.interval = 1
    cfg.work_dir = work_dir
    return cfg


def test_demo_config_builds():
    from mmdet.registry import MODELS
    cfg = Config.fromfile(CONFIG)
    assert cfg.model.backbone.type == 'PolaSwinTransformer'
    assert cfg.model.backbone.init_cfg is None  # trained from scratch
    assert cfg.train_cfg.type == 'IterBasedTrainLoop'
    assert cfg.train_dataloader.dataset.data_root == 'data/shapes/'
    assert tuple(cfg.metainfo.classes) == SHAPES_CLASSES
    assert cfg.val_evaluator.metric == ['bbox', 'segm']
    init_default_scope('mmdet')
    model = MODELS.build(cfg.model)
    assert type(model.backbone).__name__ == 'PolaSwinTransformer'
    assert model.roi_head.bbox_head.num_classes == len(SHAPES_CLASSES)
    assert model.roi_head.mask_head.num_classes == len(SHAPES_CLASSES)


def test_demo_trains_evaluates_and_draws(tmp_path, monkeypatch):
    from mmengine.runner import Runner
    data_root = str(tmp_path / 'shapes')
    make_shapes_dataset(data_root, num_train=4, num_val=2, seed=1)
    cfg = _tiny_cfg(data_root, str(tmp_path / 'work'))
    runner = Runner.from_cfg(cfg)
    runner.train()
    metrics = runner.val_loop.run()
    for key in ('coco/bbox_mAP', 'coco/segm_mAP'):
        assert key in metrics and metrics[key] >= 0
    ckpt = osp.join(cfg.work_dir, 'iter_2.pth')
    assert osp.isfile(ckpt)

    # tools/misc/visualize_predictions.py on the checkpoint
    out = tmp_path / 'predictions.png'
    monkeypatch.setattr(sys, 'argv', [
        'visualize_predictions.py', CONFIG, ckpt, '--out', str(out),
        '--num-images', '2', '--score-thr', '0.0', '--scale', '2',
        '--cfg-options', f'test_dataloader.dataset.data_root={data_root}'
    ])
    runpy.run_path(
        osp.join(REPO, 'tools', 'misc', 'visualize_predictions.py'),
        run_name='__main__')
    from PIL import Image
    img = Image.open(out)
    assert img.width > 2 * 256 and img.height > 256
