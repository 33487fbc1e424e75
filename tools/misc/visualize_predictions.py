"""Draw a detector's predictions on a few validation images into one picture.

Each tile shows the ground truth (left) and the predictions above
``--score-thr`` (right) of one image of the config's test set, enlarged by
``--scale`` so that labels stay readable on small images.

Example::

    python tools/misc/visualize_predictions.py \
        configs/demo/mask_rcnn_pola_swin_shapes.py \
        work_dirs/demo/iter_400.pth --out work_dirs/demo/predictions.png
"""
import argparse
import os
import os.path as osp
import sys
from typing import List

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..', '..'))
from pola_mm.cli import quiet_tool_warnings  # noqa: E402

# isort: split

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from mmengine.config import Config, DictAction  # noqa: E402
from mmengine.structures import InstanceData  # noqa: E402

quiet_tool_warnings()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Draw ground truth and predictions of a detector on '
        'validation images into a single picture.')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--out', required=True, help='output image (.png)')
    parser.add_argument(
        '--num-images', type=int, default=6, help='number of images')
    parser.add_argument(
        '--score-thr', type=float, default=0.5, help='score threshold')
    parser.add_argument(
        '--scale', type=int, default=3, help='enlarge images by this factor')
    parser.add_argument('--device', default='cpu')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override settings of the config, as in tools/train.py')
    return parser.parse_args()


def _scale_instances(instances: InstanceData, scale: int,
                     size: tuple) -> InstanceData:
    """Scale boxes (N, 4) and masks (N, H, W) of ``instances`` by ``scale``."""
    out = InstanceData()
    out.labels = instances.labels
    if 'scores' in instances:
        out.scores = instances.scores
    bboxes = instances.bboxes
    if hasattr(bboxes, 'tensor'):  # HorizontalBoxes of the dataset
        bboxes = bboxes.tensor
    out.bboxes = bboxes * scale
    masks = instances.masks
    if not isinstance(masks, torch.Tensor):  # BitmapMasks of the dataset
        masks = torch.from_numpy(np.asarray(masks.masks))
    if len(masks):
        masks = F.interpolate(
            masks[:, None].float(), size=size, mode='nearest')[:, 0] > 0.5
    else:
        masks = torch.zeros((0, ) + tuple(size), dtype=torch.bool)
    out.masks = masks
    return out


def _tile(gt: np.ndarray, pred: np.ndarray, name: str,
          score_thr: float) -> np.ndarray:
    """Ground truth and prediction panels (H, W, 3) side by side, titled."""
    import cv2
    h, w = gt.shape[:2]
    bar, gap = 20, 4
    tile = np.full((h + bar, 2 * w + gap, 3), 255, dtype=np.uint8)
    tile[bar:, :w] = gt
    tile[bar:, w + gap:] = pred
    for x, text in ((0, f'{name}: ground truth'),
                    (w + gap, f'prediction (score >= {score_thr:g})')):
        cv2.putText(tile, text, (x + 4, bar - 6), cv2.FONT_HERSHEY_SIMPLEX,
                    0.45, (0, 0, 0), 1, cv2.LINE_AA)
    return tile


def main() -> None:
    args = parse_args()
    import mmcv
    from mmdet.apis import inference_detector, init_detector
    from mmdet.registry import DATASETS, VISUALIZERS
    from mmengine.registry import init_default_scope

    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    model = init_detector(cfg, args.checkpoint, device=args.device)

    dataset = DATASETS.build(cfg.test_dataloader.dataset)
    visualizer = VISUALIZERS.build(
        dict(type='DetLocalVisualizer', name='pola_mm_demo_vis',
             line_width=2, alpha=0.5))
    visualizer.dataset_meta = dataset.metainfo

    tiles: List[np.ndarray] = []
    num = min(args.num_images, len(dataset))
    for idx in range(num):
        item = dataset[idx]
        sample = item['data_samples']
        img_path = sample.img_path
        result = inference_detector(model, img_path)
        img = mmcv.imread(img_path, channel_order='rgb')
        h, w = img.shape[:2]
        size = (h * args.scale, w * args.scale)
        big = mmcv.imresize(img, (size[1], size[0]), interpolation='nearest')
        pred = result.pred_instances
        pred = pred[pred.scores >= args.score_thr]
        result.pred_instances = _scale_instances(pred, args.scale, size)
        result.gt_instances = _scale_instances(sample.gt_instances,
                                               args.scale, size)
        visualizer.add_datasample(
            'shapes', big, data_sample=result, draw_gt=True, draw_pred=True,
            show=False, pred_score_thr=args.score_thr)
        drawn = visualizer.get_image()  # (H, 2 * W, 3): ground truth | pred
        tiles.append(
            _tile(drawn[:, :size[1]], drawn[:, size[1]:],
                  osp.basename(img_path), args.score_thr))

    cols = 2 if num > 1 else 1
    rows = (num + cols - 1) // cols
    th, tw = tiles[0].shape[:2]
    pad = 12
    canvas = np.full((rows * (th + pad) + pad, cols * (tw + pad) + pad, 3),
                     255, dtype=np.uint8)
    for i, tile in enumerate(tiles):
        r, c = divmod(i, cols)
        y, x = pad + r * (th + pad), pad + c * (tw + pad)
        canvas[y:y + th, x:x + tw] = tile
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    mmcv.imwrite(canvas[..., ::-1], args.out)
    print(f'Predictions of {num} validation images (left: ground truth, '
          f'right: predictions with score >= {args.score_thr}) '
          f'written to {args.out}')


if __name__ == '__main__':
    main()
