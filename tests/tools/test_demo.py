"""The embedded demo: its config builds, and tools/run_demo.sh trains a few
iterations, evaluates and draws on a tiny shapes set (the learning run itself
is ``make demo``)."""
import os
import os.path as osp
import re
import shutil
import subprocess
import sys

import pytest
from helpers import REPO

pytest.importorskip('mmdet.models')

from mmengine.config import Config  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402

from pola_mm.demo.shapes import SHAPES_CLASSES, make_shapes_dataset  # noqa

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CONFIG = osp.join(REPO, 'configs', 'demo', 'mask_rcnn_pola_swin_shapes.py')


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


@pytest.mark.skipif(shutil.which('bash') is None, reason='needs bash')
def test_run_demo_script(tmp_path):
    """tools/run_demo.sh end to end (2 iterations on 4 images): train.py,
    test.py on the checkpoint, the picture and the summary."""
    data_root = tmp_path / 'shapes'
    make_shapes_dataset(str(data_root), num_train=4, num_val=2, seed=1)
    work_dir = tmp_path / 'work'
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        DEMO_DATA=str(data_root),
        DEMO_WORK_DIR=str(work_dir),
        DEMO_TRAIN_OPTIONS=' '.join([
            'train_cfg.max_iters=2', 'train_dataloader.batch_size=2',
            'param_scheduler.0.end=1', 'param_scheduler.1.begin=1',
            'param_scheduler.1.end=2', 'default_hooks.checkpoint.interval=2',
            'default_hooks.logger.interval=1'
        ]))
    proc = subprocess.run(['bash', osp.join(REPO, 'tools', 'run_demo.sh')],
                          env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert 'Iter(train) [2/2]' in proc.stdout
    bbox = re.search(r'COCO bbox mAP: ([0-9.]+)', proc.stdout)
    segm = re.search(r'COCO segm mAP: ([0-9.]+)', proc.stdout)
    assert bbox and segm, proc.stdout[-3000:]
    assert osp.isfile(work_dir / 'iter_2.pth')
    from PIL import Image
    img = Image.open(work_dir / 'predictions.png')
    assert img.width > 2 * 128 * 3 and img.height > 128 * 3
