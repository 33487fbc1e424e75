"""The one synthetic generator's other outputs: the ``'boxes'`` style the
end-to-end tests train on, polygon masks, ADE20K-style label maps and the
colour image folder (the demo's COCO set is tested in test_shapes.py)."""
import json

import numpy as np
import pytest
from PIL import Image

from pola_mm.demo.shapes import (BOX_CLASSES, BOX_COLOURS, BOX_KINDS,
                                 generate_boxes_image, make_colour_folder,
                                 make_shapes_ade, mask_to_bbox, write_coco)


def test_boxes_style_codes_classes_by_colour():
    rng = np.random.default_rng(0)
    for _ in range(10):
        image, instances = generate_boxes_image(rng, img_size=64,
                                                max_shapes=3)
        assert image.shape == (64, 64, 3) and image.dtype == np.uint8
        assert 1 <= len(instances) <= 3
        union = np.zeros((64, 64), dtype=int)
        for inst in instances:
            cls = inst['category_id'] - 1
            assert 0 <= cls < len(BOX_CLASSES)
            mask = inst['mask']
            assert (image[mask] == BOX_COLOURS[cls]).all()
            x, y, w, h = (int(v) for v in mask_to_bbox(mask))
            assert 16 <= w <= 33 and 16 <= h <= 33  # a quarter to a half
            filled = mask[y:y + h, x:x + w].all()
            assert filled == (BOX_KINDS[cls] == 'rectangle')
            union += mask
        assert union.max() == 1
        background = image[union == 0]
        assert background.min() >= 90 and background.max() < 140


def test_polygons_and_label_maps_agree_with_masks(tmp_path):
    """One seed, one stream: the COCO polygons (read back by pycocotools)
    and the ADE label maps describe the same shapes."""
    coco_api = pytest.importorskip('pycocotools.coco')
    ann_file = write_coco(
        str(tmp_path / 'coco' / 'images'),
        str(tmp_path / 'coco' / 'ann.json'), 3, img_size=64, seed=5,
        style='boxes', mask_format='polygon', file_name='{index:04d}.png',
        max_shapes=3)
    make_shapes_ade(str(tmp_path / 'ade'), 3, img_size=64, seed=5,
                    style='boxes', max_shapes=3)
    with open(ann_file) as f:
        names = [c['name'] for c in json.load(f)['categories']]
    assert names == list(BOX_CLASSES)
    coco = coco_api.COCO(ann_file)
    for img_id in coco.getImgIds():
        info = coco.loadImgs(img_id)[0]
        assert info['file_name'] == f'{img_id - 1:04d}.png'
        label = np.asarray(Image.open(
            tmp_path / 'ade' / 'annotations' / 'validation' /
            info['file_name']))
        assert set(np.unique(label)) <= {1, 2, 3, 4}  # 4: background
        anns = coco.loadAnns(coco.getAnnIds(imgIds=img_id))
        assert anns
        assert {a['category_id'] for a in anns} == \
            set(np.unique(label).tolist()) - {4}
        for ann in anns:
            mask = coco.annToMask(ann).astype(bool)
            ref = label == ann['category_id']
            # each shape lies in its class's pixels, polygon ~ raster
            inside = (mask & ref).sum()
            assert inside >= 0.9 * ann['area'], (inside, ann['area'])
            assert abs(int(mask.sum()) - ann['area']) <= 0.1 * ann['area']


def test_colour_folder(tmp_path):
    make_colour_folder(str(tmp_path), per_class=2, img_size=8)
    for split in ('train', 'val'):
        for k, colour in enumerate(BOX_COLOURS):
            img = np.asarray(Image.open(
                tmp_path / split / f'class_{k}' / '1.png'), dtype=float)
            mean = img.reshape(-1, 3).mean(0)
            assert np.argmax(mean) == np.argmax(colour)


def test_unknown_style(tmp_path):
    with pytest.raises(ValueError, match='style'):
        make_shapes_ade(str(tmp_path), 1, style='stars')
